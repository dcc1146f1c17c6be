"""``polytrain port-code`` rules for the Paddle calls left in the registry corpus (issue
36, the rest of the corpus): each program runs on Paddle and, converted, on PyTorch, and
the two agree; what the tool cannot know stays marked."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from polytrain.porting.code import convert_source

paddle = pytest.importorskip("paddle")
torch = pytest.importorskip("torch")


def _converted(source: str) -> str:
    result = convert_source(source, "rest.py")
    left = [u for u in result.report.uses if not u.converted]
    assert not left, f"left unconverted: {left}\n{result.code}"
    return result.code


def _left(source: str) -> list[str]:
    return [u.api for u in convert_source(source, "rest.py").report.uses if not u.converted]


def _run(source: str, x: np.ndarray) -> tuple[dict[str, Any], dict[str, Any]]:
    """The program's names after a run on Paddle and, converted, on PyTorch."""
    code = _converted(source)
    src: dict[str, Any] = {"x": paddle.to_tensor(x)}
    exec(source, src)
    tgt: dict[str, Any] = {"x": torch.tensor(x)}
    exec(code, tgt)
    return src, tgt


SPLIT = """
import paddle

parts = paddle.split(x, x.shape[-1], axis=-1)
halves = paddle.split(x, num_or_sections=len([0, 1]), axis=0)
"""


def test_split_by_a_shape_entry_is_that_many_equal_parts() -> None:
    """``paddle.split(x, x.shape[-1])``: an int (a shape entry, ``len(...)``), so that many
    equal parts (torch.chunk), where a name stays marked."""
    src, tgt = _run(SPLIT, np.arange(24.0).reshape(4, 6))
    for name in ("parts", "halves"):
        assert len(src[name]) == len(tgt[name])
        for a, b in zip(src[name], tgt[name], strict=True):
            np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert _left("import paddle\nout = paddle.split(x, n)\n") == ["paddle.split"]


DTYPE_NAME = """
import paddle

single = paddle.get_default_dtype() == "float32"
other = "float64" != paddle.get_default_dtype()
half = paddle.get_default_dtype() in ("float16", "bfloat16")
"""


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_default_dtype_compared_with_names_is_its_name(dtype: str) -> None:
    """``paddle.get_default_dtype() == 'float32'``: compared with names, the default dtype
    is its name (as Paddle's) where a torch.dtype would never equal the string; printed it
    stays marked."""
    paddle.set_default_dtype(dtype)
    torch.set_default_dtype(getattr(torch, dtype))
    try:
        src, tgt = _run(DTYPE_NAME, np.zeros(1))
    finally:
        paddle.set_default_dtype("float32")
        torch.set_default_dtype(torch.float32)
    assert [src[n] for n in ("single", "other", "half")] == [
        tgt[n] for n in ("single", "other", "half")
    ]
    assert src["single"] is (dtype == "float32")
    marked = "import paddle\nprint(paddle.get_default_dtype())\n"
    marked += "ok = paddle.get_default_dtype() == d\n"
    assert _left(marked) == ["paddle.get_default_dtype"] * 2


WEIGHT_NORM = """
import paddle.nn as nn
from paddle.nn.utils import weight_norm

conv = weight_norm(nn.Conv1D(2, 3, 2), dim=DIM)
whole = nn.utils.weight_norm(nn.Linear(4, 3), dim=None)
"""


def _set_norm(layer: Any, v: np.ndarray, g: np.ndarray, backend: Any) -> None:
    """``layer``'s weight_v and weight_g set to ``v`` and ``g`` (in its own shapes)."""
    for name, value in (("weight_v", v), ("weight_g", g)):
        p = getattr(layer, name)
        if backend is paddle:
            p.set_value(paddle.to_tensor(value.reshape(p.shape).astype("float32")))
        else:
            with torch.no_grad():
                p.copy_(torch.tensor(value.reshape(tuple(p.shape)), dtype=torch.float32))
        if getattr(layer, "bias", None) is not None:
            b = layer.bias
            if backend is paddle:
                b.set_value(paddle.zeros(b.shape))
            else:
                with torch.no_grad():
                    b.zero_()


