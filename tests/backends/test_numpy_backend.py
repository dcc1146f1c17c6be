"""The numpy backend: a plugin with no framework behind it.

Its gradients through every layer kind against finite differences (a numpy-only install
has no other backend to compare with), its fp64 training step for step against the
framework backends through the command line, how it is picked when no backend is
named, what it refuses (GPUs, mixed precision, several processes), and a fresh
``pip install polytrain`` with nothing else training and comparing with it.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from polytrain import BackendError, get_backend
from polytrain.backend.base import Backend, Model
from polytrain.cli.main import main
from polytrain.distributed.cluster import ClusterInfo
from polytrain.neutral.models import (
    AvgPool2d,
    Dropout,
    Flatten,
    Linear,
    MaxPool2d,
    ModelSpec,
    get_model_spec,
    seq,
)
from polytrain.plugins.registry import (
    PluginManager,
    make_plugin_manager,
    registered_launchers,
    resolve_backend_name,
)
from polytrain.testing import backends_under_test, batch, pooling_spec, tiny_resnet
from polytrain.training.builtin_plugins import read_metrics

REPO = Path(__file__).resolve().parents[2]
MNIST_T10K = Path(__file__).parents[1] / "fixtures" / "mnist-t10k"
FRAMEWORKS = ("torch", "paddle", "mxnet", "tensorflow", "jax")


@pytest.fixture(scope="module")
def backend() -> Backend:
    return get_backend("numpy")


# -- gradients of every layer kind ---------------------------------------------------------------


def _loss(b: Backend, model: Model, x: np.ndarray, y: np.ndarray) -> float:
    with b.record():
        loss = b.cross_entropy(b.forward(model, b.to_tensor(x), train=True), b.to_tensor(y))
    return float(b.to_numpy(loss))


@pytest.mark.parametrize(
    "name", ["tiny-resnet", "lenet", "paddle-mnist", "avg-pad-ceil", "avg-ceil", "max-pad"]
)
def test_gradients_match_finite_differences(backend: Backend, name: str) -> None:
    """Conv (stride, padding), BatchNorm in training, residual, max/avg pooling (padding,
    ceil_mode), global pooling and Linear: backward equals central differences in fp64."""
    pools: dict[str, AvgPool2d | MaxPool2d] = {
        "avg-pad-ceil": AvgPool2d(3, 2, padding=1, ceil_mode=True),
        "avg-ceil": AvgPool2d(2, 2, ceil_mode=True),
        "max-pad": MaxPool2d(3, 2, padding=1),
    }
    if name in pools:
        spec = pooling_spec(pools[name])
    else:
        spec = tiny_resnet() if name == "tiny-resnet" else get_model_spec(name)
    model = backend.build_model(spec, dtype="float64")
    rng = np.random.default_rng(3)
    params = {k: v.astype(np.float64) for k, v in spec.init_params(seed=5).items()}
    for k in params:  # away from zero, so that ReLU kinks and max ties stay away too
        if not k.endswith(("running_mean", "running_var")):
            params[k] = params[k] + rng.normal(0, 0.05, params[k].shape)
    backend.set_params(model, params)
    x, y = batch(spec, 4, seed=1)
    x = x.astype(np.float64)
    with backend.record():
        logits = backend.forward(model, backend.to_tensor(x), train=True)
        loss = backend.cross_entropy(logits, backend.to_tensor(y))
    backend.backward(loss)
    grads = backend.gradients(model)
    h = 1e-6
    for k in backend.parameter_names(model):
        flat = params[k].reshape(-1)
        for i in rng.choice(flat.size, size=min(flat.size, 6), replace=False):
            moved = []
            for step in (h, -h):
                changed = {**params, k: params[k].copy()}
                changed[k].reshape(-1)[i] += step
                backend.set_params(model, changed)
                moved.append(_loss(backend, model, x, y))
            numeric = (moved[0] - moved[1]) / (2 * h)
            assert abs(grads[k].reshape(-1)[i] - numeric) < 1e-6 + 1e-5 * abs(numeric), (k, i)


def test_dropout_is_seeded_and_scaled_in_training_only(backend: Backend) -> None:
    spec = ModelSpec(
        "drop",
        seq(("flatten", Flatten()), ("drop", Dropout(0.25)), ("fc", Linear(16, 10, bias=False))),
        input_shape=(1, 4, 4),
    )
    model = backend.build_model(spec, dtype="float64")
    weight = np.zeros((10, 16))
    weight[np.arange(10), np.arange(10)] = 1.0  # logit j is input j
    backend.set_params(model, {"fc.weight": weight})
    x = np.ones((64, 1, 4, 4))
    runs = []
    for _ in range(2):
        backend.seed(7)
        runs.append(backend.to_numpy(backend.forward(model, backend.to_tensor(x), train=True)))
    np.testing.assert_array_equal(runs[0], runs[1])
    assert set(np.unique(runs[0])) == {0.0, 1 / 0.75}
    assert 0.15 < float(np.mean(runs[0] == 0)) < 0.35
    evaluated = backend.to_numpy(backend.forward(model, backend.to_tensor(x)))
    np.testing.assert_array_equal(evaluated, np.ones((64, 10)))


# -- fp64 through the command line, step for step ------------------------------------------------


def _cli_losses(name: str, out: Path) -> list[float]:
    argv = ["train", "--backend", name, "--precision", "fp64", "--model", "lenet",
            "--train-samples", "640", "--test-samples", "100", "--batch-size", "64",
            "--optimizer", "momentum", "--lr", "0.05", "--epochs", "1", "--out", str(out),
            "--quiet"]  # fmt: skip
    assert main(argv) == 0
    return [r["loss"] for r in read_metrics(out / "metrics.jsonl") if r["event"] == "step"]


@pytest.mark.slow
def test_cli_fp64_training_equals_every_framework_step_by_step(tmp_path: Path) -> None:
    others = [n for n in backends_under_test() if n != "numpy"]
    if not others:
        pytest.skip("no framework backend to compare with")
    mine = _cli_losses("numpy", tmp_path / "numpy")
    assert len(mine) == 10 and mine[-1] < mine[0] - 0.3, mine  # it trained
    for name in others:
        theirs = _cli_losses(name, tmp_path / name)
        np.testing.assert_allclose(mine, theirs, rtol=0, atol=1e-10, err_msg=name)


# -- how it is picked, what it refuses -----------------------------------------------------------


def _manager(*modules: str) -> PluginManager:
    pm = make_plugin_manager(autoload=False)
    for module in modules:
        pm.register(importlib.import_module(module), name=module)
    return pm


def test_picked_unnamed_only_when_it_is_the_only_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("POLYTRAIN_BACKEND", raising=False)
    assert resolve_backend_name(None, _manager("polytrain_numpy")).name == "numpy"
    if "torch" in backends_under_test():  # only torch besides: torch, without naming it
        pm = _manager("polytrain_numpy", "polytrain_torch")
        assert resolve_backend_name(None, pm).name == "torch"
        assert resolve_backend_name("numpy", pm).name == "numpy"
    if {"torch", "paddle"} <= set(backends_under_test()):
        pm = _manager("polytrain_numpy", "polytrain_torch", "polytrain_paddle")
        with pytest.raises(BackendError, match="Several backends are installed"):
            resolve_backend_name(None, pm)


def test_one_process_no_gpu_no_mixed_precision(backend: Backend) -> None:
    two = ClusterInfo(0, 0, 2, 2, 0, 1, "127.0.0.1", 29500, "test")
    with pytest.raises(BackendError, match="numpy backend runs in one process only"):
        backend.init_distributed(two, backend.devices("cpu"))
    backend.init_distributed(ClusterInfo(0, 0, 1, 1, 0, 1, None, None, "test"), [])
    assert registered_launchers()["numpy"].unsupported
    assert backend.gpu_count() == 0 and backend.try_all_gpus() == [backend.device("cpu")]
    with pytest.raises(BackendError, match="no GPU"):
        backend.device("gpu:0")
    support = backend.precision_support()
    assert [p for p, s in support.items() if s.supported] == ["fp32", "fp64"]
    assert "no bfloat16" in support["bf16"].detail and "float16" in support["fp16"].detail


def test_backward_twice_through_a_freed_graph_is_an_error(backend: Backend) -> None:
    spec = get_model_spec("mlp")
    model = backend.build_model(spec)
    x, y = batch(spec, 4)
    with backend.record():
        loss = backend.cross_entropy(backend.forward(model, backend.to_tensor(x), train=True),
                                     backend.to_tensor(y))  # fmt: skip
    backend.backward(loss)
    with pytest.raises(BackendError, match="second time"):
        backend.backward(loss)
    evaluated = backend.cross_entropy(backend.forward(model, backend.to_tensor(x)),
                                      backend.to_tensor(y))  # fmt: skip
    with pytest.raises(BackendError, match="depends on no parameter"):
        backend.backward(evaluated)


# -- pip install polytrain, and nothing else -----------------------------------------------------


@pytest.mark.slow
def test_fresh_install_trains_and_compares_with_numpy_alone(tmp_path: Path) -> None:
    """A new venv with ``pip install polytrain`` (from this repository; numpy and the
    pure-Python dependencies from the package index): no framework is imported, numpy
    is the backend picked, and ``polytrain compare --backends numpy`` runs end to end."""
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("polytrain", "backends"):
        shutil.copytree(REPO / name, source / name, ignore=ignore)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("POLYTRAIN_", "PYTHON"))}

    def outside(cmd: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
        """Run away from the repository, whose polytrain would be importable from its cwd."""
        return subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True,
                              timeout=timeout, check=False)  # fmt: skip

    pip = outside([python, "-m", "pip", "install", "-q", str(source)], 600)
    assert pip.returncode == 0, pip.stderr[-3000:]
    probe = (
        "import json, sys, polytrain; names = polytrain.installed_backends(); "
        "b = polytrain.get_backend(); "
        f"print(json.dumps([polytrain.__file__, names, b.name, "
        f"sorted(set({FRAMEWORKS!r}) & set(sys.modules))]))"
    )
    out = outside([python, "-c", probe], 120)
    assert out.returncode == 0, out.stderr[-3000:]
    where, *found = json.loads(out.stdout)
    assert where.startswith(str(venv)), f"polytrain imported from {where}, not the new venv"
    assert found == [["numpy"], "numpy", []], out.stdout
    data = tmp_path / "mnist"  # the test split stands in for the train split too
    data.mkdir()
    for part in ("images-idx3-ubyte.gz", "labels-idx1-ubyte.gz"):
        for split in ("train", "t10k"):
            (data / f"{split}-{part}").symlink_to(MNIST_T10K / f"t10k-{part}")
    cmd = [str(venv / "bin" / "polytrain"), "compare", "--backends", "numpy", "--dataset",
           "mnist", "--data-dir", str(data), "--train-samples", "256", "--test-samples", "200",
           "--batch-size", "64", "--epochs", "1", "--out", str(tmp_path / "cmp"),
           "--quiet"]  # fmt: skip
    run = outside(cmd, 300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    report = json.loads((tmp_path / "cmp" / "comparison.json").read_text())
    assert [r["backend"] for r in report["runs"]] == ["numpy"]
    assert len(report["runs"][0]["step_losses"]) == 4
