"""The d2l MXNet multi-GPU seed (tests/fixtures/port_code/d2l_multi_gpu_mxnet.py: LeNet on
raw NDArrays, ``attach_grad``, ``for l in ls: l.backward()``, a hand-written allreduce,
``d2l.sgd``) converted by ``polytrain port-code`` trains on PyTorch with the same per-step
losses as the original on MXNet: 2 devices, 20 steps of the seed's ``train_batch``, from
the same weights and batches.

Seams (nothing of MXNet or PyTorch is replaced):

- ``d2lzh``, the book's helper package, is a module put in ``sys.modules``: for the
  original, the book's ``sgd`` (its code) and a ``load_data_fashion_mnist`` giving fixed
  random batches; for the converted script only that loader, in PyTorch tensors (the one
  ``d2lzh`` use left marked, with what to supply; ``d2l.sgd`` became ``d2lzh_sgd``).
- Devices: both files run whole, top-level demos included, from a copy whose device
  constructors name the CPU: the original's ``mx.gpu(`` becomes ``mx.cpu(`` (``cpu(0)``
  and ``cpu(1)`` are two MXNet contexts) and its ``.device``, MXNet 2's name, becomes
  ``.context``, MXNet 1.9.1's; the converted script's ``torch.device('cuda', `` becomes
  ``torch.device('cpu', ``.
- Weights: the seed draws them with ``nd.random.normal``; those arrays (cast to the
  test's dtype) are given to both ``get_params`` calls, one per device.

The loss compared is the seed's own (``SoftmaxCrossEntropyLoss`` / ``CrossEntropyLoss``),
its mean over the whole batch with each device's parameter copy, before each step (the
seed's allreduce adds device 1's gradients into device 0's but broadcasts nothing back:
``copyto(device)`` returns a new array, in both, so the two copies part)."""

from __future__ import annotations

import runpy
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from polytrain.cli.main import main
from polytrain.porting.code import convert_source

mx = pytest.importorskip("mxnet")
torch = pytest.importorskip("torch")

SEED = Path(__file__).parent / "fixtures" / "port_code" / "d2l_multi_gpu_mxnet.py"
STEPS, BATCH, LR = 20, 8, 3.0
TOLERANCE = {"float32": 1e-5, "float64": 1e-10}
SEAMS_MXNET = {"mx.gpu(": "mx.cpu(", ".device)": ".context)"}
SEAMS_TORCH = {"torch.device('cuda', ": "torch.device('cpu', "}


def _batches(dtype: str) -> list[tuple[np.ndarray, np.ndarray]]:
    """Fashion-MNIST-shaped batches: images in [0, 1), labels 0-9."""
    rng = np.random.default_rng(0)
    return [
        (rng.random((BATCH, 1, 28, 28)).astype(dtype), rng.integers(0, 10, BATCH))
        for _ in range(STEPS)
    ]


def _d2lzh_mxnet(batches: list[tuple[np.ndarray, np.ndarray]]) -> types.ModuleType:
    module = types.ModuleType("d2lzh")

    def sgd(params: list[Any], lr: float, batch_size: int) -> None:  # the book's code
        for param in params:
            param[:] = param - lr * param.grad / batch_size

    def load_data_fashion_mnist(batch_size: int) -> tuple[list[Any], list[Any]]:
        assert batch_size == BATCH
        data = [(mx.nd.array(x, dtype=x.dtype), mx.nd.array(y, dtype="int32")) for x, y in batches]
        return data, []

    module.__dict__.update(sgd=sgd, load_data_fashion_mnist=load_data_fashion_mnist)
    return module


def _d2lzh_torch(batches: list[tuple[np.ndarray, np.ndarray]]) -> types.ModuleType:
    """What the marker asks for: PyTorch batches of the same data (no ``sgd``: converted)."""
    module = types.ModuleType("d2lzh")

    def load_data_fashion_mnist(batch_size: int) -> tuple[list[Any], list[Any]]:
        assert batch_size == BATCH
        return [(torch.from_numpy(x), torch.from_numpy(y)) for x, y in batches], []

    module.__dict__.update(load_data_fashion_mnist=load_data_fashion_mnist)
    return module


def _run(text: str, seams: dict[str, str], path: Path, d2lzh: types.ModuleType) -> dict:
    for old, new in seams.items():
        assert old in text, f"the device seam {old!r} is not in the file any more"
        text = text.replace(old, new)
    path.write_text(text, encoding="utf-8")
    before = sys.modules.get("d2lzh")
    sys.modules["d2lzh"] = d2lzh  # the file's `import d2lzh as d2l` binds it
    try:
        return runpy.run_path(str(path), run_name=path.stem)
    finally:
        if before is None:
            del sys.modules["d2lzh"]
        else:
            sys.modules["d2lzh"] = before


def _mxnet_losses(seed: dict, dtype: str, batches: list) -> list[list[float]]:
    devices = [mx.cpu(0), mx.cpu(1)]
    params = [p.astype(dtype) for p in seed["params"]]
    gpu_params = [seed["get_params"](params, d) for d in devices]
    losses = []
    for x, y in batches:
        X, Y = mx.nd.array(x, dtype=dtype), mx.nd.array(y, dtype="int32")
        losses.append([
            float(seed["loss"](seed["lenet"](X.as_in_context(d), w), Y.as_in_context(d))
                  .mean().asscalar())
            for d, w in zip(devices, gpu_params, strict=True)
        ])  # fmt: skip
        seed["train_batch"](X, Y, gpu_params, devices, LR)
    return losses


