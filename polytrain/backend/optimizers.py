"""A base for backend optimizers that run one framework optimizer per replica."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable
from typing import Any

from polytrain.backend.model import Model
from polytrain.neutral.optim import Optimizer, OptimizerConfig

NativeOptimizer = Any


class PerReplicaOptimizer(Optimizer):
    """One framework optimizer per replica (``make(model, replica, config)``), stepped
    together: identical inputs keep the replicas identical. A new learning rate reaches
    the framework's optimizers at the next step, and only when it changed."""

    def __init__(
        self,
        model: Model,
        config: OptimizerConfig,
        make: Callable[[Model, int, OptimizerConfig], NativeOptimizer],
    ) -> None:
        super().__init__(config)
        self.model = model
        self.optimizers = [make(model, i, config) for i in range(len(model.replicas))]
        self._applied_lr = config.lr

    @abstractmethod
    def _apply_lr(self, optimizer: NativeOptimizer, lr: float) -> None:
        """Give one framework optimizer the learning rate ``lr``."""

    def step(self) -> None:
        if self.lr != self._applied_lr:
            for opt in self.optimizers:
                self._apply_lr(opt, self.lr)
            self._applied_lr = self.lr
        for opt in self.optimizers:
            opt.step()
        self.step_count += 1
