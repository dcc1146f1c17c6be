"""A neutral spec run by numpy: one :class:`NumpyNet` per replica.

There is no module tree: the net walks the spec itself, as
:mod:`polytrain.neutral.reference` does, looking up each layer's parameters by their
canonical name, so names and layouts are the spec's (PyTorch's) by construction. Each
layer type's *runner* sits in one ``{LayerType: runner}`` table, :data:`RUNNERS`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, get_args

import numpy as np

from polytrain.backend.model import Model
from polytrain.errors import BackendError
from polytrain.neutral import dropout_masks
from polytrain.neutral.models import (
    GRU,
    LSTM,
    Add,
    AvgPool2d,
    BatchNorm1d,
    BatchNorm2d,
    Conv2d,
    Dropout,
    Flatten,
    GlobalAvgPool2d,
    Layer,
    Linear,
    MaxPool2d,
    ModelSpec,
    MultiHeadSelfAttention,
    ReLU,
    Reshape,
    Residual,
    SequenceLayer,
    Sequential,
    is_buffer,
    layer_parameters,
)

from . import _autograd as A
from . import _rnn_layers, _seq_layers
from ._tensor import NumpyDevice, Tensor, add

Hook = Callable[[str, Tensor], None]


class NumpyNet:
    """One replica of a spec: trainable parameters as leaf tensors, BatchNorm running
    statistics as arrays, all by canonical name and in the spec's order."""

    def __init__(self, spec: ModelSpec, device: NumpyDevice, dtype: str) -> None:
        self.spec = spec
        self.device = device
        self.dtype = np.dtype(dtype)
        self.params: dict[str, Tensor] = {}
        self.buffers: dict[str, np.ndarray] = {}
        self.shapes = spec.parameter_shapes()
        for name, shape in self.shapes.items():
            value = np.zeros(shape, self.dtype)
            if is_buffer(name):
                self.buffers[name] = value
            else:
                self.params[name] = Tensor.leaf(value, device)
        self.training = False

    def state(self) -> dict[str, np.ndarray]:
        """Every parameter and buffer array (live, not copies), in the spec's order."""
        return {
            n: self.buffers[n] if n in self.buffers else self.params[n].data for n in self.shapes
        }

    def grads(self) -> dict[str, np.ndarray]:
        """Every trainable parameter's gradient (live arrays, accumulated in place)."""
        out = {}
        for name, p in self.params.items():
            assert p.grad is not None  # a leaf's gradient exists from the start
            out[name] = p.grad
        return out

    def __call__(
        self, x: Tensor, *, train: bool, rng: np.random.Generator, hook: Hook | None = None
    ) -> Tensor:
        self.training = train
        return _Pass(self, train, rng, hook).run(self.spec.net, "", x)


@dataclass(frozen=True)
class _Pass:
    """One forward pass of a net: what a layer's runner reads besides its layer and input."""

    net: NumpyNet
    train: bool
    rng: np.random.Generator
    hook: Hook | None

    def run(self, layer: Layer, path: str, x: Tensor) -> Tensor:
        """``layer``'s output on ``x``, reported to the hook unless ``layer`` is a Sequential."""
        out = runner(layer)(self, layer, path, x)
        if self.hook is not None and not isinstance(layer, Sequential):
            self.hook(path, out)
        return out


#: a layer type's runner: (pass, layer, its canonical path, input) -> output
Runner = Callable[[_Pass, Any, str, Tensor], Tensor]


