"""What a run holds for its life besides the model: its output folder (locked by rank 0
before any work, released at the end) and the stop signals (SIGINT/SIGTERM end the run
at the next step boundary, with a checkpoint)."""

from __future__ import annotations

import contextlib
import errno
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from polytrain.errors import OutputError
from polytrain.io.run_dir import RunDirLock, claim_run_dir, os_error_line, writable_dir
from polytrain.training.options import TrainerOptions
from polytrain.training.recipe import Recipe

# An OSError with one of these (and no file name) is the output's: full, read-only, denied
OUTPUT_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO}
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class RunFolder:
    """The run's ``--out`` folder (None without one); rank 0 claims it (and checks the
    ``--tensorboard`` folder) before any work."""

    def __init__(self, recipe: Recipe, options: TrainerOptions, rank: int) -> None:
        self.path = Path(options.out_dir) if options.out_dir else None
        self._lock: RunDirLock | None = None
        if rank != 0:  # rank 0 writes the run's files
            return
        if options.tensorboard is not None:
            writable_dir(options.tensorboard, "--tensorboard")
        if options.out_dir:
            self._lock = claim_run_dir(
                options.out_dir,
                resume=options.resume,
                overwrite=options.overwrite,
                inputs={"--data": recipe.data, "--data-dir": recipe.data_dir},
            )

    def release(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    @contextlib.contextmanager
    def output_errors(self, fix: Callable[[], str]) -> Iterator[None]:
        """An OSError of writing the run's output as one OutputError line ending in what
        ``fix()`` says then (e.g. the last good checkpoint)."""
        try:
            yield
        except OSError as exc:
            if exc.filename is None and exc.errno not in OUTPUT_ERRNOS:
                raise
            raise OutputError(os_error_line(exc, fix(), self.path)) from exc


class StopRequest:
    """A stop signal received (``signal``, None until one is) and where it was honoured
    when not between steps (``note``)."""

    def __init__(self) -> None:
        self.signal: int | None = None
        self.note = ""

    @property
    def number(self) -> int:
        """The signal's number, 0 when none came (what the step runner passes around)."""
        return self.signal or 0

    def reason(self) -> str:
        """The summary's stop reason, e.g. ``interrupted by SIGTERM``."""
        return f"interrupted by {signal.Signals(self.signal or signal.SIGINT).name}{self.note}"

    @contextlib.contextmanager
    def caught(self) -> Iterator[None]:
        """Inside, SIGINT/SIGTERM only record the stop; a second signal acts at once (the
        handlers before are back). Off the main thread, signals are left alone."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def request_stop(signum: int, _frame: object) -> None:
            self.signal = signum
            for sig in STOP_SIGNALS:
                signal.signal(sig, previous[sig])

        previous = {sig: signal.signal(sig, request_stop) for sig in STOP_SIGNALS}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
