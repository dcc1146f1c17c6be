"""Signals and process lifetime under ``polytrain launch``, on every engine that launches:
SIGTERM/SIGINT make every worker stop at the same step (rank 0 saves) and the launcher
exit 128 + signal; nothing outlives a SIGKILLed launcher; a frozen rank is named; a
missing worker command is one line. Real frameworks, 2 processes, tiny runs."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from launch_helpers import POLYTRAIN, clean_env, launch_command, launchable_backends, log_text

from polytrain.cli.main import main
from polytrain.distributed.network import free_port
from polytrain.io.checkpoint import CheckpointManager, load_checkpoint

BACKENDS = launchable_backends()
GONE_SECONDS = 20.0  # every process of the job must be gone this long after the launcher


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[str]]]:
    """Launchers a test started; whatever is left (of their session) is killed after."""
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for proc in procs:
        for pid in [proc.pid, *_descendants(proc.pid)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.wait()
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()


def _launch(
    backend: str, tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> subprocess.Popen[str]:
    """A 200-step run through ``polytrain launch``, returned once rank 0 logged a step."""
    out, logs = tmp_path / "run", tmp_path / "logs"
    train = ["polytrain", "train", "--backend", backend, "--out", str(out), "--quiet",
             "--train-samples", "6400", "--test-samples", "50", "--batch-size", "32",
             "--timeout", "20"]  # fmt: skip  # 8 s: jax's first compile at load 11 took longer
    cmd = launch_command(backend, f"127.0.0.1:{free_port()}", logs, train)
    proc = subprocess.Popen(cmd, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)  # fmt: skip
    procs.append(proc)
    metrics, deadline = out / "metrics.jsonl", time.monotonic() + 180
    while not (metrics.exists() and '"step"' in metrics.read_text()):
        assert proc.poll() is None, "the job ended before its first step" + log_text(logs)
        assert time.monotonic() < deadline, "no step within 180 s" + log_text(logs)
        time.sleep(0.2)
    return proc


def _descendants(pid: int) -> set[int]:
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parents[int(stat.parent.name)] = int(stat.read_text().rpartition(")")[2].split()[1])
        except (OSError, IndexError, ValueError):
            continue
    found: set[int] = set()
    frontier = [pid]
    while frontier:
        parent = frontier.pop()
        children = {c for c, p in parents.items() if p == parent} - found
        found |= children
        frontier += children
    return found


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _survivors(job: set[int], bound: float = GONE_SECONDS) -> list[str]:
    deadline = time.monotonic() + bound
    while any(_alive(pid) for pid in job) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [Path(f"/proc/{p}/cmdline").read_text(errors="replace") for p in job if _alive(p)]


def _worker(tmp_path: Path, rank: int, job: set[int]) -> int:
    """The pid of the training process of ``rank`` (not its wrapper): the process writing
    workerlog.<rank> whose parent does not."""
    log = tmp_path / "logs" / f"workerlog.{rank}"
    writers = set()
    for pid in job:
        try:
            if Path(os.readlink(f"/proc/{pid}/fd/1")) == log:
                writers.add(pid)
        except OSError:
            continue
    inner = [pid for pid in writers if _descendants(pid).isdisjoint(writers)]
    assert len(inner) == 1, (writers, inner)
    return inner[0]


#: jaxlib 0.4.30: a rank of a 2-process job aborts in glibc ("corrupted size vs. prev_size",
#: "corrupted double-linked list") after a SIGTERM, 4 times in 27 runs under load; not
#: found in polytrain's code (docs/distributed.md, "JAX"): recorded, not hidden
JAX_SIGTERM_ABORT = pytest.mark.xfail(
    strict=False, reason="jaxlib 0.4.30 aborts a rank after SIGTERM about 1 time in 7"
)


@pytest.mark.slow
@pytest.mark.parametrize(
    "backend", [pytest.param(b, marks=[JAX_SIGTERM_ABORT] if b == "jax" else []) for b in BACKENDS]
)
def test_sigterm_makes_every_worker_stop_and_save_and_the_launcher_exit_143(
    backend: str, tmp_path: Path, started: list[subprocess.Popen[str]]
) -> None:
    proc = _launch(backend, tmp_path, started)
    job = _descendants(proc.pid)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=90)
    logs = log_text(tmp_path / "logs")
    assert proc.returncode == 128 + signal.SIGTERM, stderr + logs
    assert "polytrain launch: stopped by SIGTERM;" in stderr, stderr
    for rank in (0, 1):  # each worker stopped on the signal, neither failed
        text = (tmp_path / "logs" / f"workerlog.{rank}").read_text(errors="replace")
        assert "polytrain train: interrupted by SIGTERM" in text, logs
        assert "Traceback" not in text, logs
    latest = CheckpointManager(tmp_path / "run").latest()
    assert latest is not None, logs
    assert load_checkpoint(latest).position["global_step"] >= 1
    assert _survivors(job) == []


@pytest.mark.slow
def test_sigint_stops_the_job_with_130(
    tmp_path: Path, started: list[subprocess.Popen[str]]
) -> None:
    # not jax while a signal can abort its ranks (JAX_SIGTERM_ABORT; SIGINT did too)
    proc = _launch(next((b for b in BACKENDS if b != "jax"), BACKENDS[0]), tmp_path, started)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=90)
    assert proc.returncode == 128 + signal.SIGINT, stderr + log_text(tmp_path / "logs")
    assert CheckpointManager(tmp_path / "run").latest() is not None


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_no_process_outlives_a_killed_launcher(
    backend: str, tmp_path: Path, started: list[subprocess.Popen[str]]
) -> None:
    proc = _launch(backend, tmp_path, started)
    job = _descendants(proc.pid)  # engine launcher, wrappers, workers; ps-lite's servers
    assert len(job) >= 2 + (backend == "mxnet") * 2, job
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert _survivors(job) == [], log_text(tmp_path / "logs")


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_frozen_rank_is_named_by_the_watchdog_and_the_launcher(
    backend: str, tmp_path: Path, started: list[subprocess.Popen[str]]
) -> None:
    proc = _launch(backend, tmp_path, started)
    job = _descendants(proc.pid)
    victim = _worker(tmp_path, 1, job)
    os.kill(victim, signal.SIGSTOP)  # a hung peer: alive, silent
    frozen = time.monotonic()
    _, stderr = proc.communicate(timeout=90)
    logs = log_text(tmp_path / "logs")
    print(f"{backend}: launcher ended {time.monotonic() - frozen:.1f} s after SIGSTOP of rank 1")
    assert proc.returncode != 0
    named = f"rank 1 (pid {victim}) stopped responding"
    assert "worker rank 0 " in stderr and f"after {named}" in stderr, stderr + logs
    log0 = (tmp_path / "logs" / "workerlog.0").read_text(errors="replace")
    assert "polytrain: no training progress" in log0 and named in log0, logs
    assert "Timed out" not in log0 and "TIMEOUT" not in log0, logs  # not gloo's raw error
    assert _survivors(job) == []


DIE_AT_THE_END = """
import os
import polytrain

