"""``polytrain port`` on PyTorch models: walk ``nn.Module`` trees, load and trace them."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

import numpy as np

from polytrain.backend.mismatch import compare_names
from polytrain.backend.model_walker import LayerTensor, ModelWalker, Trace, WalkedLayer


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
    while isinstance(value, tuple | list) and value:
        value = value[0]
    return value


class TorchWalker(ModelWalker):
    """Leaf modules with parameters or floating-point buffers, in registration order."""

    framework = "torch"

    def owns(self, model: Any) -> bool:
        torch = sys.modules.get("torch")
        return torch is not None and isinstance(model, torch.nn.Module)

    def layers(self, model: Any) -> list[WalkedLayer]:
        found = []
        for name, module in model.named_modules():
            own = dict(module.named_parameters(recurse=False))
            own |= {
                k: v
                for k, v in module.named_buffers(recurse=False)
                if v is not None and v.is_floating_point()
            }
            if not own:
                continue
            tensors = {
                role: LayerTensor(f"{name}.{role}" if name else role, t.detach().cpu().numpy())
                for role, t in own.items()
            }
            groups = int(getattr(module, "groups", 1)) if _kind(module).startswith("Conv") else 1
            found.append(WalkedLayer(name, _kind(module), type(module).__name__, tensors, groups))
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
        modules = dict(model.named_modules())
        handles = []
        for layer in self.layers(model):

            def hook(_m: Any, _i: Any, out: Any, name: str = layer.name) -> None:
                value = _first_tensor(out)
                if name not in outputs and isinstance(value, torch.Tensor):
                    outputs[name] = value.detach().cpu().numpy().copy()

            handles.append(modules[layer.name].register_forward_hook(hook))
        model.eval()
        try:
            with torch.no_grad():
                result = _first_tensor(model(torch.from_numpy(np.array(inputs))))
        finally:
            for handle in handles:
                handle.remove()
        return Trace(result.detach().cpu().numpy(), outputs)
