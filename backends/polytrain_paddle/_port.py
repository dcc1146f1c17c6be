"""``polytrain port`` on Paddle models: walk ``paddle.nn.Layer`` trees, load and trace them.

A ``Linear`` stores its weight [in, out]: the layer's class, never its parameter's name,
says it is transposed to the canonical [out, in]. A ``paddle.nn.MultiHeadAttention`` (four
Linears: q_proj, k_proj, v_proj, out_proj) is one layer with PyTorch's roles, its q/k/v
weights packed into ``in_proj_weight`` (see ``attention_tensors``)."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

import numpy as np

from polytrain.backend.mismatch import compare_names
from polytrain.backend.model_walker import (
    ATTENTION,
    BARE,
    LayerTensor,
    ModelWalker,
    Setting,
    Trace,
    WalkedBlock,
    WalkedLayer,
    attention_tensors,
    bare_layers,
)

ROLES = {"_mean": "running_mean", "_variance": "running_var"}


def _kind(layer: Any) -> str:
    import paddle.nn as nn
    from paddle.nn.layer.norm import _BatchNormBase

    kinds: list[tuple[type[Any], str]] = [
        (nn.Linear, "Linear"),
        (nn.Conv1D, "Conv1d"),
        (nn.Conv2D, "Conv2d"),
        (nn.Conv3D, "Conv3d"),
        (_BatchNormBase, "BatchNorm"),
        (nn.BatchNorm, "BatchNorm"),
        (nn.Embedding, "Embedding"),
        (nn.LayerNorm, "LayerNorm"),
    ]
    return next((kind for cls, kind in kinds if isinstance(layer, cls)), type(layer).__name__)


PROJECTIONS = ("q_proj", "k_proj", "v_proj", "out_proj")  # paddle.nn.MultiHeadAttention's


def _join(name: str, child: str) -> str:
    return f"{name}.{child}" if name else child


def _tensors(name: str, layer: Any, kind: str) -> dict[str, LayerTensor]:
    """A layer's own parameters and buffers by canonical role, in the canonical layout."""
    own = {k: v for k, v in layer._parameters.items() if v is not None}
    own |= {k: v for k, v in layer._buffers.items() if v is not None}
    return {
        ROLES.get(key, key): LayerTensor(
            _join(name, key), np.asarray(t.numpy()), transpose=kind == "Linear" and key == "weight"
        )
        for key, t in own.items()
    }


def _first_tensor(value: Any) -> Any:
    while isinstance(value, tuple | list) and value:
        value = value[0]
    return value


