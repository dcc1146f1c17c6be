"""``polytrain port`` on Paddle models: walk ``paddle.nn.Layer`` trees, load and trace them.

A ``Linear`` stores its weight [in, out]: the layer's class, never its parameter's name,
says it is transposed to the canonical [out, in]."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

import numpy as np

from polytrain.backend.mismatch import compare_names
from polytrain.backend.model_walker import LayerTensor, ModelWalker, Trace, WalkedLayer

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
        found = []
        for name, layer in model.named_sublayers(include_self=True):
            own = {k: v for k, v in layer._parameters.items() if v is not None}
            own |= {k: v for k, v in layer._buffers.items() if v is not None}
            if not own:
                continue
            kind = _kind(layer)
            tensors = {
                ROLES.get(key, key): LayerTensor(
                    f"{name}.{key}" if name else key,
                    np.asarray(t.numpy()),
                    transpose=kind == "Linear" and key == "weight",
                )
                for key, t in own.items()
            }
            groups = int(getattr(layer, "_groups", 1) or 1) if kind.startswith("Conv") else 1
            found.append(WalkedLayer(name, kind, type(layer).__name__, tensors, groups))
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
