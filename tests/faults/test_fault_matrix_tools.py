"""The fault matrix, second table: ``port``, ``port-code``, ``recipe`` and ``doctor`` under
each fault (disk full, read-only output, concurrent run, SIGTERM, SIGKILL, bad value, hung
peer), one test per cell that applies; docs/reliability.md ("The fault matrix") says what
each cell guarantees and why the others do not apply.

Every cell checks the one line the user reads (a stable fragment), the exit status (2: a
user error; 143 = 128 + SIGTERM; -9: SIGKILL as the parent sees it) and the files
afterwards (the original output untouched or the whole new one, no temporary file, the
inputs as they were, no process left behind). The models are tiny torch (and Paddle)
modules written into ``tmp_path``; a framework is imported only by the cells that port.
Signal cells run real ``python -m polytrain`` processes; where the moment to signal is
too short to catch (the rename of ``recipe -o``), ``strace`` holds the process there.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from test_fault_matrix import (
    SIGTERM_EXIT,
    alive,
    finish,
    imported_frameworks,
    leftovers,
    one_line,
    wait_for,
    writing_into,
)
from test_run_dir import mounted_tmpfs

from polytrain.cli import doctor
from polytrain.cli.main import main
from polytrain.io import native as native_io
from polytrain.plugins.registry import default_plugin_manager
from polytrain.testing import backends_under_test

TINY = ["--train-samples", "64", "--test-samples", "32", "--batch-size", "32", "--epochs",
        "1", "--quiet"]  # fmt: skip
ORIGINAL = b"the original output"

# -- helpers ------------------------------------------------------------------------------


STARTED: list[subprocess.Popen[str]] = []


def start(*args: str | Path, wrap: tuple[str, ...] = ()) -> subprocess.Popen[str]:
    """``python -m polytrain ARGS`` as a real process (stderr captured; stdout too, for
    ``doctor --json``), with this test's environment (its modules on PYTHONPATH)."""
    cmd = [*wrap, sys.executable, "-m", "polytrain", *map(str, args)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    STARTED.append(proc)
    return proc


@pytest.fixture(autouse=True)
def _no_process_left() -> Iterator[None]:
    """A cell that fails half-way leaves none of the processes it started running."""
    yield
    while STARTED:
        proc = STARTED.pop()
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def stderr_of(proc: subprocess.Popen[str], timeout: float = 120) -> str:
    _, err = proc.communicate(timeout=timeout)
    return err


def ended(pid: int) -> bool:
    return not alive(pid)


@contextlib.contextmanager
def reaped(pid_file: Path) -> Iterator[None]:
    """Whatever process wrote its pid to ``pid_file`` is killed after the test if it is
    still there (a cell that fails must not leave a process behind)."""
    try:
        yield
    finally:
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)


def fill_up(path: Path) -> None:
    """A file that takes all the room left on its filesystem."""
    with open(path, "wb", buffering=0) as fh, contextlib.suppress(OSError):
        while fh.write(b"\0" * 4096):
            pass


def files_in(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (relative name -> bytes), hidden ones included."""
    return {
        str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


def on_pythonpath(monkeypatch: pytest.MonkeyPatch, folder: Path) -> None:
    """``folder`` importable here and in the processes the test starts."""
    monkeypatch.syspath_prepend(str(folder))
    paths = [str(folder), *filter(None, [os.environ.get("PYTHONPATH")])]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(paths))


@pytest.fixture
def original(tmp_path: Path) -> Path:
    """An output file that exists before the command (it must survive a failed one)."""
    path = tmp_path / "out" / "model.pt"
    path.parent.mkdir()
    path.write_bytes(ORIGINAL)
    return path


# -- port ---------------------------------------------------------------------------------

PORT_MODELS = """
import torch

def small():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))

def large():  # 40 MB of weights: writing them takes long enough to be interrupted
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(10)])

def paddle_mlp():
    import paddle
    paddle.seed(0)
    return paddle.nn.Sequential(paddle.nn.Linear(256, 256), paddle.nn.ReLU(),
                                paddle.nn.Linear(256, 256))