def _child(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _sequential(run: _Pass, layer: Sequential, path: str, x: Tensor) -> Tensor:
    for name, child in layer.layers:
        x = run.run(child, _child(path, name), x)
    return x


def _residual(run: _Pass, layer: Residual, path: str, x: Tensor) -> Tensor:
    y = run.run(layer.body, _child(path, "body"), x)
    if layer.shortcut is not None:
        x = run.run(layer.shortcut, _child(path, "shortcut"), x)
    return A.relu(add(y, x))


def _add(run: _Pass, layer: Add, path: str, x: Tensor) -> Tensor:
    branches = enumerate(layer.branches)
    outs = [run.run(branch, _child(path, f"branches.{i}"), x) for i, branch in branches]
    return _seq_layers.add_branches(outs)


def _conv2d(run: _Pass, layer: Conv2d, path: str, x: Tensor) -> Tensor:
    p = run.net.params
    bias = p[f"{path}.bias"] if layer.bias else None
    return A.conv2d(x, p[f"{path}.weight"], bias, layer.stride, layer.padding)


def _linear(run: _Pass, layer: Linear, path: str, x: Tensor) -> Tensor:
    p = run.net.params
    return A.linear(x, p[f"{path}.weight"], p[f"{path}.bias"] if layer.bias else None)


def _batch_norm_2d(run: _Pass, layer: BatchNorm2d | BatchNorm1d, path: str, x: Tensor) -> Tensor:
    p, buffers = run.net.params, run.net.buffers
    return A.batch_norm(
        x,
        p[f"{path}.weight"],
        p[f"{path}.bias"],
        buffers[f"{path}.running_mean"],
        buffers[f"{path}.running_var"],
        layer.eps,
        layer.momentum,
        run.train,
    )


def _max_pool_2d(run: _Pass, layer: MaxPool2d, path: str, x: Tensor) -> Tensor:
    k = layer.kernel_size
    return A.max_pool2d(x, k, layer.stride or k, layer.padding)


def _avg_pool_2d(run: _Pass, layer: AvgPool2d, path: str, x: Tensor) -> Tensor:
    k = layer.kernel_size
    return A.avg_pool2d(
        x, k, layer.stride or k, layer.padding, layer.ceil_mode, layer.count_include_pad
    )


def _dropout(run: _Pass, layer: Dropout, path: str, x: Tensor) -> Tensor:
    if not run.train or layer.p == 0:
        return x
    mask = dropout_masks.parity_mask(x.shape, layer.p, run.net.dtype)
    return A.dropout(x, layer.p, run.rng) if mask is None else A.multiply_by(x, mask)


def _batch_norm_1d(run: _Pass, layer: BatchNorm1d, path: str, x: Tensor) -> Tensor:
    """BatchNorm2d's kernels on [N, C, L, 1]."""
    y = _batch_norm_2d(run, layer, path, A.reshape(x, (x.shape[0], x.shape[1], -1, 1)))
    return A.reshape(y, x.shape)


def _sequence(run: _Pass, layer: SequenceLayer, path: str, x: Tensor) -> Tensor:
    return _seq_layers.run(layer, path, x, run.net.params, run.train)


def _attention(run: _Pass, layer: MultiHeadSelfAttention, path: str, x: Tensor) -> Tensor:
    p = run.net.params
    return A.self_attention(layer, x, {n: p[f"{path}.{n}"] for n in layer_parameters(layer)})


def _recurrent(run: _Pass, layer: LSTM | GRU, path: str, x: Tensor) -> Tensor:
    return _rnn_layers.recurrent(layer, path, x, run.net.params)


#: every spec layer type's runner: the sequence layers run by :mod:`._seq_layers` (the
#: reference's forward and backward), but for the entries after them
RUNNERS: dict[type, Runner] = {
    **dict.fromkeys(get_args(SequenceLayer), _sequence),
    Reshape: lambda run, layer, path, x: A.reshape(x, (x.shape[0], *layer.shape)),
    BatchNorm1d: _batch_norm_1d,
    Sequential: _sequential,
    Residual: _residual,
    Add: _add,
    Conv2d: _conv2d,
    Linear: _linear,
    BatchNorm2d: _batch_norm_2d,
    ReLU: lambda run, layer, path, x: A.relu(x),
    MaxPool2d: _max_pool_2d,
    AvgPool2d: _avg_pool_2d,
    GlobalAvgPool2d: lambda run, layer, path, x: A.global_avg_pool2d(x),
    Flatten: lambda run, layer, path, x: A.flatten(x),
    Dropout: _dropout,
    MultiHeadSelfAttention: _attention,
    LSTM: _recurrent,
    GRU: _recurrent,
}


def runner(layer: Layer) -> Runner:
    """The runner of ``layer``'s type (or nearest base) in :data:`RUNNERS`."""
    found = next((RUNNERS[t] for t in type(layer).__mro__ if t in RUNNERS), None)
    if found is None:
        raise BackendError(f"numpy backend cannot run layer {layer!r}")
    return found


@dataclass
class NumpyModel(Model):
    """A model of the numpy backend: ``nets[i]`` runs on ``devices[i]`` (the same objects
    as ``replicas``, typed)."""

    nets: list[NumpyNet] = field(default_factory=list)
