"""Gluon conversions that depend on what only the run time knows are right in every case
(issue 36, item 3), against MXNet in float64: the losses with float labels, labels of shape
(N, 1) against predictions (N,) or (N, C), and a sequence axis; the L2Loss hint the tool
printed before broadcasts (N, 1) against (N,) into (N, N); two Trainers sharing a graph (a
GAN) train to Gluon's weights, where PyTorch's accumulation would add the generator's
gradients to the discriminator's next step."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from polytrain.porting.code import convert_source

mx = pytest.importorskip("mxnet")
torch = pytest.importorskip("torch")

HEADER = (
    "import mxnet as mx\nfrom mxnet import autograd, gluon, nd\n"
    "from mxnet.gluon import loss as gloss, nn\n"
)
RNG = np.random.default_rng(5)
PRED = RNG.standard_normal((6, 4))
SEQ = RNG.standard_normal((2, 3, 4))
CASES = [
    ("out = gloss.SoftmaxCrossEntropyLoss()(p, y)", PRED, RNG.integers(0, 4, (6,)).astype(float)),
    ("out = gloss.SoftmaxCrossEntropyLoss()(p, y)", PRED, RNG.integers(0, 4, (6, 1)).astype(float)),
    ("out = gloss.SoftmaxCrossEntropyLoss()(p, y)", SEQ, RNG.integers(0, 4, (2, 3)).astype(float)),
    ("out = gloss.SoftmaxCELoss(axis=1)(p, y)", SEQ, RNG.integers(0, 3, (2, 4)).astype(float)),
    ("out = gloss.SoftmaxCrossEntropyLoss(sparse_label=False)(p, y)", PRED, RNG.random((6, 4))),
    ("out = gloss.L2Loss()(p, y)", PRED[:, :1], RNG.standard_normal(6)),
    ("out = gloss.L2Loss(weight=3.0)(p, y, s)", PRED, RNG.standard_normal((6, 4))),
    ("out = gloss.L1Loss()(p, y)", PRED[:, 0], RNG.standard_normal((6, 1))),
    ("out = gloss.SigmoidBinaryCrossEntropyLoss()(p, y)", PRED, RNG.random((6, 4))),
    ("out = gloss.SigmoidBinaryCrossEntropyLoss(from_sigmoid=True)(p, y)", 1 / (1 + np.exp(-PRED)),
     RNG.random((6, 4))),
]  # fmt: skip
WEIGHTS = RNG.random((6, 1))


def _mxnet(code: str, p: np.ndarray, y: np.ndarray) -> np.ndarray:
    arrays = {"p": p, "y": y, "s": WEIGHTS}
    ns: dict[str, Any] = {k: mx.nd.array(v, dtype="float64") for k, v in arrays.items()}
    exec(HEADER + code, ns)
    return np.asarray(ns["out"].asnumpy())


def _torch(code: str, p: np.ndarray, y: np.ndarray) -> np.ndarray:
    ns: dict[str, Any] = {"p": torch.tensor(p), "y": torch.tensor(y), "s": torch.tensor(WEIGHTS)}
    exec(code, ns)
    return ns["out"].detach().numpy()


@pytest.mark.slow
@pytest.mark.parametrize(
    "code, p, y", CASES, ids=lambda v: str(v)[:56] if isinstance(v, str) else ""
)
def test_gluon_losses_as_gluon_takes_their_labels(code: str, p: np.ndarray, y: np.ndarray) -> None:
    result = convert_source(HEADER + code)
    assert all(u.converted for u in result.report.uses), result.code
    want, got = _mxnet(code, p, y), _torch(result.code, p, y)
    assert want.shape == got.shape, (want.shape, got.shape)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-10)


@pytest.mark.filterwarnings("ignore:Using a target size:UserWarning")  # PyTorch's own warning
def test_the_l2_hint_printed_before_broadcasts_into_other_numbers() -> None:
    p, y = torch.tensor(PRED[:, :1]), torch.tensor(RNG.standard_normal(6))
    hint = 0.5 * torch.nn.functional.mse_loss(p, y, reduction="none").flatten(1).mean(1)
    want = _mxnet("out = gloss.L2Loss()(p, y)", PRED[:, :1], y.numpy())
    assert hint.shape != want.shape or not np.allclose(hint.numpy(), want)


GAN = """
trainer_d = gluon.Trainer(net_d.collect_params(), 'sgd', {'learning_rate': 0.5})
trainer_g = gluon.Trainer(net_g.collect_params(), 'sgd', {'learning_rate': 0.5})
loss_fn = gloss.L2Loss()
for _ in range(3):
    with autograd.record():
        fake = net_g(z)
        err_d = loss_fn(net_d(x), ones) + loss_fn(net_d(fake.detach()), zeros)
    err_d.backward()
    trainer_d.step(4)
    with autograd.record():
        err_g = loss_fn(net_d(net_g(z)), ones)
    err_g.backward()
    trainer_g.step(4)
