"""``polytrain port`` on MXNet Gluon models: walk ``Block`` trees, load and trace them.

Gluon names BatchNorm's scale and shift ``gamma`` and ``beta``; names in the state are
those of ``save_parameters`` (child names joined by dots). A ``Conv2D``/``Dense`` built with
``activation=...`` is traced before its activation, where other frameworks' layers end."""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from polytrain.backend.mismatch import compare_names
from polytrain.backend.model_walker import (
    BARE,
    QKV,
    LayerTensor,
    ModelWalker,
    Setting,
    Trace,
    WalkedBlock,
    WalkedLayer,
    packed,
)
from polytrain.errors import ConfigError

ROLES = {"gamma": "weight", "beta": "bias"}


def _kind(block: Any) -> str:
    from mxnet.gluon import nn

    kinds: list[tuple[type[Any], str]] = [
        (nn.Dense, "Linear"),
        (nn.Conv1D, "Conv1d"),
        (nn.Conv2D, "Conv2d"),
        (nn.Conv3D, "Conv3d"),
        (nn.BatchNorm, "BatchNorm"),
        (nn.Embedding, "Embedding"),
        (nn.LayerNorm, "LayerNorm"),
    ]
    return next((kind for cls, kind in kinds if isinstance(block, cls)), type(block).__name__)


