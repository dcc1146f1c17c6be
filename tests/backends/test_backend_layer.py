"""The shared backend layer (polytrain.backend): helpers every backend uses, and the
typed models a backend keeps, which another backend refuses instead of misreading."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest

from polytrain import BackendError, CheckpointError, OptimizerConfig, get_backend
from polytrain.backend.base import Model
from polytrain.backend.capture import capture_outputs, inspected_layers
from polytrain.backend.devices import split_device_name
from polytrain.backend.factory import backend_factory
from polytrain.backend.identity import BackendOptions
from polytrain.backend.mismatch import check_params, compare_names, compare_shapes
from polytrain.backend.optimizers import PerReplicaOptimizer
from polytrain.backend.precision_verbs import probe_float64
from polytrain.testing import backends_under_test, tiny_resnet
from polytrain.utils.threads import THREAD_VARS

BUILT_IN = [n for n in ("torch", "paddle", "mxnet") if n in backends_under_test()]

# -- parameter mismatches -------------------------------------------------------------------


def test_one_wording_for_missing_unexpected_and_misshapen() -> None:
    given = {"b": np.zeros(4), "c": np.zeros(1)}
    with pytest.raises(CheckpointError) as info:
        check_params({"a": (2,), "b": (3,)}, given, tuple)
    assert str(info.value) == (
        "Parameters do not match the model: missing a; unexpected c; "
        "wrong shape b (4,) (expected (3,))."
    )


def test_long_name_lists_are_cut_and_equal_sets_agree() -> None:
    mismatch = compare_names([f"p{i}" for i in range(10)], ["p0", "q"])
    assert mismatch.describe(limit=3) == "missing p1, p2, p3, ... and 6 more; unexpected q"
    assert not compare_shapes({"a": (1, 2)}, {"a": (1, 2)})


# -- devices --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["cpu:x", "tpu", "gpu:-1", "cpu:1:2", ""])
def test_malformed_device_names_are_backend_errors(name: str) -> None:
    with pytest.raises(BackendError, match="Unknown device name"):
        split_device_name(name)


@pytest.mark.slow
def test_every_backend_names_its_devices_back(backend_name: str) -> None:
    backend = get_backend(backend_name)
    for name in ("cpu:0", "cpu:3"):
        assert backend.device_name(backend.device(name)) == name
    with pytest.raises(BackendError, match="Unknown device name 'cpu:x'"):
        backend.device("cpu:x")


# -- typed models ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("builder", "user"), [(a, b) for a in BUILT_IN for b in BUILT_IN if a != b]
)
def test_a_model_of_another_backend_is_refused(builder: str, user: str) -> None:
    model = get_backend(builder).build_model(tiny_resnet())
    backend = get_backend(user)
    with pytest.raises(BackendError, match="build the model with the backend that runs it"):
        backend.parameter_names(model)
    plain = Model(native=model.native, devices=model.devices, replicas=model.replicas)
    with pytest.raises(BackendError, match="got a Model"):
        backend.get_params(plain)


def test_every_backend_inspects_the_same_layers() -> None:
    spec = tiny_resnet()
    names: dict[str, list[str]] = {}
    for name in BUILT_IN:
        backend = get_backend(name)
        model = backend.build_model(spec)
        x = backend.to_tensor(np.zeros((2, *spec.input_shape), np.float32))
        names[name] = [n for n, _ in backend.layer_outputs(model, x)]
    forward_order = ["conv1", "bn1", "relu", "block.shortcut.conv", "block.body.conv1"]
    forward_order += ["block.body.bn1", "block.body.relu", "block.body.conv2", "block.body.bn2"]
    forward_order += ["block", "pool", "gap", "flatten", "fc"]  # the residual block: its sum
    assert names == dict.fromkeys(BUILT_IN, forward_order)


# -- layer-output capture -------------------------------------------------------------------


class _Node:
    def __init__(self, **children: _Node) -> None:
        self.children = children
        self.hooks: list[Any] = []


class _Residual(_Node):
    pass


def test_inspected_layers_are_leaves_and_residual_blocks_once_each() -> None:
    shared = _Node()
    root = _Node(a=_Node(x=_Node(), y=shared), b=_Residual(body=_Node()), c=shared)
    layers = inspected_layers(root, lambda n: n.children.items())
    assert [name for name, _ in layers] == ["a.x", "a.y", "b", "b.body"]


def test_capture_runs_hooks_in_order_and_always_removes_them() -> None:
    layers = [("one", _Node()), ("two", _Node())]

    def attach(layer: _Node, hook: Any) -> Any:
        layer.hooks.append(hook)
        return lambda: layer.hooks.remove(hook)

    def run() -> None:
        for i, (_, layer) in enumerate(reversed(layers)):
            for hook in layer.hooks:
                hook(layer, (), np.full(2, i))

    got = capture_outputs(layers, attach, np.asarray, run)
    assert [(n, list(v)) for n, v in got] == [("two", [0, 0]), ("one", [1, 1])]
    assert all(not layer.hooks for _, layer in layers)

    def fail() -> None:
        raise RuntimeError("forward failed")

    with pytest.raises(RuntimeError):
        capture_outputs(layers, attach, np.asarray, fail)
    assert all(not layer.hooks for _, layer in layers)


# -- optimizers, precision probes, factories ------------------------------------------------


class _NativeOptimizer:
    def __init__(self) -> None:
        self.lrs: list[float] = []
        self.steps = 0

    def step(self) -> None:
        self.steps += 1


class _Optimizer(PerReplicaOptimizer):
    def _apply_lr(self, optimizer: _NativeOptimizer, lr: float) -> None:
        optimizer.lrs.append(lr)

    def zero_grad(self) -> None:
        pass

    def get_slots(self) -> dict[str, dict[str, np.ndarray]]:
        return {}

    def set_slots(self, slots: dict[str, dict[str, np.ndarray]]) -> None:
        pass


def test_a_new_learning_rate_reaches_every_replica_once() -> None:
    model = Model(native=None, devices=["a", "b"], replicas=[None, None])
    opt = _Optimizer(model, OptimizerConfig(lr=0.1), lambda m, i, c: _NativeOptimizer())
    opt.step()
    opt.set_lr(0.1)
    opt.step()
    opt.set_lr(0.05)
    opt.step()
    opt.step()
    assert [(o.lrs, o.steps) for o in opt.optimizers] == [([0.05], 4), ([0.05], 4)]
    assert opt.step_count == 4


def test_the_float64_probe_reports_refusals_and_wrong_dtypes() -> None:
    def refuses() -> tuple[Any, Any]:
        raise RuntimeError("no float64 kernel")

    assert probe_float64("fw", lambda: (np.float64, np.float64), np.float64).supported
    refused = probe_float64("fw", refuses, np.float64)
    assert not refused.supported and refused.detail == "fw float64 failed: no float64 kernel"
    no_grad = probe_float64("fw", lambda: (np.float64, None), np.float64)
    assert not no_grad.supported and "fw computed" in no_grad.detail


class _Built:
    def __init__(self, options: BackendOptions) -> None:
        self.options = options
        self.threads: int | None = None

    def set_threads(self, n: int) -> None:
        self.threads = n


def test_the_factory_exports_threads_before_the_framework_loads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for var in THREAD_VARS:
        monkeypatch.setenv(var, "1")  # restored afterwards: the factory exports its count
    monkeypatch.setenv("POLYTRAIN_THREADS", "3")
    seen: dict[str, str] = {}

    def load() -> Any:
        seen.update({var: os.environ[var] for var in THREAD_VARS})
        return _Built

    backend: Any = backend_factory(load)(BackendOptions())
    assert seen == dict.fromkeys(THREAD_VARS, "3")
    assert backend.threads == 3
