"""Gluon's classes and their structure converted by ``polytrain port-code``
(polytrain/porting/code/gluon_classes.py): a ``gluon.loss.Loss`` subclass whose
``hybrid_forward`` hands its ``F`` to Gluon's loss helpers (``_reshape_like``,
``_apply_weighting``) runs on PyTorch to the MXNet loss's numbers, with no marker left."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from polytrain.porting.code import convert_source
from polytrain.porting.code.hybrid import PARAMETER
from polytrain.porting.code.table import frameworks, merge

mx = pytest.importorskip("mxnet")
torch = pytest.importorskip("torch")

LOSS = """from mxnet import nd
from mxnet.gluon.loss import Loss, _apply_weighting, _reshape_like


class MaskedL1Loss(Loss):
    def __init__(self, weight=None, batch_axis=0, **kwargs):
        super(MaskedL1Loss, self).__init__(weight, batch_axis, **kwargs)

    def hybrid_forward(self, F, pred, label, mask, sample_weight=None):
        label = _reshape_like(F, label, pred)
        loss = F.abs(label * mask - pred * mask)
        loss = _apply_weighting(F, loss, self._weight, sample_weight)
        return F.sum(loss, axis=1) / F.sum(mask).clip(1, 1e30)


def box_error(pred, target):
    return nd.abs(_reshape_like(nd, pred, target) - target)
