"""Data parallelism in one process (the global-batch gradient contract in
docs/architecture.md): N emulated devices equal one device.

One training step of LeNet on N devices (the StepRunner: a shard per device, each
shard's summed loss divided by the global batch size, gradients summed over replicas,
an update on every replica) must give the parameters of one step on one device with
the whole batch and the plain mean loss; and replicas must stay identical over steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from polytrain import Backend, OptimizerConfig, get_backend, get_model_spec
from polytrain.data import ArrayDataset
from polytrain.neutral.optim import OPTIMIZERS
from polytrain.testing import backends_under_test
from polytrain.training.recipe import Recipe
from polytrain.training.step import StepRunner
from polytrain.training.trainer import Datasets, Trainer

SPEC = get_model_spec("lenet")
# Each optimizer at PyTorch's default learning rate (SGD at d2l's 0.1).
LR = {"sgd": 0.1, "momentum": 0.05, "adagrad": 0.01, "adam": 0.001}
TOL = 1e-6


def batch(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng([seed, 4])
    x = rng.standard_normal((n, *SPEC.input_shape)).astype(np.float32)
    return x, rng.integers(0, 10, n).astype(np.int64)


def config(name: str) -> OptimizerConfig:
    return OptimizerConfig(name=name, lr=LR[name], momentum=0.9)


def one_device_full_batch(
    backend: Backend, name: str, x: np.ndarray, y: np.ndarray
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The reference: one device, the whole batch, the plain mean loss (no StepRunner)."""
    model = backend.build_model(SPEC, [backend.device("cpu")])
    backend.set_params(model, SPEC.init_params(seed=0))
    opt = backend.make_optimizer(model, config(name))
    opt.zero_grad()
    xt, yt = backend.to_tensor(x), backend.to_tensor(y)
    with backend.record():
        loss = backend.cross_entropy(backend.forward(model, xt, train=True), yt, "mean")
    backend.backward(loss)
    grads = backend.gradients(model)
    opt.step()
    return backend.get_params(model), grads


def adam_excess(
    got: dict[str, np.ndarray],
    want: dict[str, np.ndarray],
    grads: dict[str, np.ndarray],
    want_grads: dict[str, np.ndarray],
) -> float:
    """How far one Adam step's parameters differ beyond what Adam itself makes of the
    gradients' float32 difference.

    Adam's first update is lr * g / (|g| + eps), whose slope lr * eps / (|g| + eps)^2
    reaches lr / eps = 1e5 near g = 0. LeNet has conv2 gradients of ~2e-8 (sums of
    terms of ~1e-2 that cancel), where summing per-shard gradients instead of one
    batch changes g by ~2e-10 and so the update by ~2e-6, though every gradient agrees
    to 1e-7. Elementwise, the difference may exceed TOL by at most that slope times
    the measured gradient difference (with a 2x margin for the rounding of the step)."""
    cfg = config("adam")
    worst = 0.0
    for k in want:
        g = np.minimum(np.abs(grads[k]), np.abs(want_grads[k])).astype(np.float64)
        slope = cfg.lr * cfg.epsilon / (g + cfg.epsilon) ** 2
        bound = TOL + 2 * slope * np.abs(grads[k].astype(np.float64) - want_grads[k])
        worst = max(worst, float(np.max(np.abs(got[k].astype(np.float64) - want[k]) - bound)))
    return worst


