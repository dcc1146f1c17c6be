"""Gluon functions on arrays (polytrain/porting/code/array_functions.py and the nd.*
entries of gluon.toml): a numpy type given as ``dtype=`` is read as its name; the file
converted runs on PyTorch to MXNet's values and dtypes."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from port_code_helpers import run_as_module

from polytrain.porting.code import convert_source

mx = pytest.importorskip("mxnet")
torch = pytest.importorskip("torch")

NUMPY_DTYPES = """import numpy as np
from mxnet import nd


def made():
    return [nd.ones((2, 3), dtype=np.int32), nd.full((2,), 7, dtype=np.int32),
            nd.arange(0, 4, dtype=np.int32), nd.array([1.5, 2.0], dtype=np.int32),
            nd.zeros((3,), dtype=np.float64)]
"""

NOT_NUMPY = """from mxnet import nd


class np:
    int32 = 'float64'


def made():
    return nd.ones((2, 3), dtype=np.int32)
"""


def _run(source: str) -> dict[str, Any]:
    return run_as_module(source, "port_code_gluon_functions_run")


def test_a_numpy_dtype_converts_to_the_same_values_and_dtypes() -> None:
    """Before: each ``dtype=np.int32`` was left marked ("give the dtype as a string")."""
    result = convert_source(NUMPY_DTYPES, "made.py")
    assert not [u for u in result.report.uses if not u.converted], result.code
    expected = [a.asnumpy() for a in _run(NUMPY_DTYPES)["made"]()]
    got = [t.numpy() for t in _run(result.code)["made"]()]
    for e, g in zip(expected, got, strict=True):
        assert e.dtype == g.dtype and e.shape == g.shape
        np.testing.assert_array_equal(g, e)


def test_a_name_that_is_not_numpy_stays_marked() -> None:
    """A local ``np`` is not numpy: its ``int32`` is not read as a dtype name."""
    result = convert_source(NOT_NUMPY, "local.py")
    left = [u for u in result.report.uses if not u.converted]
    assert [u.api for u in left] == ["mxnet.nd.ones"], result.code


ITSELF = """import sys

from mxnet import nd

d2l = sys.modules[__name__]


def exp(x):
    return nd.exp(x)


def expand_dims(x, axis):
    return nd.expand_dims(x, axis=axis)



def made(x):
    return d2l.expand_dims(d2l.exp(x), 1)
"""


def test_a_call_on_the_module_itself_is_its_own_function() -> None:
    """d2l's ``d2l = sys.modules[__name__]``: ``d2l.exp(x)`` calls the file's ``exp``.
    Before: read as a tensor's ``.exp()`` method on ``d2l`` and marked (an extra
    positional argument)."""
    result = convert_source(ITSELF, "d2l.py")
    assert not [u for u in result.report.uses if not u.converted], result.code
    x = np.random.default_rng(0).standard_normal(3)
    expected = _run(ITSELF)["made"](mx.nd.array(x, dtype="float64")).asnumpy()
    got = _run(result.code)["made"](torch.tensor(x)).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-12)


OVERRIDE = """from mxnet.gluon import nn


class Cell(nn.HybridBlock):
    def _score(self, F, x):
        return F.relu(x)

    def hybrid_forward(self, F, x):
        return F.sum(self._score(F, x), axis=-1)


class Scaled(Cell):
    pass


class Softer(Scaled):
    def _score(self, F, x):
        return F.softmax(x * 2.0, axis=-1) + F.exp(x)
"""


def test_an_override_of_a_method_given_f_through_self_receives_f() -> None:
    """``self._score(F, x)`` in Cell's hybrid_forward reaches Softer's override on a
    Softer. Before: the override's ``F.softmax``/``F.exp`` were marked (F not followed)."""
    result = convert_source(OVERRIDE, "cells.py")
    assert not [u for u in result.report.uses if not u.converted], result.code
    assert "def _score(self, x):" in result.code
    x = np.random.default_rng(0).standard_normal((2, 3))
    block = _run(OVERRIDE)["Softer"]()
    expected = block(mx.nd.array(x, dtype="float64")).asnumpy()
    got = _run(result.code)["Softer"]()(torch.tensor(x)).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-12)


DROPOUT = """from mxnet import nd
from mxnet.gluon import nn


class Encoder(nn.HybridBlock):
    def hybrid_forward(self, F, x):
        return F.Dropout(x, p=0.5, axes=(0,))


def loose(x):
    return nd.Dropout(x, p=0.5)
"""


def test_dropout_follows_the_block_mode_and_is_marked_outside_a_block() -> None:
    """In a block's method ``F.Dropout`` takes the module's mode (``self.training``): off
    in eval mode, as Gluon's predict mode; in training mode one mask per column (axes=(0,))
    scaled by 1 / (1 - p), as MXNet's. In a plain function the mode is unknown: marked.
    Before: both were marked ("not in the mapping table yet")."""
    result = convert_source(DROPOUT, "dropout.py")
    left = [(u.api, u.line) for u in result.report.uses if not u.converted]
    assert left == [("mxnet.nd.Dropout", 11)], result.code
    x = np.random.default_rng(0).standard_normal((4, 64)) + 3.0
    expected = _run(DROPOUT)["Encoder"]()(mx.nd.array(x, dtype="float64")).asnumpy()
    net = _run(result.code)["Encoder"]()
    np.testing.assert_array_equal(net.eval()(torch.tensor(x)).numpy(), expected)
    out = net.train()(torch.tensor(x)).numpy()
    kept = out != 0
    assert (kept == kept[:1]).all() and 0 < kept.sum() < kept.size
    np.testing.assert_allclose(out[kept], 2 * x[kept], rtol=1e-12)
