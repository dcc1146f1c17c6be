"""Per-step overhead removed without changing a number (docs/performance.md, "Where
polytrain's step time goes"): torch's split_and_load shares the loader's fresh batch
instead of copying it, and training on a shared batch gives the same losses, bit for bit,
as on a copied one."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from polytrain import get_backend
from polytrain.neutral.models import get_model_spec
from polytrain.neutral.optim import OptimizerConfig
from polytrain.training.step import StepRunner

torch = pytest.importorskip("torch")


def _batch(n: int = 6) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, 1, 28, 28))
    return x, rng.integers(0, 10, n).astype(np.int64)


def test_torch_split_and_load_shares_a_writeable_batch() -> None:
    b = get_backend("torch")
    x, _ = _batch()
    shards = b.split_and_load(x, b.devices("cpu:2"))
    assert [len(s) for s in shards] == [3, 3]
    assert shards[0].data_ptr() == x.ctypes.data  # no copy
    assert shards[1].data_ptr() == x[3:].ctypes.data
    np.testing.assert_array_equal(np.concatenate([s.numpy() for s in shards]), x)


def test_torch_split_and_load_copies_a_read_only_batch_without_warning() -> None:
    b = get_backend("torch")
    x, _ = _batch()
    x.flags.writeable = False
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch warns on a non-writable array it shares
        (shard,) = b.split_and_load(x, b.devices("cpu"))
    assert shard.data_ptr() != x.ctypes.data
    np.testing.assert_array_equal(shard.numpy(), x)


def test_torch_split_and_load_copies_a_batch_that_is_not_c_ordered() -> None:
    b = get_backend("torch")
    x = np.asfortranarray(_batch()[0])
    (shard,) = b.split_and_load(x, b.devices("cpu"))
    assert shard.data_ptr() != x.ctypes.data and shard.is_contiguous()
    np.testing.assert_array_equal(shard.numpy(), x)


def test_shared_and_copied_batches_train_to_the_same_losses_in_fp64() -> None:
    b = get_backend("torch")
    spec = get_model_spec("lenet")

    def losses(read_only: bool) -> list[float]:
        model = b.build_model(spec, b.devices("cpu:2"), dtype="float64")
        b.set_params(model, spec.init_params(0))
        opt = b.make_optimizer(model, OptimizerConfig("momentum", lr=0.05, momentum=0.9))
        runner = StepRunner(b, model, opt, precision="fp64")
        out = []
        for step in range(3):
            x, y = _batch()
            x = x + step
            x.flags.writeable = not read_only
            out.append(runner.train_step(x, y).loss_sum)
        return out

    assert losses(read_only=False) == losses(read_only=True)