def _blocks(block: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    yield prefix, block
    for name, child in block._children.items():
        yield from _blocks(child, f"{prefix}.{name}" if prefix else name)


def _fused_activation(block: Any) -> Any:
    """The ``Activation`` child of a ``Conv2D``/``Dense`` built with ``activation=...``, or
    None: the block's output is after it, while the other frameworks' layers stop before."""
    from mxnet.gluon import nn
    from mxnet.gluon.nn.conv_layers import _Conv

    if not isinstance(block, nn.Dense | _Conv):
        return None
    act = getattr(block, "act", None)
    return act if isinstance(act, nn.Activation) else None


def _qkv(name: str, block: Any, tensors: dict[str, LayerTensor]) -> WalkedLayer | None:
    """A block holding a self-attention's query, key and value projections as its own
    parameters (GluonNLP's ``DotProductSelfAttentionCell``: ``query_weight`` [U, U] ...,
    joined by MXNet's ``interleaved_matmul_selfatt_*`` operators at run time, stored apart):
    one layer of kind ``QKVProjection``; None for any other block."""
    roles = ("query", "key", "value")
    weights = {f"{r}_weight" for r in roles}
    if set(tensors) not in (weights, weights | {f"{r}_bias" for r in roles}):
        return None
    if len({tensors[w].value.shape for w in weights}) != 1:
        return None
    found = {"in_proj_weight": packed(tuple(tensors[f"{r}_weight"] for r in roles))}
    if "query_bias" in tensors:
        found["in_proj_bias"] = packed(tuple(tensors[f"{r}_bias"] for r in roles))
    return WalkedLayer(name, QKV, type(block).__name__, found)


def _has_child_params(block: Any) -> bool:
    return any(child._reg_params or _has_child_params(child) for child in block._children.values())


def _walked(name: str, block: Any, natives: Mapping[int, str]) -> list[WalkedLayer]:
    """The layers a block with its own parameters is walked as: one (its tensors named as
    ``save_parameters`` names them), a ``QKVProjection``, or, for a block that has child
    layers too, each own parameter as a bare one (``encoder.position_weight``)."""
    kind = _kind(block)
    tensors = {
        ROLES.get(key, key): LayerTensor(
            natives.get(id(p), f"{name}.{key}" if name else key), p.data().asnumpy()
        )
        for key, p in block._reg_params.items()
    }
    qkv = _qkv(name, block, tensors)
    if qkv is not None:
        return [qkv]
    if kind == type(block).__name__ and _has_child_params(block):
        return [
            WalkedLayer(t.native, BARE, f"{type(block).__name__}.{key}", {"weight": t})
            for key, t in tensors.items()
        ]
    groups = int(block._kwargs.get("num_group", 1)) if kind.startswith("Conv") else 1
    return [WalkedLayer(name, kind, type(block).__name__, tensors, groups)]


def _first_array(value: Any) -> Any:
    while isinstance(value, tuple | list) and value:
        value = value[0]
    return value


class GluonWalker(ModelWalker):
    """Blocks with their own parameters, in registration order."""

    framework = "mxnet"

    def owns(self, model: Any) -> bool:
        mxnet = sys.modules.get("mxnet")
        return mxnet is not None and isinstance(model, mxnet.gluon.Block)

    def layers(self, model: Any) -> list[WalkedLayer]:
        """Each block with its own parameters, by :func:`_walked`."""
        natives = {id(p): key for key, p in model._collect_params_with_prefix().items()}
        found = []
        for name, block in _blocks(model):
            if block._reg_params:
                found.extend(_walked(name, block, natives))
        return found

    def blocks(self, model: Any) -> list[WalkedBlock]:
        """Each ``LayerNorm`` with its epsilon (Gluon has no attention or transformer
        block to report)."""
        from mxnet.gluon import nn

        return [
            WalkedBlock(name, "LayerNorm", type(block).__name__,
                        {"eps": Setting(block._epsilon, f"epsilon={block._epsilon:g}")})
            for name, block in _blocks(model)
            if isinstance(block, nn.LayerNorm)
        ]  # fmt: skip

    def state(self, model: Any) -> dict[str, np.ndarray]:
        params = model._collect_params_with_prefix()
        return {k: p.data().asnumpy() for k, p in params.items()}

    def load_state(
        self, model: Any, tensors: Mapping[str, np.ndarray], what: str = "the ported state"
    ) -> None:
        import mxnet as mx

        params = model._collect_params_with_prefix()
        compare_names(params, tensors).check(what, 6)
        for key, value in tensors.items():
            params[key].set_data(mx.nd.array(np.asarray(value), dtype=np.asarray(value).dtype))

    def load_saved(self, model: Any, tensors: Mapping[str, np.ndarray], source: str) -> None:
        """``save_parameters`` names tensors by their place in the model (``0.weight``), as
        the state does; an older ``save_params`` file by their Gluon name (``dense0_weight``,
        with or without the model's prefix): those are renamed when every one matches."""
        params = model._collect_params_with_prefix()
        if set(tensors) != set(params):
            legacy: dict[str, str] = {}
            for key, param in params.items():
                legacy[param.name] = legacy[param.name.removeprefix(model.prefix)] = key
            if tensors and all(name in legacy for name in tensors):
                tensors = {legacy[name]: value for name, value in tensors.items()}
        self.load_state(model, tensors, source)

    def trace(self, model: Any, inputs: np.ndarray) -> Trace:
        import mxnet as mx

        if any(getattr(b, "_active", False) for _, b in _blocks(model)):
            raise ConfigError(
                "The Gluon model is hybridized: its layers cannot be traced one by one. "
                "Call model.hybridize(active=False) before porting it."
            )
        outputs: dict[str, np.ndarray] = {}
        handles = []

        def keep(name: str, value: Any) -> None:
            value = _first_array(value)
            if name not in outputs and isinstance(value, mx.nd.NDArray):
                outputs[name] = value.asnumpy()

        for name, block in _blocks(model):
            if not block._reg_params:
                continue
            act = _fused_activation(block)
            if act is not None:  # the input of its activation: the layer's own output
                handles.append(act.register_forward_pre_hook(lambda _a, i, n=name: keep(n, i)))
            else:
                handles.append(block.register_forward_hook(lambda _b, _i, o, n=name: keep(n, o)))
        try:
            with mx.autograd.predict_mode():
                array = np.asarray(inputs)
                result = _first_array(model(mx.nd.array(array, dtype=array.dtype)))
        finally:
            for handle in handles:
                handle.detach()
        return Trace(result.asnumpy(), outputs)
