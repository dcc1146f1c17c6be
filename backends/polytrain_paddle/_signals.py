"""Paddle's C++ signal handlers off, from the moment Paddle installs them.

``import paddle`` calls ``paddle.base.core.init_glog``, which installs glog's failure
handler for SIGSEGV, SIGILL, SIGFPE, SIGABRT, SIGBUS and SIGTERM: on a SIGTERM it
prints a C++ traceback and "Error Message Summary ... SignalInfo: *** SIGTERM", and it
can deadlock on malloc's lock. ``paddle.disable_signal_handler()`` (Paddle's documented
switch) resets them; the rest of ``import paddle`` takes about a second more, so
:class:`PaddleCoreFinder` makes ``init_glog`` call the switch itself, and Python's
SIGTERM/SIGINT handlers are put back at once. :func:`release_signals` runs after the
import as well, for a Paddle imported before this plugin. Nothing here imports paddle.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from polytrain.utils.signals import reclaim_stop_signals, restore_fault_handler

CORE = "paddle.base.core"  # the module whose init_glog installs the handlers


def release_signals(core: Any) -> None:
    """Paddle's handlers off (``core`` has ``disable_signal_handler``); Python's back."""
    core.disable_signal_handler()
    reclaim_stop_signals()
    restore_fault_handler()


def _follow_init_glog(core: ModuleType) -> None:
    """``core.init_glog`` followed at once by :func:`release_signals`."""
    init_glog = getattr(core, "init_glog", None)
    if init_glog is None or not hasattr(core, "disable_signal_handler"):
        return  # another layout: the release after the import still runs

    def init_glog_then_release(*args: Any, **kwargs: Any) -> Any:
        result = init_glog(*args, **kwargs)
        release_signals(core)
        return result

    core.init_glog = init_glog_then_release  # type: ignore[attr-defined]


class PaddleCoreFinder(importlib.abc.MetaPathFinder):
    """Finds ``paddle.base.core`` as Python would, and has its loader wrap ``init_glog``
    (:func:`_follow_init_glog`) once the module ran; every other module is left alone."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != CORE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        loader = spec.loader if spec is not None else None
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run_module = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run_module(module)
            _follow_init_glog(module)

        setattr(loader, "exec_module", exec_module)  # noqa: B010 - this loader instance only
        return spec


def install_core_finder() -> None:
    """Put :class:`PaddleCoreFinder` first on ``sys.meta_path`` (once)."""
    if not any(isinstance(finder, PaddleCoreFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, PaddleCoreFinder())
