"""torch.optim applies polytrain's canonical rules as they are (they are PyTorch's)."""

from __future__ import annotations

import numpy as np
import torch

from polytrain.backend.base import Model
from polytrain.backend.optimizers import PerReplicaOptimizer
from polytrain.neutral.optim import STATE_SLOTS, OptimizerConfig


def _groups(model: Model, replica: int, config: OptimizerConfig) -> list[dict]:
    by_decay: dict[float, list[torch.nn.Parameter]] = {}
    for name, p in model.replicas[replica].named_parameters():
        by_decay.setdefault(config.decay_for(name), []).append(p)
    return [{"params": ps, "weight_decay": wd} for wd, ps in by_decay.items()]


def _native(model: Model, replica: int, config: OptimizerConfig) -> torch.optim.Optimizer:
    groups = _groups(model, replica, config)
    if config.name in ("sgd", "momentum"):
        mu = config.momentum if config.name == "momentum" else 0.0
        return torch.optim.SGD(groups, lr=config.lr, momentum=mu)
    if config.name == "adagrad":
        return torch.optim.Adagrad(groups, lr=config.lr, eps=config.epsilon)
    return torch.optim.Adam(groups, lr=config.lr, betas=config.betas, eps=config.epsilon)


class TorchOptimizer(PerReplicaOptimizer):
    """One torch.optim optimizer per replica."""

    def __init__(self, model: Model, config: OptimizerConfig) -> None:
        super().__init__(model, config, _native)

    def _apply_lr(self, optimizer: torch.optim.Optimizer, lr: float) -> None:
        for group in optimizer.param_groups:
            group["lr"] = lr

    def zero_grad(self) -> None:
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=True)

    def _named(self, replica: int) -> list[tuple[str, torch.nn.Parameter]]:
        return list(self.model.replicas[replica].named_parameters())

    def get_slots(self) -> dict[str, dict[str, np.ndarray]]:
        opt = self.optimizers[0]
        out: dict[str, dict[str, np.ndarray]] = {}
        for name, p in self._named(0):
            state = opt.state.get(p, {})
            out[name] = {
                s: state[s].detach().cpu().numpy().copy()
                for s in STATE_SLOTS[self.config.name]
                if s in state and state[s] is not None
            }
        return out

    def set_slots(self, slots: dict[str, dict[str, np.ndarray]]) -> None:
        for replica, opt in enumerate(self.optimizers):
            for name, p in self._named(replica):
                given = slots.get(name, {})
                if not given:
                    continue
                state = opt.state[p]
                for slot, value in given.items():
                    state[slot] = torch.tensor(np.asarray(value), dtype=p.dtype, device=p.device)
                if self.config.name in ("adam", "adagrad"):
                    state["step"] = torch.tensor(float(self.step_count))
