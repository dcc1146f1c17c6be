"""Importing a module the user names on the command line (``pkg.module:name``): the user's
code, so a wait on it is said (:func:`waiting_notice`, also around calling what it names:
:func:`polytrain.utils.user_code.call_user`)."""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import threading
from collections.abc import Iterator
from types import ModuleType

from polytrain.utils.signals import reclaim_stop_signals

NOTICE_SECONDS = 10.0  # the user's code running this long gets a line on stderr


@contextlib.contextmanager
def waiting_notice(what: str) -> Iterator[None]:
    """One line on stderr if the block (the user's code, ``what``) runs past
    :data:`NOTICE_SECONDS`, so a factory that never returns is not a silent hang."""
    seconds = NOTICE_SECONDS
    line = (
        f"polytrain: still waiting on {what} after {seconds:g} s: that is your code "
        "running, not polytrain (SIGTERM or Ctrl-C stops it)"
    )
    timer = threading.Timer(seconds, lambda: print(line, file=sys.stderr, flush=True))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def _import(module_name: str, what: str) -> ModuleType:
    """The import itself; a C++ signal handler the user's imports installed (a
    framework's) gives SIGTERM/SIGINT back to Python's handlers after it."""
    try:
        with waiting_notice(f"the import of {module_name!r} ({what})"):
            return importlib.import_module(module_name)
    finally:
        reclaim_stop_signals()


def import_user_module(module_name: str, what: str) -> ModuleType:
    """``module_name`` from ``sys.path``, else from the current folder, which a console
    script such as ``polytrain`` does not search itself. Any failure is one ImportError
    line that starts with ``what`` (e.g. ``--plugin 'x:Y'``) and says where it looked."""
    try:
        return _import(module_name, what)
    except ModuleNotFoundError as exc:
        cwd = os.getcwd()
        if exc.name != module_name.partition(".")[0] or cwd in sys.path or "" in sys.path:
            raise ImportError(f"{what}: cannot import {module_name!r}: {exc}.") from None
        sys.path.append(cwd)
        try:
            return _import(module_name, what)
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
