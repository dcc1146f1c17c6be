"""The d2l MXNet multi-GPU seed (tests/fixtures/port_code/d2l_multi_gpu_mxnet.py: LeNet on
raw NDArrays, ``attach_grad``, ``for l in ls: l.backward()``, a hand-written allreduce,
``d2l.sgd``) converted by ``polytrain port-code`` trains on PyTorch with the same per-step
losses as the original on MXNet: 2 devices, 20 steps of the seed's ``train_batch``, from
the same weights and batches.

Seams (nothing of MXNet or PyTorch is replaced):

- ``d2lzh``, the book's helper package, is a module put in ``sys.modules``: for the
  original, the book's ``sgd`` (its code) and a ``load_data_fashion_mnist`` giving fixed
  random batches; for the converted script only that loader, in PyTorch tensors, called
  where the converted ``d2lzh_load_data_fashion_mnist`` was (it reads the book's files:
  tested against Gluon's below; ``d2l.sgd`` became ``d2lzh_sgd``).
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
nd = mx.nd
torch = pytest.importorskip("torch")

SEED = Path(__file__).parents[1] / "fixtures" / "port_code" / "d2l_multi_gpu_mxnet.py"
STEPS, BATCH, LR = 20, 8, 3.0
TOLERANCE = {"float32": 1e-5, "float64": 1e-10}
SEAMS_MXNET = {"mx.gpu(": "mx.cpu(", ".device)": ".context)"}
SEAMS_TORCH = {"torch.device('cuda', ": "torch.device('cpu', ",
               "\nimport torch\n": "\nimport torch\nimport d2lzh as _batches\n",
               "d2lzh_load_data_fashion_mnist(batch_size)":
               "_batches.load_data_fashion_mnist(batch_size)"}  # fmt: skip


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
    """The same batches in PyTorch tensors (no ``sgd``: converted)."""
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
    assert main(["port-code", str(SEED), "-o", str(out)]) == 0
    report = capsys.readouterr().out
    assert "40/40 lines with framework calls converted (100%), 0 use(s) left marked" in report
    return out.read_text(encoding="utf-8")


@pytest.mark.slow
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


@pytest.mark.slow
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


# ---- the book's other helpers (issue 36, the corpus's second pass) -----------------------


def _idx_files(root: Path, part: str, count: int, seed: int) -> None:
    """A pair of gzipped idx files (the MNIST format) of random 28 x 28 images."""
    import gzip
    import struct

    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    with gzip.open(root / f"{part}-images-idx3-ubyte.gz", "wb") as f:
        images = rng.integers(0, 256, (count, 28, 28)).astype(np.uint8)
        f.write(struct.pack(">IIII", 2051, count, 28, 28) + images.tobytes())
    with gzip.open(root / f"{part}-labels-idx1-ubyte.gz", "wb") as f:
        labels = rng.integers(0, 10, count).astype(np.uint8)
        f.write(struct.pack(">II", 2049, count) + labels.tobytes())


def _book(code: str) -> dict[str, Any]:
    """``code`` (MXNet code using d2lzh) converted and run; every use converted."""
    head = "import d2lzh as d2l\nimport mxnet as mx\nfrom mxnet import gluon, nd\n"
    result = convert_source(head + code)
    assert all(u.converted for u in result.report.uses), result.code
    ns: dict[str, Any] = {}
    exec(result.code, ns)
    return ns


@pytest.mark.slow
def test_d2lzh_fashion_mnist_batches_are_gluons(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The converted loader reads the book's files as Gluon's FashionMNIST with ToTensor
    (the test's files are not MXNet's: its sha1 check is passed over)."""
    root = tmp_path / "fashion-mnist"
    _idx_files(root, "train", 7, 0)
    _idx_files(root, "t10k", 5, 1)
    import mxnet.gluon.data.vision.datasets as sets
    import mxnet.gluon.utils as utils

    monkeypatch.setattr(utils, "check_sha1", lambda *args: True)
    monkeypatch.setattr(sets, "check_sha1", lambda *args: True)
    vision = mx.gluon.data.vision
    gluon_test = mx.gluon.data.DataLoader(
        vision.FashionMNIST(str(root), train=False).transform_first(vision.transforms.ToTensor()),
        2, shuffle=False,
    )  # fmt: skip
    ns = _book(f"train_iter, test_iter = d2l.load_data_fashion_mnist(2, root={str(root)!r})\n")
    mine = [(x.asnumpy(), y.asnumpy()) for x, y in gluon_test]
    theirs = [(x.numpy(), y.numpy()) for x, y in ns["test_iter"]]
    assert len(mine) == len(theirs) == 3
    for (a, b), (c, d) in zip(mine, theirs, strict=True):
        np.testing.assert_array_equal(a, c)
        np.testing.assert_array_equal(b, d)
        assert c.dtype == np.float32 and d.dtype == np.int32
    labels = sorted(int(v) for _, y in ns["train_iter"] for v in y)  # shuffled: another order
    assert labels == sorted(int(v) for v in vision.FashionMNIST(str(root))._label)


