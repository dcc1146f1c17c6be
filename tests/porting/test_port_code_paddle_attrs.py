"""Paddle's ParamAttr beyond its initializer (polytrain/porting/code/paddle_attrs.toml):
a learning rate, an L2 decay or a trainable flag of the parameter's own, as a layer's
weight_attr / bias_attr or create_parameter's attr, a literal or a name. The converted
code gives the parameters those settings, and the first optimizer step checks that the
parameter groups agree: run as Paddle runs it, it trains to Paddle's numbers; with one
group for all, it stops (issue 36)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from polytrain.porting.code import convert_source

paddle = pytest.importorskip("paddle")
torch = pytest.importorskip("torch")

PROGRAM = """
import numpy as np
import paddle
import paddle.nn as nn
from paddle import ParamAttr
from paddle.regularizer import L2Decay

paddle.set_default_dtype("float64")
lr_mult = 0.5
decay = L2Decay(0.0)


class Net(nn.Layer):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(
            3, 4, weight_attr=ParamAttr(learning_rate=lr_mult),
            bias_attr=ParamAttr(regularizer=decay)
        )
        self.bn = nn.LayerNorm(
            4, weight_attr=ParamAttr(regularizer=L2Decay(0.0), learning_rate=lr_mult)
        )
        self.out = nn.Linear(4, 1, weight_attr=ParamAttr(trainable=False))
        self.scale = self.create_parameter([1], attr=ParamAttr(learning_rate=lr_mult))

    def forward(self, x):
        return self.out(paddle.tanh(self.bn(self.fc(x)))) * self.scale


net = Net()
opt = paddle.optimizer.Momentum(
    learning_rate=0.25, momentum=0.5, parameters=net.parameters(), weight_decay=L2Decay(0.125)
)
"""


def _steps(net: Any, opt: Any, backend: Any, weights: dict[str, np.ndarray]) -> list[float]:
    """Three steps on fixed batches from ``weights`` (Paddle's layout), the losses."""
    with backend.no_grad():
        for name, p in net.named_parameters():
            if backend is paddle:
                p.set_value(weights[name])
                continue
            value = weights[name].T if name.endswith("weight") and p.ndim == 2 else weights[name]
            p.copy_(torch.tensor(value))
    rng = np.random.default_rng(0)
    losses = []
    for _ in range(3):
        x, y = rng.normal(size=(8, 3)), rng.normal(size=(8, 1))
        tensor = paddle.to_tensor if backend is paddle else torch.tensor
        loss = ((net(tensor(x)) - tensor(y)) ** 2).mean()
        loss.backward()
        opt.step()
        (opt.clear_grad if backend is paddle else opt.zero_grad)()
        losses.append(float(loss.numpy() if backend is paddle else loss.detach()))
    return losses


GROUPS = """
attr = lambda p: getattr(p, 'paddle_attr', {})
groups = {}
for p in net.parameters():
    a = attr(p)
    key = (a.get('lr_scale', 1.0), a.get('weight_decay', 0.125))
    groups.setdefault(key, []).append(p)
opt = torch.optim.SGD(
    [{'params': ps, 'lr': 0.25 * s, 'lr_scale': s, 'weight_decay': d}
     for (s, d), ps in groups.items()],
    lr=0.25, momentum=0.5)
"""


def _converted() -> str:
    result = convert_source(PROGRAM, "attrs.py")
    left = [(u.api, u.why) for u in result.report.uses if not u.converted]
    assert left == [], left
    return result.code


def test_param_attr_settings_train_to_paddles_numbers_in_their_groups() -> None:
    paddle_ns: dict[str, Any] = {}
    exec(PROGRAM, paddle_ns)
    try:
        weights = {n: p.numpy() for n, p in paddle_ns["net"].named_parameters()}
        want = _steps(paddle_ns["net"], paddle_ns["opt"], paddle, weights)
        assert not paddle_ns["net"].out.weight.trainable
    finally:
        paddle.set_default_dtype("float32")
    torch_ns: dict[str, Any] = {}
    default = torch.get_default_dtype()
    try:
        exec(_converted() + GROUPS, torch_ns)
        got = _steps(torch_ns["net"], torch_ns["opt"], torch, weights)
    finally:
        torch.set_default_dtype(default)
    assert not torch_ns["net"].out.weight.requires_grad
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-10)


