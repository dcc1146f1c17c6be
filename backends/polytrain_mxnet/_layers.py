"""Gluon blocks for the neutral specs, with PyTorch's semantics where MXNet's differ.

Children are registered under the spec's layer names, so the structural parameter
names (``block._collect_params_with_prefix()``) are the canonical ones, except that
BatchNorm keeps Gluon's ``gamma``/``beta`` (renamed on get/set), so the .params files
stay loadable by plain Gluon code.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import Any

import mxnet as mx
from mxnet import autograd
from mxnet.gluon import nn

from polytrain.errors import BackendError
from polytrain.neutral import dropout_masks, models

from ._channel_blocks import ChannelPlan, applies, plan_channels, run_padded
from ._precision import autocast_active
from ._rnn_layers import RECURRENT_BUILDERS
from ._rnn_names import canonical_name
from ._seq_layers import SEQUENCE_BUILDERS, Add


class _StatsTrace(threading.local):
    """The root block whose graph is being traced, and the BatchNorm layers met so far."""

    root: nn.HybridBlock | None = None
    layers: list[tuple[_BatchNorm, Any, Any, Any]] | None = None
    input: tuple[str, tuple[int, ...]] | None = None  # root's (data name, shape)
    shape: tuple[int, ...] = ()  # the root's input shape in the call that traces


_TRACE = _StatsTrace()


class _StatsRoot(nn.HybridBlock):
    """A container that, hybridized, returns its BatchNorm layers' new running statistics
    as extra outputs of its cached graph and writes them into their parameters after each
    training call (a cached graph cannot assign to a parameter); the same operators as
    the imperative update, so the same numbers. Subclasses define ``_body``."""

    def __init__(self) -> None:
        super().__init__()
        self._stat_params: list[tuple[Any, Any]] = []  # (running_mean, running_var) per layer
        self._stat_inputs: tuple[str, Any] | None = None  # (data name, their inputs' Group)
        self._min_count: dict[tuple[int, ...], int] = {}  # input shape -> smallest n

    def _body(self, F: Any, x: Any) -> Any:
        raise NotImplementedError

    def hybrid_forward(self, F: Any, x: Any) -> Any:
        if _TRACE.root is not self or F is not mx.sym:
            return self._body(F, x)
        outer, _TRACE.layers = _TRACE.layers, []
        _TRACE.input = (x.name, _TRACE.shape)
        try:
            out = self._body(F, x)
            layers = _TRACE.layers
        finally:
            _TRACE.layers = outer
        self._stat_params = [(bn.running_mean, bn.running_var) for bn, *_ in layers]
        self._stat_inputs = (x.name, mx.sym.Group([i for *_, i in layers])) if layers else None
        self._min_count = {}
        if not layers:
            return out
        return [out, *(s for _, mean, var, _ in layers for s in (mean, var))]

    def forward(self, x: Any, *args: Any) -> Any:
        if not self._active or not isinstance(x, mx.nd.NDArray):
            return super().forward(x, *args)
        outer = _TRACE.root, _TRACE.shape
        _TRACE.root, _TRACE.shape = self, x.shape  # read if this call traces the graph
        try:
            out = super().forward(x, *args)
        finally:
            _TRACE.root, _TRACE.shape = outer
        if not self._stat_params:
            return out
        out, *stats = out
        if autograd.is_training():
            self._check_count(x.shape)
            pairs = zip(self._stat_params, stats[::2], stats[1::2], strict=True)
            with autograd.pause():
                for (mean, var), new_mean, new_var in pairs:
                    new_mean.copyto(mean.data(x.context))
                    new_var.copyto(var.data(x.context))
        return out

    def _check_count(self, shape: tuple[int, ...]) -> None:
        n = self._min_count.get(shape)
        if n is None and self._stat_inputs is not None:
            name, inputs = self._stat_inputs
            shapes = inputs.infer_shape_partial(**{name: shape})[1]
            n = self._min_count[shape] = min(math.prod(s) // s[1] for s in shapes)
        if n is not None and n < 2:
            raise BackendError(
                "BatchNorm in training needs more than 1 value per channel, "
                f"got model input {shape}."
            )


class _Sequential(_StatsRoot):
    """The children in order; traced with zero-padded convolution channels where
    ``channels`` says (:mod:`._channel_blocks`)."""

    def __init__(
        self, layers: list[tuple[str, nn.HybridBlock]], channels: ChannelPlan | None = None
    ) -> None:
        super().__init__()
        for name, block in layers:
            self.register_child(block, name)
        self._channels = channels

    def _body(self, F: Any, x: Any) -> Any:
        if self._channels is not None:
            blocks = list(self._children.values())
            if applies(blocks, F, self._channels, autocast_active()):
                return run_padded(F, x, blocks, self._channels)
        for block in self._children.values():
            x = block(x)
        return x


class _Residual(_StatsRoot):
    def __init__(self, body: nn.HybridBlock, shortcut: nn.HybridBlock | None) -> None:
        super().__init__()
        self.body = body
        self.shortcut = shortcut

    def _body(self, F: Any, x: Any) -> Any:
        s = x if self.shortcut is None else self.shortcut(x)
        return F.relu(self.body(x) + s)


class _BatchNorm(nn.HybridBlock):
    """PyTorch's BatchNorm2d: batch statistics in training, running statistics updated
    in the forward pass with torch's momentum and the unbiased variance (imperatively,
    or, hybridized under a :class:`_StatsRoot`, as graph outputs that the root writes)."""

    def __init__(self, channels: int, eps: float, momentum: float) -> None:
        super().__init__()
        self.eps, self.momentum = eps, momentum
        c = (channels,)
        self.gamma = self.params.get("gamma", shape=c, init="ones")
        self.beta = self.params.get("beta", shape=c, init="zeros")
        self.running_mean = self.params.get(
            "running_mean", shape=c, init="zeros", grad_req="null", differentiable=False
        )
        self.running_var = self.params.get(
            "running_var", shape=c, init="ones", grad_req="null", differentiable=False
        )

    def hybrid_forward(
        self, F: Any, x: Any, gamma: Any, beta: Any, running_mean: Any, running_var: Any
    ) -> Any:
        if F is mx.sym:
            self._trace_running(x, running_mean, running_var)
        elif autograd.is_training():
            self._update_running(x, running_mean, running_var)
        # momentum=1: MXNet's op updates the running stats itself, in *backward* and with
        # the biased variance; 1 makes that a no-op (eps from the spec, never 1e-3).
        stats = (running_mean, running_var)
        return F.BatchNorm(x, gamma, beta, *stats, eps=self.eps, momentum=1.0, fix_gamma=False)

    def _trace_running(self, x: Any, mean: Any, var: Any) -> None:
        """The new running statistics as symbols, handed to the root being traced."""
        if _TRACE.layers is None:
            if autograd.is_training():
                raise BackendError(
                    "polytrain's BatchNorm on MXNet is hybridized only under a polytrain "
                    "container: hybridize the model with polytrain_mxnet's hybridize()."
                )
            return
        m = self.momentum
        data = mx.sym.BlockGrad(x)  # the statistics take no gradient
        batch_mean, batch_var = mx.sym.moments(data, axes=_axes(_traced_ndim(x)))
        # n = values per channel, as a float64 tensor (the input shape may change per call);
        # m * n / (n - 1) in float64 then cast, like the imperative Python scalar.
        channels = mx.sym.slice_axis(mx.sym.shape_array(data), axis=0, begin=1, end=2)
        n = mx.sym.cast(mx.sym.size_array(data), "float64") / mx.sym.cast(channels, "float64")
        factor = mx.sym.cast((n * m) / (n - 1), self.running_var.dtype)
        new_mean = (1 - m) * mean + m * batch_mean
        new_var = (1 - m) * var + mx.sym.broadcast_mul(batch_var, factor)
        _TRACE.layers.append((self, new_mean, new_var, x))

    def _update_running(self, x: Any, mean: Any, var: Any) -> None:
        n = x.size // x.shape[1]
        if n < 2:
            raise BackendError(
                f"BatchNorm in training needs more than 1 value per channel, got input {x.shape}."
            )
        m = self.momentum
        with autograd.pause():
            batch_mean, batch_var = mx.nd.moments(x, axes=_axes(x.ndim))
            mean[:] = (1 - m) * mean + m * batch_mean
            var[:] = (1 - m) * var + (m * n / (n - 1)) * batch_var


def _axes(ndim: int) -> tuple[int, ...]:
    """All but the channel axis: [N, C, H, W]; BatchNorm1d's [N, C] or [N, C, L]."""
    return (0, *range(2, ndim))


