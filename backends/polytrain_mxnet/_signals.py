"""MXNet's C++ segfault logger off.

When libmxnet loads it installs a SIGSEGV handler (``install_signal_handlers``, built in
with ``MXNET_USE_SIGNAL_HANDLER``; no environment switch) that prints "Segmentation
fault: 11" and a backtrace, calling ``backtrace_symbols`` (malloc) inside the handler,
then the handler before it. SIGTERM and SIGINT it leaves alone. polytrain resets
SIGSEGV to the default, as Paddle's switch does for its own, so that no framework's C++
handler runs in a polytrain process; Python's faulthandler (``PYTHONFAULTHANDLER=1``)
still reports a crash when it is on (docs/reliability.md, "polytrain owns the signals").
"""

from __future__ import annotations

import signal
import threading

from polytrain.utils.signals import reclaim_stop_signals, restore_fault_handler


def release_signals() -> None:
    """MXNet's SIGSEGV handler off; Python's SIGTERM/SIGINT handlers in place."""
    if threading.current_thread() is not threading.main_thread():
        return  # only the main thread sets handlers
    signal.signal(signal.SIGSEGV, signal.SIG_DFL)
    reclaim_stop_signals()
    restore_fault_handler()