@pytest.mark.parametrize(
    ("optimizer", "says"),
    [
        ("torch.optim.SGD(net.parameters(), lr=0.25)", "'lr_scale': 0.5"),
        (
            "torch.optim.SGD([{'params': [net.fc.weight, net.bn.weight, net.scale],"
            " 'lr_scale': 0.5}], lr=0.25, weight_decay=0.125)",
            "weight_decay=0.0",
        ),
        (
            "torch.optim.AdamW([{'params': [net.fc.weight, net.bn.weight, net.scale],"
            " 'lr_scale': 0.5}], weight_decay=0.125)",
            "",
        ),
    ],
)
def test_an_optimizer_that_disagrees_with_the_param_attrs_stops(optimizer: str, says: str) -> None:
    torch_ns: dict[str, Any] = {}
    default = torch.get_default_dtype()
    try:
        exec(_converted() + f"opt = {optimizer}\n", torch_ns)
    finally:
        torch.set_default_dtype(default)
    net, opt = torch_ns["net"], torch_ns["opt"]
    net(torch.ones(2, 3, dtype=torch.float64)).sum().backward()
    if not says:  # AdamW: a decay of 0 of its own is Paddle's AdamW too
        opt.step()
        return
    with pytest.raises(RuntimeError, match=says):
        opt.step()


def test_a_regularizer_that_is_not_l2_stops_where_the_layer_is_made() -> None:
    source = (
        "import paddle\nreg = paddle.regularizer.L1Decay(0.1)\n"
        "fc = paddle.nn.Linear(3, 4, weight_attr=paddle.ParamAttr(regularizer=reg))\n"
    )
    result = convert_source(source, "l1.py")
    assert [u.api for u in result.report.uses if not u.converted] == ["paddle.regularizer.L1Decay"]
    code = result.code.replace("reg = paddle.regularizer.L1Decay(0.1)", "reg = 'l1'")
    with pytest.raises(NotImplementedError, match="L2 coefficient only"):
        exec(code, {})


def test_a_literal_learning_rate_of_its_own_is_converted_and_checked() -> None:
    source = (
        "import paddle\nemb = paddle.nn.Embedding(5, 3, weight_attr=paddle.ParamAttr("
        "learning_rate=30))\nopt = paddle.optimizer.SGD(0.1, parameters=emb.parameters())\n"
    )
    result = convert_source(source, "lr.py")
    assert [u.api for u in result.report.uses if not u.converted] == []
    ns: dict[str, Any] = {}
    exec(result.code, ns)
    ns["emb"](torch.tensor([1, 2])).sum().backward()
    with pytest.raises(RuntimeError, match=r"'lr_scale': 30\.0 and lr = the base rate"):
        ns["opt"].step()


CROSS_ENTROPY = """
import numpy as np
import paddle
import paddle.nn.functional as F

rng = np.random.default_rng(0)
x = paddle.to_tensor(rng.normal(size=(6, 3)))
x3 = paddle.to_tensor(rng.normal(size=(2, 3, 4)))
y = paddle.to_tensor(np.array([0, 1, -100, 2, 1, -100]))
kept = paddle.to_tensor(np.array([0, 1, 1, 2, 1, 0]))
w = paddle.to_tensor(np.array([1.0, 2.0, 3.0]))
ii = 1
out = {case}
"""


@pytest.mark.parametrize(
    "case",
    [
        "paddle.nn.CrossEntropyLoss()(x, y)",  # Paddle's mean: over all 6 labels
        "F.cross_entropy(x, y)",
        "F.cross_entropy(x, y.unsqueeze(-1))",
        "F.cross_entropy(x3, paddle.to_tensor([[0, 1, -100, 2], [1, -100, 0, 0]]), axis=1)",
        "paddle.nn.CrossEntropyLoss(weight=w)(x, y)",  # over the kept labels' weights
        "paddle.nn.CrossEntropyLoss(ignore_index=ii)(x, kept)",  # over the kept labels
        "paddle.nn.CrossEntropyLoss(weight=w, ignore_index=ii)(x, kept)",
        "F.cross_entropy(x, paddle.full([6], ii), ignore_index=ii)",  # none kept: 0
        "F.cross_entropy(x, paddle.full([6], -100))",
        "F.cross_entropy(x, y, reduction='sum')",
        "F.cross_entropy(x, y, reduction='none')",
    ],
)
def test_cross_entropy_with_ignored_labels_is_paddles(case: str) -> None:
    source = CROSS_ENTROPY.format(case=case)
    result = convert_source(source, "ce.py")
    assert [u.api for u in result.report.uses if not u.converted] == []
    paddle_ns: dict[str, Any] = {}
    exec(source, paddle_ns)
    torch_ns: dict[str, Any] = {}
    exec(result.code, torch_ns)
    want, got = paddle_ns["out"].numpy(), torch_ns["out"].detach().numpy()
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


