"""Paddle's own nn.LSTM / nn.GRU for the recurrent layers (``time_major=False``).

Paddle keeps PyTorch's gate order (LSTM i, f, g, o; GRU r, z, n with the reset gate
applied after the recurrent product), layout ([gates * H, in]) and flat names
(``weight_ih_l0``), checked against the numpy reference in float64. Its layer lists each
parameter twice in ``state_dict()`` (also as ``0.cell.weight_ih``) and its ``.to(dtype)``
fails on the empty ``_dropout_state`` buffer it keeps for cuDNN, so the layer here holds
Paddle's as a hidden child and registers only the flat names: the same tensors, named
once, cast in place with the model.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import paddle
from paddle import nn

from polytrain.neutral import models


class Recurrent(nn.Layer):
    """Paddle's nn.LSTM or nn.GRU, batch first, from a zero state, returning the output
    sequence; its parameters under their flat names (``weight_ih_l0``, ...)."""

    def __init__(self, layer: models.LSTM | models.GRU) -> None:
        super().__init__()
        cls = nn.LSTM if isinstance(layer, models.LSTM) else nn.GRU
        rnn = cls(layer.input_size, layer.hidden_size, layer.num_layers, time_major=False)
        object.__setattr__(self, "_rnn", rnn)  # not a sublayer: no cell aliases, no buffer
        for name, param in rnn.named_parameters():
            self.add_parameter(name, param)

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        rnn: nn.Layer = self._rnn
        rnn.training = self.training  # the fused op's is_test follows the mode
        return rnn(x)[0]


#: the recurrent layers' builders
RECURRENT_BUILDERS: dict[type, Callable[[Any], nn.Layer]] = {
    models.LSTM: Recurrent,
    models.GRU: Recurrent,
}
