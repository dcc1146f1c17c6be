"""A progress watchdog: a process that stops making progress exits instead of hanging,
and names the process of its node that stopped first.

In a multi-process job a dead peer can leave the others blocked inside a collective
(ps-lite has no timeout at all). The trainer feeds the watchdog after every step and
every evaluation; if nothing arrives for ``timeout`` seconds, the watchdog prints why
and ends the process with :data:`EXIT_CODE`. It fires :func:`lead` seconds before the
engines' own collective timeouts (which start later, when the collective does), so the
message is polytrain's line, not a gloo error that blames the rank that waited. The last
checkpoint is untouched: saves are atomic.

Under ``polytrain launch`` (which sets :data:`PROGRESS_DIR_VAR` to a folder of the node)
the watchdog thread writes a heartbeat, ``progress.<rank>.json``, every
:data:`HEARTBEAT_SECONDS`: a process that is blocked waiting for its peers keeps beating,
one that is stopped, frozen or dead does not. :func:`stalled` reads them; the watchdog's
message and the launcher's report name the rank that stopped responding.
"""

from __future__ import annotations

import faulthandler
import json
import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

EXIT_CODE = 75
BACKSTOP_SECONDS = 5.0  # Deadline: the GIL-free backstop fires this much later
PROGRESS_DIR_VAR = "POLYTRAIN_PROGRESS_DIR"
HEARTBEAT_SECONDS = 1.0
STALE_SECONDS = 3 * HEARTBEAT_SECONDS  # a heartbeat this old: the process stopped responding


def lead(timeout: float) -> float:
    """How much earlier than ``timeout`` the watchdog fires."""
    return min(1.0, timeout / 10)


@dataclass(frozen=True)
class Heartbeat:
    """The last sign of life of one rank of this node (times are wall-clock)."""

    rank: int
    pid: int
    where: str  # the progress at the heartbeat, e.g. "epoch 1 step 12"
    beat: float  # the last heartbeat
    silent_from: float = 0.0  # the last silence (a stopped or frozen process, resumed)
    silent_to: float = 0.0
    ended: bool = False

    def silent_at(self, when: float) -> float:
        """For how long this rank had not responded at ``when`` (0: it had)."""
        if self.beat < when:
            return when - self.beat
        if self.silent_from < when <= self.silent_to:
            return when - self.silent_from
        return 0.0

    def describe(self, when: float) -> str:
        return (
            f"rank {self.rank} (pid {self.pid}) stopped responding "
            f"{self.silent_at(when):.0f} s earlier"
        )


def read_heartbeats(folder: Path) -> list[Heartbeat]:
    beats = []
    for path in folder.glob("progress.*.json"):
        with suppress(OSError, ValueError, TypeError, KeyError):
            beats.append(Heartbeat(**json.loads(path.read_text())))
    return sorted(beats, key=lambda b: b.rank)


def stalled(folder: Path | None, when: float, exclude: int | None = None) -> list[Heartbeat]:
    """Ranks of this node that had stopped responding at ``when``, longest silent first."""
    if folder is None:
        return []
    beats = [
        b
        for b in read_heartbeats(folder)
        if b.rank != exclude and not (b.ended and b.beat <= when)  # ended later: it counts
    ]
    silent = [b for b in beats if b.silent_at(when) > STALE_SECONDS]
    return sorted(silent, key=lambda b: -b.silent_at(when))


class Watchdog:
    """Ends the process when :meth:`feed` is not called for ``timeout`` seconds."""

    def __init__(self, timeout: float, what: str = "training", rank: int | None = None) -> None:
        self.timeout = timeout
        self.what = what
        self.where = "start-up"
        self.rank = rank
        folder = os.environ.get(PROGRESS_DIR_VAR)
        self.folder = Path(folder) if folder and rank is not None else None
        self._last = time.monotonic()
        self._beat_at = time.time()
        self._silence = (0.0, 0.0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="polytrain-watchdog", daemon=True)

    def start(self) -> Watchdog:
        self._last = time.monotonic()
        self._beat()
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
        self._beat(ended=True)

    def _beat(self, ended: bool = False) -> None:
        if self.folder is None or self.rank is None:
            return
        now = time.time()
        if now - self._beat_at > STALE_SECONDS:  # this process itself did not run
            self._silence = (self._beat_at, now)
        self._beat_at = now
        record = Heartbeat(self.rank, os.getpid(), self.where, now, *self._silence, ended)
        path = self.folder / f"progress.{self.rank}.json"
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        with suppress(OSError):  # a heartbeat is a courtesy: never a reason to fail
            tmp.write_text(json.dumps(record.__dict__))
            tmp.replace(path)

    def _run(self) -> None:
        fire_after = self.timeout - lead(self.timeout)
        while True:
            left = fire_after - (time.monotonic() - self._last)
            if left <= 0:
                self._fire(time.monotonic() - self._last)
            if self._stop.wait(min(HEARTBEAT_SECONDS, left)):
                return
            self._beat()

    def _fire(self, idle: float) -> None:
        now = time.time()
        culprits = stalled(self.folder, now, exclude=self.rank)
        silence = self._silence[1] - self._silence[0]
        if self._silence[1] > now - idle and silence > STALE_SECONDS:  # it was stopped itself
            cause = f"this process itself did not run for {silence:.0f} s (stopped or frozen)"
        elif culprits:
            cause = "; ".join(b.describe(now) for b in culprits)
        else:
            cause = "another process of the job has probably died or hung"
        print(
            f"polytrain: no {self.what} progress for {idle:.0f} s after {self.where} "
            f"(timeout {self.timeout:.0f} s): {cause}. Exiting; the last checkpoint is intact.",
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
