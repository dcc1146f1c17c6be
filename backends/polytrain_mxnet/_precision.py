"""Mixed precision on MXNet: ``contrib.amp``'s operator lists, applied only inside
:func:`autocast`.

``amp.init()`` rewraps every ``mx.nd``/``mx.sym`` operator for the rest of the process,
so one bf16 run would turn every later model in that process to bf16. Here the same
wrappers (amp's own ``_wrap_symbol_functions``) are built once per precision and swapped
into the operator namespaces on entry and out again on exit, like ``torch.autocast``.
Gluon looks operators up at call time (``F.Convolution``), so imperative blocks follow
the context; a hybridized block keeps the graph it traced first, so polytrain runs every
forward pass of a model (training and evaluation) under the same precision.

MXNet 1.9.1 casts to bfloat16 on CPUs (oneDNN) and to float16 on GPUs only; CPU float16
gemm is not implemented. :func:`support` measures both with a tiny forward pass.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterator, Sequence
from types import ModuleType
from typing import Any

import mxnet as mx
import numpy as np
from mxnet import autograd, ndarray, symbol
from mxnet.contrib.amp import amp as _amp

from polytrain.backend.precision import PrecisionSupport, cpu_flags
from polytrain.backend.precision_verbs import probe_float64

TARGETS: dict[str, Any] = {"bf16": _amp.bfloat16, "fp16": np.dtype(np.float16)}
_MISSING = object()
_lock = threading.Lock()
_active: list[str] = []  # the precision entered, once per nesting level


def autocast_active() -> bool:
    """Whether an :func:`autocast` context is open (its operators are amp's wrappers)."""
    return bool(_active)


def _namespaces(root: ModuleType) -> list[ModuleType]:
    """The modules amp rewraps: mx.nd (or mx.sym), its .op and ._internal, and one
    submodule per operator prefix (contrib, linalg, random, ...)."""
    found = [root, root.op, root._internal]
    for prefix in mx.base._OP_NAME_PREFIX_LIST:
        sub = getattr(root, prefix[1:-1], None)
        if isinstance(sub, ModuleType):
            found.append(sub)
    return list({id(m): m for m in found}.values())


_nd_cast, _sym_cast = ndarray.amp_cast, symbol.amp_cast
_nd_identity, _sym_identity = ndarray.identity, symbol.identity


def _nd_cast_keeping_added_grads(data: Any, *args: Any, **kwargs: Any) -> Any:
    # MXNet 1.9.1: amp_cast's backward ignores grad_req "add" (polytrain's, so gradients
    # accumulate over shards and micro-batches): a parameter cast directly gets a zero
    # gradient. An identity in front takes the add; amp_cast writes into a fresh buffer.
    if isinstance(data, mx.nd.NDArray) and data.grad is not None:
        data = _nd_identity(data)
    return _nd_cast(data, *args, **kwargs)


def _sym_cast_keeping_added_grads(data: Any, *args: Any, **kwargs: Any) -> Any:
    if isinstance(data, mx.sym.Symbol) and data.get_children() is None:  # a variable
        data = _sym_identity(data)
    return _sym_cast(data, *args, **kwargs)


@functools.cache
def _swaps(precision: str) -> tuple[tuple[ModuleType, str, Any, Any], ...]:
    """(module, name, original, amp wrapper) of every operator amp wraps for
    ``precision``; the namespaces are left as they were."""
    modules = _namespaces(ndarray) + _namespaces(symbol)
    before = [(m, dict(vars(m))) for m in modules]
    try:
        for root in (symbol, ndarray):
            _amp._wrap_symbol_functions(root, TARGETS[precision])
        ndarray.amp_cast = _nd_cast_keeping_added_grads
        symbol.amp_cast = _sym_cast_keeping_added_grads
    finally:
        swaps = []
        for module, old in before:
            for name, value in list(vars(module).items()):
                original = old.get(name, _MISSING)
                if original is not value:
                    swaps.append((module, name, original, value))
        _restore(swaps)
    return tuple(swaps)


def _restore(swaps: Sequence[tuple[ModuleType, str, Any, Any]]) -> None:
    for module, name, original, _ in swaps:
        if original is _MISSING:
            delattr(module, name)
        else:
            setattr(module, name, original)


@contextlib.contextmanager
def autocast(precision: str) -> Iterator[None]:
    """Run MXNet operators under amp's casting rules for ``precision`` (re-entrant)."""
    swaps = _swaps(precision)
    with _lock:
        if _active and _active[0] != precision:
            raise RuntimeError(f"autocast({precision!r}) inside autocast({_active[0]!r})")
        if not _active:
            for module, name, _, wrapped in swaps:
                setattr(module, name, wrapped)
        _active.append(precision)
    try:
        yield
    finally:
        with _lock:
            _active.pop()
            if not _active:
                _restore(swaps)


def unscale(grads: Sequence[Any], inv_scale: float) -> bool:
    """Scale the gradients in place; True if all are finite (one sync per context)."""
    by_context: dict[Any, list[Any]] = {}
    for g in grads:
        by_context.setdefault(g.context, []).append(g)
    flags = []
    for group in by_context.values():
        for start in range(0, len(group), 128):  # the op takes a bounded number of inputs
            chunk = group[start : start + 128]
            flags.append(mx.nd.multi_all_finite(*chunk, num_arrays=len(chunk), init_output=True))
        for g in group:
            g *= inv_scale
    return all(bool(f.asscalar()) for f in flags)


def is_low_precision(dtype: Any) -> bool:
    return bool(dtype == _amp.bfloat16 or dtype == np.float16)


@functools.cache
def support(device_type: str, precision: str) -> PrecisionSupport:
    """Measured on ``device_type`` ("cpu" or "gpu"): a convolution and a dense layer
    under :func:`autocast` must compute in the low precision, forward and backward."""
    if precision == "fp32":
        return PrecisionSupport("fp32", True)
    ctx = mx.cpu() if device_type == "cpu" else mx.gpu(0)
    if precision == "fp64":
        return probe_float64(
            f"MXNet {mx.__version__}", lambda: _float64_dtypes(ctx), np.float64, _first_line
        )
    try:
        x = mx.nd.ones((2, 1, 8, 8), ctx=ctx)
        w, v = mx.nd.ones((4, 1, 3, 3), ctx=ctx), mx.nd.ones((10, 144), ctx=ctx)
        w.attach_grad(grad_req="add")  # as polytrain's parameters
        with autograd.record(), autocast(precision):
            h = mx.nd.Convolution(x, w, kernel=(3, 3), num_filter=4, no_bias=True)
            out = mx.nd.FullyConnected(h.flatten(), v, num_hidden=10, no_bias=True)
            loss = out.astype("float32").sum()
        loss.backward()
        grad = w.grad.asnumpy()  # MXNet is asynchronous: errors surface at a sync point
    except mx.base.MXNetError as exc:
        lines = [ln.strip() for ln in str(exc).splitlines() if "Error" in ln]
        reason = (lines[-1] if lines else str(exc).strip().splitlines()[0]).split("Error: ")[-1]
        return PrecisionSupport(precision, False, f"MXNet {mx.__version__}: {reason}")
    if not grad.any():
        return PrecisionSupport(precision, False, "amp_cast lost the parameter gradients")
    if not (is_low_precision(h.dtype) and is_low_precision(out.dtype)):
        return PrecisionSupport(
            precision,
            False,
            f"MXNet {mx.__version__} amp casts to {TARGETS[precision]} only on "
            f"{'GPUs' if precision == 'fp16' else 'CPUs'}; it would run in float32 here",
        )
    return PrecisionSupport(precision, True, _note(device_type, precision))


def _float64_dtypes(ctx: Any) -> tuple[Any, Any]:
    """A float64 convolution and dense layer, forward and backward on ``ctx``."""
    x = mx.nd.ones((2, 1, 8, 8), ctx=ctx, dtype="float64")
    w = mx.nd.ones((4, 1, 3, 3), ctx=ctx, dtype="float64")
    v = mx.nd.ones((10, 144), ctx=ctx, dtype="float64")
    w.attach_grad(grad_req="add")
    with autograd.record():
        h = mx.nd.Convolution(x, w, kernel=(3, 3), num_filter=4, no_bias=True)
        out = mx.nd.FullyConnected(h.flatten(), v, num_hidden=10, no_bias=True)
        loss = out.sum()
    loss.backward()
    grad = w.grad.asnumpy()  # errors surface at a sync point
    if not grad.any():
        raise RuntimeError("the weight's gradient came out zero")
    return out.dtype, grad.dtype


def _first_line(exc: Exception) -> str:
    return (str(exc).strip().splitlines() or [repr(exc)])[0]


def _note(device_type: str, precision: str) -> str:
    if precision == "fp16":
        return "with a dynamic loss scale"
    if device_type == "cpu":
        native = sorted({"avx512_bf16", "amx_bf16"} & cpu_flags())
        note = f"CPU has {', '.join(native)}" if native else "no bf16 units on this CPU"
        return f"{note}; slower than fp32 with MXNet 1.9.1 (casts around every layer)"
    return ""
