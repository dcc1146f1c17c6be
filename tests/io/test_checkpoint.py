"""The neutral checkpoint: round trip, atomic replacement, SIGKILL, bad inputs, run dirs.

Plain numpy only: no framework is imported here or in the subprocesses.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import random
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import polytrain
from polytrain.errors import CheckpointError, ConfigError
from polytrain.io import checkpoint as ckpt
from polytrain.io.checkpoint import (
    CheckpointManager,
    describe_checkpoint,
    find_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from polytrain.neutral.models import get_model_spec, mlp
from polytrain.neutral.optim import OptimizerConfig
from polytrain.training.recipe import Recipe

SPEC = mlp(hidden=8)


def _params(seed: int = 0) -> dict[str, np.ndarray]:
    return SPEC.init_params(seed)


def _optimizer_state(params: dict[str, np.ndarray], step: int = 5) -> dict[str, Any]:
    rng = np.random.default_rng(step)
    slots = {
        n: {
            "exp_avg": rng.standard_normal(p.shape).astype(np.float32),
            "exp_avg_sq": rng.random(p.shape).astype(np.float32),
        }
        for n, p in params.items()
    }
    config = OptimizerConfig(name="adam", lr=0.01)
    return {"config": config.to_dict(), "step": step, "lr": 0.005, "slots": slots}


def _save(path: Path, seed: int = 0, **kwargs: Any) -> Path:
    params = _params(seed)
    kwargs.setdefault("optimizer_state", _optimizer_state(params))
    kwargs.setdefault("position", {"epoch": 1, "step": 3, "global_step": 12})
    return save_checkpoint(path, params=params, spec=SPEC, **kwargs)


def _listing(directory: Path) -> dict[str, bytes]:
    """Every file under ``directory`` with its bytes (hidden entries included)."""
    return {
        str(p.relative_to(directory)): p.read_bytes() for p in directory.rglob("*") if p.is_file()
    } | {str(p.relative_to(directory)) + "/": b"" for p in directory.rglob("*") if p.is_dir()}


def _assert_same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert list(a) == list(b)
    for name in a:
        assert a[name].dtype == b[name].dtype, name
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


# -- round trip -----------------------------------------------------------------------------------


def test_round_trip_params_optimizer_and_manifest(tmp_path: Path) -> None:
    params = _params(3)
    state = _optimizer_state(params, step=7)
    recipe = Recipe(model="mlp", lr=0.01).to_dict()
    history = [{"epoch": 0, "train_loss": np.float32(0.5), "test_accuracy": None}]
    before = datetime.now(UTC) - timedelta(seconds=1)
    path = save_checkpoint(
        tmp_path / "ck",
        params=params,
        optimizer_state=state,
        spec=SPEC,
        backend="paddle",
        framework_version="3.3.1",
        position={"epoch": 2, "step": 40, "global_step": 140},
        seed=11,
        recipe=recipe,
        scaler={"scale": 65536.0, "growth_tracker": 3},
        history=history,
        extra={"note": "hello", "devices": ["cpu:0", "cpu:1"]},
    )
    assert path == (tmp_path / "ck").absolute()
    assert sorted(os.listdir(path)) == [
        "manifest.json",
        "model.safetensors",
        "optimizer.safetensors",
    ]

    ck = load_checkpoint(path, spec=SPEC)
    _assert_same(ck.params, params)
    assert ck.optimizer_state is not None
    assert ck.optimizer_state.keys() == {"config", "step", "lr", "slots"}
    assert OptimizerConfig.from_dict(ck.optimizer_state["config"]) == OptimizerConfig("adam", 0.01)
    assert (ck.optimizer_state["step"], ck.optimizer_state["lr"]) == (7, 0.005)
    assert ck.optimizer_state["slots"].keys() == state["slots"].keys()
    for name, slots in state["slots"].items():
        _assert_same(ck.optimizer_state["slots"][name], slots)
    assert ck.position == {"epoch": 2, "step": 40, "global_step": 140}
    assert ck.recipe == recipe and Recipe.from_dict(ck.recipe) == Recipe(model="mlp", lr=0.01)
    assert ck.scaler == {"scale": 65536.0, "growth_tracker": 3}
    assert ck.history == [{"epoch": 0, "train_loss": 0.5, "test_accuracy": None}]
    assert ck.path == path

    m = ck.manifest
    assert (m["format"], m["format_version"]) == ("polytrain-checkpoint", 1)
    assert m["polytrain_version"] == polytrain.__version__
    created = datetime.fromisoformat(m["created"])
    assert created.utcoffset() == timedelta(0) and before <= created <= datetime.now(UTC)
    assert m["backend"] == {"name": "paddle", "framework_version": "3.3.1"}
    assert m["model"] == {"name": "mlp", "spec": SPEC.to_dict()}
    assert m["seed"] == 11 and m["extra"] == {"note": "hello", "devices": ["cpu:0", "cpu:1"]}
    assert m["optimizer"]["slots"] == {n: ["exp_avg", "exp_avg_sq"] for n in params}
    tensors = m["files"]["model.safetensors"]["tensors"]
    assert tensors == {
        n: {"shape": list(s), "dtype": "float32"} for n, s in SPEC.parameter_shapes().items()
    }
    assert set(m["files"]["optimizer.safetensors"]["tensors"]) == {
        f"{n}/{s}" for n in params for s in ("exp_avg", "exp_avg_sq")
    }
    for fname, entry in m["files"].items():
        data = (path / fname).read_bytes()
        assert entry["sha256"] == hashlib.sha256(data).hexdigest()
        assert entry["size"] == len(data)
    assert json.loads((path / "manifest.json").read_text()) == m


def test_params_become_float32_and_slots_keep_their_dtype(tmp_path: Path) -> None:
    params = {k: v.astype(np.float64) for k, v in _params().items()}
    slots = {"fc1.weight": {"momentum_buffer": np.full((8, 784), 0.1, np.float64)}}
    state = {"config": {"name": "momentum"}, "step": 1, "lr": 0.1, "slots": slots}
    save_checkpoint(tmp_path / "ck", params=params, optimizer_state=state)
    ck = load_checkpoint(tmp_path / "ck")
    assert {a.dtype for a in ck.params.values()} == {np.dtype(np.float32)}
    _assert_same(ck.params, {k: v.astype(np.float32) for k, v in params.items()})
    assert ck.optimizer_state is not None
    _assert_same(ck.optimizer_state["slots"]["fc1.weight"], slots["fc1.weight"])
    assert ck.manifest["model"] == {"name": None, "spec": None}


@pytest.mark.parametrize(
    "state", [None, {"config": {"name": "sgd"}, "step": 4, "lr": 0.1, "slots": {}}]
)
def test_no_optimizer_tensors_no_optimizer_file(tmp_path: Path, state: Any) -> None:
    if state is not None:  # sgd: a state without slots, each parameter with an empty dict
        state["slots"] = {n: {} for n in _params()}
    path = _save(tmp_path / "ck", optimizer_state=state)
    assert sorted(os.listdir(path)) == ["manifest.json", "model.safetensors"]
    ck = load_checkpoint(path)
    assert ck.optimizer_state == state


def test_non_contiguous_arrays_are_written_correctly(tmp_path: Path) -> None:
    base = np.arange(784 * 8, dtype=np.float32).reshape(784, 8)
    params = _params()
    params["fc1.weight"] = base.T  # a transposed view, as a Paddle Linear gives
    params["fc2.weight"] = np.arange(20 * 16, dtype=np.float32).reshape(20, 16)[::2, ::2]
    slot = np.asfortranarray(np.ones((8, 784), np.float32) * np.arange(784, dtype=np.float32))
    state = {"config": {}, "step": 1, "lr": 0.1, "slots": {"fc1.weight": {"buf": slot}}}
    assert not params["fc1.weight"].flags.c_contiguous and not slot.flags.c_contiguous
    save_checkpoint(tmp_path / "ck", params=params, spec=SPEC, optimizer_state=state)
    ck = load_checkpoint(tmp_path / "ck", spec=SPEC)
    np.testing.assert_array_equal(ck.params["fc1.weight"], base.T)
    np.testing.assert_array_equal(ck.params["fc2.weight"], params["fc2.weight"])
    assert ck.optimizer_state is not None
    np.testing.assert_array_equal(ck.optimizer_state["slots"]["fc1.weight"]["buf"], slot)


def test_loading_never_unpickles(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _save(tmp_path / "ck")

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("unpickling")

    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(pickle, "Unpickler", refuse)
    assert load_checkpoint(tmp_path / "ck").params


def test_core_checkpoint_imports_no_framework() -> None:
    code = (
        "import sys, polytrain.io.checkpoint\n"
        "print(sorted({'torch', 'paddle', 'mxnet', 'tensorflow', 'jax'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# -- atomic replacement ---------------------------------------------------------------------------


class _Unconvertible:
    def __array__(self, dtype: Any = None) -> np.ndarray:
        raise RuntimeError("device lost")


def _crash_on_call(monkeypatch: pytest.MonkeyPatch, name: str, n: int) -> None:
    """Make ``os.<name>`` raise on its n-th call (1-based) inside polytrain.io.checkpoint."""
    real = getattr(os, name)
    calls = []

    def fake(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        if len(calls) == n:
            raise OSError(28, "No space left on device (simulated)")
        return real(*args, **kwargs)

    monkeypatch.setattr(ckpt.os, name, fake)


@pytest.mark.parametrize(
    "crash",
    ["conversion", "json", "fsync-model", "fsync-manifest", "rename-aside", "rename-new"],
)
def test_failed_save_leaves_old_checkpoint_intact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, crash: str
) -> None:
    target = _save(tmp_path / "ck", seed=1)
    before = _listing(tmp_path)
    params: dict[str, Any] = _params(2)
    extra: dict[str, Any] = {}
    if crash == "conversion":
        params["fc2.bias"] = _Unconvertible()
    elif crash == "json":
        extra["callback"] = object()
    elif crash.startswith("fsync"):  # model, optimizer, manifest: the manifest is 3rd
        _crash_on_call(monkeypatch, "fsync", 1 if crash == "fsync-model" else 3)
    else:
        _crash_on_call(monkeypatch, "rename", 1 if crash == "rename-aside" else 2)
    with pytest.raises((CheckpointError, OSError)) as info:
        state = _optimizer_state(_params(2))
        save_checkpoint(target, params=params, optimizer_state=state, spec=SPEC, extra=extra)
    if crash in ("conversion", "json"):
        assert info.type is CheckpointError
        assert ("fc2.bias" if crash == "conversion" else "extra") in str(info.value)
    monkeypatch.undo()
    assert _listing(tmp_path) == before  # no temporary or aside directory remains
    _assert_same(load_checkpoint(target).params, _params(1))


def test_replacing_a_checkpoint(tmp_path: Path) -> None:
    target = _save(tmp_path / "ck", seed=1)
    _save(target, seed=2, optimizer_state=None)
    assert os.listdir(tmp_path) == ["ck"]
    ck = load_checkpoint(target)
    _assert_same(ck.params, _params(2))
    assert ck.optimizer_state is None  # the old optimizer file went with the old checkpoint
    assert not (target / "optimizer.safetensors").exists()


def test_killed_between_the_two_renames(tmp_path: Path) -> None:
    """The one instant with nothing at the path: the old checkpoint waits at .ck.old."""
    target = _save(tmp_path / "ck", seed=1)
    os.rename(target, tmp_path / ".ck.old")  # what a SIGKILL after the first rename leaves
    (tmp_path / ".ck.tmp-dead").mkdir()  # and the new one, never renamed
    with pytest.warns(RuntimeWarning, match="interrupted"):
        ck = load_checkpoint(target)
    _assert_same(ck.params, _params(1))
    _save(target, seed=2)
    assert os.listdir(tmp_path) == ["ck"]
    _assert_same(load_checkpoint(target).params, _params(2))
    # killed after the second rename: the new one is in place, the old one is stale
    (tmp_path / ".ck.old").mkdir()
    _save(target, seed=3)
    assert os.listdir(tmp_path) == ["ck"]
    _assert_same(load_checkpoint(target).params, _params(3))


def test_refuses_to_replace_a_directory_that_is_not_a_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text("{}\n")
    (tmp_path / "file").write_text("x")
    before = _listing(tmp_path)
    for target in (tmp_path / "run", tmp_path / "file"):
        with pytest.raises(CheckpointError, match="not a polytrain checkpoint"):
            _save(target)
    assert _listing(tmp_path) == before


# -- a real SIGKILL, several times ----------------------------------------------------------------

_WRITER = textwrap.dedent(
    """
    import sys
    import numpy as np
    from polytrain.io.checkpoint import CheckpointManager, find_checkpoint, load_checkpoint
    from polytrain.io.checkpoint import save_checkpoint

    mode, where = sys.argv[1], sys.argv[2]
    manager = CheckpointManager(where, keep=2)
    try:  # resume, as a training run does
        start = load_checkpoint(where).position["global_step"] + 1
    except Exception:
        start = 0
    for step in range(start, start + 100_000):
        params = {
            "a": np.full((1024, 1024), step, np.float32),
            "b": np.full((2048, 512), -step, np.float32).T,  # non-contiguous
        }
        slots = {"a": {"exp_avg": np.full((1024, 1024), step / 2, np.float32)}}
        save = manager.save if mode == "manager" else lambda **kw: save_checkpoint(where, **kw)
        save(
            params=params,
            optimizer_state={"config": {"name": "adam"}, "step": step, "lr": 0.1, "slots": slots},
            position={"epoch": step // 10, "step": step % 10, "global_step": step},
        )
        print(step, flush=True)
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["manager", "overwrite"])
def test_sigkill_at_random_moments_always_leaves_a_valid_checkpoint(
    tmp_path: Path, mode: str
) -> None:
    """A writer saving ~12 MB checkpoints in a loop (manager: new step dirs and the latest
    pointer; overwrite: one path replaced each time) is SIGKILLed at random moments; each
    time the checkpoint found afterwards is complete and at least the last one reported."""
    script = tmp_path / "writer.py"
    script.write_text(_WRITER)
    where = tmp_path / "run"
    rng = random.Random(1234)
    rounds, mid_write = 8, 0
    for _ in range(rounds):
        with subprocess.Popen(
            [sys.executable, str(script), mode, str(where)], stdout=subprocess.PIPE, text=True
        ) as proc:
            assert proc.stdout is not None
            first = proc.stdout.readline()  # one save of this round is committed
            assert first.strip(), "the writer died before its first save"
            time.sleep(rng.uniform(0.0, 0.3))
            os.kill(proc.pid, signal.SIGKILL)
            rest = proc.stdout.read()
            assert proc.wait() == -signal.SIGKILL
        committed = int((first + rest).split()[-1])
        parent = where / "checkpoints" if mode == "manager" else tmp_path
        mid_write += any(e.startswith(".") for e in os.listdir(parent))

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ck = load_checkpoint(where)
        if mode == "manager":  # the pointer itself is always valid: no fallback
            assert not caught, [str(w.message) for w in caught]
            assert len(CheckpointManager(where).checkpoints()) <= 3  # keep 2 (+1 unpruned)
            assert ck.path.name == f"step-{ck.position['global_step']:08d}"
        else:  # only when killed between the two renames: the old one, with a warning
            assert all("interrupted" in str(w.message) for w in caught)
        step = ck.position["global_step"]
        assert step in (committed, committed + 1)  # +1: killed after the commit, before print
        np.testing.assert_array_equal(ck.params["a"], np.full((1024, 1024), step, np.float32))
        np.testing.assert_array_equal(ck.params["b"], np.full((512, 2048), -step, np.float32))
        assert ck.optimizer_state is not None and ck.optimizer_state["step"] == step
        np.testing.assert_array_equal(ck.optimizer_state["slots"]["a"]["exp_avg"], step / 2)
    # the next save cleans whatever the kills left behind
    params = {"a": np.zeros(3, np.float32)}
    if mode == "manager":
        CheckpointManager(where).save(params=params, position={"global_step": 10**6})
        entries = sorted(os.listdir(where / "checkpoints"))
        assert len(entries) == 3 and entries[0] == "latest" and entries[2] == "step-01000000"
    else:
        save_checkpoint(where, params=params)
        assert sorted(os.listdir(tmp_path)) == ["run", "writer.py"]
    print(f"{mode}: {mid_write} of {rounds} kills left a temporary directory behind")


