"""Paddle's convolutions built by polytrain add their bias with one reduction in backward
(backends/polytrain_paddle/_layers.py, ``_ChannelBias``): the same numbers as Paddle's own
Conv2D, float64 to 1e-12, and the same parameters under the same names."""

from __future__ import annotations

import numpy as np
import pytest

from polytrain.neutral import models

paddle = pytest.importorskip("paddle")
from polytrain_paddle._layers import _Conv2D, build  # noqa: E402 - needs paddle


@pytest.mark.parametrize("stride,padding,bias", [(1, 0, True), (2, 1, True), (1, 1, False)])
def test_conv_matches_paddles_own_conv2d(stride: int, padding: int, bias: bool) -> None:
    spec = models.Conv2d(3, 5, 3, stride=stride, padding=padding, bias=bias)
    ours = build(spec)
    assert isinstance(ours, _Conv2D)
    theirs = paddle.nn.Conv2D(
        3, 5, 3, stride=stride, padding=padding, bias_attr=None if bias else False
    )
    rng = np.random.default_rng(0)
    for layer in (ours, theirs):
        layer.to(dtype="float64")
    for (name, p), q in zip(ours.named_parameters(), theirs.parameters(), strict=True):
        value = rng.standard_normal(p.shape)
        p.set_value(value)
        q.set_value(value)
        assert name in ("weight", "bias")
    x = rng.standard_normal((4, 3, 9, 9))
    outs = []
    for layer in (ours, theirs):
        inp = paddle.to_tensor(x, stop_gradient=False)
        out = layer(inp)
        (out * out).sum().backward()
        outs.append([out.numpy(), inp.grad.numpy(), *(p.grad.numpy() for p in layer.parameters())])
    for a, b in zip(*outs, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
