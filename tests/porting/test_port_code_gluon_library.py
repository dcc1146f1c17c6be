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


SIZES = """from mxnet.gluon import nn
from mxnet.gluon.nn import BatchNorm


def _conv3x3(channels, stride, in_channels):
    return nn.Conv2D(channels, kernel_size=3, strides=stride, padding=1,
                     use_bias=False, in_channels=in_channels)


class Stem(nn.HybridBlock):
    def __init__(self, in_channels, norm_layer=BatchNorm, **kwargs):
        super(Stem, self).__init__(**kwargs)
        self.conv = _conv3x3(4, 2, in_channels)
        self.bn = norm_layer(scale=False, center=False)
        self.last = norm_layer(gamma_initializer='zeros')
        self.dense = nn.Dense(3, in_units=in_channels and 4 * 2 * 2)

    def hybrid_forward(self, F, x):
        return self.dense(self.last(self.bn(self.conv(x))) + 1)
"""


def _gluon_and_converted(source: str, name: str) -> tuple[dict, dict]:
    """``source`` run (its classes defined) as Gluon, and converted as PyTorch."""
    result = convert_source(source, f"{name}.py")
    assert result.report.unconverted == {}, result.code
    space: dict = {}
    exec(compile(source, f"<{name}>", "exec"), space)  # the test's own code
    converted: dict = {}
    exec(compile(result.code, "<converted>", "exec"), converted)  # the tool's output
    return space, converted


def test_an_input_size_in_a_variable_is_deferred_where_it_is_zero() -> None:
    """gluon-cv's ``_conv3x3(channels, stride, in_channels)`` with ``in_channels=0``
    (thumbnail ResNets): ``in_channels=in_channels`` made PyTorch's Conv2d(in_channels=0),
    a layer of no input that fails at its first call; a size in a variable is now given
    to ``gluon_deferred``, lazy where it is 0. The BatchNorms as values take Gluon's
    ``scale=False, center=False`` (not learnt) and ``gamma_initializer='zeros'``, which
    were refused. Outputs and gradients agree with MXNet's (1e-10) for sizes 0 and 2."""
    import numpy as np
    import pytest

    mx = pytest.importorskip("mxnet")
    torch = pytest.importorskip("torch")
    from port_code_corpus_harness import copy_weights

    space, converted = _gluon_and_converted(SIZES, "sizes")
    x = np.random.default_rng(2).standard_normal((2, 2, 4, 4))
    for size in (0, 2):
        block = space["Stem"](size)
        block.initialize(mx.init.Xavier())
        block.cast("float64")
        block(mx.nd.array(x, dtype="float64"))  # deferred shapes
        with mx.autograd.record():
            expected = block(mx.nd.array(x, dtype="float64"))
        expected.backward()
        net = converted["Stem"](size).double()
        with torch.no_grad():
            net(torch.tensor(x))  # lazy shapes
        copy_weights(block, net)
        got = net(torch.tensor(x))
        got.sum().backward()
        np.testing.assert_allclose(got.detach().numpy(), expected.asnumpy(), rtol=0, atol=1e-10)
        assert net.bn.weight.grad is None and net.bn.bias.grad is None  # not learnt
        np.testing.assert_allclose(
            net.conv.weight.grad.numpy(), block.conv.weight.grad().asnumpy(), atol=1e-10
        )


def test_pooling_ceil_mode_is_refused_where_a_window_can_start_in_the_padding() -> None:
    """Gluon's ``ceil_mode=True`` (MXNet's 'full' convention) keeps a last window that
    starts in the right padding, which PyTorch's ceil_mode drops: equal only where each
    window is at least its stride plus the padding wide (the table's examples run such
    layers); a pool of size 2, stride 2, padding 1 is refused when made."""
    import pytest

    pytest.importorskip("torch")
    source = "from mxnet.gluon import nn\nlayer = nn.MaxPool2D(2, 2, 1, ceil_mode=True)\n"
    result = convert_source(source, "pool.py")
    assert result.report.unconverted == {}, result.code
    with pytest.raises(NotImplementedError, match="may start in the padding"):
        exec(compile(result.code, "<converted>", "exec"), {})  # the tool's output


FILLED = """from mxnet.gluon import nn


def _add_conv(out, channels, norm_layer, relu6=False):
    out.add(nn.Conv2D(channels, 3, use_bias=False))
    out.add(norm_layer())
    out.add(ReLU6() if relu6 else nn.Activation('relu'))


def _seen(seen, x):
    seen.add(x)
"""


def test_a_parameter_filled_with_blocks_is_a_container() -> None:
    """gluon-cv's mobilenet fills a Sequential in ``_add_conv(out, ...)``: ``out`` is a
    parameter, not made in the file, so ``out.add(...)`` was left as Gluon's ``add``,
    unmarked, which PyTorch's Sequential has not. A name given a framework block by
    ``add`` in a function is a container there: each of its ``add`` calls converted; a
    set's ``add`` stays."""
    result = convert_source(FILLED, "filled.py")
    assert result.report.unconverted == {}, result.code
    assert "out.extend([nn.LazyConv2d(" in result.code
    assert "out.extend([norm_layer()])" in result.code
    assert "out.extend([ReLU6() if relu6 else nn.ReLU()])" in result.code
    assert "seen.add(x)" in result.code