# -- bad inputs -----------------------------------------------------------------------------------


def _load_fails(path: Path, match: str, **kwargs: Any) -> str:
    before = _listing(path.parent)
    with pytest.raises(CheckpointError, match=match) as info:
        load_checkpoint(path, **kwargs)
    assert _listing(path.parent) == before  # loading writes nothing, repairs nothing
    assert "Traceback" not in str(info.value)
    return str(info.value)


@pytest.mark.parametrize("fname", ["model.safetensors", "optimizer.safetensors"])
def test_truncated_tensor_file(tmp_path: Path, fname: str) -> None:
    path = _save(tmp_path / "ck")
    data = (path / fname).read_bytes()
    (path / fname).write_bytes(data[: len(data) // 2])
    for verify in (True, False):
        message = _load_fails(path, "truncated", verify=verify)
        assert str(path / fname) in message


def test_garbage_bytes_in_tensor_file(tmp_path: Path) -> None:
    path = _save(tmp_path / "ck")
    size = (path / "model.safetensors").stat().st_size
    (path / "model.safetensors").write_bytes(b"\xff" * size)  # not even a header length
    message = _load_fails(path, "sha256")
    assert "model.safetensors" in message
    # without the checksum, the safetensors error arrives wrapped, naming the file
    message = _load_fails(path, "not a valid safetensors file", verify=False)
    assert "model.safetensors" in message


def test_missing_or_broken_manifest(tmp_path: Path) -> None:
    path = _save(tmp_path / "ck")
    manifest = (path / "manifest.json").read_bytes()
    (path / "manifest.json").write_bytes(manifest[:100])
    _load_fails(path, "manifest.json is not valid JSON")
    (path / "manifest.json").write_text(json.dumps({"format": "something-else"}))
    _load_fails(path, "not a polytrain checkpoint manifest")
    manifest_dict = json.loads(manifest)
    del manifest_dict["files"]["model.safetensors"]["tensors"]
    (path / "manifest.json").write_text(json.dumps(manifest_dict))
    _load_fails(path, "manifest.json is malformed: KeyError")
    with pytest.raises(CheckpointError, match="malformed"):
        describe_checkpoint(path)
    (path / "manifest.json").unlink()
    _load_fails(path, "has no manifest.json")
    _load_fails(tmp_path / "nowhere", "No checkpoint at")


def test_manifest_of_a_newer_format_version(tmp_path: Path) -> None:
    path = _save(tmp_path / "ck")
    manifest = json.loads((path / "manifest.json").read_text())
    manifest.update(format_version=2, polytrain_version="9.0.0")
    (path / "manifest.json").write_text(json.dumps(manifest))
    message = _load_fails(path, "format version 2")
    assert "polytrain 9.0.0" in message
    assert f"this polytrain {polytrain.__version__} reads format version 1" in message
    assert "Upgrade polytrain" in message


def test_checkpoint_of_another_model(tmp_path: Path) -> None:
    path = _save(tmp_path / "ck")
    message = _load_fails(path, "does not match model 'lenet'", spec=get_model_spec("lenet"))
    assert "it holds model 'mlp', not 'lenet'" in message
    assert "unexpected in the checkpoint (0)" not in message
    assert "missing from the checkpoint (4): conv1.weight, conv1.bias, conv2.weight" in message
    assert "fc1.weight (checkpoint (8, 784), model (128, 800))" in message
    # same name, other size: the shapes say what differs
    message = _load_fails(path, "does not match model 'mlp'", spec=mlp(hidden=16))
    assert "holds model" not in message
    assert "fc1.weight (checkpoint (8, 784), model (16, 784))" in message
    assert "fc2.weight (checkpoint (10, 8), model (10, 16))" in message
    assert load_checkpoint(path, spec=mlp(hidden=8)).params  # the right one loads


def test_tensor_with_a_wrong_shape(tmp_path: Path) -> None:
    path = _save(tmp_path / "ck", optimizer_state=None)
    # a file whose checksum and size are right but whose tensor disagrees with the manifest
    params = _params()
    params["fc1.weight"] = params["fc1.weight"].reshape(784, 8)
    blob = ckpt.stnp.save(params)
    (path / "model.safetensors").write_bytes(blob)
    manifest = json.loads((path / "manifest.json").read_text())
    entry = manifest["files"]["model.safetensors"]
    entry.update(sha256=hashlib.sha256(blob).hexdigest(), size=len(blob))
    (path / "manifest.json").write_text(json.dumps(manifest))
    message = _load_fails(path, "does not match the manifest")
    assert "fc1.weight: file ((784, 8), 'float32'), manifest ((8, 784), 'float32')" in message


def test_bad_inputs_to_save_write_nothing(tmp_path: Path) -> None:
    params = _params()
    bad_shape = {**params, "fc1.weight": np.zeros((3, 3), np.float32)}
    cases: list[tuple[dict[str, Any], str]] = [
        ({"params": bad_shape, "spec": SPEC}, r"fc1.weight \(given \(3, 3\), model \(8, 784\)\)"),
        ({"params": {"w": np.array(["a"])}}, "not a number type"),
        ({"params": {"w": np.array([object()])}}, "not a number type"),
        (
            {"params": params, "optimizer_state": {"step": 1}},
            "Optimizer.state_dict",
        ),
        (
            {"params": params, "optimizer_state": {**_optimizer_state({"x": params["fc1.bias"]})}},
            "slots for 'x', which is not a parameter",
        ),
        ({"params": params, "position": {"global_step": "ten"}}, "position must hold integers"),
        ({"params": params, "history": [{"x": {1, 2}}]}, "history"),
    ]
    for kwargs, match in cases:
        with pytest.raises(CheckpointError, match=match):
            save_checkpoint(tmp_path / "ck", **kwargs)
    assert os.listdir(tmp_path) == []


# -- run directories ------------------------------------------------------------------------------


def _manager_save(manager: CheckpointManager, step: int) -> Path:
    return manager.save(params=_params(step), spec=SPEC, position={"global_step": step})


def test_manager_keeps_the_newest_and_points_latest(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path / "run", keep=2)
    assert manager.latest() is None
    paths = [_manager_save(manager, step) for step in (5, 10, 15, 20)]
    assert paths[-1] == manager.directory / "step-00000020"
    assert sorted(os.listdir(manager.directory)) == ["latest", "step-00000015", "step-00000020"]
    assert json.loads(manager.pointer.read_text()) == {
        "checkpoint": "step-00000020",
        "global_step": 20,
    }
    assert manager.latest() == paths[-1]
    for path in (tmp_path / "run", manager.directory, paths[-1]):
        assert find_checkpoint(path) == paths[-1]
    _assert_same(load_checkpoint(tmp_path / "run", spec=SPEC).params, _params(20))


def test_manager_never_prunes_what_latest_names(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path / "run", keep=1)
    _manager_save(manager, 50)
    _manager_save(manager, 3)  # a lower step (a restart from scratch) is still the latest
    assert manager.checkpoints() == [manager.directory / f"step-{s:08d}" for s in (3, 50)]
    assert manager.latest() == manager.directory / "step-00000003"


def test_manager_prune_cleans_what_killed_saves_left(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path / "run", keep=5)
    _manager_save(manager, 1)
    old = _manager_save(manager, 2)
    os.rename(old, manager.directory / ".step-00000002.old")  # killed mid-replacement
    (manager.directory / ".step-00000007.tmp-x1").mkdir()  # killed while writing
    (manager.directory / ".step-00000001.trash").mkdir()  # killed while pruning
    (manager.directory / ".latest.x2.tmp").write_text("")  # killed while writing the pointer
    manager.prune()
    assert sorted(os.listdir(manager.directory)) == ["latest", "step-00000001", "step-00000002"]
    _assert_same(load_checkpoint(old).params, _params(2))


@pytest.mark.parametrize("damage", ["truncate", "delete", "garbage-pointer", "no-pointer"])
def test_latest_falls_back_to_the_newest_valid_checkpoint(tmp_path: Path, damage: str) -> None:
    manager = CheckpointManager(tmp_path / "run", keep=3)
    paths = [_manager_save(manager, step) for step in (1, 2, 3)]
    if damage == "truncate":
        (paths[2] / "model.safetensors").write_bytes(b"\0" * 10)
        expected, match = paths[1], "truncated"
    elif damage == "delete":
        for f in paths[2].iterdir():
            f.unlink()
        paths[2].rmdir()
        expected, match = paths[1], "No such file|Cannot read"
    elif damage == "garbage-pointer":
        manager.pointer.write_text("step-00000003\x00garbage")
        expected, match = paths[2], "unreadable"
    else:
        manager.pointer.unlink()
        expected, match = paths[2], "does not exist"
    with pytest.warns(RuntimeWarning, match=match) as record:
        assert manager.latest() == expected
    assert f"using the newest valid checkpoint {expected}" in str(record[0].message)


def test_latest_is_none_when_nothing_is_valid(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path / "run")
    path = _manager_save(manager, 1)
    (path / "manifest.json").write_text("{")
    with pytest.warns(RuntimeWarning, match="no valid checkpoint"):
        assert manager.latest() is None
    with pytest.warns(RuntimeWarning), pytest.raises(CheckpointError, match="no complete"):
        find_checkpoint(tmp_path / "run")


def test_manager_arguments(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="keep must be >= 1"):
        CheckpointManager(tmp_path, keep=0)
    with pytest.raises(ConfigError, match="global_step"):
        CheckpointManager(tmp_path).save(params=_params(), position={"epoch": 1})
    assert os.listdir(tmp_path) == []


def test_describe_checkpoint(tmp_path: Path) -> None:
    path = _save(tmp_path / "ck", backend="mxnet", framework_version="1.9.1")
    text = describe_checkpoint(path)
    assert f"checkpoint  {path}" in text
    assert "model       mlp (spec included)" in text
    assert "written by  mxnet 1.9.1, polytrain " in text
    assert "position    epoch 1, step 3, global step 12" in text
    assert f"tensors     4 ({SPEC.num_parameters():,} values)" in text
    assert "optimizer   adam, lr 0.005, step 5, 8 slots" in text
    assert "scaler      none" in text
    bare = describe_checkpoint(save_checkpoint(tmp_path / "b", params={"w": np.zeros(2)}))
    assert "model       ? (no spec: a user model)" in bare and "optimizer   none" in bare