class DieAtTheEnd:
    @polytrain.hookimpl
    def polytrain_train_end(self, run, summary):
        if run.rank == 1:  # a peer lost after its last step, before the exit barrier
            os._exit(3)
"""


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_peer_that_dies_at_the_end_does_not_hold_the_others(
    backend: str, tmp_path: Path, started: list[subprocess.Popen[str]]
) -> None:
    """jax's shutdown waits for every peer (100 s, until its heartbeats time out),
    ps-lite's exit barrier for ever: rank 0 leaves within its --timeout, under the
    watchdog."""
    (tmp_path / "die_at_the_end.py").write_text(DIE_AT_THE_END)
    timeout, logs = 20, tmp_path / "logs"  # jax's first compile under a loaded suite: > 8 s
    train = ["polytrain", "train", "--backend", backend, "--out", str(tmp_path / "run"),
             "--quiet", "--train-samples", "640", "--test-samples", "50", "--batch-size",
             "32", "--timeout", str(timeout), "--plugin", "die_at_the_end:DieAtTheEnd"]  # fmt: skip
    env = {**clean_env(), "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    cmd = launch_command(backend, f"127.0.0.1:{free_port()}", logs, train)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)  # fmt: skip
    started.append(proc)
    begun = time.monotonic()
    _, stderr = proc.communicate(timeout=300)
    seconds, logs_text = time.monotonic() - begun, log_text(logs)
    assert proc.returncode != 0 and "rank 1" in stderr, stderr + logs_text
    assert "Traceback" not in (logs / "workerlog.0").read_text(errors="replace"), logs_text
    # the run itself takes 5-40 s; jax's own bound (its heartbeats) is 100 s after it
    assert seconds < 50 + 2 * timeout, f"{seconds:.0f} s\n{stderr}{logs_text}"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("command", [["no-such-cmd"], ["./no-such-cmd"], ["python", "nope.py"]])
def test_a_missing_worker_command_is_one_line(
    backend: str, command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["launch", "--backend", backend, "--nproc-per-node", "2", "--master",
                 f"127.0.0.1:{free_port()}", "--", *command])  # fmt: skip
    (line,) = capsys.readouterr().err.splitlines()
    assert code == 2
    assert line.startswith("polytrain launch: error: The worker "), line
    assert command[-1] in line, line


def test_a_missing_worker_command_starts_nothing(tmp_path: Path) -> None:
    """Through the real CLI: no engine launcher runs, no traceback."""
    cmd = [*POLYTRAIN, "launch", "--backend", BACKENDS[-1], "--nproc-per-node", "2",
           "--log-dir", str(tmp_path), "--", "no-such-cmd"]  # fmt: skip
    proc = subprocess.run(cmd, env=clean_env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert not any(tmp_path.iterdir())  # no log: nothing was started