def _traced_ndim(x: Any) -> int:
    """The rank of a symbol inside the graph being traced, from the root's input shape."""
    assert _TRACE.input is not None
    name, shape = _TRACE.input
    return len(x.infer_shape_partial(**{name: shape})[1][0])


class _AvgPoolCeil(nn.AvgPool2D):
    """AvgPool with ceil_mode and PyTorch's output size: MXNet's 'full' convention keeps
    a last window that starts in the right padding, PyTorch drops it."""

    def __init__(self, kernel: int, stride: int, padding: int, count_include_pad: bool) -> None:
        super().__init__(kernel, stride, padding, True, count_include_pad=count_include_pad)
        self._k, self._s, self._p = kernel, stride, padding

    def hybrid_forward(self, F: Any, x: Any) -> Any:
        y = super().hybrid_forward(F, x)
        if self._s <= self._k - self._p:  # torch's rule cannot drop a window here
            return y
        # PyTorch keeps the ceil((size + pad) / stride) windows starting before the right
        # padding: a kernel-1 'valid' pool of one right-padded channel has that size.
        p = self._p
        one = F.slice_axis(x, axis=1, begin=0, end=1)
        if p:
            one = F.pad(one, mode="constant", pad_width=(0, 0, 0, 0, 0, p, 0, p))
        like = F.Pooling(one, kernel=(1, 1), stride=(self._s, self._s), pool_type="max")
        return F.slice_like(y, like, axes=(2, 3))


