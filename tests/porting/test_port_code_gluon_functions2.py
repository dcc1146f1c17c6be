"""Gluon functions on arrays, the rest (gluon.toml's gluon_dtype, gluon_argsort,
gluon_topk, gluon_div_sqrt_dim, nd.empty, nd.stack's out=): each converted file runs on
PyTorch to MXNet's values and dtypes."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from port_code_helpers import run_as_module

from polytrain.porting.code import convert_source

mx = pytest.importorskip("mxnet")
torch = pytest.importorskip("torch")

DTYPE_IN_A_VARIABLE = """import numpy as np
import mxnet as mx


def made(dtype, name):
    arrs = [mx.nd.array([[1, 2, 3]], dtype=name), mx.nd.array([[4, 5, 6]], dtype=name)]
    out = mx.nd.empty((len(arrs),) + arrs[0].shape, dtype=arrs[0].dtype)
    stacked = mx.nd.stack(*arrs, out=out)
    return [mx.nd.full(shape=(2, 3), val=7, dtype=dtype), mx.nd.full((2,), 1.5, dtype=None),
            mx.nd.array(np.arange(6.0).reshape(2, 3), dtype=dtype), stacked,
            mx.nd.empty((2,), dtype=dtype).shape]
"""

ARRAY_DTYPE_NONE = """import mxnet as mx


def made(source, dtype):
    return mx.nd.array(source, dtype=dtype)
"""

SORTED = """from mxnet import nd


def made(x):
    return [nd.argsort(x), nd.argsort(x, axis=0, is_ascend=False),
            nd.topk(x, k=2), nd.topk(x, ret_typ='both', k=3, is_ascend=True)[1],
            nd.topk(x, axis=None, k=4, ret_typ='value'), nd.topk(x, k=2, ret_typ='mask'),
            nd.contrib.div_sqrt_dim(x)]
"""


def _run(source: str) -> dict[str, Any]:
    return run_as_module(source, "port_code_gluon_functions2_run")


def _numpy(value: Any) -> Any:
    if isinstance(value, tuple):
        return value
    return value.asnumpy() if hasattr(value, "asnumpy") else value.numpy()


def _same(expected: list[Any], got: list[Any]) -> None:
    for e, g in zip(expected, got, strict=True):
        e, g = _numpy(e), _numpy(g)
        if isinstance(e, tuple):
            assert tuple(g) == e
            continue
        assert e.dtype == g.dtype and e.shape == g.shape, (e, g)
        np.testing.assert_allclose(g, e, rtol=1e-6)


def _converted(source: str) -> str:
    result = convert_source(source, "made.py")
    assert not [u for u in result.report.uses if not u.converted], result.code
    return result.code


@pytest.mark.parametrize(
    ("dtype", "name"), [("int32", "int32"), (np.float64, "float64"), (None, "int64")]
)
def test_a_dtype_in_a_variable_converts_to_mxnets_dtype(dtype: Any, name: str) -> None:
    """Before: `dtype=dtype` was left marked ("give the dtype as a string"), nd.empty was
    not in the table and nd.stack's `out=` was refused."""
    converted = _converted(DTYPE_IN_A_VARIABLE)
    expected = _run(DTYPE_IN_A_VARIABLE)["made"]
    got = _run(converted)["made"]
    _same(expected(dtype, name), got(dtype, name))


@pytest.mark.parametrize("dtype", [None, "int32", "float64"])
@pytest.mark.parametrize("kind", ["list", "numpy", "array"])
def test_nd_array_keeps_an_arrays_dtype_and_makes_the_rest_float32(kind: str, dtype: Any) -> None:
    """MXNet's nd.array: without a dtype, an NDArray source's own (int32 here) and float32
    for a list or a numpy array. Before: `dtype=torch.float32` was written for every
    source, so an int32 NDArray became float32 without a marker."""
    values = np.arange(6, dtype=np.int64).reshape(2, 3)
    sources = {
        "list": (values.tolist(), values.tolist()),
        "numpy": (values, values),
        "array": (mx.nd.array(values, dtype="int32"), torch.tensor(values, dtype=torch.int32)),
    }
    original, converted = sources[kind]
    expected = _run(ARRAY_DTYPE_NONE)["made"](original, dtype)
    _same([expected], [_run(_converted(ARRAY_DTYPE_NONE))["made"](converted, dtype)])


def test_argsort_and_topk_keep_mxnets_float_indices_and_tie_order() -> None:
    """Before: nd.argsort, nd.topk and nd.contrib.div_sqrt_dim were left marked. Ties:
    equal values keep their order as in MXNet; the indices are float32 as MXNet's."""
    x = np.array([[1, 0, 1, 2, 0], [2, 2, 1, 1, 0], [0, 0, 0, 1, 1]], dtype=np.float32)
    expected = _run(SORTED)["made"](mx.nd.array(x))
    got = _run(_converted(SORTED))["made"](torch.tensor(x))
    _same(expected, got)


