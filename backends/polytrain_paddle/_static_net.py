"""A neutral model spec as ops of a Paddle static program (the static fast path's forward).

Each spec layer becomes the functional ops its dygraph layer (``_layers``) runs, reading
the dygraph layer's own parameters by name (``Params``), so the program and the eager
model share one set of tensors. Two forms differ from the eager layers, both to keep
Paddle's slow kernels off the step (docs/performance.md, "Paddle's static graph"):

* a convolution's bias is added inside the convolution (``fold_bias``) where that costs
  nothing: one more input channel of ones whose filter tap is the bias. oneDNN pads the
  input channels to blocks of 16, so for ``in_channels % 16 != 0`` the extra channel is
  free, and the broadcast add with its reduction (Paddle's slowest kernels here) is gone.
  Same numbers up to float rounding (the bias is summed with the products);
* BatchNorm's running statistics are assigned in the program with the eager layer's
  PyTorch rule (``momentum`` weights the batch; the unbiased variance).

A layer this module has no form for raises :class:`StaticUnsupported` (the model then
trains eagerly, and says why).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import paddle
import paddle.nn.functional as F

from polytrain.neutral import models

ONEDNN_BLOCK = 16  # oneDNN's AVX-512 channel block: a conv's input channels are padded to it


class StaticUnsupported(Exception):
    """The spec (or the run) has something the static program does not build."""


@dataclass
class Params:
    """The program's view of the eager layer's state: ``get(key)`` gives the parameter of
    the state-dict entry ``key`` (created once, named as the eager tensor, so a scope
    holding the eager tensors under those names feeds it)."""

    tensors: dict[str, Any]  # state-dict key -> the eager tensor
    values: dict[str, Any] = field(default_factory=dict)  # key -> program value

    def get(self, key: str) -> Any:
        if key not in self.values:
            tensor = self.tensors[key]
            value = paddle.static.create_parameter(list(tensor.shape), tensor.dtype,
                                                   name=tensor.name)  # fmt: skip
            value.stop_gradient = tensor.stop_gradient
            self.values[key] = value
        return self.values[key]


@dataclass
class NetBuilder:
    """Emits the training forward of a spec into the current program."""

    params: Params
    onednn: bool  # convolutions run oneDNN's kernels: fold their biases where free
    dtype: str = "float32"

    def __call__(self, layer: models.Layer, x: Any, prefix: str = "") -> Any:
        emit = _EMITTERS.get(type(layer))
        if emit is None:
            raise StaticUnsupported(f"no static form for {type(layer).__name__} layers")
        return emit(self, layer, x, prefix)

    def key(self, prefix: str, leaf: str) -> str:
        return f"{prefix}.{leaf}" if prefix else leaf


def _sequential(net: NetBuilder, layer: models.Sequential, x: Any, prefix: str) -> Any:
    for name, child in layer.layers:
        x = net(child, x, net.key(prefix, name))
    return x


def _residual(net: NetBuilder, layer: models.Residual, x: Any, prefix: str) -> Any:
    body = net(layer.body, x, net.key(prefix, "body"))
    short = x if layer.shortcut is None else net(layer.shortcut, x, net.key(prefix, "shortcut"))
    return F.relu(body + short)


def fold_bias(layer: models.Conv2d, onednn: bool) -> bool:
    """Whether the bias rides in the convolution as a channel of ones: free under oneDNN
    when the channel count is not a multiple of its block, and only where the bias tap
    ``(padding, padding)`` of the filter always lands inside the image (2p < k)."""
    return (
        onednn
        and layer.bias
        and layer.in_channels % ONEDNN_BLOCK != 0
        and 2 * layer.padding < layer.kernel_size
    )


def _conv2d(net: NetBuilder, layer: models.Conv2d, x: Any, prefix: str) -> Any:
    w = net.params.get(net.key(prefix, "weight"))
    b = net.params.get(net.key(prefix, "bias")) if layer.bias else None
    s, p, k = layer.stride, layer.padding, layer.kernel_size
    if b is None or not fold_bias(layer, net.onednn):
        return F.conv2d(x, w, b, stride=s, padding=p)
    ones = paddle.full([x.shape[0], 1, *x.shape[2:]], 1.0, x.dtype)
    tap = F.pad(b.reshape([layer.out_channels, 1, 1, 1]), [p, k - 1 - p, p, k - 1 - p])
    return F.conv2d(paddle.concat([x, ones], axis=1), paddle.concat([w, tap], axis=1),
                    None, stride=s, padding=p)  # fmt: skip


def _linear(net: NetBuilder, layer: models.Linear, x: Any, prefix: str) -> Any:
    w = net.params.get(net.key(prefix, "weight"))
    b = net.params.get(net.key(prefix, "bias")) if layer.bias else None
    return F.linear(x, w, b)


def _batch_norm(net: NetBuilder, layer: models.BatchNorm2d, x: Any, prefix: str) -> Any:
    """Paddle's fused kernel with momentum 0 gives the batch mean and biased variance (as
    the eager ``_BatchNorm2D`` reads them); the running statistics follow PyTorch's rule."""
    if net.dtype != "float32":
        raise StaticUnsupported("float64 BatchNorm stays eager (its element-wise form)")
    get = net.params.get
    weight, bias = get(net.key(prefix, "weight")), get(net.key(prefix, "bias"))
    running_mean, running_var = get(net.key(prefix, "_mean")), get(net.key(prefix, "_variance"))
    c = layer.num_features
    scratch_mean = paddle.full([c], 0.0, x.dtype)
    scratch_var = paddle.full([c], 0.0, x.dtype)
    y, mean, var, *_ = paddle._C_ops.batch_norm(
        x, scratch_mean, scratch_var, weight, bias, False, 0.0, layer.eps, "NCHW", False, False
    )
    n = math.prod(x.shape) // x.shape[1]
    m = layer.momentum
    paddle.assign(running_mean * (1 - m) + mean * m, output=running_mean)
    unbiased = var * (n / max(n - 1, 1))
    paddle.assign(running_var * (1 - m) + unbiased * m, output=running_var)
    return y


def _relu(net: NetBuilder, layer: models.ReLU, x: Any, prefix: str) -> Any:
    return F.relu(x)


def _max_pool(net: NetBuilder, layer: models.MaxPool2d, x: Any, prefix: str) -> Any:
    return F.max_pool2d(x, layer.kernel_size, layer.stride, layer.padding)


def _avg_pool(net: NetBuilder, layer: models.AvgPool2d, x: Any, prefix: str) -> Any:
    if layer.ceil_mode or layer.padding:
        raise StaticUnsupported("AvgPool2d with padding or ceil_mode stays eager")
    return F.avg_pool2d(x, layer.kernel_size, layer.stride or layer.kernel_size)


def _global_avg_pool(net: NetBuilder, layer: models.GlobalAvgPool2d, x: Any, prefix: str) -> Any:
    return F.adaptive_avg_pool2d(x, 1)


def _flatten(net: NetBuilder, layer: models.Flatten, x: Any, prefix: str) -> Any:
    return paddle.flatten(x, 1)


_EMITTERS: dict[type, Callable[[NetBuilder, Any, Any, str], Any]] = {
    models.Sequential: _sequential,
    models.Residual: _residual,
    models.Conv2d: _conv2d,
    models.Linear: _linear,
    models.BatchNorm2d: _batch_norm,
    models.ReLU: _relu,
    models.MaxPool2d: _max_pool,
    models.AvgPool2d: _avg_pool,
    models.GlobalAvgPool2d: _global_avg_pool,
    models.Flatten: _flatten,
}
