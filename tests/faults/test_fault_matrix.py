"""The fault matrix: each command (train, compare, convert) under each fault (disk full,
read-only output, concurrent run, SIGTERM, SIGKILL, bad value), one test per cell.

Every cell checks three things: the one line the user reads (a stable fragment), the exit
status (2: a user error; 143 = 128 + SIGTERM; -9: SIGKILL as the parent sees it) and the
files afterwards (the last checkpoint loads, no partial output, the original untouched,
no temporary files where the design promises none, the lock released for the next run).
docs/reliability.md ("The fault matrix") lists what each cell guarantees.

Cells that are decided before any backend is imported run once (on numpy); cells whose
outcome goes through a framework (training under SIGTERM, a full disk mid-run) run on
every backend under test. Signal cells run real ``python -m polytrain`` processes.
"""

from __future__ import annotations

import contextlib
import csv
import fcntl
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from convert_helpers import assert_same, random_params
from marks import xfail_known_jaxlib_abort
from test_run_dir import mounted_tmpfs

from polytrain.cli.main import main
from polytrain.io.checkpoint import CheckpointManager, load_checkpoint, save_checkpoint
from polytrain.io.convert import read_weights
from polytrain.io.run_dir import LOCK_FILE
from polytrain.neutral.models import get_model_spec
from polytrain.testing import backends_under_test
from polytrain.training.builtin_plugins import read_metrics

TINY = ["--train-samples", "64", "--test-samples", "32", "--batch-size", "32", "--epochs",
        "1", "--quiet"]  # fmt: skip
LONG_STEPS = 1000  # a signal sent after the first step lands mid-run, even on a fast backend
LONG = ["--train-samples", str(32 * LONG_STEPS), "--test-samples", "32", "--batch-size", "32",
        "--epochs", "1", "--quiet"]  # fmt: skip
COMPARE = ["compare", "--backends", "numpy", "--parity-steps", "1", "--quiet"]
FRAMEWORKS = ("torch", "paddle", "mxnet")
SIGTERM_EXIT = 128 + signal.SIGTERM


# -- helpers ------------------------------------------------------------------------------


def polytrain(*args: str | Path) -> subprocess.Popen[str]:
    """``python -m polytrain ARGS`` as a real process (stderr captured)."""
    cmd = [sys.executable, "-m", "polytrain", *map(str, args)]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen[str], timeout: float = 120) -> str:
    """Wait for ``proc``; its stderr."""
    _, err = proc.communicate(timeout=timeout)
    return err


def one_line(err: str, command: str) -> str:
    """The single ``polytrain COMMAND: ...`` line of ``err`` (frameworks may log others)."""
    lines = [line for line in err.splitlines() if line.startswith(f"polytrain {command}")]
    assert len(lines) == 1, err
    return lines[0]


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def steps_logged(out: Path) -> int:
    metrics = out / "metrics.jsonl"
    return metrics.read_text().count('"event": "step"') if metrics.exists() else 0


def tensorboard_purges(folder: Path) -> list[int]:
    """The steps from which TensorBoard drops earlier events: its event files' session
    starts (a TFRecord: length, its CRC, the ``Event``, its CRC)."""
    from tensorboardX.proto.event_pb2 import Event, SessionLog

    purges = []
    for path in sorted(folder.glob("events.out.tfevents.*")):
        data = path.read_bytes()
        while data:
            (length,) = struct.unpack("<Q", data[:8])
            event = Event.FromString(data[12 : 12 + length])
            data = data[16 + length :]
            if event.HasField("session_log") and event.session_log.status == SessionLog.START:
                purges.append(event.step)
    return purges


def lock_is_free(folder: Path) -> bool:
    """Could a new run take ``folder``'s lock now?"""
    lock = folder / LOCK_FILE
    if not lock.exists():
        return True
    with open(lock) as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False
    return True


def lock_owner(folder: Path) -> int:
    """The pid recorded in ``folder``'s lock file."""
    return int(json.loads((folder / LOCK_FILE).read_text())["pid"])


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "zombie" not in _state(pid)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split("\n")[0]
    except (OSError, IndexError):
        return "zombie"


def leftovers(folder: Path) -> list[str]:
    """Temporary files and folders of interrupted writes (atomic_path, checkpoints)."""
    if not folder.exists():
        return []
    return sorted(
        str(p.relative_to(folder))
        for p in folder.rglob(".*")
        if p.name.endswith((".tmp", ".old", ".trash")) or ".tmp-" in p.name
    )


