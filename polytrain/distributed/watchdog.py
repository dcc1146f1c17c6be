"""A progress watchdog: a process that stops making progress exits instead of hanging.

In a multi-process job a dead peer can leave the others blocked inside a collective
(ps-lite has no timeout at all). The trainer feeds the watchdog after every step and
every evaluation; if nothing arrives for ``timeout`` seconds, the watchdog prints why
and ends the process with :data:`EXIT_CODE`. The last checkpoint is untouched: saves
are atomic.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

EXIT_CODE = 75
BACKSTOP_SECONDS = 5.0  # Deadline: the GIL-free backstop fires this much later


class Watchdog:
    """Ends the process when :meth:`feed` is not called for ``timeout`` seconds."""

    def __init__(self, timeout: float, what: str = "training") -> None:
        self.timeout = timeout
        self.what = what
        self.where = "start-up"
        self._last = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="polytrain-watchdog", daemon=True)

    def start(self) -> Watchdog:
        self._last = time.monotonic()
        self._thread.start()
        return self

    def feed(self, where: str) -> None:
        """Progress was made; ``where`` names the point for the error message."""
        self.where = where
        self._last = time.monotonic()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2)

    def _run(self) -> None:
        while not self._stop.wait(min(1.0, self.timeout / 4)):
            idle = time.monotonic() - self._last
            if idle > self.timeout:
                print(
                    f"polytrain: no {self.what} progress for {idle:.0f} s after {self.where} "
                    f"(timeout {self.timeout:.0f} s); another process of the job has probably "
                    "died or hung. Exiting; the last checkpoint is intact.",
                    file=sys.stderr,
                    flush=True,
                )
                os._exit(EXIT_CODE)


class Deadline:
    """Ends the process when a blocking call has not returned within ``timeout`` seconds.

    For engines whose rendezvous or collectives have no timeout of their own (ps-lite;
    Paddle's TCP store while it waits for the other ranks): a Python exception cannot
    interrupt a call blocked in C++. One daemon thread serves every call made through
    :meth:`__call__`, which names what is being waited for; the message names it too.
    That thread needs the GIL: for calls that block without releasing it (Paddle's store),
    ``holds_gil=True`` also arms :func:`faulthandler.dump_traceback_later`, whose C thread
    prints where every thread stands and exits a few seconds later.
    """

    def __init__(self, timeout: float, engine: str, *, holds_gil: bool = False) -> None:
        self.timeout = timeout
        self.engine = engine
        self.holds_gil = holds_gil
        self._what: str | None = None
        self._since = 0.0
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="polytrain-deadline", daemon=True)
        self._thread.start()

    @contextmanager
    def __call__(self, what: str) -> Iterator[None]:
        with self._lock:
            self._what, self._since = what, time.monotonic()
        if self.holds_gil:
            faulthandler.dump_traceback_later(self.timeout + BACKSTOP_SECONDS, exit=True)
        try:
            yield
        finally:
            if self.holds_gil:
                faulthandler.cancel_dump_traceback_later()
            with self._lock:
                self._what = None

    def _run(self) -> None:
        while True:
            time.sleep(min(1.0, self.timeout / 4))
            with self._lock:
                what, waited = self._what, time.monotonic() - self._since
            if what is not None and waited > self.timeout:
                print(
                    f"polytrain: {self.engine}: {what} did not finish within "
                    f"{self.timeout:.0f} s; another process of the job has probably died or "
                    "cannot be reached. Exiting; the last checkpoint is intact.",
                    file=sys.stderr,
                    flush=True,
                )
                os._exit(EXIT_CODE)
