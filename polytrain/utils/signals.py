"""polytrain owns SIGTERM and SIGINT (docs/reliability.md, "polytrain owns the signals").

A framework's C++ code can install its own handlers with ``sigaction`` behind Python's
back (Paddle's glog failure handler takes SIGTERM: it prints a C++ dump and can deadlock
on malloc's lock). Python's table still names Python's handler, so
:func:`reclaim_stop_signals` puts that one back. :func:`stop_signals_deferred` holds a
stop signal while a framework loads; :func:`stop_signals_interrupt` lets one end a wait
on something outside polytrain. Only the main thread can set handlers: elsewhere these
do nothing.
"""

from __future__ import annotations

import contextlib
import faulthandler
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)

Handler = Callable[[int, Any], Any] | int | signal.Handlers | None


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _install(sig: int, handler: Handler) -> None:
    """``handler`` in the C-level table too; one Python never set (None) becomes the default."""
    signal.signal(sig, signal.SIG_DFL if handler is None else handler)


def reclaim_stop_signals() -> None:
    """Python's handlers for SIGTERM and SIGINT back in the C-level table, over any a
    framework's C++ code installed since (Python's own table never saw those)."""
    if _main_thread():
        for sig in STOP_SIGNALS:
            _install(sig, signal.getsignal(sig))


def restore_fault_handler() -> None:
    """Python's faulthandler back on the crash signals, if it was on (``-X faulthandler``,
    ``PYTHONFAULTHANDLER``, pytest), after a framework reset them to the default."""
    stream = sys.__stderr__
    if faulthandler.is_enabled() and stream is not None:
        faulthandler.disable()
        with contextlib.suppress(ValueError, OSError, AttributeError):
            faulthandler.enable(file=stream)


@contextlib.contextmanager
def stop_signals_deferred() -> Iterator[None]:
    """Inside, SIGTERM and SIGINT are only recorded; on leaving, Python's handlers are
    reclaimed and a recorded signal is raised again, so its handler (polytrain's stop,
    KeyboardInterrupt, the default exit) runs then. For a framework's import: a handler
    that raises inside Paddle's C++ module init leaves an ImportError and a traceback."""
    if not _main_thread():
        yield
        return
    caught: list[int] = []
    previous = {
        sig: signal.signal(sig, lambda signum, _: caught.append(signum)) for sig in STOP_SIGNALS
    }
    try:
        yield
    finally:
        for sig, handler in previous.items():
            _install(sig, handler)
        for signum in dict.fromkeys(caught):
            signal.raise_signal(signum)


class StopSignalled(BaseException):
    """A stop signal ended a wait on something outside polytrain. A BaseException, as
    KeyboardInterrupt is, so that a library's ``except Exception`` does not wrap it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextlib.contextmanager
def stop_signals_interrupt() -> Iterator[None]:
    """Inside, SIGTERM or SIGINT ends the block with :class:`StopSignalled` right after
    the handler in place ran (the Trainer's records the stop; one that raises raises).
    For a wait on something outside polytrain, such as a tracking server."""
    if not _main_thread():
        yield
        return
    previous: dict[int, Handler] = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}

    def restore() -> None:
        for sig, handler in previous.items():
            if signal.getsignal(sig) is interrupt:  # not if the handler replaced itself
                _install(sig, handler)

    def interrupt(signum: int, frame: Any) -> None:
        restore()
        handler = previous[signum]
        if callable(handler):
            handler(signum, frame)
        elif handler == signal.SIG_IGN:
            return
        else:  # the default: the process ends, as it would have without this block
            signal.raise_signal(signum)
        raise StopSignalled(signum)

    for sig in STOP_SIGNALS:
        signal.signal(sig, interrupt)
    try:
        yield
    finally:
        restore()
