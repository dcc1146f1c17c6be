"""Importing a module the user names on the command line (``pkg.module:name``)."""

from __future__ import annotations

import importlib
import os
import sys
from types import ModuleType


def import_user_module(module_name: str, what: str) -> ModuleType:
    """``module_name`` from ``sys.path``, else from the current folder, which a console
    script such as ``polytrain`` does not search itself. Any failure is one ImportError
    line that starts with ``what`` (e.g. ``--plugin 'x:Y'``) and says where it looked."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        cwd = os.getcwd()
        if exc.name != module_name.partition(".")[0] or cwd in sys.path or "" in sys.path:
            raise ImportError(f"{what}: cannot import {module_name!r}: {exc}.") from None
        sys.path.append(cwd)
        try:
            return importlib.import_module(module_name)
        except ModuleNotFoundError as again:
            if again.name != module_name.partition(".")[0]:
                raise ImportError(f"{what}: importing {module_name!r} failed: {again}.") from None
            raise ImportError(
                f"{what}: cannot import {module_name!r} from sys.path or {cwd}: {again}. "
                "Add its folder to PYTHONPATH."
            ) from None
        except ImportError as again:  # found, but its own imports failed
            raise ImportError(f"{what}: importing {module_name!r} failed: {again}.") from None
    except ImportError as exc:  # found, but its own imports failed
        raise ImportError(f"{what}: importing {module_name!r} failed: {exc}.") from None
