"""``self.create_parameter(...)`` / ``self.add_parameter(...)`` in a class derived from a
Paddle layer (polytrain/porting/code/layer_self.py): converted to PyTorch parameters of
the shapes, dtypes and initial values Paddle makes, counted as framework uses; on a
receiver the tool cannot tell is a Paddle layer, marked (issue 36)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from polytrain.porting.code import convert_source

paddle = pytest.importorskip("paddle")
torch = pytest.importorskip("torch")

HOLDER = """
import paddle
import paddle.nn as nn


class Base(nn.Layer):
    pass


class Holder(Base):
    def __init__(self):
        super().__init__()
        self.w = self.create_parameter([300, 200])
        self.v = self.create_parameter(shape=[1000])
        self.s = self.create_parameter([])
        self.b = self.create_parameter([200], is_bias=True)
        self.c = self.create_parameter(
            [3, 4], attr=paddle.ParamAttr(initializer=nn.initializer.Constant(0.5)), dtype="float64"
        )
        self.k = self.create_parameter(
            [300, 200], default_initializer=nn.initializer.KaimingNormal()
        )
        self.none = self.create_parameter([3], attr=False)
        self.kept = self.add_parameter("extra", self.create_parameter([2, 2], is_bias=True))


layer = Holder()
"""


def _params(layer: Any) -> dict[str, np.ndarray]:
    return {
        n: (p.detach().numpy() if hasattr(p, "detach") else p.numpy())
        for n, p in layer.named_parameters()
    }


def _made(source: str) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], Any]:
    result = convert_source(source, "holder.py")
    paddle_ns: dict[str, Any] = {}
    exec(source, paddle_ns)
    torch_ns: dict[str, Any] = {}
    exec(result.code, torch_ns)
    return _params(paddle_ns["layer"]), _params(torch_ns["layer"]), result


def _xavier_limit(fan_in: int, fan_out: int) -> float:
    return float(np.sqrt(6.0 / (fan_in + fan_out)))


def test_create_parameter_in_a_layer_class_makes_paddles_parameters() -> None:
    want, got, result = _made(HOLDER)
    assert [u.api for u in result.report.uses if not u.converted] == []
    assert sum(u.api == ".create_parameter" for u in result.report.uses) == 8
    assert list(got) == list(want) == ["w", "v", "s", "b", "c", "k", "extra"]
    for name in want:
        assert got[name].shape == want[name].shape, name
        assert got[name].dtype == want[name].dtype, name
    np.testing.assert_array_equal(got["c"], np.full((3, 4), 0.5))
    np.testing.assert_array_equal(got["b"], np.zeros(200, np.float32))
    np.testing.assert_array_equal(got["extra"], np.zeros((2, 2), np.float32))
    # Paddle's default, Xavier-uniform with its fans: a vector of n has fan_in = fan_out = n
    for name, limit in (
        ("w", _xavier_limit(300, 200)),
        ("v", _xavier_limit(1000, 1000)),
        ("s", _xavier_limit(1, 1)),
    ):
        for values in (want[name], got[name]):
            assert np.abs(values).max() <= limit, name
        if name != "s":
            assert np.abs(got[name]).max() > 0.95 * limit, name
            assert abs(got[name].std() - limit / np.sqrt(3)) < 0.05 * limit, name
    # Kaiming: Paddle's fan in of [300, 200] is 300 (PyTorch's of that shape: 200)
    for values in (want["k"], got["k"]):
        assert abs(values.std() / np.sqrt(2.0 / 300) - 1) < 0.03


def test_add_parameter_returns_the_parameter_it_registers() -> None:
    result = convert_source(HOLDER, "holder.py")
    ns: dict[str, Any] = {}
    exec(result.code, ns)
    layer = ns["layer"]
    assert layer.kept is layer.extra and layer.none is None


MARKED = [
    # bases imported from the model's own package: the tool cannot tell it is a Layer
    "from ppcls.arch.backbone.base.theseus_layer import TheseusLayer\n"
    "class Head(TheseusLayer):\n"
    "    def __init__(self):\n"
    "        super().__init__()\n"
    "        self.w = self.create_parameter([2, 3])\n",
    # a function nested in the method: its `self` is its own parameter
    "class Head(nn.Layer):\n"
    "    def __init__(self):\n"
    "        super().__init__()\n"
    "        def make(self):\n"
    "            return self.create_parameter([2, 3])\n"
    "        self.w = make(self)\n",
    # a static method's first parameter is not the layer
    "class Head(nn.Layer):\n"
    "    @staticmethod\n"
    "    def make(owner):\n"
    "        return owner.create_parameter([2, 3])\n",
    # a receiver not known to be a Layer
    "w = holder.create_parameter([2, 3])\n",
]


@pytest.mark.parametrize("source", MARKED, ids=range(len(MARKED)))
def test_create_parameter_on_another_receiver_is_marked(source: str) -> None:
    result = convert_source("import paddle\nimport paddle.nn as nn\n" + source, "head.py")
    left = [u for u in result.report.uses if not u.converted]
    assert [u.api for u in left] == [".create_parameter"]
    assert "not one the tool knows to be a Paddle layer" in left[0].why
    assert ".create_parameter([2, 3])" in result.code  # left as it was, under the marker
