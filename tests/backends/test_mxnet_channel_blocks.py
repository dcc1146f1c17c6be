"""MXNet's float32 convolutions traced with zero-padded channels (polytrain_mxnet's
``_channel_blocks``): which layers pad, that the hybridized graph really runs the padded
convolutions, and that it computes what the plain layers compute."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from polytrain import get_backend
from polytrain.neutral import models
from polytrain.neutral.models import (
    AvgPool2d,
    Conv2d,
    Flatten,
    Linear,
    MaxPool2d,
    ModelSpec,
    ReLU,
    get_model_spec,
    seq,
)
from polytrain.testing import batch

mx = pytest.importorskip("mxnet")
from mxnet import autograd  # noqa: E402
from polytrain_mxnet._channel_blocks import PaddedConv, plan_channels  # noqa: E402
from polytrain_mxnet._precision import autocast  # noqa: E402


def _layers_of(spec: ModelSpec) -> list[models.Layer]:
    return [layer for _, layer in spec.net.layers]


def test_lenet_pads_both_convolutions_and_slices_before_flatten() -> None:
    plan = plan_channels(_layers_of(get_model_spec("lenet")))
    assert plan is not None
    # conv1 1 -> 20 (+12 = 32); conv2 reads the 32 and writes 50 (+14 = 64)
    assert plan.convs == {0: PaddedConv(0, 12), 3: PaddedConv(12, 14)}
    assert plan.slices == {6: 50}  # before Flatten, back to conv2's 50


@pytest.mark.parametrize(
    ("layers", "why"),
    [
        ([Conv2d(1, 16, 3), ReLU()], "a whole block already"),
        ([Conv2d(1, 24, 3), ReLU()], "a multiple of 8: oneDNN's 8-wide kernels run it"),
        ([Conv2d(1, 18, 3), ReLU()], "18 -> 32 adds more than 60 %"),
        ([Conv2d(1, 4, 3), ReLU()], "4 -> 16 adds more than 60 %"),
        ([Conv2d(6, 20, 3), ReLU()], "a plain 6-channel input is read slowly either way"),
        ([Linear(4, 4)], "no convolution"),
    ],
)
def test_no_padding_where_it_was_not_measured_faster(layers: list[Any], why: str) -> None:
    assert plan_channels(layers) is None, why


def test_a_padded_run_ends_at_any_other_layer_and_at_the_end() -> None:
    plan = plan_channels([Conv2d(3, 20, 3), MaxPool2d(2, 2), Conv2d(20, 16, 1), Flatten()])
    assert plan is not None
    assert plan.convs == {0: PaddedConv(0, 12), 2: PaddedConv(12, 0)}
    assert plan.slices == {}  # conv 16 -> whole blocks: nothing to slice
    plan = plan_channels([Conv2d(3, 20, 3), ReLU(), Conv2d(20, 24, 3)])
    assert plan is not None  # 24 stays, so it must not read the padded 32: slice first
    assert plan.convs == {0: PaddedConv(0, 12)}
    assert plan.slices == {2: 20}
    plan = plan_channels([Conv2d(3, 20, 3), AvgPool2d(2)])
    assert plan is not None and plan.slices == {2: 20}  # at the end


def _steps(spec: ModelSpec, dtype: str, fast: bool, pad: bool = True) -> tuple[list, Any]:
    """Two recorded forward/backward passes: outputs and gradients, and the block."""
    b = get_backend("mxnet", fast=fast)
    model = b.build_model(spec, dtype=dtype)
    if not pad:
        model.native._channels = None  # as built without a plan (no graph traced yet)
    b.set_params(model, spec.init_params(seed=3))
    net, params = model.native, sorted(model.native._collect_params_with_prefix().items())
    seen = []
    for step in range(2):
        x = mx.nd.array(batch(spec, 16, seed=step)[0], dtype=dtype)
        for _, p in params:
            p.zero_grad()
        with autograd.record():
            out = net(x)
            (out * out).sum().backward()
        seen += [out.asnumpy(), *(p.grad().asnumpy() for _, p in params)]
    return seen, net


def _conv_filters(net: Any) -> list[int]:
    """num_filter of each Convolution in the block's cached graph."""
    graph = json.loads(net._cached_graph[1].tojson())
    return [int(n["attrs"]["num_filter"]) for n in graph["nodes"] if n["op"] == "Convolution"]