class _SelfAttention(nn.HybridBlock):
    """Self-attention from FullyConnected and batch_dot (Gluon has no attention layer),
    holding PyTorch's ``in_proj_weight`` [3E, E] / ``in_proj_bias`` and an ``out_proj``
    Dense (Gluon's Dense weight is [out, in], as PyTorch's): canonical names as they are."""

    def __init__(self, layer: models.MultiHeadSelfAttention) -> None:
        super().__init__()
        e = layer.embed_dim
        self.heads, self.causal, self.bias = layer.num_heads, layer.causal, layer.bias
        self.in_proj_weight = self.params.get("in_proj_weight", shape=(3 * e, e))
        if layer.bias:
            self.in_proj_bias = self.params.get("in_proj_bias", shape=(3 * e,), init="zeros")
        self.out_proj = nn.Dense(e, use_bias=layer.bias, flatten=False, in_units=e)
        self._e = e

    def hybrid_forward(self, F: Any, x: Any, in_proj_weight: Any, in_proj_bias: Any = None) -> Any:
        e, h = self._e, self.heads
        qkv = F.FullyConnected(
            x, in_proj_weight, in_proj_bias, num_hidden=3 * e, no_bias=not self.bias,
            flatten=False,
        )  # fmt: skip
        qkv = F.transpose(F.reshape(qkv, shape=(0, 0, 3 * h, -1)), axes=(0, 2, 1, 3))
        q, k, v = (F.reshape(a, shape=(-3, -2)) for a in F.split(qkv, num_outputs=3, axis=1))
        scores = F.batch_dot(q, k, transpose_b=True) / math.sqrt(e // h)  # [N*H, T, T]
        if self.causal:  # a large negative (not -inf) after the last key a query may see
            rows = F.reshape(F.contrib.arange_like(scores, axis=1), shape=(-1, 1))
            cols = F.reshape(F.contrib.arange_like(scores, axis=2), shape=(1, -1))
            hidden = F.expand_dims(F.broadcast_greater(cols, rows), axis=0)
            scores = F.broadcast_add(scores, hidden * -1e30)
        context = F.batch_dot(F.softmax(scores, axis=-1), v)  # [N*H, T, D]
        context = F.reshape(context, shape=(-4, -1, h, 0, 0))
        context = F.reshape(F.transpose(context, axes=(0, 2, 1, 3)), shape=(0, 0, -3))
        return self.out_proj(context)


class _Dropout(nn.Dropout):
    """nn.Dropout, whose training mask comes from numpy while a parity step is open
    (``dropout_masks="parity"``, polytrain.neutral.dropout_masks)."""

    def __init__(self, rate: float) -> None:
        super().__init__(rate)
        self._p = rate

    def hybrid_forward(self, F: Any, x: Any) -> Any:
        if not autograd.is_training() or self._p == 0:
            return super().hybrid_forward(F, x)
        if not isinstance(x, mx.nd.NDArray):
            if dropout_masks.parity_active():
                raise BackendError(
                    "Parity dropout masks need imperative Gluon: run without --fast."
                )
            return super().hybrid_forward(F, x)
        mask = dropout_masks.parity_mask(x.shape, self._p, x.dtype)
        if mask is None:
            return super().hybrid_forward(F, x)
        return x * mx.nd.array(mask, ctx=x.context, dtype=x.dtype)


def _build_sequential(layer: models.Sequential) -> nn.HybridBlock:
    children = [(n, build(c)) for n, c in layer.layers]
    return _Sequential(children, plan_channels([c for _, c in layer.layers]))


def _build_residual(layer: models.Residual) -> nn.HybridBlock:
    short = None if layer.shortcut is None else build(layer.shortcut)
    return _Residual(build(layer.body), short)


def _build_add(layer: models.Add) -> nn.HybridBlock:
    return Add([build(branch) for branch in layer.branches])


def _build_conv2d(layer: models.Conv2d) -> nn.HybridBlock:
    return nn.Conv2D(
        layer.out_channels,
        layer.kernel_size,
        strides=layer.stride,
        padding=layer.padding,
        in_channels=layer.in_channels,
        use_bias=layer.bias,
    )


def _build_linear(layer: models.Linear) -> nn.HybridBlock:
    """flatten=False: like torch, act on the last axis only."""
    return nn.Dense(
        layer.out_features, use_bias=layer.bias, flatten=False, in_units=layer.in_features
    )


def _build_batch_norm(layer: models.BatchNorm2d | models.BatchNorm1d) -> nn.HybridBlock:
    return _BatchNorm(layer.num_features, layer.eps, layer.momentum)


def _build_max_pool_2d(layer: models.MaxPool2d) -> nn.HybridBlock:
    return nn.MaxPool2D(layer.kernel_size, layer.stride, layer.padding)


def _build_avg_pool_2d(layer: models.AvgPool2d) -> nn.HybridBlock:
    stride = layer.stride or layer.kernel_size
    if layer.ceil_mode:
        return _AvgPoolCeil(layer.kernel_size, stride, layer.padding, layer.count_include_pad)
    return nn.AvgPool2D(
        layer.kernel_size, stride, layer.padding, count_include_pad=layer.count_include_pad
    )


#: every spec layer type's builder: the layer -> its Gluon block (shapes given, so
#: nothing is deferred)
BUILDERS: dict[type, Callable[[Any], nn.HybridBlock]] = {
    models.Sequential: _build_sequential,
    models.Residual: _build_residual,
    models.Add: _build_add,
    models.Conv2d: _build_conv2d,
    models.Linear: _build_linear,
    models.BatchNorm2d: _build_batch_norm,
    models.BatchNorm1d: _build_batch_norm,
    models.ReLU: lambda _: nn.Activation("relu"),
    models.MaxPool2d: _build_max_pool_2d,
    models.AvgPool2d: _build_avg_pool_2d,
    models.GlobalAvgPool2d: lambda _: nn.GlobalAvgPool2D(),
    models.Flatten: lambda _: nn.Flatten(),
    models.Dropout: lambda layer: _Dropout(layer.p),
    models.MultiHeadSelfAttention: _SelfAttention,
    **SEQUENCE_BUILDERS,
    **RECURRENT_BUILDERS,
}


def build(layer: models.Layer) -> nn.HybridBlock:
    """A Gluon block for one neutral layer: the builder of its type (or nearest base) in
    :data:`BUILDERS`."""
    builder = next((BUILDERS[t] for t in type(layer).__mro__ if t in BUILDERS), None)
    if builder is None:
        raise BackendError(f"mxnet backend cannot build layer {layer!r}")
    return builder(layer)


def hybridize(block: nn.Block) -> None:
    """Hybridize every subtree without Dropout (whose parity masks come from numpy at run
    time) whose BatchNorm layers, if any, sit under a :class:`_StatsRoot` at its top."""
    inner = _blocks(block)
    if not any(isinstance(b, _Dropout) for b in inner) and (
        isinstance(block, _StatsRoot) or not any(isinstance(b, _BatchNorm) for b in inner)
    ):
        block.hybridize(static_alloc=True, static_shape=True)
        return
    for child in block._children.values():
        hybridize(child)


def _blocks(block: nn.Block) -> list[nn.Block]:
    out = [block]
    for child in block._children.values():
        out += _blocks(child)
    return out


_TO_CANONICAL = {"gamma": "weight", "beta": "bias"}


def canonical(name: str) -> str:
    """Gluon's structural name -> canonical (BatchNorm gamma/beta -> weight/bias, an
    RNN layer's ``_unfused.0.i2h_weight`` -> ``weight_ih_l0``)."""
    recurrent = canonical_name(name)
    if recurrent is not None:
        return recurrent
    head, _, last = name.rpartition(".")
    last = _TO_CANONICAL.get(last, last)
    return f"{head}.{last}" if head else last
