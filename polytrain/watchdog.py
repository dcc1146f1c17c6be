"""A progress watchdog: a process that stops making progress exits instead of hanging.

In a multi-process job a dead peer can leave the others blocked inside a collective
(ps-lite has no timeout at all). The trainer feeds the watchdog after every step and
every evaluation; if nothing arrives for ``timeout`` seconds, the watchdog prints why
and ends the process with :data:`EXIT_CODE`. The last checkpoint is untouched: saves
are atomic.
"""

from __future__ import annotations

import os
import sys
import threading
import time

EXIT_CODE = 75


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
