"""A run owns its output folder.

* :func:`writable_dir` checks a folder (``--out``, ``--tensorboard``, ``--log-dir``) before
  any work: it is created if missing, must be a folder, and must accept a file.
* :func:`claim_run_dir` takes the folder's lock and refuses a folder that holds another
  run unless the user resumes it or asks to overwrite it; when that run has no checkpoint
  to resume (stopped before or during its first save, or every checkpoint set aside as
  diverged) the refusal says so and names what to run instead.

The lock is ``.polytrain.lock`` with an advisory ``flock`` held for the life of the run; the
file names the owner (pid, host, command, start time) for the message a second run gets.
The kernel drops the lock when its process dies, however it dies, so a lock left by a
killed run is stale by construction and the next run takes it. The file itself stays
(deleting a lock file races with a process that has just opened it).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import socket
import sys
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from polytrain.errors import CheckpointError, ConfigError, OutputError
from polytrain.io.checkpoint import find_checkpoint, missing_checkpoint

LOCK_FILE = ".polytrain.lock"
METRICS_FILE = "metrics.jsonl"
CURVES_FILE = "curves.png"
STEPS_CSV = "steps.csv"  # --log csv
EPOCHS_CSV = "epochs.csv"
RUN_OPTIONS_FILE = "run-options.toml"  # the options train --resume carries
RUN_FILES = (METRICS_FILE, CURVES_FILE, "checkpoints", STEPS_CSV, EPOCHS_CSV, RUN_OPTIONS_FILE)


def os_error_line(exc: OSError, fix: str, folder: Path | None = None) -> str:
    """One line for an OSError a user can cause: the path (or the folder written into,
    when the failing write had no file name), the reason, what to do."""
    where = exc.filename if exc.filename is not None else f"into {folder or 'a file'}"
    reason = exc.strerror or type(exc).__name__
    return f"cannot write {where}: {reason}. {fix}"


def writable_dir(path: str | os.PathLike[str], flag: str) -> Path:
    """``path`` as a folder that exists and accepts files, or :class:`OutputError` naming
    the flag, the path and the fix."""
    folder = Path(path).expanduser()
    if folder.exists() and not folder.is_dir():
        raise OutputError(f"{flag} {folder} is a file, not a folder; name a folder.")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".polytrain-probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise OutputError(
            f"{flag} {folder} is not writable ({exc.strerror or exc}); "
            "choose a folder you can write to."
        ) from None
    return folder


def run_contents(folder: Path) -> list[str]:
    """The files of a training run in ``folder`` (empty if it holds none)."""
    return [name for name in RUN_FILES if (folder / name).exists()]


@dataclass
class RunDirLock:
    """The held lock of one run's output folder; :meth:`release` when the run ends."""

    folder: Path
    handle: IO[str] | None

    def release(self) -> None:
        if self.handle is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self.handle, fcntl.LOCK_UN)
            self.handle.close()
            self.handle = None


def _owner_record() -> str:
    return json.dumps(
        {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "command": " ".join(sys.argv),
            "since": time.strftime("%Y-%m-%d %H:%M:%S"),
        }
    )


def _owner(handle: IO[str]) -> str:
    handle.seek(0)
    try:
        info = json.loads(handle.read() or "{}")
        return f"pid {info['pid']} on {info['host']} since {info['since']} ({info['command']})"
    except (ValueError, KeyError, TypeError):
        return "another process"


def lock_run_dir(folder: Path) -> RunDirLock:
    """Take ``folder``'s lock or raise :class:`OutputError` naming its owner."""
    lock = folder / LOCK_FILE
    try:
        handle = open(lock, "a+", encoding="utf-8")  # noqa: SIM115 - held for the run
    except OSError as exc:
        raise OutputError(os_error_line(exc, "Choose a folder you can write to.")) from None
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        owner = _owner(handle)
        handle.close()
        raise OutputError(
            f"{folder} is in use by another run: {owner}. Wait for it to end or choose "
            "another --out."
        ) from None
    handle.seek(0)
    handle.truncate()
    handle.write(_owner_record() + "\n")
    handle.flush()
    return RunDirLock(folder, handle)


def _inside(path: Path, folder: Path) -> bool:
    return path.resolve().is_relative_to(folder.resolve())


def claim_run_dir(
    path: str | os.PathLike[str],
    *,
    resume: str | os.PathLike[str] | None = None,
    overwrite: bool = False,
    inputs: Mapping[str, str | os.PathLike[str] | None] | None = None,
) -> RunDirLock:
    """Lock ``path`` for one training run.

    A folder that holds another run's files (metrics, checkpoints) is refused unless
    ``resume`` names a checkpoint inside it (the same run goes on) or ``overwrite`` is set
    (its run files are deleted once the lock is held; other files stay). ``inputs``
    (option -> path): a run file that is or holds one of them is never deleted."""
    folder = writable_dir(path, "--out")
    held = lock_run_dir(folder)
    try:
        found = run_contents(folder)
        if found and not (resume is not None and _inside(Path(resume), folder)):
            if not overwrite:
                raise ConfigError(_refusal(folder, found, resume))
            _keep_inputs(folder, found, inputs or {})
            for name in found:
                target = folder / name
                if target.is_dir():
                    shutil.rmtree(target)
                else:
                    target.unlink()
    except BaseException:
        held.release()
        raise
    return held


def _keep_inputs(
    folder: Path, found: list[str], inputs: Mapping[str, str | os.PathLike[str] | None]
) -> None:
    """An OutputError when --overwrite would delete an input of this run."""
    for name in found:
        target = (folder / name).resolve()
        for option, given in inputs.items():
            if given is None:
                continue
            source = Path(given).resolve()
            if source == target or target in source.parents:
                raise OutputError(
                    f"--overwrite would delete {folder / name}, which holds the input given to "
                    f"{option} ({given}); move it out of {folder} or choose another --out."
                )


def _refusal(folder: Path, found: list[str], resume: str | os.PathLike[str] | None) -> str:
    """Why ``folder`` is refused, and what to run instead."""
    what = ", ".join(found)
    if resume is not None:
        hint = "--resume names another run"
    else:
        try:
            with warnings.catch_warnings():  # a damaged latest: the fallback is fine here
                warnings.simplefilter("ignore")
                find_checkpoint(folder)
        except CheckpointError:
            return (
                f"--out {folder} holds another run ({what}) with no checkpoint to resume: "
                f"{missing_checkpoint(folder)}; to replace it, --overwrite; or choose "
                "another --out."
            )
        hint = f"to continue it, --resume {folder}"
    return (
        f"--out {folder} holds another run ({what}); {hint}; to replace it, --overwrite; "
        "or choose another --out."
    )
