"""port-code on Gluon library code (gluon-cv's model zoo, gluon-nlp): what the registry
corpus found beyond ``hybrid_forward`` (tests/porting/test_port_code_hybrid.py)."""

from __future__ import annotations

from polytrain.porting.code import convert_source

DEFAULT = """from mxnet.gluon import nn
from mxnet.gluon.nn import BatchNorm


class Block(nn.HybridBlock):
    def __init__(self, channels, norm_layer=BatchNorm, norm_kwargs=None, **kwargs):
        super().__init__(**kwargs)
        self.bn = norm_layer(**({} if norm_kwargs is None else norm_kwargs))
"""


def test_a_framework_layer_as_a_parameter_default_is_converted() -> None:
    """gluon-cv's ``norm_layer=BatchNorm``: the default was left as it was, unmarked, so
    the converted block made a Gluon layer inside a PyTorch module; it is a value now,
    converted by the entry's ``value`` (a name without one is marked)."""
    result = convert_source(DEFAULT, "block.py")
    assert result.report.unconverted == {}, result.code
    assert "norm_layer=gluon_batch_norm," in result.code
    assert "mxnet" not in result.code


NORM = """from mxnet.gluon import nn
from mxnet.gluon.nn import BatchNorm


class Block(nn.HybridBlock):
    def __init__(self, norm_layer=BatchNorm, norm_kwargs=None, **kwargs):
        super().__init__(**kwargs)
        self.bn = norm_layer(**({} if norm_kwargs is None else norm_kwargs))

    def hybrid_forward(self, F, x):
        return self.bn(x)
"""


def test_a_batch_norm_passed_as_a_value_normalises_as_gluons() -> None:
    """``norm_layer=BatchNorm`` then ``norm_layer(momentum=0.8, in_channels=3)``: the
    table's ``gluon_batch_norm`` takes Gluon's arguments; training-mode outputs agree
    with MXNet's (1e-10; the running statistics update at another time: rule 9)."""
    import numpy as np
    import pytest

    mx = pytest.importorskip("mxnet")
    torch = pytest.importorskip("torch")
    result = convert_source(NORM, "norm.py")
    assert result.report.unconverted == {}, result.code
    x = np.random.default_rng(1).standard_normal((2, 3, 4, 4))
    kwargs = {"momentum": 0.8, "in_channels": 3}
    space: dict = {}
    exec(compile(NORM, "<norm>", "exec"), space)  # the test's own code
    block = space["Block"](norm_kwargs=kwargs)
    block.initialize()
    block.cast("float64")
    with mx.autograd.record():
        expected = block(mx.nd.array(x, dtype="float64")).asnumpy()
    converted: dict = {}
    exec(compile(result.code, "<converted>", "exec"), converted)  # the tool's output
    net = converted["Block"](norm_kwargs=kwargs).double().train()
    got = net(torch.tensor(x)).detach().numpy()
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-10)


TWO_CLASSES = """from mxnet.gluon import nn


class Down(nn.HybridBlock):
    def __init__(self, **kwargs):
        super(Down, self).__init__(**kwargs)
        self.downsample = nn.HybridSequential(prefix='')
        self.downsample.add(nn.Dense(3, in_units=4))


class Plain(nn.HybridBlock):
    def __init__(self, **kwargs):
        super(Plain, self).__init__(**kwargs)
        self.downsample = nn.Dense(3, in_units=4)
"""


def test_self_attributes_of_two_classes_are_two_receivers() -> None:
    """gluon-cv's cifarresnet: ``self.downsample`` is a HybridSequential in one block and
    a Conv2D in the next; the receivers were keyed by their text in the module, so the
    last maker won and ``self.downsample.add(...)`` was left as Gluon's ``add``, which
    PyTorch's Sequential has not. They are keyed by class now."""
    result = convert_source(TWO_CLASSES, "blocks.py")
    assert "self.downsample.extend([torch.nn.Sequential(torch.nn.Flatten(), " in result.code
    assert result.report.unconverted == {}, result.code


def test_a_blocks_prefix_given_on_to_its_base_is_dropped() -> None:
    """gluon-cv makes its blocks with ``block(..., prefix='')``, and each block gives its
    ``**kwargs`` to ``super().__init__``: PyTorch's Module refused ``prefix`` (a
    TypeError at the first block). They go through ``gluon_block_kwargs``, which drops
    ``prefix`` and refuses ``params`` (shared parameters)."""
    import pytest

    pytest.importorskip("torch")
    result = convert_source(TWO_CLASSES, "blocks.py")
    assert "super(Down, self).__init__(**gluon_block_kwargs(**kwargs))" in result.code
    space: dict = {}
    exec(compile(result.code, "<converted>", "exec"), space)  # the tool's output
    assert len(space["Down"](prefix="").downsample) == 1
    with pytest.raises(NotImplementedError, match="shared parameters"):
        space["Plain"](params=object())
