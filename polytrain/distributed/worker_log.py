"""The wrapper ``polytrain launch`` puts around each worker an engine's launcher starts.

``python -m polytrain.distributed.worker_log --rank-var VAR [--log-dir DIR] [--status-dir DIR]
-- CMD...`` runs the command as a child; the worker's rank is read from the variable
``VAR``, which the engine's launcher sets (the plugin's launcher names it):

* its output goes to ``DIR/workerlog.<rank>`` (as Paddle's launcher does) when a log
  directory is given;
* SIGTERM/SIGINT/SIGHUP are passed on, once: the child runs in a process group of its
  own, so the engine's launcher signalling the wrapper's group does not signal it twice
  (a second SIGTERM would end a worker before it saved). The child dies with the wrapper,
  and the wrapper gets SIGTERM when the engine's launcher dies (Linux
  ``PR_SET_PDEATHSIG``), so no worker outlives its launchers;
* a stop polytrain launch asked for (it writes ``STATUS_DIR/stop`` before signalling) that
  the child obeyed (it ended by that signal or with 128 + it) makes the wrapper exit 0:
  the engine's launcher then ends quietly, and ``polytrain launch`` exits 128 + signal;
* when the child ends, ``STATUS_DIR/rank<R>.json`` records how and when: after a failure
  the launcher names the worker that died *first* (the engines' own reports may name a
  peer that failed a few milliseconds later because its collective broke);
* the wrapper ends the same way (same exit code, or the same signal).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
USAGE = "usage: worker_log --rank-var VAR [--log-dir DIR] [--status-dir DIR] -- CMD [ARGS...]"


def rank_from_env(variable: str) -> int:
    """The worker's rank, from the variable its engine's launcher sets."""
    value = os.environ.get(variable, "").strip()
    if not value.isdigit():
        shown = "is not set" if variable not in os.environ else f"is {value!r}, not a rank"
        sys.exit(
            f"polytrain worker_log: {variable} {shown}; the engine's launcher sets it for "
            "every worker: run this through polytrain launch."
        )
    return int(value)


STOP_FILE = "stop"  # in the status directory: the signal polytrain launch stops with


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Linux: this process gets ``sig`` when its parent ends (``PR_SET_PDEATHSIG``); as a
    ``preexec_fn`` it applies to the child being started. Elsewhere nothing happens."""
    if sys.platform != "linux":
        return
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(1, sig)  # PR_SET_PDEATHSIG


def _child_setup() -> None:  # runs in the child between fork and exec
    os.setpgid(0, 0)
    die_with_parent(signal.SIGKILL)


def full_log_dir(log_dir: str | os.PathLike[str] | None) -> str:
    """Why worker logs may have swallowed a failure: the ``--log-dir`` is full ('' if not)."""
    if log_dir is None:
        return ""
    try:
        free = os.statvfs(log_dir).f_bavail
    except OSError:
        return ""
    if free:
        return ""
    return f"--log-dir {log_dir} is full (no space left); free space or choose another --log-dir"


def log_trouble(log_dir: Path | None, rank: int) -> str:
    """Why a failed worker's log may have swallowed its error: its folder is full."""
    full = full_log_dir(log_dir)
    return f"its log workerlog.{rank} could not be written: {full}" if full else ""


def requested_stop(status_dir: Path | None) -> int:
    """The signal ``polytrain launch`` asked the workers to stop with (0: none)."""
    try:
        return int((status_dir / STOP_FILE).read_text()) if status_dir else 0
    except (OSError, ValueError):
        return 0


def obeyed(code: int, sig: int) -> bool:
    """Did a process that was asked to stop with ``sig`` end because of it?"""
    return sig > 0 and code in (-sig, 128 + sig)


def _parse(argv: list[str]) -> tuple[Path | None, Path | None, str, list[str]]:
    """``--log-dir``, ``--status-dir``, ``--rank-var`` and the command after ``--``."""
    log_dir = status_dir = rank_var = None
    while argv and argv[0] != "--":
        flag, value, argv = argv[0], argv[1] if len(argv) > 1 else "", argv[2:]
        if flag == "--log-dir":
            log_dir = Path(value)
        elif flag == "--status-dir":
            status_dir = Path(value)
        elif flag == "--rank-var":
            rank_var = value
        else:
            sys.exit(f"{USAGE}; got {flag}")
    cmd = argv[1:]
    if not cmd or not rank_var:
        sys.exit(USAGE)
    return log_dir, status_dir, rank_var, cmd


def _write_status(
    status_dir: Path, rank: int, pid: int, code: int, ended: float, reason: str
) -> None:
    """``rank<N>.json`` in ``status_dir``: how the worker ended (written whole)."""
    record: dict[str, float | str] = {"rank": rank, "pid": pid, "code": code, "time": ended}
    if reason:
        record["reason"] = reason
    tmp = status_dir / f".rank{rank}.json.tmp"
    tmp.write_text(json.dumps(record))
    tmp.replace(status_dir / f"rank{rank}.json")


def main(argv: list[str]) -> int:
    log_dir, status_dir, rank_var, cmd = _parse(argv)
    rank = rank_from_env(rank_var)
    parent = os.getppid()
    die_with_parent(signal.SIGTERM)  # forwarded below: the worker saves, then ends
    if os.getppid() != parent:  # the engine's launcher ended before that took effect
        return 128 + signal.SIGTERM
    output = None
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
        output = open(log_dir / f"workerlog.{rank}", "ab")  # noqa: SIM115 - closed at exit
    child = subprocess.Popen(
        cmd, stdout=output, stderr=subprocess.STDOUT if output else None,
        preexec_fn=_child_setup if sys.platform == "linux" else None,
    )  # fmt: skip

    def forward(signum: int, _frame: object) -> None:
        child.send_signal(signum)
        child.send_signal(signal.SIGCONT)  # a stopped (frozen) worker must see it too

    for sig in FORWARDED:
        signal.signal(sig, forward)
    while True:
        try:
            code = child.wait()
            break
        except InterruptedError:  # pragma: no cover - PEP 475 retries; kept for clarity
            continue
    ended = time.time()
    reason = log_trouble(log_dir, rank) if code != 0 else ""
    if reason:  # the log cannot hold the worker's own last words: say it here
        print(f"polytrain launch: worker rank {rank}: {reason}", file=sys.stderr, flush=True)
    if status_dir is not None:
        _write_status(status_dir, rank, child.pid, code, ended, reason)
    if output is not None:
        output.close()
    if obeyed(code, requested_stop(status_dir)):
        return 0  # the stop polytrain launch asked for, not a failure of the job
    if code < 0:  # end the same way, so the engine reports the signal
        for sig in FORWARDED:
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


def read_statuses(status_dir: Path) -> list[dict[str, Any]]:
    """The records of every worker of this node that has ended, earliest first."""
    records = []
    for path in status_dir.glob("rank*.json"):
        try:
            records.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return sorted(records, key=lambda r: r["time"])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