def max_diff(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    assert a.keys() == b.keys()
    return max(float(np.max(np.abs(a[k].astype(np.float64) - b[k]))) for k in a)


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", OPTIMIZERS)
@pytest.mark.parametrize("n", [1, 2, 3])
def test_step_on_n_devices_equals_one_device(backend: Backend, optimizer: str, n: int) -> None:
    x, y = batch(10, seed=1)  # over 3 devices: shards of 4, 3, 3
    want_params, want_grads = one_device_full_batch(backend, optimizer, x, y)
    model = backend.build_model(SPEC, backend.devices(f"cpu:{n}"))
    backend.set_params(model, SPEC.init_params(seed=0))
    opt = backend.make_optimizer(model, config(optimizer))
    StepRunner(backend, model, opt).train_step(x, y)
    for replica in range(n):
        grads = backend.gradients(model, replica)  # summed over replicas, not yet zeroed
        assert max_diff(grads, want_grads) <= TOL, f"gradients of replica {replica}"
        got = backend.get_params(model, replica)
        diff = max_diff(got, want_params)
        where = f"{backend.name} {optimizer} cpu:{n} replica {replica}: {diff:.2e}"
        if optimizer == "adam":  # see adam_excess: at most ~1e-5 on LeNet
            assert adam_excess(got, want_params, grads, want_grads) <= 0, where
            assert diff <= 1e-5, where
        else:
            assert diff <= TOL, where


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_replicas_stay_identical(backend: Backend, optimizer: str) -> None:
    model = backend.build_model(SPEC, backend.devices("cpu:3"))
    backend.set_params(model, SPEC.init_params(seed=2))
    runner = StepRunner(backend, model, backend.make_optimizer(model, config(optimizer)))
    for step in range(20):
        runner.train_step(*batch(8 + step % 5, seed=100 + step))  # 8..12: uneven shards
    first = backend.get_params(model, 0)
    assert max_diff(first, backend.get_params(model)) == 0.0  # the default is replica 0
    for replica in (1, 2):  # every replica applies the same update to the same summed
        diff = max_diff(backend.get_params(model, replica), first)  # gradient: bitwise
        assert diff == 0.0, f"replica {replica} drifted by {diff:.2e}"


@pytest.mark.slow
def test_trainer_on_three_devices_matches_one(backend: Backend) -> None:
    """The recipe loop (``polytrain train --devices cpu:3``): same losses, same accuracy."""
    rng = np.random.default_rng(7)
    images = rng.integers(0, 256, (200, 28, 28), dtype=np.uint8)
    labels = (images[:, 10:18, 10:18].mean(axis=(1, 2)) > 127).astype(np.int64)
    data = Datasets(
        ArrayDataset(images[:160], labels[:160]), ArrayDataset(images[160:], labels[160:])
    )
    results = []
    for devices in ("cpu", "cpu:3"):
        recipe = Recipe(epochs=1, batch_size=32, devices=devices, optimizer="momentum", lr=0.05)
        trainer = Trainer(recipe, backend, datasets=data, progress=False)
        summary = trainer.fit()
        results.append((summary.epochs[0], backend.get_params(trainer.model)))
    (one, p1), (three, p3) = results
    assert abs(one.train_loss - three.train_loss) < 1e-6
    assert one.test_metric == three.test_metric
    assert max_diff(p1, p3) < 1e-5  # five steps of momentum SGD


# Backends that sum gradients in flat buckets (MXNet's go through its kvstore, key by key).
BUCKETED = [b for b in ("torch", "paddle") if b in backends_under_test()]


def _counting_allreduce(backend: Backend) -> list[int]:
    """Count the calls of the per-parameter collective (the backend's own allreduce)."""
    calls = [0]
    allreduce = backend.allreduce

    def counted(tensors: Sequence[Any], op: str) -> None:
        calls[0] += 1
        allreduce(tensors, op)

    backend.allreduce = counted  # type: ignore[method-assign]
    return calls


@pytest.mark.slow
@pytest.mark.parametrize("name", BUCKETED)
def test_bucketed_sync_equals_the_per_parameter_path(name: str) -> None:
    """20 momentum steps on ``cpu:3``: buckets of 10 kB (LeNet's 8 gradients in 5
    buckets) and one 25 MB bucket give what one collective per parameter gives."""
    params, calls = [], []
    for mb in (0.0, 0.01, None):  # 0: per parameter; None: the 25 MB default
        backend = get_backend(name, bucket_mb=mb)
        calls.append(_counting_allreduce(backend))
        model = backend.build_model(SPEC, backend.devices("cpu:3"))
        backend.set_params(model, SPEC.init_params(seed=2))
        runner = StepRunner(backend, model, backend.make_optimizer(model, config("momentum")))
        for step in range(20):
            runner.train_step(*batch(8 + step % 5, seed=100 + step))
        params.append([backend.get_params(model, r) for r in range(3)])
    per_parameter, *bucketed = params
    for got in bucketed:
        for replica in range(3):
            assert max_diff(got[replica], per_parameter[replica]) <= TOL
    assert calls[0][0] == 20 * len(backend.parameter_names(model))  # one per parameter and step
    assert calls[1][0] == calls[2][0] == 0  # buckets never take the per-parameter path
