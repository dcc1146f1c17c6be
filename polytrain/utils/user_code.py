"""Calling code the user names (``--model pkg.module:factory``, ``--plugin``, ``port``'s
model factories): a failure inside it is one line naming the callable and the error; the
user's own traceback only with ``--debug`` (``POLYTRAIN_DEBUG=1``), which the CLI prints
from the error's ``__cause__``."""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from typing import Any

from polytrain.errors import ConfigError
from polytrain.utils.user_import import waiting_notice

DEBUG_VARIABLE = "POLYTRAIN_DEBUG"


def debug_enabled() -> bool:
    """Whether the user asked for tracebacks (``--debug`` sets ``POLYTRAIN_DEBUG=1``)."""
    return os.environ.get(DEBUG_VARIABLE, "") not in ("", "0")


def traceback_hint() -> str:
    """The end of a user-code error line: how to see the traceback (nothing under --debug)."""
    return "" if debug_enabled() else " (--debug shows its traceback)"


def call_user(func: Callable[[], Any], what: str) -> Any:
    """``func()`` for ``what`` (e.g. ``--model 'pkg:build'``): a callable that needs
    arguments, or that raises, is one ConfigError line naming it; the user's exception is
    the line's ``__cause__``."""
    name = getattr(func, "__qualname__", None) or type(func).__name__
    try:
        inspect.signature(func).bind()
    except TypeError as exc:
        raise ConfigError(
            f"{what}: {name} cannot be called with no arguments ({exc}); polytrain calls it "
            "with none: give defaults to its parameters or name a function that takes none."
        ) from None
    except ValueError:  # a builtin without a signature: just call it
        pass
    module = getattr(func, "__module__", None)
    try:
        with waiting_notice(f"{module + '.' if module else ''}{name}() ({what})"):
            return func()
    except (KeyboardInterrupt, SystemExit):
        raise
    except Exception as exc:
        raise ConfigError(
            f"{what}: calling {name}() failed: {type(exc).__name__}: {exc}{traceback_hint()}"
        ) from exc
