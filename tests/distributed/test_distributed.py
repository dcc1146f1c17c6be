"""Several processes on loopback through ``polytrain launch``, for every backend.

Each backend's own engine (torchrun + gloo, paddle.distributed.launch + gloo, MXNet's
ps-lite dist_sync): 2 processes x 1 CPU device match one process on the full batch, the
trainer logs and checkpoints on rank 0 only, a killed worker stops the whole job within
60 s without losing the last checkpoint, and set-up mistakes give one clear line.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from launch_helpers import (
    POLYTRAIN,
    clean_env,
    launch_command,
    launchable_backends,
    load_npz,
    log_text,
    max_param_diff,
    output_of,
    reference_params,
    steps_command,
)
from polytrain_paddle._launcher import PaddleLauncher
from polytrain_torch._launcher import TorchrunLauncher

from polytrain.distributed.cluster import resolve
from polytrain.distributed.launcher import LaunchSpec
from polytrain.distributed.network import free_port, interface_of
from polytrain.distributed.worker_log import read_statuses
from polytrain.errors import ClusterError
from polytrain.io.checkpoint import CheckpointManager, load_checkpoint
from polytrain.plugins.registry import cluster_environments
from polytrain.testing import backends_under_test

pytestmark = pytest.mark.slow

PARITY_ATOL = 1e-6
KILL_BOUND_SECONDS = 60.0


@pytest.fixture(scope="module", params=launchable_backends())
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _master() -> str:
    return f"127.0.0.1:{free_port()}"


def _run(cmd: list[str], timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cmd, env=clean_env(), capture_output=True, text=True, timeout=timeout, check=False
    )


def _train_command(backend: str, out: Path, *extra: str) -> list[str]:
    return ["polytrain", "train", "--backend", backend, "--out", str(out), *extra]


# -- parity --------------------------------------------------------------------------------


def test_two_processes_equal_one_process_on_the_full_batch(backend: str, tmp_path: Path) -> None:
    reference = reference_params(backend, tmp_path / "single")
    out, logs = tmp_path / "dist", tmp_path / "logs"
    out.mkdir()
    proc = _run(launch_command(backend, _master(), logs, steps_command(backend, out)))
    assert proc.returncode == 0, output_of(proc) + log_text(logs)
    rank0, rank1 = load_npz(out / "rank0.npz"), load_npz(out / "rank1.npz")
    diff = max_param_diff(reference, rank0)
    print(f"{backend}: 2 processes vs 1 on the full batch, max |diff| {diff:.2e}")
    assert diff <= PARITY_ATOL
    assert max_param_diff(rank0, rank1) == 0.0  # the replicas are identical
    assert {"workerlog.0", "workerlog.1"} <= {p.name for p in logs.iterdir()}


def test_two_processes_in_fp64_equal_one_process_to_1e_12(backend: str, tmp_path: Path) -> None:
    """The parity mode across processes: float64 gradients go through each engine exactly
    (MXNet's servers add in float32, so float64 sums are gathered instead)."""
    reference = reference_params(backend, tmp_path / "single", precision="fp64")
    out, logs = tmp_path / "dist", tmp_path / "logs"
    out.mkdir()
    command = steps_command(backend, out, precision="fp64")
    proc = _run(launch_command(backend, _master(), logs, command))
    assert proc.returncode == 0, output_of(proc) + log_text(logs)
    rank0, rank1 = load_npz(out / "rank0.npz"), load_npz(out / "rank1.npz")
    assert rank0["conv1.weight"].dtype == np.float64
    diff = max_param_diff(reference, rank0)
    print(f"{backend} fp64: 2 processes vs 1 on the full batch, max |diff| {diff:.2e}")
    assert diff <= 1e-12
    assert max_param_diff(rank0, rank1) == 0.0


def test_srun_style_tasks_without_a_launcher(backend: str, tmp_path: Path) -> None:
    """What ``srun --ntasks=2 polytrain ...`` gives each task: SLURM variables only
    (polytrain.distributed.cluster reads them); torch and Paddle join through MASTER_ADDR/PORT."""
    if backend == "mxnet":
        pytest.skip("MXNet needs scheduler and server roles: srun runs polytrain launch per node")
    reference = reference_params(backend, tmp_path / "single")
    out = tmp_path / "dist"
    out.mkdir()
    slurm = {"SLURM_JOB_ID": "4242", "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_NUM_NODES": "1",
             "SLURM_STEP_TASKS_PER_NODE": "2", "SLURM_NODEID": "0",
             "SLURM_STEP_NODELIST": "localhost", "MASTER_PORT": str(free_port())}  # fmt: skip
    tasks = []
    for r in (0, 1):
        env = {**clean_env(), **slurm, "SLURM_PROCID": str(r), "SLURM_LOCALID": str(r)}
        cmd = [POLYTRAIN[0], *steps_command(backend, out)]
        with open(tmp_path / f"task{r}.log", "w") as log:  # a full pipe would block a task
            tasks.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT))
    codes = [task.wait(timeout=180) for task in tasks]
    assert codes == [0, 0], log_text(tmp_path)
    rank0, rank1 = load_npz(out / "rank0.npz"), load_npz(out / "rank1.npz")
    assert max_param_diff(reference, rank0) <= PARITY_ATOL
    assert max_param_diff(rank0, rank1) == 0.0


