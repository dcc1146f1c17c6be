"""Gluon's own rnn.LSTM / rnn.GRU (the fused RNN operator, layout ``NTC``) for the
recurrent layers: PyTorch's gate order and layout, checked against the numpy reference in
float64; their Gluon names are renamed to the canonical ones (see ``_rnn_names``).

MXNet 1.9's native fused kernel (what float64 runs; float32 runs oneDNN's) skips the
gradient between stacked layers when the layer's input needs none, as a net's first layer
fed with data: every layer but the top one then gets a wrong weight gradient (measured: off
by up to 8e-2 for a 2-layer GRU). Stacked layers here take their input through ``x + 0 *
sum(bias_ih_l0)``: exactly ``x`` (and exactly 0 added to that bias's gradient, for finite
values), but an input that needs a gradient, so the kernel computes them all.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mxnet.gluon import nn, rnn

from polytrain.neutral import models


def _needs_input_gradient(F: Any, inputs: Any, kwargs: dict[str, Any]) -> Any:
    """``inputs`` + an exact zero that depends on a parameter (see the module docstring)."""
    zero = F.reshape(F.sum(kwargs["l0_i2h_bias"] * 0), shape=(1, 1, 1))
    return F.broadcast_add(inputs, zero)


class LSTM(rnn.LSTM):
    def hybrid_forward(self, F: Any, inputs: Any, states: Any, *args: Any, **kwargs: Any) -> Any:
        if self._num_layers > 1:
            inputs = _needs_input_gradient(F, inputs, kwargs)
        return super().hybrid_forward(F, inputs, states, *args, **kwargs)


class GRU(rnn.GRU):
    def hybrid_forward(self, F: Any, inputs: Any, states: Any, *args: Any, **kwargs: Any) -> Any:
        if self._num_layers > 1:
            inputs = _needs_input_gradient(F, inputs, kwargs)
        return super().hybrid_forward(F, inputs, states, *args, **kwargs)


def _recurrent(cls: type[LSTM | GRU]) -> Callable[[Any], nn.HybridBlock]:
    """The builder of a ``cls`` block from its spec layer. Called without states, Gluon's
    layer starts from zeros and returns the output sequence only."""

    def build(layer: models.LSTM | models.GRU) -> nn.HybridBlock:
        return cls(
            layer.hidden_size, num_layers=layer.num_layers, layout="NTC",
            input_size=layer.input_size,
        )  # fmt: skip

    return build


#: the recurrent layers' builders
RECURRENT_BUILDERS: dict[type, Callable[[Any], nn.HybridBlock]] = {
    models.LSTM: _recurrent(LSTM),
    models.GRU: _recurrent(GRU),
}