def test_hybridized_lenet_runs_padded_convolutions_with_the_plain_numbers() -> None:
    spec = get_model_spec("lenet")
    padded, net = _steps(spec, "float32", fast=True)
    assert _conv_filters(net) == [32, 64]
    plain, plain_net = _steps(spec, "float32", fast=True, pad=False)
    assert _conv_filters(plain_net) == [20, 50]
    imperative, _ = _steps(spec, "float32", fast=False)
    assert len(padded) == len(plain) == len(imperative)
    for i, (p, a, m) in enumerate(zip(padded, plain, imperative, strict=True)):
        assert p.shape == a.shape  # parameters and gradients keep their own shapes
        np.testing.assert_array_equal(a, m, err_msg=f"array {i}")  # plain graph: to the bit
        # float32 sums in another order: within a few units of rounding of the largest
        assert np.abs(p - a).max() <= 1e-5 * np.abs(a).max(), f"array {i}"


def test_a_convolution_without_bias_and_a_max_pool_pad_as_well() -> None:
    net = seq(
        ("conv1", Conv2d(3, 20, 3, bias=False)),
        ("relu", ReLU()),
        ("pool", MaxPool2d(2, 2, padding=1)),
        ("conv2", Conv2d(20, 16, 3, padding=1)),
        ("flatten", Flatten()),
        ("fc", Linear(16 * 5 * 5, 10)),
    )
    spec = ModelSpec("no-bias", net, input_shape=(3, 10, 10))
    padded, net_padded = _steps(spec, "float32", fast=True)
    assert _conv_filters(net_padded) == [32, 16]
    plain, _ = _steps(spec, "float32", fast=True, pad=False)
    for i, (p, a) in enumerate(zip(padded, plain, strict=True)):
        assert p.shape == a.shape
        assert np.abs(p - a).max() <= 1e-5 * np.abs(a).max(), f"array {i}"


def test_float64_and_autocast_trace_the_plain_convolutions() -> None:
    spec = get_model_spec("lenet")
    hybrid, net = _steps(spec, "float64", fast=True)
    assert _conv_filters(net) == [20, 50]  # oneDNN has no float64 convolution
    imperative, _ = _steps(spec, "float64", fast=False)
    for i, (h, m) in enumerate(zip(hybrid, imperative, strict=True)):
        np.testing.assert_array_equal(h, m, err_msg=f"array {i}")
    b = get_backend("mxnet", fast=True)
    model = b.build_model(spec, dtype="float32")
    with autocast("bf16"):
        model.native(mx.nd.array(batch(spec, 4, seed=0)[0]))
    assert _conv_filters(model.native) == [20, 50]


def test_a_non_finite_input_stays_non_finite() -> None:
    """A padded channel multiplies its zero weights by the input: inf gives NaN there,
    which the next convolution reads; the output is non-finite either way."""
    net = seq(
        ("conv1", Conv2d(1, 20, 3)),
        ("relu", ReLU()),
        ("conv2", Conv2d(20, 50, 3)),
        ("flatten", Flatten()),
        ("fc", Linear(50 * 4 * 4, 10)),
    )
    spec = ModelSpec("odd-channels", net, input_shape=(1, 8, 8))
    for pad in (True, False):
        b = get_backend("mxnet", fast=True)
        model = b.build_model(spec, dtype="float32")
        if not pad:
            model.native._channels = None
        b.set_params(model, spec.init_params(seed=0))
        x = batch(spec, 2, seed=0)[0].copy()
        x[0, 0, 3, 3] = np.inf
        out = model.native(mx.nd.array(x)).asnumpy()
        assert not np.isfinite(out[0]).all(), pad
        assert np.isfinite(out[1]).all(), pad