def imported_frameworks(args: list[str]) -> tuple[int, str, list[str]]:
    """Run ``polytrain ARGS`` in a fresh interpreter: exit code, stderr and the frameworks it
    imported (a refusal made before any work imports none)."""
    code = (
        "import sys; from polytrain.cli.main import main\n"
        "try:\n    code = main(sys.argv[1:])\nexcept SystemExit as exc:  # argparse\n"
        "    code = exc.code\n"
        f"print([m for m in {FRAMEWORKS!r} if m in sys.modules]); sys.exit(code)"
    )
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          check=False)  # fmt: skip
    return done.returncode, done.stderr, eval(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def lenet_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    spec = get_model_spec("lenet")
    path = tmp_path_factory.mktemp("sources") / "lenet"
    save_checkpoint(path, params=random_params(spec), spec=spec)
    return path


@pytest.fixture(scope="module")
def resnet_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """45 MB of weights: converting it takes long enough to be interrupted mid-write."""
    spec = get_model_spec("resnet18")
    path = tmp_path_factory.mktemp("sources") / "resnet18"
    save_checkpoint(path, params=random_params(spec), spec=spec)
    return path


@pytest.fixture
def original(tmp_path: Path) -> Iterator[Path]:
    """An output file that exists before the conversion (it must survive a failed one)."""
    path = tmp_path / "out" / "model.pt"
    path.parent.mkdir()
    path.write_bytes(b"the original model")
    yield path


# -- train --------------------------------------------------------------------------------


@pytest.mark.slow
def test_train_disk_full(
    backend_name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with mounted_tmpfs(tmp_path / "small", "size=1400k") as small:
        out = small / "run"  # a LeNet checkpoint with momentum takes ~500 kB (Adam's: 1.5 MB)
        code = main(["train", "--backend", backend_name, *TINY, "--epochs", "4", "--out", str(out),
                     "--checkpoint-every", "1", "--keep-checkpoints", "3",
                     "--optimizer", "momentum", "--lr", "0.05"])  # fmt: skip
        line = one_line(capsys.readouterr().err, "train")
        assert code == 2, line
        assert "No space left on device" in line and "the last good checkpoint is " in line
        named = line.split("the last good checkpoint is ")[1].split(":")[0]
        assert load_checkpoint(named).position["global_step"] >= 1
        assert leftovers(out) == []
        assert lock_is_free(out)


def test_train_read_only_output(tmp_path: Path) -> None:
    with mounted_tmpfs(tmp_path / "ro", "ro,size=1m") as ro:
        code, err, imported = imported_frameworks(
            ["train", "--backend", "torch", *TINY, "--out", str(ro / "run")]
        )
        line = one_line(err, "train")
        assert code == 2, err
        assert "is not writable (Read-only file system)" in line
        assert imported == []  # refused before any backend was imported
        assert os.listdir(ro) == []


@pytest.mark.slow
def test_train_concurrent_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    first = polytrain("train", "--backend", "numpy", *LONG, "--out", out)
    try:
        wait_for(lambda: steps_logged(out) >= 1, "the first run's first step")
        code = main(["train", "--backend", "numpy", *TINY, "--out", str(out)])
        line = one_line(capsys.readouterr().err, "train")
        assert code == 2
        assert f"is in use by another run: pid {first.pid}" in line
    finally:
        first.send_signal(signal.SIGTERM)
        finish(first)
    assert first.returncode == SIGTERM_EXIT  # the first run was not disturbed
    assert lock_is_free(out)
    assert main(["train", "--backend", "numpy", *TINY, "--out", str(out), "--overwrite"]) == 0


@pytest.mark.slow
def test_train_sigterm(backend_name: str, tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = polytrain("train", "--backend", backend_name, *LONG, "--out", out)
    wait_for(lambda: steps_logged(out) >= 1, f"the first {backend_name} step")
    proc.send_signal(signal.SIGTERM)
    err = finish(proc)
    xfail_known_jaxlib_abort(backend_name, proc.returncode, err)
    line = one_line(err, "train")
    assert proc.returncode == SIGTERM_EXIT, line
    assert "interrupted by SIGTERM" in line and "; checkpoint " in line
    saved = load_checkpoint(line.split("; checkpoint ")[1].strip())
    assert 0 < saved.position["step"] < LONG_STEPS
    assert CheckpointManager(out).latest() == saved.path
    assert leftovers(out) == []
    assert lock_is_free(out)


@pytest.mark.slow
def test_train_sigkill(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    proc = polytrain("train", "--backend", "numpy", *LONG, "--train-samples", "3200",
                     "--checkpoint-every", "3", "--log", "csv,tensorboard",
                     "--out", out)  # fmt: skip
    wait_for(lambda: steps_logged(out) >= 10, "10 steps")
    proc.send_signal(signal.SIGKILL)
    finish(proc)
    assert proc.returncode == -signal.SIGKILL
    latest = CheckpointManager(out).latest()
    assert latest is not None and load_checkpoint(latest).position["global_step"] >= 3
    assert lock_is_free(out)  # the kernel dropped the dead run's lock
    resumed_at = load_checkpoint(latest).position["global_step"]
    code = main(["train", "--backend", "numpy", "--quiet", "--log", "csv,tensorboard",
                 "--resume", str(out)])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    assert leftovers(out) == []  # the resumed run cleaned what the kill left
    records = read_metrics(out / "metrics.jsonl")
    steps = [r["global_step"] for r in records if r["event"] == "step"]
    assert steps == list(range(1, 101))  # each step once: none lost to the kill, none twice
    with open(out / "steps.csv", newline="") as fh:
        assert [int(row["global_step"]) for row in csv.DictReader(fh)] == steps
    # TensorBoard hides the killed run's events from the first step redone on
    assert resumed_at + 1 in tensorboard_purges(out / "tensorboard")


def test_train_resume_goes_on_in_its_run_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--resume RUN`` without ``--out`` saves in RUN and cleans what a kill left there
    (a save in flight: ``.step-N.tmp-*``); it used to train and save nothing."""
    out = tmp_path / "run"
    assert main(["train", "--backend", "numpy", *TINY, "--out", str(out)]) == 0
    (out / "checkpoints" / ".step-00000003.tmp-killed").mkdir()
    code = main(["train", "--backend", "numpy", "--quiet", "--epochs", "2", "--resume", str(out)])
    assert code == 0, capsys.readouterr().err
    latest = CheckpointManager(out).latest()
    assert latest is not None and latest.name == "step-00000004"
    assert leftovers(out) == []


def test_train_bad_value(tmp_path: Path) -> None:
    out = tmp_path / "run"
    code, err, imported = imported_frameworks(
        ["train", "--backend", "torch", *TINY, "--threads", "100000", "--out", str(out)]
    )
    assert code == 2
    assert "argument --threads: must be an integer in 1.." in one_line(err, "train")
    assert imported == []
    assert not out.exists()


# -- compare ------------------------------------------------------------------------------


@pytest.mark.slow
def test_compare_disk_full(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with mounted_tmpfs(tmp_path / "small", "size=600k") as small:
        out = small / "cmp"
        code = main([*COMPARE, *TINY, "--epochs", "4", "--out", str(out)])
        line = one_line(capsys.readouterr().err, "compare")  # after the run's own line
        assert code == 2, line
        assert "The numpy run could not write its files" in line
        assert not (out / "comparison.json").exists()
        assert leftovers(out) == []
        assert lock_is_free(out) and lock_is_free(out / "numpy")


def test_compare_read_only_output(tmp_path: Path) -> None:
    with mounted_tmpfs(tmp_path / "ro", "ro,size=1m") as ro:
        code, err, imported = imported_frameworks(
            [*COMPARE, "--backends", "torch,paddle", *TINY, "--out", str(ro / "cmp")]
        )
        assert code == 2, err
        assert "is not writable (Read-only file system)" in one_line(err, "compare")
        assert imported == []
        assert os.listdir(ro) == []


@pytest.mark.slow
def test_compare_concurrent_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cmp"
    first = polytrain(*COMPARE, *LONG, "--train-samples", "1600", "--out", out)
    try:
        wait_for(lambda: steps_logged(out / "numpy") >= 1, "the first comparison's run")
        code = main([*COMPARE, *TINY, "--out", str(out)])
        line = one_line(capsys.readouterr().err, "compare")
        assert code == 2
        assert f"is in use by another run: pid {first.pid}" in line
    finally:
        finish(first)
    assert first.returncode == 0  # the first comparison was not disturbed
    assert (out / "comparison.json").exists()
    assert lock_is_free(out)


def _compare_mid_run(out: Path) -> tuple[subprocess.Popen[str], int]:
    """A comparison whose numpy run is training; its pid and the run's."""
    proc = polytrain(*COMPARE, *LONG, "--out", out)
    wait_for(lambda: steps_logged(out / "numpy") >= 1, "the comparison's run")
    return proc, lock_owner(out / "numpy")


@pytest.mark.slow
def test_compare_sigterm(tmp_path: Path) -> None:
    out = tmp_path / "cmp"
    proc, child = _compare_mid_run(out)
    proc.send_signal(signal.SIGTERM)
    line = one_line(finish(proc), "compare")
    assert proc.returncode == SIGTERM_EXIT, line
    assert "interrupted by SIGTERM" in line
    assert not alive(child)  # the backend run ended with it ...
    latest = CheckpointManager(out / "numpy").latest()  # ... after saving its checkpoint
    assert latest is not None and 0 < load_checkpoint(latest).position["step"] < LONG_STEPS
    assert not (out / "comparison.json").exists()
    assert leftovers(out) == []
    assert lock_is_free(out) and lock_is_free(out / "numpy")


@pytest.mark.slow
def test_compare_sigkill(tmp_path: Path) -> None:
    out = tmp_path / "cmp"
    proc, child = _compare_mid_run(out)
    proc.send_signal(signal.SIGKILL)
    finish(proc)
    assert proc.returncode == -signal.SIGKILL
    wait_for(lambda: not alive(child), "the orphaned backend run to end", timeout=60)
    latest = CheckpointManager(out / "numpy").latest()  # it was told to stop, and saved
    assert latest is not None and 0 < load_checkpoint(latest).position["step"] < LONG_STEPS
    assert not (out / "comparison.json").exists()
    assert leftovers(out) == []
    assert lock_is_free(out) and lock_is_free(out / "numpy")


def test_compare_bad_value(tmp_path: Path) -> None:
    out = tmp_path / "cmp"
    code, err, imported = imported_frameworks(
        [*COMPARE, "--backends", "torch,paddle", "--parity-steps", "-5", "--out", str(out)]
    )
    assert code == 2
    assert "argument --parity-steps: must be an integer >= 1" in one_line(err, "compare")
    assert imported == []
    assert not out.exists()


# -- convert ------------------------------------------------------------------------------


def test_convert_disk_full(
    tmp_path: Path, lenet_checkpoint: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with mounted_tmpfs(tmp_path / "small", "size=64k") as small:
        (small / "model.pt").write_bytes(b"the original model")
        code = main(["convert", str(lenet_checkpoint), str(small / "model.pt"), "--to", "torch"])
        line = one_line(capsys.readouterr().err, "convert")
        assert code == 2, line
        assert f"Cannot write {small / 'model.pt'}: No space left on device" in line
        assert (small / "model.pt").read_bytes() == b"the original model"
        assert os.listdir(small) == ["model.pt"]  # no temporary file left


def test_convert_read_only_output(
    tmp_path: Path, lenet_checkpoint: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with mounted_tmpfs(tmp_path / "ro", "size=1m") as ro:
        (ro / "model.pt").write_bytes(b"the original model")
        subprocess.run(["mount", "-o", "remount,ro", str(ro)], check=True)
        code = main(["convert", str(lenet_checkpoint), str(ro / "model.pt"), "--to", "torch"])
        line = one_line(capsys.readouterr().err, "convert")
        assert code == 2, line
        assert f"Cannot write {ro / 'model.pt'}: Read-only file system" in line
        assert (ro / "model.pt").read_bytes() == b"the original model"
        assert os.listdir(ro) == ["model.pt"]


@pytest.mark.slow
def test_convert_concurrent_run(tmp_path: Path, resnet_checkpoint: Path, original: Path) -> None:
    first = _convert_mid_write(resnet_checkpoint, original)
    second = polytrain("convert", resnet_checkpoint, original, "--to", "torch")
    procs = [first, second]
    errs = [finish(p) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errs
    assert_same(read_weights(original).params, load_checkpoint(resnet_checkpoint).params)
    assert os.listdir(original.parent) == ["model.pt"]  # one whole file, no temporary one


def writing_into(pid: int, folder: Path) -> bool:
    """Has process ``pid`` a file in ``folder`` open (a named or an unnamed temporary)?"""
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(f"{folder}/"):
                    return True
    return False


def _convert_mid_write(source: Path, target: Path) -> subprocess.Popen[str]:
    """A conversion caught while it writes its output."""
    proc = polytrain("convert", source, target, "--to", "torch")
    wait_for(lambda: writing_into(proc.pid, target.parent), "the write", timeout=60)
    return proc


def _old_or_whole_new(target: Path, source: Path) -> None:
    """``target`` is the original file, or (a signal after the rename) the whole new one."""
    if target.read_bytes() != b"the original model":
        assert_same(read_weights(target).params, load_checkpoint(source).params)


@pytest.mark.slow
def test_convert_sigterm(resnet_checkpoint: Path, original: Path) -> None:
    proc = _convert_mid_write(resnet_checkpoint, original)
    proc.send_signal(signal.SIGTERM)
    line = one_line(finish(proc), "convert")
    assert proc.returncode == SIGTERM_EXIT, line
    assert "interrupted by SIGTERM" in line
    _old_or_whole_new(original, resnet_checkpoint)
    assert os.listdir(original.parent) == ["model.pt"]


@pytest.mark.slow
def test_convert_sigkill(resnet_checkpoint: Path, original: Path) -> None:
    proc = _convert_mid_write(resnet_checkpoint, original)
    proc.send_signal(signal.SIGKILL)
    finish(proc)
    assert proc.returncode == -signal.SIGKILL
    _old_or_whole_new(original, resnet_checkpoint)
    assert os.listdir(original.parent) == ["model.pt"]


def test_convert_bad_value(tmp_path: Path, lenet_checkpoint: Path) -> None:
    out = tmp_path / "model.pt"
    code, err, imported = imported_frameworks(
        ["convert", str(lenet_checkpoint), str(out), "--to", "torch", "--dtype", "float16"]
    )
    assert code == 2
    assert "argument --dtype: invalid choice: 'float16'" in one_line(err, "convert")
    assert imported == []
    assert not out.exists()


# -- launch ---------------------------------------------------------------------------------
# SIGTERM, SIGKILL, the hung peer (a frozen rank named by the watchdog) and a missing worker
# command run on every engine in tests/distributed/test_launch_signals.py; a bad count
# (--nproc-per-node 0, --node-rank past --nnodes) in tests/cli/test_flag_ranges.py. The cells
# below are the rest.

ENGINES = [e for e in FRAMEWORKS if e in backends_under_test()]


def listening(port: int) -> bool:
    with contextlib.closing(socket.socket()) as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


PRINTS = [sys.executable, "-c", "print('x' * 100000)"]  # more than the full disk takes


@pytest.mark.slow
@pytest.mark.parametrize("engine", ENGINES)
def test_launch_disk_full(engine: str, tmp_path: Path) -> None:
    with mounted_tmpfs(tmp_path / "small", "size=64k") as small:
        (small / "fill").write_bytes(b"\0" * 64 * 1024)  # nothing left for the logs
        proc = polytrain("launch", "--backend", engine, "--nproc-per-node", "2",
                         "--log-dir", small / "logs", "--", *PRINTS)  # fmt: skip
        err = finish(proc)
        assert proc.returncode == 1, err  # the workers failed: the engine's code
        last = [line for line in err.splitlines() if line.startswith("polytrain launch")][-1]
        assert f"--log-dir {small / 'logs'} is full (no space left)" in last, err
        assert err.rstrip().endswith(last)  # the last word (torchrun prints its report before)


def test_launch_read_only_log_dir(tmp_path: Path) -> None:
    with mounted_tmpfs(tmp_path / "ro", "ro,size=64k") as ro:
        code, err, imported = imported_frameworks(
            ["launch", "--backend", "torch", "--log-dir", str(ro / "logs"), "--", "true"]
        )
    assert code == 2
    assert f"--log-dir {ro / 'logs'} is not writable (Read-only file system)" in one_line(
        err, "launch"
    )
    assert imported == []  # refused before any engine starts


@pytest.mark.slow
@pytest.mark.parametrize("engine", ENGINES)
def test_launch_concurrent_run(engine: str, tmp_path: Path) -> None:
    master = "127.0.0.1:29631"
    logs = ["--log-dir", str(tmp_path / "logs")]  # Paddle's default is ./log
    first = polytrain("launch", "--backend", engine, "--master", master, *logs, "--", "sleep",
                      "10")  # fmt: skip
    try:
        if engine != "paddle":  # the first job's rendezvous listens (Paddle's: no port)
            wait_for(lambda: listening(29631), "the first job's rendezvous", timeout=60)
        time.sleep(1)
        second = polytrain("launch", "--backend", engine, "--master", master, "--log-dir",
                           tmp_path / "logs2", "--timeout", "30", "--", "true")  # fmt: skip
        err = finish(second)
        if engine == "paddle":  # one node: Paddle picks free ports itself, nothing shared
            assert second.returncode == 0, err
        else:
            assert second.returncode == 2, err
            assert "Port 29631 is already in use on this host" in one_line(err, "launch")
        assert first.poll() is None  # the running job was not disturbed
        finish(first)
        assert first.returncode == 0
    finally:
        if first.poll() is None:
            first.kill()
            first.communicate()
