"""``polytrain port`` on PyTorch models: walk ``nn.Module`` trees, load and trace them.

An ``nn.MultiheadAttention`` is one layer with its ``out_proj`` (which it never calls as a
module: its output is the attention's); traced with the fused fast path off, so that every
layer runs as a module."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

import numpy as np

from polytrain.backend.mismatch import compare_names
from polytrain.backend.model_walker import (
    LayerTensor,
    ModelWalker,
    Setting,
    Trace,
    WalkedBlock,
    WalkedLayer,
    bare_layers,
)


def _kind(module: Any) -> str:
    import torch.nn as nn

    kinds: list[tuple[type[Any], str]] = [
        (nn.Linear, "Linear"),
        (nn.Conv1d, "Conv1d"),
        (nn.Conv2d, "Conv2d"),
        (nn.Conv3d, "Conv3d"),
        (nn.modules.batchnorm._BatchNorm, "BatchNorm"),
        (nn.Embedding, "Embedding"),
        (nn.LayerNorm, "LayerNorm"),
    ]
    return next((kind for cls, kind in kinds if isinstance(module, cls)), type(module).__name__)


def _first_tensor(value: Any) -> Any:
    """The first tensor of an output: of a tuple, a list or a mapping (Hugging Face's
    ``ModelOutput``: ``last_hidden_state``, ``logits``)."""
    while isinstance(value, tuple | list | Mapping) and value:
        value = next(iter(value.values())) if isinstance(value, Mapping) else value[0]
    return value


class TorchWalker(ModelWalker):
    """Leaf modules with parameters or floating-point buffers, in registration order."""

    framework = "torch"

    def owns(self, model: Any) -> bool:
        torch = sys.modules.get("torch")
        return torch is not None and isinstance(model, torch.nn.Module)

    def layers(self, model: Any) -> list[WalkedLayer]:
        import torch.nn as nn

        found = []
        folded = set()  # the out_proj of each nn.MultiheadAttention, walked with it
        for name, module in model.named_modules():
            if name in folded:
                continue
            own = dict(module.named_parameters(recurse=False))
            own |= {
                k: v
                for k, v in module.named_buffers(recurse=False)
                if v is not None and v.is_floating_point()
            }
            if isinstance(module, nn.MultiheadAttention):
                folded.add(f"{name}.out_proj" if name else "out_proj")
                own |= {f"out_proj.{k}": v for k, v in module.out_proj.named_parameters()}
            if not own:
                continue
            tensors = {
                role: LayerTensor(f"{name}.{role}" if name else role, t.detach().cpu().numpy())
                for role, t in own.items()
            }
            kind = _kind(module)
            if kind == type(module).__name__ and len(list(module.parameters())) > len(own):
                found += bare_layers(kind, tensors)
                continue
            groups = int(getattr(module, "groups", 1)) if kind.startswith("Conv") else 1
            found.append(WalkedLayer(name, kind, type(module).__name__, tensors, groups))
        return found

    def blocks(self, model: Any) -> list[WalkedBlock]:
        found = []
        for name, module in model.named_modules():
            settings = _settings(module)
            if settings:
                kind = type(module).__name__
                found.append(WalkedBlock(name, _block_kind(module) or kind, kind, settings))
        return found

    def state(self, model: Any) -> dict[str, np.ndarray]:
        return {k: v.detach().cpu().numpy() for k, v in model.state_dict().items()}

    def load_state(
        self, model: Any, tensors: Mapping[str, np.ndarray], what: str = "the ported state"
    ) -> None:
        import torch

        compare_names(model.state_dict(), tensors).check(what, 6)
        model.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in tensors.items()})

    def trace(self, model: Any, inputs: np.ndarray) -> Trace:
        import torch

        outputs: dict[str, np.ndarray] = {}
        handles = []
        for module_name, module in model.named_modules():  # every module: a group of

            def hook(_m: Any, _i: Any, out: Any, name: str = module_name) -> None:
                value = _first_tensor(out)  # layers is compared at its parent's output
                if name not in outputs and isinstance(value, torch.Tensor):
                    outputs[name] = value.detach().cpu().numpy().copy()

            if module_name:
                handles.append(module.register_forward_hook(hook))
        model.eval()
        fast = torch.backends.mha.get_fastpath_enabled()
        torch.backends.mha.set_fastpath_enabled(False)  # the fused kernel skips the hooks
        try:
            with torch.no_grad():
                result = _first_tensor(model(torch.from_numpy(np.array(inputs))))
        finally:
            torch.backends.mha.set_fastpath_enabled(fast)
            for handle in handles:
                handle.remove()
        return Trace(result.detach().cpu().numpy(), outputs)


def _block_kind(module: Any) -> str | None:
    import torch.nn as nn

    kinds: list[tuple[type[Any], str]] = [
        (nn.TransformerEncoderLayer, "TransformerEncoderLayer"),
        (nn.TransformerDecoderLayer, "TransformerDecoderLayer"),
        (nn.MultiheadAttention, "MultiheadAttention"),
        (nn.LayerNorm, "LayerNorm"),
    ]
    return next((kind for cls, kind in kinds if isinstance(module, cls)), None)


def activation_name(fn: Any) -> str:
    """``relu``, ``gelu`` (exact), ``gelu(approximate='tanh')``, else the callable's name."""
    import torch.nn as nn
    import torch.nn.functional as F

    if fn is F.relu or isinstance(fn, nn.ReLU):
        return "relu"
    if fn is F.gelu:
        return "gelu"
    if isinstance(fn, nn.GELU):
        return "gelu" if fn.approximate == "none" else f"gelu(approximate={fn.approximate!r})"
    return str(getattr(fn, "__name__", type(fn).__name__))


def _settings(module: Any) -> dict[str, Setting]:
    """The options of a transformer or attention layer that no tensor shows."""
    kind = _block_kind(module)
    if kind == "MultiheadAttention":
        bias = module.in_proj_bias is not None
        return {
            "num_heads": Setting(module.num_heads, f"num_heads={module.num_heads}"),
            "bias": Setting(bias, f"bias={bias}"),
            "kdim": Setting(module.kdim, f"kdim={module.kdim}"),
            "vdim": Setting(module.vdim, f"vdim={module.vdim}"),
            "dropout": Setting(float(module.dropout), f"dropout={module.dropout:g}"),
            "add_zero_attn": Setting(module.add_zero_attn, f"add_zero_attn={module.add_zero_attn}"),
            "batch_first": Setting(module.batch_first, f"batch_first={module.batch_first}"),
        }
    if kind is None:
        return {}
    if kind == "LayerNorm":
        return {"eps": Setting(module.eps, f"eps={module.eps:g}")}
    act = activation_name(module.activation)
    bias = module.linear1.bias is not None
    return {
        "norm_first": Setting(module.norm_first, f"norm_first={module.norm_first}"),
        "activation": Setting(act, f"activation={act}"),
        "bias": Setting(bias, f"bias={bias}"),
        "layer_norm_eps": Setting(module.norm1.eps, f"layer_norm_eps={module.norm1.eps:g}"),
        "dropout": Setting(module.dropout1.p, f"dropout={module.dropout1.p:g}"),
        "activation_dropout": Setting(
            module.dropout.p, f"dropout={module.dropout.p:g} (after the activation)"
        ),
    }
