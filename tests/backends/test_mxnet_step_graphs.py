"""MXNet's per-step overhead removed without changing a number (docs/performance.md,
"MXNet's step graphs"): the cross-entropy and the accuracy count run as cached graphs
with the floats of their operators run one by one, held counts stay as computed, and a
batch is shared with cpu(0) only where no operator can read it after the step."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from polytrain import get_backend

mx = pytest.importorskip("mxnet")
from mxnet import autograd  # noqa: E402
from polytrain_mxnet import _engine  # noqa: E402


def _op_by_op(logits: object, labels: object, mean: bool) -> object:
    """The cross_entropy verb's operators one by one, as it ran them before its graph."""
    logp = mx.nd.log_softmax(logits.astype("float64"), axis=1)  # type: ignore[attr-defined]
    losses = -mx.nd.pick(logp, labels.reshape((-1,)), axis=1)  # type: ignore[attr-defined]
    total = losses.mean() if mean else losses.sum()
    return total.astype("float64" if logits.dtype == np.float64 else "float32")  # type: ignore[attr-defined]


def _loss_and_grad(
    fn: object, x: object, w: object, labels: object
) -> tuple[np.ndarray, np.ndarray]:
    w.attach_grad()  # type: ignore[attr-defined]
    with autograd.record():
        loss = fn(mx.nd.dot(x, w), labels)  # type: ignore[operator]
    loss.backward()
    return loss.asnumpy(), w.grad.asnumpy()  # type: ignore[attr-defined]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_cross_entropy_graph_gives_the_operators_floats_bit_for_bit(
    dtype: str, reduction: str
) -> None:
    b = get_backend("mxnet")
    rng = np.random.default_rng(0)
    for n in (64, 23, 64):  # another batch size is planned again, then the first again
        x = mx.nd.array(rng.standard_normal((n, 7)) * 4, dtype=dtype)
        w = mx.nd.array(rng.standard_normal((7, 10)), dtype=dtype)
        labels = mx.nd.array(rng.integers(0, 10, n), dtype="int64")
        got = _loss_and_grad(lambda lo, la: b.cross_entropy(lo, la, reduction), x, w, labels)
        want = _loss_and_grad(lambda lo, la: _op_by_op(lo, la, reduction == "mean"), x, w, labels)
        assert got[0].dtype == want[0].dtype == np.dtype(dtype)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])
    # one cached graph per reduction and dtype, not one per call
    assert list(b._graphs._blocks) == [("ce", str(reduction == "mean"), dtype)]


def test_count_correct_graph_counts_and_held_counts_stay_as_computed() -> None:
    b = get_backend("mxnet")
    rng = np.random.default_rng(1)
    held, want = [], []
    for n, dtype in [(50, "float32"), (17, "float32"), (50, "float64")]:
        logits = rng.standard_normal((n, 10))
        labels = rng.integers(0, 10, n)
        with autograd.record():  # as inside a training step
            held.append(b.count_correct(mx.nd.array(logits, dtype=dtype), mx.nd.array(labels)))
        want.append(int((logits.argmax(axis=1) == labels).sum()))
    assert [int(c.asscalar()) for c in held] == want  # later calls did not overwrite them
    assert sorted(k[1] for k in b._graphs._blocks if k[0] == "count") == ["float32", "float64"]


def test_half_precision_logits_run_op_by_op() -> None:
    b = get_backend("mxnet")
    logits = mx.nd.array([[0.0, 2.0], [3.0, 1.0]], dtype="float16")
    labels = mx.nd.array([1, 1], dtype="int64")
    assert int(b.count_correct(logits, labels).asscalar()) == 1
    assert b.cross_entropy(logits, labels, "sum").dtype == np.float32
    assert not b._graphs._blocks


def _run(code: str, engine: str) -> str:
    """stdout of ``code`` in a fresh process on ``engine`` (fixed at mxnet's import)."""
    env = {k: v for k, v in os.environ.items() if k != _engine.CHOSEN_VAR}
    env[_engine.ENGINE_VAR] = engine
    run = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-1500:]
    return run.stdout


SHARES = """
import mxnet as mx, numpy as np
from polytrain import get_backend
b = get_backend("mxnet")
x = np.arange(6 * 4, dtype=np.float32).reshape(6, 4)
first, second = b.split_and_load(x, b.devices("cpu:2"))
assert (first.context, second.context) == (mx.cpu(0), mx.cpu(1))
x[0, 0] = x[5, 0] = -1.0  # fails if the caller's batch was frozen
base = np.ones((4, 3), np.float32)
view = base.view()
view.flags.writeable = False
(frozen,) = b.split_and_load(view, b.devices("cpu"))
base[:] = 7.0
print(first.asnumpy()[0, 0], second.asnumpy()[2, 0], frozen.asnumpy().max())
"""


@pytest.mark.slow
def test_naive_engine_shares_a_writeable_batch_with_cpu0_only() -> None:
    # cpu(0)'s shard sees the change (shared); cpu(1)'s and a read-only batch's do not
    assert _run(SHARES, _engine.NAIVE).split() == ["-1.0", "20.0", "1.0"]


@pytest.mark.slow
def test_the_threaded_engine_copies_every_batch() -> None:
    # its operators may read a batch after the step returned
    assert _run(SHARES, _engine.THREADED).split() == ["0.0", "20.0", "1.0"]


TRAIN = """
import numpy as np
from polytrain import get_backend
from polytrain.neutral.models import get_model_spec
from polytrain.neutral.optim import OptimizerConfig
from polytrain.training.step import StepRunner
b = get_backend("mxnet")
spec = get_model_spec("lenet")
for read_only in (False, True):
    model = b.build_model(spec, b.devices("cpu:2"), dtype="float64")
    b.set_params(model, spec.init_params(0))
    opt = b.make_optimizer(model, OptimizerConfig("momentum", lr=0.05, momentum=0.9))
    runner = StepRunner(b, model, opt, precision="fp64")
    rng = np.random.default_rng(0)
    losses = []
    for _ in range(3):
        x = rng.standard_normal((6, 1, 28, 28))
        x.flags.writeable = not read_only
        losses.append(runner.train_step(x, rng.integers(0, 10, 6)).loss_sum)
    print(repr(losses))
"""


@pytest.mark.slow
def test_shared_and_copied_batches_train_to_the_same_losses_in_fp64() -> None:
    shared, copied = _run(TRAIN, _engine.NAIVE).splitlines()
    assert shared == copied
