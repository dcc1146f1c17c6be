"""``polytrain port-code`` rules met in PaddleClas' and PaddleNLP's library code (issue 36,
the registry corpus): framework classes as types (annotations), and the table's synonyms
of Paddle names, each checked on Paddle itself."""

from __future__ import annotations

import inspect
import typing
from typing import Any

import numpy as np
import pytest

from polytrain.porting.code import convert_source
from polytrain.porting.code.table import frameworks

paddle = pytest.importorskip("paddle")
torch = pytest.importorskip("torch")

TYPED = """
from typing import Optional, Tuple

import paddle
import paddle.nn as nn


def scaled(x: paddle.Tensor, emb: Optional[nn.Embedding] = None) -> Tuple[paddle.Tensor, bool]:
    return x * 2, isinstance(x, paddle.Tensor)


def pick(layers: "list[nn.Linear]", i: int) -> nn.Linear | None:
    return layers[i] if layers else None


out, is_tensor = scaled(x)
"""


def _converted(source: str) -> str:
    result = convert_source(source, "typed.py")
    left = [u for u in result.report.uses if not u.converted]
    assert not left, f"left unconverted: {left}\n{result.code}"
    return result.code


def test_framework_classes_in_annotations_are_the_torch_classes() -> None:
    """``x: paddle.Tensor``, ``Optional[nn.Embedding]``, ``nn.Linear | None``: types, so
    torch's classes, where they were marked (Tensor) or refused as a call used without
    its arguments (a layer)."""
    code = _converted(TYPED)
    x = np.arange(6.0).reshape(2, 3)
    src: dict[str, Any] = {"x": paddle.to_tensor(x)}
    exec(TYPED, src)
    tgt: dict[str, Any] = {"x": torch.tensor(x)}
    exec(code, tgt)
    np.testing.assert_array_equal(src["out"].numpy(), tgt["out"].numpy())
    assert src["is_tensor"] is tgt["is_tensor"] is True
    hints = typing.get_type_hints(tgt["scaled"])
    assert hints["x"] is torch.Tensor
    assert hints["emb"] == typing.Optional[torch.nn.Embedding]  # noqa: UP045 - as written
    assert typing.get_type_hints(tgt["pick"])["return"] == torch.nn.Linear | None


def test_a_call_of_paddle_tensor_stays_marked() -> None:
    """``paddle.Tensor(a)`` keeps the array's dtype, ``torch.Tensor(a)`` makes float32."""
    a = np.arange(3.0)
    assert paddle.Tensor(a).dtype == paddle.float64
    assert torch.Tensor(a).dtype == torch.float32
    result = convert_source("import paddle\nout = paddle.Tensor(a)\n", "call.py")
    assert [u.api for u in result.report.uses if not u.converted] == ["paddle.Tensor"]


def test_the_tables_synonyms_are_the_same_paddle_objects() -> None:
    """Each synonym the Paddle table reads as another name is that object in Paddle."""
    same = frameworks()["paddle"].same
    checked = 0
    for alias, canonical in same.items():
        if "fluid" in alias or "fluid" in canonical:
            continue  # fluid is gone from Paddle 3: its synonyms are documented ones
        found, meant = _attribute(alias), _attribute(canonical)
        if inspect.ismodule(found):
            continue  # a module's synonym: its names are checked by their entries
        assert found is meant, alias
        checked += 1
    assert checked >= 3


def _attribute(dotted: str) -> Any:
    value: Any = paddle
    for part in dotted.split(".")[1:]:
        value = getattr(value, part)
    return value