def torch_mlp():
    return torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(),
                               torch.nn.Linear(256, 256))
"""
HUNG_FACTORY = """
import os, time

def build():  # never returns
    with open(os.environ["FAULT_MARK"], "w") as fh:
        fh.write(str(os.getpid()))
    while True:
        time.sleep(1)
"""
PORT_SOURCES = [b for b in ("torch", "paddle") if b in backends_under_test()]


@pytest.fixture
def port_models(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``faultmodels`` (tiny torch and Paddle models) and ``faulthang`` importable."""
    modules = tmp_path / "modules"
    modules.mkdir()
    (modules / "faultmodels.py").write_text(textwrap.dedent(PORT_MODELS))
    (modules / "faulthang.py").write_text(textwrap.dedent(HUNG_FACTORY))
    on_pythonpath(monkeypatch, modules)
    return modules


def port_args(model: str, out: Path | str) -> list[str]:
    shape = "2,1024" if model == "large" else "2,8"
    return ["port", f"faultmodels:{model}", f"faultmodels:{model}", str(out), "--input-shape",
            shape]  # fmt: skip


def torch_weights(model: str) -> dict[str, np.ndarray]:
    import faultmodels  # type: ignore[import-not-found]

    return {k: v.numpy() for k, v in getattr(faultmodels, model)().state_dict().items()}


def assert_ported(path: Path, model: str) -> None:
    """``path`` is the whole weights file of ``faultmodels.MODEL`` (its seeded weights)."""
    found, tensors = native_io.read_native(path)
    expected = torch_weights(model)
    assert found == "torch" and set(tensors) == set(expected)
    for name, value in expected.items():
        np.testing.assert_array_equal(tensors[name], value)


def old_or_whole(path: Path, model: str) -> None:
    if path.read_bytes() != ORIGINAL:
        assert_ported(path, model)