def test_d2lzh_train_ch3_steps_as_gluons_loop_and_evaluates_in_eval_mode(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """train_ch3 with a Trainer: the weights after an epoch of two batches are those of
    Gluon's loop (record, loss.sum(), backward, step(batch_size)); evaluate_accuracy runs
    the net in eval mode (its dropout off) and gives it back in training mode."""
    rng = np.random.default_rng(5)
    x, y = rng.standard_normal((8, 4)), rng.integers(0, 3, 8)
    w, b = rng.standard_normal((3, 4)), rng.standard_normal(3)
    net = mx.gluon.nn.Dense(3, in_units=4)
    net.initialize()
    net.cast("float64")
    net.weight.set_data(nd.array(w, dtype="float64"))
    net.bias.set_data(nd.array(b, dtype="float64"))
    trainer = mx.gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.5})
    loss = mx.gluon.loss.SoftmaxCrossEntropyLoss()
    for i in (0, 4):
        X, Y = nd.array(x[i : i + 4], dtype="float64"), nd.array(y[i : i + 4], dtype="float64")
        with mx.autograd.record():
            total = loss(net(X), Y).sum()
        total.backward()
        trainer.step(4)
    code = (
        "from mxnet.gluon import loss as gloss, nn\n"
        "net = nn.Sequential()\nnet.add(nn.Dense(3, in_units=4, flatten=False), nn.Dropout(0.5))\n"
        "trainer = gluon.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.5})\n"
        "def run(train_iter, test_iter):\n"
        "    d2l.train_ch3(net, train_iter, test_iter, gloss.SoftmaxCrossEntropyLoss(), 1, 4,"
        " None, None, trainer)\n"
        "    return d2l.evaluate_accuracy(test_iter, net)\n"
    )  # fmt: skip
    ns = _book(code)
    tnet = ns["net"].double()
    with torch.no_grad():
        tnet[0].weight.copy_(torch.tensor(w))
        tnet[0].bias.copy_(torch.tensor(b))
    batches = [(torch.tensor(x[i : i + 4]), torch.tensor(y[i : i + 4])) for i in (0, 4)]
    tnet[1].p = 0.0  # the training batches without dropout: Gluon's loop above has none
    ns["run"](batches, batches)
    np.testing.assert_allclose(tnet[0].weight.detach().numpy(), net.weight.data().asnumpy(),
                               rtol=0, atol=1e-10)  # fmt: skip
    assert "epoch 1, loss " in capsys.readouterr().out
    tnet[1].p = 0.9  # evaluated in eval mode: the dropout does nothing
    predicted = (torch.tensor(x) @ tnet[0].weight.T + tnet[0].bias).argmax(1).numpy()
    assert ns["d2lzh_evaluate_accuracy"](batches, tnet) == float(np.mean(predicted == y))
    assert tnet.training