MODE_TESTS = """import mxnet as mx
from mxnet import nd, sym
from mxnet.gluon import nn


class Twice(nn.HybridBlock):
    def _scale(self, F, x):
        if F is mx.sym:
            return x
        return x * 2 if nd != F else x

    def hybrid_forward(self, F, x):
        if F == nd:
            x = x + 1
        elif F == mx.symbol:
            x = x - 1
        return self._scale(F, x)
"""

UNKNOWN_MODE = """from mxnet.gluon import nn


class Twice(nn.HybridBlock):
    def hybrid_forward(self, F, x):
        if F == self.mode or F in (self.mode,):
            return x
        return x * 2
"""


def test_a_test_of_which_module_F_is_converts_to_the_eager_answer() -> None:
    """Before: the `F` of `F == nd` was marked (code the tool does not see) and `nd`
    itself too: PyTorch's forward runs eagerly, as Gluon's block with mxnet.nd."""
    result = convert_source(MODE_TESTS, "twice.py")
    assert not [u for u in result.report.uses if not u.converted], result.code
    assert "if True:" in result.code and "elif False:" in result.code
    x = np.arange(6.0).reshape(2, 3)
    block = _run(MODE_TESTS)["Twice"]()
    expected = block(mx.nd.array(x, dtype="float64")).asnumpy()
    got = _run(result.code)["Twice"]()(torch.tensor(x)).numpy()
    np.testing.assert_array_equal(got, expected)


def test_F_compared_with_anything_else_stays_marked() -> None:
    result = convert_source(UNKNOWN_MODE, "twice.py")
    left = [u for u in result.report.uses if not u.converted]
    assert [u.api for u in left] == ["F", "F"], result.code


RESIZED = """from mxnet import nd


def made(x, i):
    return [nd.contrib.BilinearResize2D(x, height=5, width=3), nd.Concat(x, x)]
"""


def test_resize_and_concat_give_mxnets_values() -> None:
    """Before: BilinearResize2D and Concat were not in the table."""
    x = np.random.default_rng(0).standard_normal((1, 2, 3, 4)).astype(np.float32)
    i = np.array([1, 2], dtype=np.int32)
    expected = _run(RESIZED)["made"](mx.nd.array(x), mx.nd.array(i, dtype="int32"))
    got = _run(_converted(RESIZED))["made"](torch.tensor(x), torch.tensor(i))
    _same(expected, got)


def test_softmax_output_and_a_like_with_a_dtype_stay_marked_with_what_to_write() -> None:
    """Before: "not in the table" / "its argument dtype= is not in the table"."""
    source = "from mxnet import nd\n\nout = nd.SoftmaxOutput(x, y)\n"
    source += "z = nd.zeros_like(x, dtype='int64')\n"
    result = convert_source(source, "s.py")
    assert "gradient is that of the cross-entropy" in result.code
    assert "MXNet 1.9.1 takes dtype= and ignores it" in result.code


HAS_OPERATOR = """from mxnet import nd
from mxnet.gluon import nn


class Decode(nn.HybridBlock):
    def hybrid_forward(self, F, x, anchors):
        if 'box_decode' in F.contrib.__dict__:
            return F.contrib.box_decode(x, anchors, format='corner')
        return x


def made(x, anchors):
    assert 'div_sqrt_dim' in nd.contrib.__dict__
    return [Decode()(x, anchors), nd.contrib.div_sqrt_dim(x)]
"""


def test_a_test_for_an_operator_the_table_converts_is_true() -> None:
    """Before: `'box_decode' in F.contrib.__dict__` was marked (MXNet 1.9.1 has it, and
    the converted code has the helper: the same branch runs); an operator the table does
    not convert stays marked."""
    result = convert_source(HAS_OPERATOR, "decode.py")
    assert not [u for u in result.report.uses if not u.converted], result.code
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 3, 4)).astype(np.float32)
    anchors = np.array([[[0, 0, 2, 3], [1, 1, 4, 2], [2, 0, 5, 5]]], dtype=np.float32)
    expected = _run(HAS_OPERATOR)["made"](mx.nd.array(x), mx.nd.array(anchors))
    got = _run(result.code)["made"](torch.tensor(x), torch.tensor(anchors))
    _same(expected, got)
    unknown = convert_source(
        "from mxnet import nd\n\nok = 'no_op' in nd.contrib.__dict__\n", "u.py"
    )
    assert [u.api for u in unknown.report.uses if not u.converted] == ["mxnet.nd.contrib.__dict__"]