def test_paddle_reverse_and_tensor_transpose_compute_as_on_paddle() -> None:
    source = (
        "import paddle\n"
        "out = [paddle.reverse(x, [0]), paddle.reverse(x, axis=1),"
        " paddle.tensor.transpose(x, [1, 0])]\n"
    )
    code = _converted(source)
    x = np.random.default_rng(0).standard_normal((2, 3))
    src: dict[str, Any] = {"x": paddle.to_tensor(x)}
    exec(source, src)
    tgt: dict[str, Any] = {"x": torch.tensor(x)}
    exec(code, tgt)
    for a, b in zip(src["out"], tgt["out"], strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


LAYOUTS = """
import paddle
import paddle.nn as nn


def make(data_format="NCHW"):
    return nn.Sequential(
        nn.Conv2D(2, 4, 3, padding=1, data_format=data_format),
        nn.BatchNorm(4, act="relu", data_layout=data_format),
        nn.BatchNorm2D(4, data_format=data_format),
        nn.MaxPool2D(2, data_format=data_format),
        nn.AvgPool2D(1, data_format=data_format),
        nn.AdaptiveAvgPool2D(1, data_format=data_format),
    )


def make_1d(fmt="NCL"):
    return nn.Sequential(nn.Conv1D(2, 3, 3, data_format=fmt), nn.BatchNorm1D(3, data_format=fmt))


net, net_1d = make(), make_1d()
"""


def test_a_data_format_known_only_when_run_is_checked_where_the_layer_is_made() -> None:
    """``data_format=data_format`` (PaddleClas threads it through its models): converted,
    the layer is made where the value is channels first and refused where it is not;
    a literal channels-last value stays marked."""
    code = _converted(LAYOUTS)
    src: dict[str, Any] = {}
    exec(LAYOUTS, src)
    tgt: dict[str, Any] = {}
    exec(code, tgt)
    from port_code_corpus_harness import copy_weights

    x = np.random.default_rng(0).standard_normal((2, 2, 6, 6)).astype("float32")
    y = x[:, :, 0, :]
    for name, value in (("net", x), ("net_1d", y)):
        src[name].eval()
        tgt[name].eval()
        copy_weights(src[name], tgt[name])
        want = src[name](paddle.to_tensor(value)).numpy()
        got = tgt[name](torch.tensor(value)).detach().numpy()
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    with pytest.raises(NotImplementedError, match="data_format='NHWC'"):
        tgt["make"]("NHWC")
    literal = convert_source(
        "import paddle\nlayer = paddle.nn.Conv2D(2, 3, 3, data_format='NHWC')\n"
    )
    assert [u.api for u in literal.report.uses if not u.converted] == ["paddle.nn.Conv2D"]


ATTRS = """
import paddle
import paddle.nn as nn


def block(bias, act=nn.GELU):
    return nn.Sequential(nn.Linear(3, 4, bias_attr=bias), act())


nets = [block(False), block(True), block(None), block("named", act=nn.Hardswish)]
"""


def test_a_bias_attr_known_only_when_run_and_activation_classes_as_values() -> None:
    """``bias_attr=qkv_bias`` (PaddleClas' ViT): False makes no bias, True, None or a name
    the layer's own; ``act_layer=nn.GELU`` / ``nn.Hardswish`` as values: torch's classes."""
    code = _converted(ATTRS)
    src: dict[str, Any] = {}
    exec(ATTRS, src)
    tgt: dict[str, Any] = {}
    exec(code, tgt)
    from port_code_corpus_harness import copy_weights

    x = np.random.default_rng(0).standard_normal((2, 3)).astype("float32")
    for made, want_net in zip(tgt["nets"], src["nets"], strict=True):
        assert (made[0].bias is None) is (want_net[0].bias is None)
        copy_weights(want_net, made)
        want = want_net(paddle.to_tensor(x)).numpy()
        np.testing.assert_allclose(made(torch.tensor(x)).detach().numpy(), want, atol=1e-6)
    assert [type(n[1]) for n in tgt["nets"]] == [torch.nn.GELU] * 3 + [torch.nn.Hardswish]


def test_astype_takes_paddles_dtype_names() -> None:
    """``x.astype('float')`` is float64 in Paddle (numpy's names), float32 as torch.float;
    a numpy array keeps its own astype."""
    source = (
        "import numpy as np\nimport paddle\n"
        "out = [x.astype(d) for d in ('float', 'int', float, 'bool', np.int32, 'float16')]\n"
        "arr = x.numpy().astype('float32')\n"
    )
    code = _converted(source)
    src: dict[str, Any] = {"x": paddle.to_tensor(np.arange(3.0) - 1)}
    exec(source, src)
    tgt: dict[str, Any] = {"x": torch.tensor(np.arange(3.0) - 1)}
    exec(code, tgt)
    for a, b in zip(src["out"], tgt["out"], strict=True):
        assert str(a.dtype).split(".")[-1] == str(b.dtype).split(".")[-1]
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert isinstance(tgt["arr"], np.ndarray) and tgt["arr"].dtype == np.float32