def test_label_smoothing_with_an_ignored_label_stops_as_paddle_does() -> None:
    source = CROSS_ENTROPY.format(case="F.cross_entropy(x, y, label_smoothing=0.1)")
    with pytest.raises(ValueError):
        exec(source, {})
    with pytest.raises(NotImplementedError, match="ignore_index"):
        exec(convert_source(source, "ce.py").code, {})


DEFAULT_DTYPE = """
import numpy as np
import paddle

paddle.set_default_dtype("float64")
x = paddle.ones([2], dtype=paddle.get_default_dtype())
y = paddle.cast(x > 0, paddle.get_default_dtype())
z = (x > 0).astype(paddle.get_default_dtype())
a = np.ones(2, dtype=np.int64).astype(paddle.get_default_dtype())
out = [str(t.dtype).split(".")[-1] for t in (x, y, z, a)] + [float(v.sum()) for v in (x, y, z, a)]
"""


def test_default_dtype_as_a_dtype_argument_is_torchs() -> None:
    result = convert_source(DEFAULT_DTYPE, "dtype.py")
    assert [u.api for u in result.report.uses if not u.converted] == []
    paddle_ns: dict[str, Any] = {}
    torch_ns: dict[str, Any] = {}
    default = torch.get_default_dtype()
    try:
        exec(DEFAULT_DTYPE, paddle_ns)
        exec(result.code, torch_ns)
    finally:
        paddle.set_default_dtype("float32")
        torch.set_default_dtype(default)
    assert torch_ns["out"] == paddle_ns["out"] == ["float64"] * 4 + [2.0] * 4


def test_default_dtype_elsewhere_stays_marked() -> None:
    source = (
        "import paddle\nsame = paddle.get_default_dtype() == name\n"
        "print(paddle.get_default_dtype())\n"
    )
    result = convert_source(source, "dtype.py")
    left = [u.api for u in result.report.uses if not u.converted]
    assert left == ["paddle.get_default_dtype"] * 2


POOL = """
import numpy as np
import paddle
import paddle.nn as nn

x = paddle.to_tensor(np.random.default_rng(0).normal(size=(1, 2, {size}, {size})))
out = {layer}(x)
"""

# (input size, kernel, stride, padding): each window at least its stride plus the padding
# wide (Paddle and PyTorch agree), or not (refused); Paddle 3.3.1 differs from PyTorch in
# the second list (a last window starting in the padding)
AGREE = [(5, 2, 2, 0), (7, 3, 2, 1), (6, 3, 3, 0), (7, 4, 2, 2), (5, 3, 1, 1)]
DIFFER = [(5, 2, 2, 1), (6, 1, 2, 0), (7, 4, 3, 2)]


@pytest.mark.parametrize("kind", ["MaxPool2D", "AvgPool2D", "AvgPool2D-inclusive"])
def test_pooling_ceil_mode_is_paddles_or_refused(kind: str) -> None:
    layer = kind.split("-")[0]
    extra = ", exclusive=False" if kind.endswith("inclusive") else ""
    for size, k, s, p in AGREE + DIFFER:
        made = f"nn.{layer}({k}, stride={s}, padding={p}, ceil_mode=True{extra})"
        source = POOL.format(size=size, layer=made)
        result = convert_source(source, "pool.py")
        assert [u.api for u in result.report.uses if not u.converted] == []
        paddle_ns: dict[str, Any] = {}
        exec(source, paddle_ns)
        torch_ns: dict[str, Any] = {}
        if (size, k, s, p) in DIFFER:
            with pytest.raises(NotImplementedError, match="ceil_mode=True"):
                exec(result.code, torch_ns)
            continue
        exec(result.code, torch_ns)
        want, got = paddle_ns["out"].numpy(), torch_ns["out"].numpy()
        assert got.shape == want.shape, (size, k, s, p)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