def test_d2lzh_grad_clipping_and_consecutive_batches_as_the_book_defines_them() -> None:
    ns = _book(
        "import numpy as np\n"
        "params = [nd.array([[3.0, 4.0]]), nd.array([12.0])]\n"
        "def clip(theta):\n    d2l.grad_clipping(params, theta, mx.cpu())\n"
        "batches = list(d2l.data_iter_consecutive(list(range(23)), 2, 3))\n"
    )
    params = [torch.zeros(1, 2, requires_grad=True), torch.zeros(1, requires_grad=True)]
    params[0].grad, params[1].grad = torch.tensor([[3.0, 4.0]]), torch.tensor([12.0])
    ns["params"] = params
    ns["clip"](6.5)  # the norm is 13: every gradient halved
    assert params[0].grad.tolist() == [[1.5, 2.0]] and params[1].grad.tolist() == [6.0]
    ns["clip"](100.0)
    assert params[1].grad.tolist() == [6.0]
    indices = np.arange(22, dtype=np.float32).reshape(2, 11)
    want = [(indices[:, i : i + 3], indices[:, i + 1 : i + 4]) for i in (0, 3, 6)]
    assert len(ns["batches"]) == 3
    for (x, y), (a, b) in zip(ns["batches"], want, strict=True):
        assert x.dtype == torch.float32
        np.testing.assert_array_equal(x.numpy(), a)
        np.testing.assert_array_equal(y.numpy(), b)


def test_d2lzh_residual_computes_gluons_block() -> None:
    """The book's block, built here of Gluon's layers, against D2lzhResidual with the same
    weights (by name: conv1, bn1, ...), in training and in eval mode."""
    from mxnet.gluon import nn

    class Residual(nn.Block):
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = nn.Conv2D(4, kernel_size=3, padding=1, strides=2)
            self.conv2 = nn.Conv2D(4, kernel_size=3, padding=1)
            self.conv3 = nn.Conv2D(4, kernel_size=1, strides=2)
            self.bn1, self.bn2 = nn.BatchNorm(), nn.BatchNorm()

        def forward(self, X: Any) -> Any:
            Y = nd.relu(self.bn1(self.conv1(X)))
            Y = self.bn2(self.conv2(Y))
            return nd.relu(Y + self.conv3(X))

    x = np.random.default_rng(2).standard_normal((2, 3, 6, 6))
    gluon = Residual()
    gluon.initialize(mx.init.Normal(0.5))
    gluon.cast("float64")
    gluon(nd.array(x, dtype="float64"))
    ns = _book("blk = d2l.Residual(4, use_1x1conv=True, strides=2)\n")
    blk = ns["blk"]
    blk(torch.zeros(1, 3, 6, 6))
    blk.double()
    torch_names = {"gamma": "weight", "beta": "bias"}
    state = {}
    for attr in ("conv1", "conv2", "conv3", "bn1", "bn2"):
        block = getattr(gluon, attr)
        for name, p in block.params.items():
            role = name[len(block.prefix) :]
            state[f"{attr}.{torch_names.get(role, role)}"] = torch.tensor(p.data().asnumpy())
    blk.load_state_dict(state, strict=False)
    blk.eval()  # eval first: the running variances part at a training step (rule 7)
    want_eval = gluon(nd.array(x, dtype="float64")).asnumpy()
    got_eval = blk(torch.tensor(x)).detach().numpy()
    with mx.autograd.train_mode():
        want_train = gluon(nd.array(x, dtype="float64")).asnumpy()
    blk.train()
    got_train = blk(torch.tensor(x)).detach().numpy()
    np.testing.assert_allclose(got_train, want_train, rtol=0, atol=1e-6)
    np.testing.assert_allclose(got_eval, want_eval, rtol=0, atol=1e-6)