@pytest.mark.filterwarnings("ignore:.*weight_norm. is deprecated:FutureWarning")
@pytest.mark.parametrize("dim", ["0", "1", "2", "None", "-1"])
def test_weight_norm_of_a_convolution_normalises_the_same_axes(dim: str) -> None:
    """weight_norm on a layer made in the call: a convolution's weight has one layout in
    both (any dim), a Linear's whole-tensor norm none; new v and g give the same output."""
    source = WEIGHT_NORM.replace("DIM", dim)
    code = _converted(source)
    rng = np.random.default_rng(0)
    v, x = rng.standard_normal((3, 2, 2)), rng.standard_normal((2, 2, 5))
    g = rng.uniform(0.5, 2.0, 1 if dim in ("None", "-1") else v.shape[int(dim)])
    vl, xl = rng.standard_normal((4, 3)), rng.standard_normal((2, 4))
    src: dict[str, Any] = {}
    exec(source, src)
    tgt: dict[str, Any] = {}
    exec(code, tgt)
    outs = []
    for ns, backend in ((src, paddle), (tgt, torch)):
        _set_norm(ns["conv"], v, g, backend)
        _set_norm(ns["whole"], vl if backend is paddle else vl.T, np.array([1.5]), backend)
        as_tensor = paddle.to_tensor if backend is paddle else torch.tensor
        outs.append([
            ns[n](as_tensor(a.astype("float32"))).detach().numpy()
            for n, a in (("conv", x), ("whole", xl))
        ])  # fmt: skip
    for a, b in zip(*outs, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_weight_norm_of_a_linear_or_an_unknown_layer_stays_marked() -> None:
    """A Linear's weight is [in, out] in Paddle: its dim=0 is torch's dim=1; a layer the
    tool does not know (a name, the code's own class) could be either."""
    source = (
        "import paddle.nn as nn\nfrom paddle.nn.utils import weight_norm\n"
        "a = weight_norm(nn.Linear(4, 3))\nb = weight_norm(layer, dim=0)\n"
        "fc = nn.Linear(4, 3)\nc = weight_norm(fc, 'weight', 1)\nd = weight_norm(fc, dim=-1)\n"
    )
    assert _left(source) == ["paddle.nn.utils.weight_norm"] * 3


TO_ATTR = """
import paddle
import paddle.nn as nn
from paddle import ParamAttr
from paddle.regularizer import L2Decay

attrs = ParamAttr._to_attr([None, True, "w", nn.initializer.Constant(0.5), False])
fc = nn.Linear(3, 2, weight_attr=attrs[3], bias_attr=attrs[4])
own = nn.Linear(3, 2, weight_attr=attrs[0], bias_attr=ParamAttr._to_attr("b"))
decayed = nn.Linear(3, 2, weight_attr=ParamAttr._to_attr(L2Decay(0.25)))
"""


def test_to_attr_gives_the_converted_param_attr() -> None:
    """``ParamAttr._to_attr``: None, True and a name are the layer's own initializer, an
    initializer sets the weight, False removes the bias, an L2Decay is the parameter's
    own decay; a list, each of its items."""
    src, tgt = _run(TO_ATTR, np.zeros(1))
    np.testing.assert_array_equal(src["fc"].weight.numpy(), tgt["fc"].weight.detach().numpy().T)
    assert src["fc"].bias is None and tgt["fc"].bias is None
    assert float(tgt["fc"].weight.detach().max()) == 0.5
    assert tgt["attrs"][:3] == [None, None, None] and tgt["attrs"][4] is False
    assert tgt["own"].bias is not None and src["own"].bias is not None
    assert src["decayed"].weight.regularizer._coeff == 0.25
    assert tgt["decayed"].weight.paddle_attr == {"weight_decay": 0.25}


LINEAR_READS = """
import paddle
import paddle.nn as nn
import paddle.nn.functional as F

linear = nn.Linear(3, 2)


def reads(x, h):
    return [
        paddle.matmul(x, linear.weight), paddle.matmul(h, linear.weight, transpose_y=True),
        paddle.mm(x, linear.weight), F.linear(x, linear.weight, linear.bias),
        linear.weight.numpy().sum(), linear.weight.abs().max(), linear.weight[0] * 2,
    ]
"""


def test_a_linear_weight_in_a_product_or_reduced_is_converted() -> None:
    """Paddle's Linear weight is [in, out], PyTorch's [out, in]: in a product it is read
    as ``.mT`` (the source's tensor), reduced to a number as it is; another read (a
    slice) stays marked."""
    code = convert_source(LINEAR_READS, "reads.py").code
    assert _left(LINEAR_READS) == ["paddle.nn.Linear.weight"]
    code = code.replace("linear.weight[0]", "linear.weight.mT[0]")  # the marked read
    rng = np.random.default_rng(0)
    w, x, h = rng.standard_normal((3, 2)), rng.standard_normal((4, 3)), rng.standard_normal((4, 2))
    src: dict[str, Any] = {}
    exec(LINEAR_READS, src)
    src["linear"].weight.set_value(paddle.to_tensor(w.astype("float32")))
    tgt: dict[str, Any] = {}
    exec(code, tgt)
    with torch.no_grad():
        tgt["linear"].weight.copy_(torch.tensor(w.T, dtype=torch.float32))
        tgt["linear"].bias.copy_(torch.tensor(src["linear"].bias.numpy()))
    a = src["reads"](paddle.to_tensor(x.astype("float32")), paddle.to_tensor(h.astype("float32")))
    b = tgt["reads"](torch.tensor(x, dtype=torch.float32), torch.tensor(h, dtype=torch.float32))
    for s, t in zip(a, b, strict=True):
        s = s.numpy() if hasattr(s, "numpy") else s
        t = t.detach().numpy() if hasattr(t, "detach") else t
        np.testing.assert_allclose(s, t, rtol=1e-5, atol=1e-6)