# -- the trainer on a slice --------------------------------------------------------------


def test_train_logs_and_checkpoints_on_rank_0_only(backend: str, tmp_path: Path) -> None:
    out, logs = tmp_path / "run", tmp_path / "logs"
    recipe = ["--train-samples", "256", "--test-samples", "100", "--batch-size", "64",
              "--epochs", "1", "--checkpoint-every", "2", "--optimizer", "momentum",
              "--lr", "0.05"]  # fmt: skip
    proc = _run(launch_command(backend, _master(), logs, _train_command(backend, out, *recipe)))
    assert proc.returncode == 0, output_of(proc) + log_text(logs)
    log0 = (logs / "workerlog.0").read_text(errors="replace")
    log1 = (logs / "workerlog.1").read_text(errors="replace")
    header = "global batch 64 (32/device) | momentum lr 0.05 constant"
    assert header in log0 and "x 2 process(es)" in log0, log0
    assert header not in log1 and "train loss" not in log1, log1  # rank 1 reports nothing
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    starts = [r for r in records if r["event"] == "start"]
    assert len(starts) == 1 and starts[0]["world_size"] == 2 and starts[0]["rank"] == 0
    assert sum(r["event"] == "step" for r in records) == 4  # 256 / 64, written once
    latest = CheckpointManager(out).latest()
    assert latest is not None
    checkpoint = load_checkpoint(latest)
    assert checkpoint.position["global_step"] == 4
    assert checkpoint.manifest["extra"]["world_size"] == 2


# -- faults --------------------------------------------------------------------------------


