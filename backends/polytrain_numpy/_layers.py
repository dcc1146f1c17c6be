"""A neutral spec run by numpy: one :class:`NumpyNet` per replica.

There is no module tree: the net walks the spec itself, as
:mod:`polytrain.neutral.reference` does, looking up each layer's parameters by their
canonical name, so names and layouts are the spec's (PyTorch's) by construction.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from polytrain.backend.model import Model
from polytrain.errors import BackendError
from polytrain.neutral import dropout_masks
from polytrain.neutral.models import (
    Add,
    AvgPool2d,
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
    RecurrentLayer,
    ReLU,
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
        return self._run(self.spec.net, "", x, train, rng, hook)

    def _run(
        self,
        layer: Layer,
        path: str,
        x: Tensor,
        train: bool,
        rng: np.random.Generator,
        hook: Hook | None,
    ) -> Tensor:
        if isinstance(layer, Sequential):
            for name, child in layer.layers:
                x = self._run(child, f"{path}.{name}" if path else name, x, train, rng, hook)
            return x
        if isinstance(layer, Residual):
            prefix = f"{path}." if path else ""
            y = self._run(layer.body, prefix + "body", x, train, rng, hook)
            if layer.shortcut is not None:
                x = self._run(layer.shortcut, prefix + "shortcut", x, train, rng, hook)
            out = A.relu(add(y, x))
        elif isinstance(layer, Add):
            prefix = f"{path}." if path else ""
            out = _seq_layers.add_branches(
                [
                    self._run(branch, f"{prefix}branches.{i}", x, train, rng, hook)
                    for i, branch in enumerate(layer.branches)
                ]
            )
        else:
            out = self._leaf(layer, path, x, train, rng)
        if hook is not None:
            hook(path, out)
        return out

    def _leaf(
        self, layer: Layer, path: str, x: Tensor, train: bool, rng: np.random.Generator
    ) -> Tensor:
        p = self.params
        if isinstance(layer, Conv2d):
            bias = p[f"{path}.bias"] if layer.bias else None
            return A.conv2d(x, p[f"{path}.weight"], bias, layer.stride, layer.padding)
        if isinstance(layer, Linear):
            return A.linear(x, p[f"{path}.weight"], p[f"{path}.bias"] if layer.bias else None)
        if isinstance(layer, BatchNorm2d):
            return A.batch_norm(
                x,
                p[f"{path}.weight"],
                p[f"{path}.bias"],
                self.buffers[f"{path}.running_mean"],
                self.buffers[f"{path}.running_var"],
                layer.eps,
                layer.momentum,
                train,
            )
        if isinstance(layer, ReLU):
            return A.relu(x)
        if isinstance(layer, MaxPool2d):
            k = layer.kernel_size
            return A.max_pool2d(x, k, layer.stride or k, layer.padding)
        if isinstance(layer, AvgPool2d):
            k = layer.kernel_size
            return A.avg_pool2d(
                x, k, layer.stride or k, layer.padding, layer.ceil_mode, layer.count_include_pad
            )
        if isinstance(layer, GlobalAvgPool2d):
            return A.global_avg_pool2d(x)
        if isinstance(layer, Flatten):
            return A.flatten(x)
        if isinstance(layer, Dropout):
            if not train or layer.p == 0:
                return x
            mask = dropout_masks.parity_mask(x.shape, layer.p, self.dtype)
            return A.dropout(x, layer.p, rng) if mask is None else A.multiply_by(x, mask)
        if isinstance(layer, SequenceLayer):
            return _seq_layers.run(layer, path, x, p, self.buffers, train)
        if isinstance(layer, MultiHeadSelfAttention):
            leaves = layer_parameters(layer)
            return A.self_attention(layer, x, {n: p[f"{path}.{n}"] for n in leaves})
        if isinstance(layer, RecurrentLayer):
            return _rnn_layers.recurrent(layer, path, x, p)
        raise BackendError(f"numpy backend cannot run layer {layer!r}")


@dataclass
class NumpyModel(Model):
    """A model of the numpy backend: ``nets[i]`` runs on ``devices[i]`` (the same objects
    as ``replicas``, typed)."""

    nets: list[NumpyNet] = field(default_factory=list)
