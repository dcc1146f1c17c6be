"""A ``torch.optim`` state dict from canonical optimizer state.

Built by torch itself: the optimizer the rule names is constructed over stand-in tensors of
the parameters' shapes, in the model's parameter order, given the state, and its
``state_dict()`` saved, so that ``torch.optim.<Rule>(model.parameters(), ...)
.load_state_dict(torch.load(path))`` takes it (its hyperparameters come with it).
"""

from __future__ import annotations

import io

import numpy as np
import torch

from polytrain.backend.optimizer_file import OptimizerFile


def _optimizer(state: OptimizerFile, params: list[torch.Tensor]) -> torch.optim.Optimizer:
    h = state.hyper
    if state.rule in ("sgd", "momentum"):
        return torch.optim.SGD(
            params,
            lr=h["lr"],
            momentum=h.get("momentum", 0.0),
            weight_decay=h["weight_decay"],
            nesterov=bool(h.get("nesterov", False)),
        )
    if state.rule == "adagrad":
        return torch.optim.Adagrad(params, lr=h["lr"], eps=h["eps"], weight_decay=h["weight_decay"])
    cls = torch.optim.AdamW if state.rule == "adamw" else torch.optim.Adam
    return cls(params, lr=h["lr"], betas=tuple(h["betas"]), eps=h["eps"],
               weight_decay=h["weight_decay"])  # fmt: skip


def encode_optimizer(state: OptimizerFile) -> bytes:
    """``torch.save(optimizer.state_dict())`` bytes for ``state``."""
    params = [torch.zeros(state.shapes[name], requires_grad=True) for name in state.slots]
    opt = _optimizer(state, params)
    for p, slots in zip(params, state.slots.values(), strict=True):
        entry = opt.state[p]
        for slot, value in slots.items():
            entry[slot] = torch.from_numpy(np.array(value, dtype=np.float32))
        if state.rule in ("adam", "adamw", "adagrad"):
            entry["step"] = torch.tensor(float(state.step), dtype=torch.float32)
    buffer = io.BytesIO()
    torch.save(opt.state_dict(), buffer)
    return buffer.getvalue()