def _with_aliases(state: Mapping[str, Any], tensors: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """``tensors`` plus, for each tensor the model's state lists under several names (the
    same parameter object), the names the file left out."""
    names: dict[int, list[str]] = {}
    for key, value in state.items():
        names.setdefault(id(value), []).append(key)
    out = dict(tensors)
    for group in names.values():
        given = next((k for k in group if k in tensors), None)
        if given is not None:
            out.update({k: tensors[given] for k in group if k not in tensors})
    return out


class PaddleWalker(ModelWalker):
    """Sublayers with parameters or buffers, in registration order."""

    framework = "paddle"

    def owns(self, model: Any) -> bool:
        paddle = sys.modules.get("paddle")
        return paddle is not None and isinstance(model, paddle.nn.Layer)

    def layers(self, model: Any) -> list[WalkedLayer]:
        import paddle.nn as nn

        found = []
        folded: set[str] = set()  # the projections of each MultiHeadAttention, walked with it
        for name, layer in model.named_sublayers(include_self=True):
            if name in folded:
                continue
            if isinstance(layer, nn.MultiHeadAttention):
                folded |= {_join(name, p) for p in PROJECTIONS}
                tensors = attention_tensors(
                    *(_tensors(_join(name, p), getattr(layer, p), "Linear") for p in PROJECTIONS)
                )
                found.append(WalkedLayer(name, ATTENTION, type(layer).__name__, tensors))
                continue
            kind = _kind(layer)
            tensors = _tensors(name, layer, kind)
            if not tensors:
                continue
            if kind == type(layer).__name__ and len(layer.parameters()) > len(tensors):
                found += bare_layers(type(layer).__name__, tensors)
                continue
            groups = int(getattr(layer, "_groups", 1) or 1) if kind.startswith("Conv") else 1
            found.append(WalkedLayer(name, kind, type(layer).__name__, tensors, groups))
        return found

    def blocks(self, model: Any) -> list[WalkedBlock]:
        found = []
        for name, layer in model.named_sublayers(include_self=True):
            kind = _block_kind(layer)
            if kind is not None:
                found.append(WalkedBlock(name, kind, type(layer).__name__, _settings(layer)))
        return found

    def notes(self, model: Any) -> list[str]:
        import paddle.nn as nn

        return [
            f"source layer {name} is Dropout(p={layer.p}, mode='downscale_in_infer'): in eval "
            f"it multiplies by 1 - p = {1 - layer.p:g}, so the target must too (a dropout that "
            "rescales while training, the usual one, does not)"
            for name, layer in model.named_sublayers(include_self=True)
            if isinstance(layer, nn.Dropout) and layer.mode == "downscale_in_infer" and layer.p
        ]

    def state(self, model: Any) -> dict[str, np.ndarray]:
        return {k: np.asarray(v.numpy()) for k, v in model.state_dict().items()}

    def load_state(
        self, model: Any, tensors: Mapping[str, np.ndarray], what: str = "the ported state"
    ) -> None:
        import paddle

        compare_names(model.state_dict(), tensors).check(what, 6)
        model.set_state_dict({k: paddle.to_tensor(np.array(v)) for k, v in tensors.items()})

    def load_saved(self, model: Any, tensors: Mapping[str, np.ndarray], source: str) -> None:
        """The file lists an RNN's tensors once (the reader drops their cell aliases,
        ``0.cell.weight_ih``); the state lists each under every name it has."""
        self.load_state(model, _with_aliases(model.state_dict(), tensors), source)

    def trace(self, model: Any, inputs: np.ndarray) -> Trace:
        import paddle

        outputs: dict[str, np.ndarray] = {}
        layers = dict(model.named_sublayers(include_self=True))
        handles = []
        fused = {name: layer._act for name, layer in layers.items() if _fused_act(layer)}
        for walked in self.layers(model):
            if walked.kind == BARE:  # no layer of its own runs it
                continue

            def hook(_l: Any, _i: Any, out: Any, name: str = walked.name) -> Any:
                value = _first_tensor(out)
                if name not in outputs and isinstance(value, paddle.Tensor):
                    outputs[name] = np.array(value.numpy())
                if name in fused:  # recorded before its fused activation; applied here
                    return getattr(paddle.nn.functional, fused[name])(out)
                return None

            handles.append(layers[walked.name].register_forward_post_hook(hook))
        model.eval()
        try:
            for name in fused:
                layers[name]._act = None
            with paddle.no_grad():
                result = _first_tensor(model(paddle.to_tensor(np.array(inputs))))
        finally:
            for name, act in fused.items():
                layers[name]._act = act
            for handle in handles:
                handle.remove()
        return Trace(np.array(result.numpy()), outputs)


def _fused_act(layer: Any) -> bool:
    """A layer that applies an activation after its own output (Paddle's ``BatchNorm(act=
    "relu")``): port compares the output before it, as the target's own layer gives it."""
    import paddle

    act = getattr(layer, "_act", None)
    return isinstance(act, str) and hasattr(paddle.nn.functional, act)


def _block_kind(layer: Any) -> str | None:
    """PyTorch's class name for a Paddle transformer or attention layer, else None."""
    import paddle.nn as nn

    kinds: list[tuple[type[Any], str]] = [
        (nn.TransformerEncoderLayer, "TransformerEncoderLayer"),
        (nn.TransformerDecoderLayer, "TransformerDecoderLayer"),
        (nn.MultiHeadAttention, ATTENTION),
        (nn.LayerNorm, "LayerNorm"),
    ]
    return next((kind for cls, kind in kinds if isinstance(layer, cls)), None)


ACTIVATIONS = ("relu", "gelu", "silu", "tanh", "sigmoid", "elu", "leaky_relu", "swish")


def _activation_name(fn: Any) -> str:
    """The name of ``paddle.nn.functional``'s function ``fn`` is (``gelu`` is exact there,
    ``approximate=False``), else the callable's own name."""
    import paddle.nn.functional as F

    found = next((name for name in ACTIVATIONS if getattr(F, name, None) is fn), None)
    return found or str(getattr(fn, "__name__", type(fn).__name__))


def _settings(layer: Any) -> dict[str, Setting]:
    """The options of a transformer or attention layer that no tensor shows, by the
    names of PyTorch's arguments (``norm_first``), spelt as Paddle's (``normalize_before``)."""
    if _block_kind(layer) == "LayerNorm":
        return {"eps": Setting(layer._epsilon, f"epsilon={layer._epsilon:g}")}
    if _block_kind(layer) == ATTENTION:
        bias = layer.q_proj.bias is not None
        return {
            "num_heads": Setting(layer.num_heads, f"num_heads={layer.num_heads}"),
            "bias": Setting(bias, "bias_attr=False" if not bias else "biases (bias_attr)"),
            "kdim": Setting(layer.kdim, f"kdim={layer.kdim}"),
            "vdim": Setting(layer.vdim, f"vdim={layer.vdim}"),
            "dropout": Setting(float(layer.dropout), f"dropout={layer.dropout:g}"),
            "add_zero_attn": Setting(False, "no add_zero_attn (Paddle has none)"),
            "batch_first": Setting(True, "batch first (Paddle's only layout)"),
        }
    act = _activation_name(layer.activation)
    eps = layer.norm1._epsilon
    bias = layer.linear1.bias is not None
    return {
        "norm_first": Setting(
            bool(layer.normalize_before), f"normalize_before={layer.normalize_before}"
        ),
        "activation": Setting(act, f"activation={act!r}"),
        "bias": Setting(bias, "bias_attr=False" if not bias else "biases (bias_attr)"),
        "layer_norm_eps": Setting(eps, f"layer_norm_eps={eps:g}"),
        "dropout": Setting(layer.dropout1.p, f"dropout={layer.dropout1.p:g}"),
        "activation_dropout": Setting(layer.dropout.p, f"act_dropout={layer.dropout.p:g}"),
    }