@pytest.mark.parametrize("source", PORT_SOURCES)
def test_port_disk_full(
    source: str, tmp_path: Path, port_models: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    weights: list[str] = []
    if source == "paddle":  # a Paddle model with a weights file, into a torch model
        import faultmodels
        import paddle

        paddle.save(faultmodels.paddle_mlp().state_dict(), str(tmp_path / "mlp.pdparams"))
        weights = ["--weights", str(tmp_path / "mlp.pdparams")]
    inputs = files_in(tmp_path / "modules")
    with mounted_tmpfs(tmp_path / "small", "size=64k") as small:  # 256 kB of weights
        (small / "model.pt").write_bytes(ORIGINAL)
        model = "paddle_mlp" if source == "paddle" else "torch_mlp"
        code = main(["port", f"faultmodels:{model}", "faultmodels:torch_mlp",
                     str(small / "model.pt"), "--input-shape", "2,256", *weights,
                     "--map-out", str(small / "map.json"),
                     "--report", str(small / "report.json")])  # fmt: skip
        line = one_line(capsys.readouterr().err, "port")
        assert code == 2, line
        assert f"error: {small / 'model.pt'}: No space left on device" in line
        assert (small / "model.pt").read_bytes() == ORIGINAL
        for name in ("map.json", "report.json"):  # written before the weights: whole
            json.loads((small / name).read_text())
        assert sorted(os.listdir(small)) == ["map.json", "model.pt", "report.json"]
    assert files_in(tmp_path / "modules") == inputs


def test_port_read_only_output(tmp_path: Path, port_models: Path) -> None:
    with mounted_tmpfs(tmp_path / "ro", "ro,size=64k") as ro:
        code, err, imported = imported_frameworks(port_args("small", ro / "sub" / "model.pt"))
        line = one_line(err, "port")
        assert code == 2, err
        assert f"the output {ro / 'sub' / 'model.pt'} cannot be written: {ro} is not " in line
        assert "writable (Read-only file system)" in line
        assert imported == []  # said before the models were built
        assert os.listdir(ro) == []


@pytest.mark.slow
def test_port_concurrent_run(original: Path, port_models: Path) -> None:
    procs = [start(*port_args("small", original)) for _ in range(2)]
    errs = [stderr_of(p) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errs
    assert_ported(original, "small")
    assert os.listdir(original.parent) == ["model.pt"]  # one whole file, no temporary one


def _port_mid_write(target: Path) -> subprocess.Popen[str]:
    """A port of 40 MB of weights caught while it writes them."""
    proc = start(*port_args("large", target))
    wait_for(lambda: writing_into(proc.pid, target.parent), "the write", timeout=120)
    return proc


@pytest.mark.slow
def test_port_sigterm(original: Path, port_models: Path) -> None:
    proc = _port_mid_write(original)
    proc.send_signal(signal.SIGTERM)
    line = one_line(stderr_of(proc), "port")
    assert proc.returncode == SIGTERM_EXIT, line
    assert "interrupted by SIGTERM" in line
    old_or_whole(original, "large")
    assert os.listdir(original.parent) == ["model.pt"]


@pytest.mark.slow
def test_port_sigkill(original: Path, port_models: Path) -> None:
    proc = _port_mid_write(original)
    proc.send_signal(signal.SIGKILL)
    finish(proc)
    assert proc.returncode == -signal.SIGKILL
    old_or_whole(original, "large")
    assert os.listdir(original.parent) == ["model.pt"]


def test_port_bad_value(tmp_path: Path, port_models: Path) -> None:
    out = tmp_path / "model.pt"
    code, err, imported = imported_frameworks([*port_args("small", out), "--tolerance", "-1"])
    assert code == 2
    assert "argument --tolerance: must be a finite number > 0" in one_line(err, "port")
    assert imported == []
    assert not out.exists()


def test_port_hung_factory(
    tmp_path: Path, port_models: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The port's peer is the user's factory: one that never returns is stopped by SIGTERM
    (the wait is said after 10 s: test_signals_owned.py::test_a_wait_on_the_users_code_is_said)."""
    mark = tmp_path / "factory.pid"
    monkeypatch.setenv("FAULT_MARK", str(mark))
    out = tmp_path / "model.pt"
    proc = start("port", "faulthang:build", "faulthang:build", out, "--input-shape", "2,8")
    with reaped(mark):
        wait_for(mark.exists, "the factory's call", timeout=60)
        proc.send_signal(signal.SIGTERM)
        line = one_line(stderr_of(proc), "port")
    assert proc.returncode == SIGTERM_EXIT, line
    assert "interrupted by SIGTERM" in line
    assert not out.exists()


# -- port-code ----------------------------------------------------------------------------

PADDLE_CODE = """import paddle

x = paddle.to_tensor([1.0, 2.0])
y = paddle.matmul(x, x)
"""
DATA_BYTES = 48 << 20  # a data file copied as it is: the write lasts long enough to catch


def make_project(
    folder: Path, names: tuple[str, ...], data_bytes: int = DATA_BYTES, fill: bytes = b"\1"
) -> Path:
    """A project: a few Paddle modules and one large data file (copied, not converted;
    the first file written, so that the modules follow it)."""
    for name in names:
        (folder / f"{name}.py").parent.mkdir(parents=True, exist_ok=True)
        (folder / f"{name}.py").write_text(PADDLE_CODE + f"# {name}\n")
    (folder / "0_data.bin").write_bytes(fill * data_bytes)
    return folder


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return make_project(tmp_path / "proj", ("train", "pkg/model"))


OLD_OUTPUT = {"old.py": b"the old conversion\n"}


def write_old_output(out: Path) -> Path:
    """``out`` made a converted folder from before (:data:`OLD_OUTPUT`)."""
    out.mkdir(parents=True)
    for name, data in OLD_OUTPUT.items():
        (out / name).write_bytes(data)
    return out


@pytest.fixture
def old_output(tmp_path: Path) -> Path:
    """A converted folder from before (--overwrite replaces it only with a whole new one)."""
    return write_old_output(tmp_path / "out" / "proj_torch")


def assert_converted(out: Path, project: Path) -> None:
    """``out`` is the whole conversion of ``project``: every file, the data copied."""
    found = files_in(out)
    expected = {str(p.relative_to(project)) for p in project.rglob("*") if p.is_file()}
    assert set(found) == expected
    assert found["0_data.bin"] == (project / "0_data.bin").read_bytes()
    assert all(b"import torch" in v for k, v in found.items() if k.endswith(".py"))


def old_or_whole_folder(out: Path, project: Path) -> None:
    if files_in(out) != OLD_OUTPUT:
        assert_converted(out, project)


def test_port_code_disk_full(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    project = make_project(tmp_path / "proj", ("train", "pkg/model"), data_bytes=1 << 20)
    inputs = files_in(project)
    with mounted_tmpfs(tmp_path / "small", "size=512k") as small:
        out = write_old_output(small / "proj_torch")
        code = main(["port-code", str(project), "-o", str(out), "--overwrite"])
        line = one_line(capsys.readouterr().err, "port-code")
        assert code == 2, line
        assert f"error: {out}: No space left on device" in line
        assert files_in(out) == OLD_OUTPUT  # not half a new one
        assert os.listdir(small) == ["proj_torch"]  # no temporary folder
    assert files_in(project) == inputs


def test_port_code_read_only_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "train.py").write_text(PADDLE_CODE)
    with mounted_tmpfs(tmp_path / "ro", "ro,size=64k") as ro:
        code = main(["port-code", str(tmp_path / "train.py"), "-o", str(ro / "train.py")])
        line = one_line(capsys.readouterr().err, "port-code")
        assert code == 2, line
        assert f"-o {ro / 'train.py'} cannot be written: {ro} is not writable (Read-only" in line
        assert os.listdir(ro) == []


@pytest.mark.slow
def test_port_code_concurrent_run(tmp_path: Path, old_output: Path) -> None:
    """Two conversions of different projects into one folder, the second one run whole
    while the first is stopped (SIGSTOP) in the middle of its writing: both end with 0,
    and the folder is the one that finished last, whole (not a mix of the two)."""
    first = make_project(tmp_path / "first", ("a", "b"))
    second = make_project(tmp_path / "second", ("c", "pkg/d", "e"), 1 << 20, fill=b"\2")
    proc = _port_code_mid_write(first, old_output)
    proc.send_signal(signal.SIGSTOP)
    try:
        code = main(["port-code", str(second), "-o", str(old_output), "--overwrite"])
        assert code == 0
    finally:
        proc.send_signal(signal.SIGCONT)
    err = stderr_of(proc)
    assert proc.returncode == 0, err
    assert_converted(old_output, first)
    assert os.listdir(old_output.parent) == ["proj_torch"]


def _port_code_mid_write(project: Path, out: Path, tries: int = 5) -> subprocess.Popen[str]:
    """A folder conversion caught while it writes (copies its 48 MB data file). The copy
    may end between two looks on a fast disk or a busy machine: a conversion that ended
    uncaught is undone and started again, ``tries`` times."""
    for _ in range(tries):
        proc = start("port-code", project, "-o", out, "--overwrite")
        while proc.poll() is None:
            if writing_into(proc.pid, out.parent):
                return proc
            time.sleep(0.001)
        assert proc.returncode == 0, stderr_of(proc)
        shutil.rmtree(out)
        write_old_output(out)
    raise AssertionError(f"port-code was never caught writing in {tries} tries")


@pytest.mark.slow
def test_port_code_sigterm(project: Path, old_output: Path) -> None:
    proc = _port_code_mid_write(project, old_output)
    proc.send_signal(signal.SIGTERM)
    line = one_line(stderr_of(proc), "port-code")
    assert proc.returncode == SIGTERM_EXIT, line
    assert "interrupted by SIGTERM" in line
    old_or_whole_folder(old_output, project)
    assert os.listdir(old_output.parent) == ["proj_torch"]


@pytest.mark.slow
def test_port_code_sigkill(project: Path, old_output: Path) -> None:
    proc = _port_code_mid_write(project, old_output)
    proc.send_signal(signal.SIGKILL)
    finish(proc)
    assert proc.returncode == -signal.SIGKILL
    old_or_whole_folder(old_output, project)  # the hidden folder being written may stay:
    assert main(["port-code", str(project), "-o", str(old_output), "--overwrite"]) == 0
    assert_converted(old_output, project)
    assert os.listdir(old_output.parent) == ["proj_torch"]  # the next conversion removed it


def test_port_code_bad_value(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "zero.py"
    assert main(["port-code", "/dev/zero", "-o", str(out)]) == 2
    line = one_line(capsys.readouterr().err, "port-code")
    assert "SRC /dev/zero is a character device, not a regular file" in line
    assert not out.exists()


# -- recipe -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("runs") / "run"
    assert main(["train", "--backend", "numpy", *TINY, "--out", str(out)]) == 0
    return out


def is_recipe(path: Path) -> None:
    assert tomllib.loads(path.read_text())["model"] == "lenet"


@pytest.mark.slow
def test_recipe_disk_full(
    tmp_path: Path, run_folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with mounted_tmpfs(tmp_path / "small", "size=64k") as small:
        (small / "recipe.toml").write_bytes(ORIGINAL)
        fill_up(small / "fill")
        code = main(["recipe", str(run_folder), "-o", str(small / "recipe.toml")])
        line = one_line(capsys.readouterr().err, "recipe")
        assert code == 2, line
        assert f"error: {small / 'recipe.toml'}: No space left on device" in line
        assert (small / "recipe.toml").read_bytes() == ORIGINAL
        assert sorted(os.listdir(small)) == ["fill", "recipe.toml"]


def test_recipe_read_only_output(
    tmp_path: Path, run_folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with mounted_tmpfs(tmp_path / "ro", "size=64k") as ro:
        (ro / "recipe.toml").write_bytes(ORIGINAL)
        subprocess.run(["mount", "-o", "remount,ro", str(ro)], check=True)
        code = main(["recipe", str(run_folder), "-o", str(ro / "recipe.toml")])
        line = one_line(capsys.readouterr().err, "recipe")
        assert code == 2, line
        assert line.endswith(f"error: {ro / 'recipe.toml'}: Read-only file system")
        assert (ro / "recipe.toml").read_bytes() == ORIGINAL
        assert os.listdir(ro) == ["recipe.toml"]


@pytest.mark.slow
def test_recipe_concurrent_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``recipe`` owns no folder: it reads a run another process is writing (a checkpoint
    every step, the oldest pruned) and writes one whole file each time."""
    out = tmp_path / "run"
    train = start("train", "--backend", "numpy", *TINY, "--train-samples", "6400",
                  "--checkpoint-every", "1", "--keep-checkpoints", "1", "--out", out)  # fmt: skip
    target = tmp_path / "recipe.toml"
    try:
        wait_for(lambda: (out / "checkpoints" / "latest").exists(), "the first checkpoint")
        for _ in range(20):
            assert main(["recipe", str(out), "-o", str(target)]) == 0, capsys.readouterr().err
            is_recipe(target)
    finally:
        train.send_signal(signal.SIGTERM)
        stderr_of(train)
    assert train.returncode == SIGTERM_EXIT  # the run was not disturbed
    assert sorted(os.listdir(tmp_path)) == ["recipe.toml", "run"]  # no temporary file


def strace_at(syscall: str, when: str) -> tuple[str, ...]:
    """``strace`` holding its process 3 s at ``syscall`` (``when``: enter or exit)."""
    if shutil.which("strace") is None:
        pytest.skip("strace is not installed")
    probe = subprocess.run(["strace", "-qq", "-o", "/dev/null", "true"], capture_output=True,
                           check=False)  # fmt: skip
    if probe.returncode != 0:
        pytest.skip(f"strace cannot trace here: {probe.stderr.decode().strip()}")
    return ("strace", "-qq", "-o", os.devnull, "-e", f"trace={syscall}", "-e",
            f"inject={syscall}:delay_{when}=3000000")  # fmt: skip


def traced(proc: subprocess.Popen[str]) -> int:
    """The pid of the polytrain process ``strace`` (``proc``) runs (strace may fork one of
    its own in between)."""
    found: list[int] = []

    def look() -> bool:
        pids = [proc.pid]
        while pids:
            pid = pids.pop()
            with contextlib.suppress(OSError):
                if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(python):
                    found.append(pid)
                    return True
                for task in Path(f"/proc/{pid}/task").iterdir():
                    pids += map(int, (task / "children").read_text().split())
        return False

    python = f"{sys.executable}\0-m\0polytrain\0".encode()

    wait_for(look, "the traced polytrain process", timeout=30)
    return found[0]


@pytest.mark.slow
def test_recipe_sigterm(tmp_path: Path, run_folder: Path) -> None:
    """SIGTERM at the worst moment: the new recipe is complete under its temporary name
    (``strace`` holds the process right after ``linkat`` names it, before the rename)."""
    target = tmp_path / "out" / "recipe.toml"
    target.parent.mkdir()
    target.write_bytes(ORIGINAL)
    proc = start("recipe", run_folder, "-o", target, wrap=strace_at("linkat", "exit"))
    pid = traced(proc)
    wait_for(lambda: leftovers(target.parent) != [], "the named temporary file", timeout=60)
    os.kill(pid, signal.SIGTERM)
    line = one_line(stderr_of(proc), "recipe")
    assert proc.returncode == SIGTERM_EXIT, line
    assert "interrupted by SIGTERM" in line
    if target.read_bytes() != ORIGINAL:
        is_recipe(target)
    assert os.listdir(target.parent) == ["recipe.toml"]


@pytest.mark.slow
def test_recipe_sigkill(tmp_path: Path, run_folder: Path) -> None:
    """SIGKILL while the recipe is written (held at its ``fsync``, before it has a name):
    nothing of it stays."""
    target = tmp_path / "out" / "recipe.toml"
    target.parent.mkdir()
    target.write_bytes(ORIGINAL)
    proc = start("recipe", run_folder, "-o", target, wrap=strace_at("fsync", "enter"))
    pid = traced(proc)
    wait_for(lambda: writing_into(pid, target.parent), "the write", timeout=60)
    os.kill(pid, signal.SIGKILL)
    finish(proc)
    assert proc.returncode == -signal.SIGKILL
    assert target.read_bytes() == ORIGINAL
    assert os.listdir(target.parent) == ["recipe.toml"]


def test_recipe_bad_value(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty").mkdir()
    target = tmp_path / "recipe.toml"
    assert main(["recipe", str(tmp_path / "empty"), "-o", str(target)]) == 2
    line = one_line(capsys.readouterr().err, "recipe")
    assert f"No checkpoint at {tmp_path / 'empty'}: expected a checkpoint directory" in line
    assert not target.exists()


# -- doctor -------------------------------------------------------------------------------

DOCTOR_PLUGIN = """
import os, sys, time
from polytrain import BackendInfo, hookimpl
from polytrain.distributed.supervisor import EngineLauncher

def mark(role):  # whole or absent: the test kills as soon as the file exists
    path = f"{os.environ['FAULT_MARK']}.{role}"
    with open(path + ".tmp", "w") as fh:
        fh.write(str(os.getpid()))
    os.replace(path + ".tmp", path)

def stuck(options):  # the probe's import of this backend never ends
    mark("probe")
    while True:
        time.sleep(1)

def numpy_backend(options):  # probes fine; its engine never starts the workers
    from polytrain.plugins.registry import get_backend
    return get_backend("numpy", options=options)

ENGINE = "import faultdoctor, time; faultdoctor.mark('engine'); time.sleep(600)"

class MuteLauncher(EngineLauncher):
    backend = "mute"
    name = "mute-engine"
    rank_variable = "RANK"
    def command(self, spec, status_dir, address):
        return [sys.executable, "-c", ENGINE]

@hookimpl
def polytrain_register_backends(register):
    register(BackendInfo(name="stuck", framework="numpy", distribution="numpy", factory=stuck))
    register(BackendInfo(name="mute", framework="numpy", distribution="numpy",
                         factory=numpy_backend))

@hookimpl
def polytrain_register_launchers(register):
    register(MuteLauncher())
"""
PHASES = {"probe": "stuck", "engine": "mute"}  # mid-probe: the import probe, the allreduce


@pytest.fixture
def doctor_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Backends ``stuck`` and ``mute`` registered here and in the processes started; the
    pid of each probe and engine process goes to ``<mark>.<role>``."""
    modules = tmp_path / "plugins"
    modules.mkdir()
    (modules / "faultdoctor.py").write_text(textwrap.dedent(DOCTOR_PLUGIN))
    on_pythonpath(monkeypatch, modules)
    monkeypatch.setenv("POLYTRAIN_PLUGINS", "faultdoctor")
    monkeypatch.setenv("FAULT_MARK", str(tmp_path / "mark"))
    default_plugin_manager.cache_clear()
    yield tmp_path / "mark"
    monkeypatch.undo()
    default_plugin_manager.cache_clear()


@pytest.mark.slow
def test_doctor_disk_full(tmp_path: Path) -> None:
    """doctor writes only to stdout: here a file on a full disk."""
    with mounted_tmpfs(tmp_path / "small", "size=64k") as small:
        fill_up(small / "fill")
        with open(small / "doctor.txt", "w") as stdout:
            done = subprocess.run([sys.executable, "-m", "polytrain", "doctor", "numpy",
                                   "--no-collectives"], stdout=stdout, stderr=subprocess.PIPE,
                                  text=True, check=False)  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert one_line(done.stderr, "doctor").endswith("error: No space left on device")
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr


@pytest.mark.slow
def test_doctor_concurrent_run() -> None:
    """doctor owns no file: two at once each report the same, whole."""
    procs = [start("doctor", "numpy", "--no-collectives", "--json") for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    reports = [json.loads(out) for out, _ in outs]
    for report in reports:
        report[0].pop("import_seconds")
    assert reports[0] == reports[1] and reports[0][0]["importable"]


@pytest.mark.slow
@pytest.mark.parametrize("phase", PHASES)
def test_doctor_sigterm(phase: str, doctor_plugin: Path) -> None:
    role = doctor_plugin.with_suffix(f".{phase}")
    proc = start("doctor", PHASES[phase])
    with reaped(role):
        wait_for(role.exists, f"the {phase} process", timeout=60)
        proc.send_signal(signal.SIGTERM)
        line = one_line(stderr_of(proc, timeout=60), "doctor")
        assert proc.returncode == SIGTERM_EXIT, line
        assert "interrupted by SIGTERM" in line
        wait_for(lambda: ended(int(role.read_text())), f"the {phase} to end", timeout=10)


@pytest.mark.slow
@pytest.mark.parametrize("phase", PHASES)
def test_doctor_sigkill(phase: str, doctor_plugin: Path) -> None:
    role = doctor_plugin.with_suffix(f".{phase}")
    proc = start("doctor", PHASES[phase])
    with reaped(role):
        wait_for(role.exists, f"the {phase} process", timeout=60)
        proc.send_signal(signal.SIGKILL)
        finish(proc)
        assert proc.returncode == -signal.SIGKILL
        wait_for(lambda: ended(int(role.read_text())), f"the {phase} to end", timeout=10)


@pytest.mark.slow
def test_doctor_bad_value() -> None:
    code, err, imported = imported_frameworks(["doctor", "nosuch"])
    assert code == 2
    assert "Unknown backend 'nosuch'" in one_line(err, "doctor")
    assert imported == []


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_doctor_hung_probe(
    doctor_plugin: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A probe that never ends (an import, the allreduce's engine) is stopped at the probe
    timeout and reported as the reason; doctor goes on and ends."""
    monkeypatch.setattr(doctor, "PROBE_TIMEOUT", 3.0)
    with reaped(doctor_plugin.with_suffix(".probe")), reaped(doctor_plugin.with_suffix(".engine")):
        assert main(["doctor", "stuck", "mute", "--json"]) == 0
    stuck, mute = json.loads(capsys.readouterr().out)
    assert stuck["error"] == "the probe did not end within 3 s; stopped"
    assert mute["importable"] and not mute["collective"]["ok"]
    assert "did not start within 3 s" in mute["collective"]["why"]
    for role in ("probe", "engine"):
        assert ended(int(doctor_plugin.with_suffix(f".{role}").read_text()))