"""


def _gan_inputs(side: str) -> dict[str, Any]:
    rng = np.random.default_rng(11)
    arrays = {"z": rng.standard_normal((4, 2)), "x": rng.standard_normal((4, 3)),
              "ones": np.ones((4, 1)), "zeros": np.zeros((4, 1))}  # fmt: skip
    weights = [rng.standard_normal((3, 2)), rng.standard_normal(3),
               rng.standard_normal((1, 3)), rng.standard_normal(1)]  # fmt: skip
    if side == "mxnet":
        nets = [mx.gluon.nn.Dense(3, in_units=2), mx.gluon.nn.Dense(1, in_units=3)]
        for net, (w, b) in zip(nets, (weights[:2], weights[2:]), strict=True):
            net.initialize()
            net.cast("float64")
            net.weight.set_data(mx.nd.array(w, dtype="float64"))
            net.bias.set_data(mx.nd.array(b, dtype="float64"))
        tensors = {k: mx.nd.array(v, dtype="float64") for k, v in arrays.items()}
    else:
        nets = [torch.nn.Linear(2, 3).double(), torch.nn.Linear(3, 1).double()]
        with torch.no_grad():
            for net, (w, b) in zip(nets, (weights[:2], weights[2:]), strict=True):
                net.weight.copy_(torch.tensor(w))
                net.bias.copy_(torch.tensor(b))
        tensors = {k: torch.tensor(v) for k, v in arrays.items()}
    return {"net_g": nets[0], "net_d": nets[1], **tensors}


def _weights(ns: dict[str, Any]) -> list[np.ndarray]:
    out = []
    for net in (ns["net_g"], ns["net_d"]):
        for p in (net.weight, net.bias):
            out.append(p.data().asnumpy() if hasattr(p, "data") and callable(p.data) else
                       p.detach().numpy())  # fmt: skip
    return out


def test_two_trainers_sharing_a_graph_train_to_gluons_weights() -> None:
    src = _gan_inputs("mxnet")
    exec(HEADER + GAN, src)
    code = convert_source(HEADER + GAN).code
    assert code.count("gluon_backward(") >= 3, code  # its definition and both backward calls
    tgt = _gan_inputs("torch")
    exec(code, tgt)
    for a, b in zip(_weights(src), _weights(tgt), strict=True):
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-10)


PER_DEVICE = """
trainer = gluon.Trainer(net_d.collect_params(), 'sgd', {'learning_rate': 0.5})
loss_fn = gloss.L2Loss()
for _ in range(3):
    xs = gluon.utils.split_and_load(x, [mx.cpu()])
    with autograd.record():
        losses = [loss_fn(net_d(part), ones) for part in xs]
    for l in losses:
        l.backward()
    trainer.step(4)
"""


def test_a_backward_per_device_before_the_step_divides_and_zeroes() -> None:
    """``for l in losses: l.backward()`` then ``trainer.step(n)`` (the split_and_load
    loop): each loss divided by n, the gradients zeroed after the step, as Gluon's."""
    src = _gan_inputs("mxnet")
    exec(HEADER + PER_DEVICE, src)
    code = convert_source(HEADER + PER_DEVICE).code
    assert "(l / 4).sum().backward()" in code and "trainer.zero_grad()" in code, code
    tgt = _gan_inputs("torch")
    exec(code, tgt)
    for a, b in zip(_weights(src), _weights(tgt), strict=True):
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-10)


# ---- what running the corpus's files found (issue 36, the corpus's second pass) -----------

SGD_BY_HAND = (
    HEADER
    + """
x = nd.array(a, dtype='float64')
w = nd.array([[0.5], [-1.0], [2.0]], dtype='float64')
w.attach_grad()

def sgd(params, lr, batch_size):
    for param in params:
        param[:] = param - lr * param.grad / batch_size

for _ in range(3):
    with autograd.record():
        l = (nd.dot(x, w) ** 2).sum()
    l.backward()
    sgd([w], 0.1, 4)
    w -= 0.01 * w.grad
out = w
"""
)


def test_an_array_updated_in_place_by_its_gradient_is_updated_without_recording() -> None:
    """The book's ``param[:] = param - lr * param.grad / batch_size`` (and ``w -= ...``):
    MXNet updates outside recording; PyTorch refuses an in-place change of a leaf that
    needs a gradient unless no gradient is recorded (``with torch.no_grad():``)."""
    result = convert_source(SGD_BY_HAND)
    assert all(u.converted for u in result.report.uses), result.code
    a = RNG.standard_normal((4, 3))
    gluon: dict[str, Any] = {"a": a}
    exec(SGD_BY_HAND, gluon)
    converted: dict[str, Any] = {"a": a}
    exec(result.code, converted)
    np.testing.assert_allclose(converted["out"].detach().numpy(), gluon["out"].asnumpy(),
                               rtol=0, atol=1e-12)  # fmt: skip