"""


def _run(code: str) -> dict[str, Any]:
    space: dict[str, Any] = {}
    exec(compile(code, "<loss>", "exec"), space)  # the test's own code
    return space


def _same_block_outputs(source: str, code: str, x: np.ndarray) -> Any:
    """The block ``make()`` builds in ``source`` (MXNet) and in ``code`` (converted), both
    float64, give the same outputs on ``x``; the converted net."""
    block = _run(source)["make"]()
    block.cast("float64")
    expected = block(mx.nd.array(x, dtype="float64")).asnumpy()
    net = _run(code)["make"]().double()
    got = net(torch.tensor(x)).detach().numpy()
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-10)
    return net


def test_a_loss_subclass_runs_to_mxnets_numbers() -> None:
    """Before: the ``F`` given to ``_reshape_like`` / ``_apply_weighting`` was marked as
    code the tool does not see, and ``nd`` given to them as an unconverted ``mxnet.nd``."""
    result = convert_source(LOSS, "loss.py")
    assert not [u for u in result.report.uses if not u.converted], result.code
    rng = np.random.default_rng(0)
    pred, mask, weight = rng.standard_normal((4, 3)), rng.random((4, 3)), rng.random((4, 1))
    label = rng.standard_normal(12)
    gluon_space, torch_space = _run(LOSS), _run(result.code)
    nd_args = [mx.nd.array(a, dtype="float64") for a in (pred, label, mask, weight)]
    th_args = [torch.tensor(a) for a in (pred, label, mask, weight)]
    for kwargs in ({}, {"weight": 0.5, "prefix": "l1_"}):
        expected = gluon_space["MaskedL1Loss"](**kwargs)(*nd_args).asnumpy()
        got = torch_space["MaskedL1Loss"](**kwargs)(*th_args).numpy()
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-10)
    expected = gluon_space["box_error"](nd_args[1], nd_args[0]).asnumpy()
    got = torch_space["box_error"](th_args[1], th_args[0]).numpy()
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-10)


def test_a_loss_subclass_refuses_shared_parameters() -> None:
    """``params=`` (another block's parameters) has no PyTorch form: refused when made."""
    result = convert_source(LOSS, "loss.py")
    with pytest.raises(NotImplementedError, match="shared parameters"):
        _run(result.code)["MaskedL1Loss"](params={})


PARAMS = """import numpy as np
import mxnet as mx
from mxnet import init
from mxnet.gluon import nn


class Scaled(nn.HybridBlock):
    def __init__(self, means, weight_initializer=None, **kwargs):
        super(Scaled, self).__init__(**kwargs)
        with self.name_scope():
            self.g = self.params.get('g', shape=(1,), init=mx.init.Constant(0.5),
                                     allow_deferred_init=True)
            self.v = self.params.get('v', shape=(1, 3), init=weight_initializer)
            self.pos_bias = self.params.get('pos_bias', shape=3, dtype=np.float64)
            self.w = self.params.get('w', shape=(3,), init='zeros', dtype='float64')
            self.means = self.params.get_constant('means', means)

    def hybrid_forward(self, F, x, g, v, pos_bias, w, means):
        return F.broadcast_add(F.broadcast_mul(x, g) * v + pos_bias + w, means)


def make():
    net = Scaled(np.array([1.0, 2.0, 3.0]), prefix='scaled_')
    net.initialize(init.Constant(3.0))
    return net
"""


def test_block_parameters_are_made_and_initialised_as_gluons() -> None:
    """Before: each ``self.params.get`` was marked (write the Parameter by hand). Gluon gives
    a parameter made without ``init`` the net's initializer whatever its name
    (``pos_bias`` gets 3.0, not a bias's zero), one with ``init`` its own; a constant is
    not learnt."""
    result = convert_source(PARAMS, "params.py")
    assert not [u for u in result.report.uses if not u.converted], result.code
    x = np.random.default_rng(1).standard_normal((2, 3))
    net = _same_block_outputs(PARAMS, result.code, x)
    assert net.pos_bias.tolist() == [3.0, 3.0, 3.0] and net.g.tolist() == [0.5]
    assert not net.means.requires_grad and net.g.requires_grad


@pytest.mark.parametrize(
    ("arguments", "why"),
    [
        ("shape=(0, 3)", "Gluon infers the 0 sizes"),
        ("shape=(2,), grad_stype='row_sparse'", "row_sparse gradients"),
        ("shape=(2,), lr_mult=0.1", "its own optimizer group"),
    ],
)
def test_a_parameter_torch_cannot_hold_as_gluon_does_is_refused(arguments: str, why: str) -> None:
    source = (
        "from mxnet.gluon import nn\n\n\nclass B(nn.HybridBlock):\n"
        "    def __init__(self):\n        super().__init__()\n"
        f"        self.w = self.params.get('w', {arguments})\n\n"
        "    def hybrid_forward(self, F, x, w):\n        return x * w\n"
    )
    result = convert_source(source, "b.py")
    assert not [u for u in result.report.uses if not u.converted], result.code
    with pytest.raises(NotImplementedError, match=why):
        _run(result.code)["B"]()


def test_a_getter_with_arguments_it_cannot_name_stays_marked() -> None:
    source = (
        "from mxnet.gluon import nn\n\n\nclass B(nn.HybridBlock):\n"
        "    def __init__(self, **options):\n        super().__init__()\n"
        "        self.w = self.params.get('w', **options)\n\n"
        "    def hybrid_forward(self, F, x, w):\n        return x * w\n"
    )
    result = convert_source(source, "b.py")
    assert result.report.reasons() == {"Block.params.get": PARAMETER}


SYMBOLS = """import mxnet as mx
from mxnet.gluon import SymbolBlock
from mxnet.base import string_types


def expand(y, names):
    if isinstance(names, string_types):
        names = [names]
    assert isinstance(y, mx.symbol.Symbol)
    y = mx.sym.Convolution(y, num_filter=8, kernel=(3, 3), name=names[0])
    return SymbolBlock([y], [mx.sym.var('data')])
"""


def test_the_symbol_api_is_marked_with_what_to_write() -> None:
    """Before: each symbolic call was marked "not in the mapping table yet", as if a
    later table would convert it; MXNet's graph API has no line-by-line PyTorch form, and
    the marker says what to write instead. ``string_types`` and ``Symbol`` as a type are
    converted (nothing in the converted program is a Symbol)."""
    result = convert_source(SYMBOLS, "symbols.py")
    reasons = result.report.reasons()
    assert set(reasons) == {"mxnet.sym.Convolution", "mxnet.sym.var", "mxnet.gluon.SymbolBlock"}
    assert all("torch.nn.Module" in why for why in reasons.values()), reasons
    assert "isinstance(names, (str,))" in result.code
    assert "isinstance(y, GluonSymbol)" in result.code


def test_two_tables_of_one_framework_keep_both_unconverted_modules() -> None:
    """A framework split over two table files (Paddle's five) keeps every table's
    ``[framework.unconverted]`` hints; the merge used to drop them (and would have dropped
    gluon.toml's symbol hints beside a second mxnet table)."""
    gluon = frameworks()["mxnet"]
    extra = dataclasses.replace(
        gluon, entries={}, methods={}, unconverted={"mxnet.rtc": "compile CUDA yourself"}
    )
    both = merge(gluon, extra)
    assert both.why_not("mxnet.sym.var") == gluon.why_not("mxnet.sym.var") != ""
    assert both.why_not("mxnet.rtc.CudaModule") == "compile CUDA yourself"


NORMS = """from mxnet.gluon import nn


class Block(nn.Block):
    def __init__(self, units, **kwargs):
        super().__init__(**kwargs)
        self.ln = nn.LayerNorm()
        self.sized = nn.LayerNorm(in_channels=3)
        self.inferred = nn.LayerNorm(in_channels=0, epsilon=1e-3)

    def forward(self, x):
        return self.inferred(self.sized(self.ln(x)))


def make():
    net = Block(3)
    net.initialize()
    return net
"""


def test_a_layer_norm_without_its_size_is_made_at_the_first_call() -> None:
    """Before: ``nn.LayerNorm()`` (Gluon infers the size) was marked "give in_channels";
    it is PyTorch's LayerNorm made lazily now, and initialised as Gluon's (ones, zeros)."""
    result = convert_source(NORMS, "norms.py")
    assert not [u for u in result.report.uses if not u.converted], result.code
    assert "self.ln = GluonLazyLayerNorm()" in result.code
    assert "self.sized = nn.LayerNorm(normalized_shape=3)" in result.code
    x = np.random.default_rng(2).standard_normal((2, 4, 3))
    net = _same_block_outputs(NORMS, result.code, x)
    assert type(net.ln) is torch.nn.LayerNorm and net.ln.weight.tolist() == [1.0] * 3


def test_a_layer_norm_sized_by_a_variable_is_made_by_its_value() -> None:
    """A size in a variable may be 0 (Gluon infers it) when the code runs."""
    source = (
        "from mxnet.gluon import nn\n\n\ndef make(size):\n"
        "    return nn.LayerNorm(in_channels=size)\n"
    )
    result = convert_source(source, "norm.py")
    assert not [u for u in result.report.uses if not u.converted], result.code
    make = _run(result.code)["make"]
    assert type(make(0)).__name__ == "GluonLazyLayerNorm"
    assert make(3).normalized_shape == (3,)


def test_kwargs_pass_on_only_to_a_helper_with_the_sources_signature() -> None:
    """Before: ``SoftmaxCrossEntropyLoss(sparse_label=False, **kwargs)`` (gluon-cv's
    distillation loss) was marked: its helper takes Gluon's keywords by their names, so
    the mapping passes on as it is; an entry whose names differ keeps the marker."""
    source = (
        "from mxnet.gluon import loss as gloss\n\n\ndef make(**kwargs):\n"
        "    return gloss.SoftmaxCrossEntropyLoss(sparse_label=False, **kwargs)\n\n\n"
        "def other(**kwargs):\n    return gloss.L2Loss(**kwargs)\n"
    )
    result = convert_source(source, "losses.py")
    assert list(result.report.reasons()) == ["mxnet.gluon.loss.L2Loss"], result.code
    assert "gluon_softmax_ce_loss(sparse_label=False, **kwargs)" in result.code