def _torch_losses(script: dict, weights: list, batches: list) -> list[list[float]]:
    devices = [torch.device("cpu", 0), torch.device("cpu", 1)]
    params = [torch.from_numpy(w) for w in weights]
    gpu_params = [script["get_params"](params, d) for d in devices]
    losses = []
    for x, y in batches:
        X, Y = torch.from_numpy(x), torch.from_numpy(y)
        with torch.no_grad():
            losses.append([
                float(script["loss"](script["lenet"](X, w), Y).mean())
                for w in gpu_params
            ])  # fmt: skip
        script["train_batch"](X, Y, gpu_params, devices, LR)
    return losses


def _convert(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    out = tmp_path / "d2l_torch.py"
    assert main(["port-code", str(SEED), "-o", str(out)]) == 3  # the loader stays marked
    report = capsys.readouterr().out
    assert "39/40 lines with framework calls converted (98%), 1 use(s) left marked" in report
    return out.read_text(encoding="utf-8")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_converted_seed_trains_with_the_losses_of_the_original(
    dtype: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = _convert(tmp_path, capsys)
    assert "        gluon_backward(l)" in text.splitlines()  # `for l in ls: l.backward()`
    batches = _batches(dtype)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        mx.random.seed(0)
        original = _run(SEED.read_text(encoding="utf-8"), SEAMS_MXNET,
                        tmp_path / "original.py", _d2lzh_mxnet(batches))  # fmt: skip
        converted = _run(text, SEAMS_TORCH, tmp_path / "converted.py", _d2lzh_torch(batches))
        weights = [p.astype(dtype).asnumpy() for p in original["params"]]
        mxnet_losses = _mxnet_losses(original, dtype, batches)
        torch_losses = _torch_losses(converted, weights, batches)
        if dtype == "float32":  # the seed's own train(): 4 epochs, both run
            original["train"](2, BATCH, LR)
            converted["train"](2, BATCH, LR)
    finally:
        torch.set_num_threads(threads)
    mine, theirs = np.array(mxnet_losses), np.array(torch_losses)
    assert mine.shape == (STEPS, 2)
    assert len(set(mine[:, 0])) == STEPS and abs(mine[-1, 0] - mine[0, 0]) > 1e-3  # it trains
    assert abs(mine[-1, 0] - mine[-1, 1]) > 1e-6  # the copies part (no broadcast)
    diff = np.abs(mine - theirs)
    worst = int(diff.max(axis=1).argmax())
    print(f"{dtype}: largest per-step loss difference {diff.max():.2g} (step {worst + 1})")
    assert diff.max() <= TOLERANCE[dtype], (
        f"step {worst + 1}: MXNet {mine[worst]}, PyTorch {theirs[worst]}"
    )


def test_a_plain_sum_backward_adds_to_the_last_steps_gradients(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Why ``gluon_backward``: ``l.sum().backward()`` alone (what the `.sum()` rule writes)
    adds each step's gradients to those left by the last step, which d2l's sgd keeps."""
    text = _convert(tmp_path, capsys).replace("gluon_backward(l)", "l.sum().backward()")
    batches = _batches("float64")
    mx.random.seed(0)
    original = _run(SEED.read_text(encoding="utf-8"), SEAMS_MXNET,
                    tmp_path / "original.py", _d2lzh_mxnet(batches))  # fmt: skip
    converted = _run(text, SEAMS_TORCH, tmp_path / "converted.py", _d2lzh_torch(batches))
    weights = [p.astype("float64").asnumpy() for p in original["params"]]
    mine = np.array(_mxnet_losses(original, "float64", batches))
    theirs = np.array(_torch_losses(converted, weights, batches))
    assert np.abs(mine[:2] - theirs[:2]).max() <= 1e-10  # the first step is the same
    assert np.abs(mine - theirs).max() > 1e-4


SHARED = """import mxnet as mx
from mxnet import autograd, nd

w = nd.array(a, dtype='float64')
w.attach_grad()
with autograd.record():
    ls = [(w * 3).sum(), (w * w).sum()]
for l in ls:
    l.backward()
out = w.grad * 1
with autograd.record():
    z = w * w
z.backward()
again = w.grad * 1
"""


def test_gluon_backward_keeps_the_last_gradient_of_a_leaf_as_gluon_does() -> None:
    """Two losses on one array, backward in turn: Gluon keeps the last one's gradient
    (2w), PyTorch's backward would add (3 + 2w); a non-scalar loss sums."""
    result = convert_source(SHARED)
    assert not result.report.unconverted
    assert "    gluon_backward(l)" in result.code and "gluon_backward(z)" in result.code
    a = np.array([1.0, -2.0, 0.5])
    gluon: dict[str, Any] = {"a": a}
    exec(SHARED, gluon)
    converted: dict[str, Any] = {"a": a}
    exec(result.code, converted)
    for name in ("out", "again"):
        np.testing.assert_array_equal(gluon[name].asnumpy(), converted[name].numpy())
    np.testing.assert_array_equal(converted["out"].numpy(), 2 * a)