def test_the_collected_parameters_initialize_and_zero_grad_as_the_block() -> None:
    """``net.collect_params().initialize(...)`` / ``.zero_grad()`` (Gluon's ParameterDict)
    are the net's: the converted calls are on the net, not on its parameter iterator."""
    code = HEADER + (
        "net = nn.Dense(2, in_units=3, flatten=False)\n"
        "net.collect_params().initialize(mx.init.Constant(0.5))\n"
        "net(nd.ones((1, 3))).sum().backward()\n"
        "net.collect_params().zero_grad()\n"
    )
    result = convert_source(code)
    assert "gluon_initialize(net, init=" in result.code, result.code
    ns: dict[str, Any] = {}
    exec(result.code, ns)
    assert torch.all(ns["net"].weight == 0.5) and torch.all(ns["net"].weight.grad == 0)


LATE_IMPORT = """import argparse
parser = argparse.ArgumentParser()
import mxnet as mx
from mxnet import gluon

def data(root):
    return gluon.data.vision.MNIST(root, train=False)
"""


def test_helper_classes_follow_a_framework_import_below_other_statements() -> None:
    """The helpers (here a torch Dataset class) come after ``import torch`` where the
    file imports its framework below other code (gluon/mnist.py): a class deriving from
    ``torch.utils.data.Dataset`` needs ``torch`` bound when it is defined."""
    result = convert_source(LATE_IMPORT)
    lines = result.code.splitlines()
    assert lines.index("import torch") < lines.index("class GluonMNIST(GluonVisionDataset):")
    ns: dict[str, Any] = {}
    exec(result.code, ns)
    assert callable(ns["data"])


def test_begin_state_with_gluons_zeros_passed_as_the_function() -> None:
    """``model.begin_state(func=mx.nd.zeros, batch_size=..., ctx=...)`` (the word LM):
    the function passed is PyTorch's, which gluon_rnn's begin_state calls."""
    code = HEADER + (
        "from mxnet.gluon import rnn\n"
        "layer = rnn.LSTM(4, num_layers=2, input_size=3)\n"
        "layer.initialize()\n"
        "states = layer.begin_state(func=mx.nd.zeros, batch_size=5, ctx=mx.cpu())\n"
    )
    result = convert_source(code)
    assert all(u.converted for u in result.report.uses), result.code
    gluon: dict[str, Any] = {}
    exec(code, gluon)
    ns: dict[str, Any] = {}
    exec(result.code, ns)
    want = [s.asnumpy() for s in gluon["states"]]
    got = [s.numpy() for s in ns["states"]]
    assert [w.shape for w in want] == [g.shape for g in got] == [(2, 5, 4)] * 2
    assert all(not g.any() for g in got)


SPLIT_STEP = (
    HEADER
    + """
net = nn.Dense(2, in_units=3, flatten=False)
net.initialize(mx.init.Constant(0.25), ctx=ctxs)
net.cast('float64')
trainer = gluon.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.5})
loss = gloss.L2Loss()
for x, y in batches:
    data = gluon.utils.split_and_load(x, ctx_list=ctxs, batch_axis=0)
    label = gluon.utils.split_and_load(y, ctx_list=ctxs, batch_axis=0)
    outputs = []
    with autograd.record():
        for a, b in zip(data, label):
            z = net(a)
            L = loss(z, b)
            L.backward()
            outputs.append(z)
    trainer.step(x.shape[0])
"""
)


@pytest.mark.slow
def test_a_step_after_losses_backward_in_a_loop_in_record_divides_each() -> None:
    """super_resolution.py: ``with autograd.record(): for x, y in ...: ... L.backward();
    outputs.append(z)`` then ``trainer.step(n)``: each device's loss divided by n (Gluon's
    step scales the sum of the devices' gradients), the step paired. The converted net is
    one model (gluon_initialize refuses several devices: given one, as it asks)."""
    result = convert_source(SPLIT_STEP)
    assert all(u.converted for u in result.report.uses), result.code
    rng = np.random.default_rng(9)
    batches = [(rng.standard_normal((4, 3)), rng.standard_normal((4, 2))) for _ in range(3)]
    gluon: dict[str, Any] = {"batches": [(mx.nd.array(x, dtype="float64"),
                                          mx.nd.array(y, dtype="float64")) for x, y in batches],
                             "ctxs": [mx.cpu(0), mx.cpu(1)]}  # fmt: skip
    exec(SPLIT_STEP, gluon)
    ns: dict[str, Any] = {"batches": [(torch.tensor(x), torch.tensor(y)) for x, y in batches],
                          "ctxs": [torch.device("cpu")] * 2}  # fmt: skip
    exec(result.code.replace(", ctx=ctxs)", ")", 1), ns)
    np.testing.assert_allclose(
        ns["net"].weight.detach().numpy(),
        gluon["net"].weight.data(mx.cpu(0)).asnumpy(),
        rtol=0,
        atol=1e-12,
    )
