"""Gluon's ``hybrid_forward(self, F, x)`` converted as PyTorch's ``forward(self, x)``
(polytrain/porting/code/hybrid.py): ``F.x`` as ``mxnet.nd.x`` in it and in the functions it
passes ``F`` to, ``F`` gone from their definitions and calls, the block's parameters read
from ``self``; an ``F`` given to code the tool does not see is marked. The converted
block runs on PyTorch to the MXNet block's numbers."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from polytrain.porting.code import convert_source
from polytrain.porting.code.hybrid import PASSED_ON

mx = pytest.importorskip("mxnet")
torch = pytest.importorskip("torch")

BLOCK = """from mxnet import nd
from mxnet.gluon import nn


def _scaled_softmax(F, score, scale):
    return F.softmax(score * scale, axis=-1)


class Scaled(nn.HybridBlock):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = nn.Dense(3, in_units=4, flatten=False)

    def _weights(self, F, x):
        return _scaled_softmax(F, self.dense(x), 2.0)

    def hybrid_forward(self, F, x):
        return F.broadcast_mul(self._weights(F, x), F.sum(x, axis=-1, keepdims=True))
"""


def _run(code: str) -> dict[str, Any]:
    space: dict[str, Any] = {}
    exec(compile(code, "<block>", "exec"), space)  # the test's own code
    return space


def test_hybrid_forward_runs_as_forward_to_the_same_numbers() -> None:
    """Before: every ``F.x`` was left marked and ``hybrid_forward`` kept its name (PyTorch
    calls ``forward``: the converted block failed at its first call)."""
    result = convert_source(BLOCK, "block.py")
    assert not [u for u in result.report.uses if not u.converted], result.code
    assert "def forward(self, x):" in result.code
    assert "def _scaled_softmax(score, scale):" in result.code
    assert "self._weights(x)" in result.code
    x = np.random.default_rng(0).standard_normal((2, 4))
    block = _run(BLOCK)["Scaled"]()
    block.initialize()
    block.cast("float64")
    expected = block(mx.nd.array(x, dtype="float64")).asnumpy()
    net = _run(result.code)["Scaled"]().double()
    with torch.no_grad():
        net.dense.weight.copy_(torch.tensor(block.dense.weight.data().asnumpy()))
        net.dense.bias.copy_(torch.tensor(block.dense.bias.data().asnumpy()))
    got = net(torch.tensor(x)).detach().numpy()
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-10)


PARAMS = """from mxnet.gluon import nn


class Scale(nn.HybridBlock):
    def __init__(self, means=None, **kwargs):
        super().__init__(**kwargs)
        self.g = self.params.get('g', shape=(1,))
        if means is not None:
            self.means = self.params.get_constant('means', means)

    def hybrid_forward(self, F, x, g, means=None):
        '''Scaled.'''
        return F.broadcast_mul(x, g)
"""


def test_block_parameters_given_by_name_are_read_from_self() -> None:
    """Gluon passes the parameters a block made (``self.g = self.params.get('g')``) to
    ``hybrid_forward`` by name; PyTorch's ``forward`` reads them from ``self``; one the
    block made only sometimes (a default in the signature) through ``getattr``. The
    parameters themselves are made by ``gluon_parameter`` / ``gluon_constant``
    (tests/porting/test_port_code_gluon_classes.py)."""
    result = convert_source(PARAMS, "scale.py")
    assert "    def forward(self, x):\n        '''Scaled.'''\n        g = self.g\n" in result.code
    assert "means = getattr(self, 'means', None)" in result.code
    left = {u.api: u.why for u in result.report.uses if not u.converted}
    assert left == {}, left
    compile(result.code, "scale.py", "exec")


PASSED = """from mxnet.gluon import nn
from somewhere import helper


class Block(nn.HybridBlock):
    def hybrid_forward(self, F, x):
        return helper(F, x) + F.ones_like(x)
"""


def test_an_F_given_to_code_the_tool_does_not_see_is_marked() -> None:
    """``helper(F, x)`` of another module: the converted ``forward`` has no ``F``."""
    result = convert_source(PASSED, "passed.py")
    assert result.report.unconverted == {"F": 1}
    assert PASSED_ON.split(":")[0] in result.code
    assert "helper(F, x) + torch.ones_like(x)" in result.code