def _descendants(pid: int) -> dict[int, int]:
    """pid -> parent pid of every process below ``pid``."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    found: dict[int, int] = {}
    frontier = [pid]
    while frontier:
        parent = frontier.pop()
        for child, ppid in parents.items():
            if ppid == parent and child not in found:
                found[child] = ppid
                frontier.append(child)
    return found


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.decode(errors="replace").partition("=") for item in raw.split(b"\0") if item)
    return {k: v for k, _, v in pairs}


def _stdout(pid: int) -> Path | None:
    try:
        return Path(os.readlink(f"/proc/{pid}/fd/1"))
    except OSError:
        return None


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for its parent counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


@pytest.fixture
def launched() -> Iterator[list[subprocess.Popen[str]]]:
    """Launchers started by a test; whatever is left is killed afterwards."""
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _start(cmd: list[str], procs: list[subprocess.Popen[str]]) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        cmd, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    procs.append(proc)
    return proc


def test_killed_worker_stops_the_job_and_keeps_the_checkpoint(
    backend: str, tmp_path: Path, launched: list[subprocess.Popen[str]]
) -> None:
    out, logs = tmp_path / "run", tmp_path / "logs"
    train = _train_command(backend, out, "--batch-size", "32", "--test-samples", "100",
                           "--checkpoint-every", "5", "--quiet", "--timeout", "30")  # fmt: skip
    proc = _start(launch_command(backend, _master(), logs, train), launched)
    deadline = time.monotonic() + 180
    while not (out / "checkpoints" / "latest").exists():
        assert proc.poll() is None, "the job ended before its first checkpoint" + log_text(logs)
        assert time.monotonic() < deadline, "no checkpoint within 180 s" + log_text(logs)
        time.sleep(0.2)
    job = _descendants(proc.pid)
    # rank 1 writes workerlog.1 (MXNet's ranks come from ps-lite; its launcher renames the
    # log once it is known); torch and Paddle workers run inside
    # polytrain.distributed.worker_log, whose child is the worker to kill, not the wrapper
    rank1 = [pid for pid in job if _stdout(pid) == logs / "workerlog.1"]
    victim = next((pid for pid in rank1 if job[pid] in rank1), rank1[0])
    os.kill(victim, signal.SIGKILL)
    killed = time.monotonic()
    try:
        _, stderr = proc.communicate(timeout=KILL_BOUND_SECONDS)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the launcher still runs {KILL_BOUND_SECONDS} s after the kill")
    while any(_alive(pid) for pid in job) and time.monotonic() - killed < KILL_BOUND_SECONDS:
        time.sleep(0.2)
    elapsed = time.monotonic() - killed
    named = [ln for ln in stderr.splitlines() if f"pid {victim}" in ln]
    print(f"{backend}: every process of the job gone {elapsed:.1f} s after kill -9 of rank 1;")
    print("\n".join(named))
    assert not [pid for pid in job if _alive(pid)], "processes survived the bound"
    assert proc.returncode != 0
    assert re.search(rf"worker rank 1 \(pid {victim}\)", stderr), stderr
    latest = CheckpointManager(out).latest()
    assert latest is not None
    assert load_checkpoint(latest).position["global_step"] >= 5


# -- set-up errors: one readable line ----------------------------------------------------


def _one_error_line(stderr: str, *needles: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.startswith("polytrain launch: error:")]
    assert len(lines) == 1, stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def test_port_in_use_on_the_master(backend: str, tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        master = f"127.0.0.1:{busy.getsockname()[1]}"
        proc = _run(launch_command(backend, master, tmp_path, ["polytrain", "env"]), timeout=60)
    assert proc.returncode == 2, output_of(proc)
    _one_error_line(proc.stderr, "already in use", "--master 127.0.0.1:")


def test_unreachable_master(backend: str, tmp_path: Path) -> None:
    master = f"127.0.0.2:{free_port()}"  # on loopback, nobody listens (and not "local" to paddle)
    cmd = launch_command(backend, master, tmp_path, _train_command(backend, tmp_path / "run"),
                         nnodes=2, node_rank=1, timeout=5)  # fmt: skip
    start = time.monotonic()
    proc = _run(cmd, timeout=90)
    assert proc.returncode == 2, output_of(proc)
    _one_error_line(proc.stderr, master, "connection refused")
    assert time.monotonic() - start < 60


def test_mismatched_world_sizes(
    backend: str, tmp_path: Path, launched: list[subprocess.Popen[str]]
) -> None:
    master = _master()
    train = ["--train-samples", "128", "--test-samples", "50", "--batch-size", "32",
             "--epochs", "1", "--quiet", "--timeout", "8"]  # fmt: skip
    nodes = [
        _start(launch_command(backend, master, tmp_path / f"logs{rank}",
                              _train_command(backend, tmp_path / f"run{rank}", *train),
                              nproc=1, nnodes=nnodes, node_rank=rank, timeout=8),
               launched)
        for rank, nnodes in ((0, 2), (1, 3))
    ]  # fmt: skip
    outputs = []
    for node in nodes:
        stdout, stderr = node.communicate(timeout=90)
        outputs.append(stdout + stderr)
        assert node.returncode != 0, stdout + stderr
    text = "\n".join(outputs)
    assert re.search(r"[Mm]ismatched world sizes|same --nnodes", text), text


def test_launch_needs_a_command(tmp_path: Path) -> None:
    proc = _run([*POLYTRAIN, "launch", "--backend", "torch"], timeout=60)
    assert proc.returncode == 2
    _one_error_line(proc.stderr, "after '--'")


# -- the pieces, without processes ---------------------------------------------------------


def test_engine_commands(tmp_path: Path) -> None:
    spec = LaunchSpec("paddle", ["polytrain", "train"], nproc_per_node=2, nnodes=2, node_rank=1,
                      master="10.0.0.1:6170", log_dir="logs")  # fmt: skip
    paddle = PaddleLauncher().command(spec, tmp_path, "10.0.0.2")
    assert "--devices" not in paddle  # Paddle's launcher fails with it on CPU
    assert paddle[paddle.index("--max_restart") + 1] == "0"  # a dead worker fails the job
    assert paddle[paddle.index("--host") + 1] == "10.0.0.2"
    assert paddle[paddle.index("--master") + 1] == "10.0.0.1:6170"
    assert paddle[paddle.index("--rank-var") + 1] == "PADDLE_TRAINER_ID"  # for worker_log
    torch = TorchrunLauncher().command(LaunchSpec("torch", ["x.py"], nproc_per_node=2), tmp_path,
                                       "127.0.0.1")  # fmt: skip
    assert torch[torch.index("--max-restarts") + 1] == "0"
    assert "polytrain.distributed.worker_log" in torch and "--status-dir" in torch
    assert torch[torch.index("--rank-var") + 1] == "RANK"


def test_loopback_interface() -> None:
    assert interface_of("127.0.0.1") == "lo"
    assert interface_of("192.0.2.254") is None  # TEST-NET-1: no interface here has it


def test_a_job_of_another_size_than_launched_is_an_error() -> None:
    env = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "29500",
           "POLYTRAIN_LAUNCH_WORLD_SIZE": "3"}  # fmt: skip
    environments = cluster_environments()
    with pytest.raises(ClusterError, match=r"Mismatched world sizes.*asked for 3.*of 2"):
        resolve(env, environments=environments)
    same = {**env, "POLYTRAIN_LAUNCH_WORLD_SIZE": "2"}
    assert resolve(same, environments=environments).world_size == 2


@pytest.mark.parametrize("code", ["raise SystemExit(3)", "import os; os.kill(os.getpid(), 9)"])
def test_worker_wrapper_records_how_the_worker_ended(code: str, tmp_path: Path) -> None:
    env = {**clean_env(), "RANK": "4"}
    python = POLYTRAIN[0]
    wrapped = [python, "-m", "polytrain.distributed.worker_log", "--rank-var", "RANK",
               "--status-dir", str(tmp_path), "--log-dir", str(tmp_path),
               "--", python, "-c", f"print('hi'); {code}"]  # fmt: skip
    proc = subprocess.run(wrapped, env=env, capture_output=True, text=True, check=False)
    expected = 3 if "SystemExit" in code else -9
    assert proc.returncode == expected  # the wrapper ends as its worker did
    (record,) = read_statuses(tmp_path)
    assert record["rank"] == 4 and record["code"] == expected
    assert (tmp_path / "workerlog.4").read_text() == "hi\n"


def test_exact_host_sums_survive_float32_servers() -> None:
    if "mxnet" not in backends_under_test():
        pytest.skip("mxnet is not among the backends under test")
    from polytrain_mxnet._parallel import _split3

    values = np.array([0.1, 2.0**30 + 1.0, -1e-20, 123456.789012345, 0.0, 60000.0])
    parts = _split3(values)
    assert parts.dtype == np.float32
    assert np.array_equal(parts.astype(np.float64).sum(axis=0), values)
