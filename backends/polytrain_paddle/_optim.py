"""paddle.optimizer applies polytrain's canonical rules natively.

Checked against :func:`polytrain.optim.numpy_step` by the conformance suite: Paddle's
SGD, Momentum (lr outside the velocity), Adagrad (accumulator starting at 0) and Adam
(its ``lr * sqrt(1-b2^t) / (1-b1^t)`` with ``eps * sqrt(1-b2^t)`` is PyTorch's formula
rearranged) with a float ``weight_decay`` (L2 added to the gradient) are the same
updates. State slots live in Paddle's accumulators, read and written per parameter.
"""

from __future__ import annotations

import numpy as np
import paddle

from polytrain.backend import Model
from polytrain.optim import STATE_SLOTS, Optimizer, OptimizerConfig

_ACCUMULATOR = {  # canonical slot -> Paddle accumulator name
    "momentum_buffer": "velocity",
    "sum": "moment",
    "exp_avg": "moment1",
    "exp_avg_sq": "moment2",
}


def _named(model: Model, replica: int) -> list[tuple[str, paddle.Tensor]]:
    """Trainable parameters with canonical names (BatchNorm buffers are not trainable)."""
    layout = model.private["layout"]
    params = model.replicas[replica].named_parameters()
    return [(layout[n][0], p) for n, p in params if not p.stop_gradient]


def _groups(model: Model, replica: int, config: OptimizerConfig) -> list[dict]:
    by_decay: dict[float, list[paddle.Tensor]] = {}
    for name, p in _named(model, replica):
        by_decay.setdefault(config.decay_for(name), []).append(p)
    # A float weight_decay is L2 added to the gradient; None skips the extra op.
    return [{"params": ps, "weight_decay": wd or None} for wd, ps in by_decay.items()]


def _native(model: Model, replica: int, config: OptimizerConfig) -> paddle.optimizer.Optimizer:
    groups = _groups(model, replica, config)
    if config.name == "sgd":
        return paddle.optimizer.SGD(learning_rate=config.lr, parameters=groups)
    if config.name == "momentum":
        return paddle.optimizer.Momentum(
            learning_rate=config.lr, momentum=config.momentum, parameters=groups
        )
    if config.name == "adagrad":
        return paddle.optimizer.Adagrad(
            learning_rate=config.lr,
            epsilon=config.epsilon,
            parameters=groups,
            initial_accumulator_value=0.0,
        )
    b1, b2 = config.betas
    return paddle.optimizer.Adam(
        learning_rate=config.lr, beta1=b1, beta2=b2, epsilon=config.epsilon, parameters=groups
    )


def _accumulator(opt: paddle.optimizer.Optimizer, name: str, p: paddle.Tensor) -> paddle.Tensor:
    # Paddle has no public per-parameter state accessor; _accumulators[name][param.name]
    # is where every dygraph optimizer keeps it (created lazily on the first step).
    return opt._accumulators.get(name, {}).get(p.name)


def _beta_power(beta: float, steps: int) -> np.ndarray:
    """Adam's beta-power accumulator after ``steps`` updates, rounded as Paddle's kernel
    does (starts at beta, multiplied by beta in float32 each step)."""
    value = np.float32(beta)
    for _ in range(steps):
        value = np.float32(value * np.float32(beta))
    return np.array([value], np.float32)


class PaddleOptimizer(Optimizer):
    """One paddle.optimizer per replica; identical inputs keep replicas identical."""

    def __init__(self, model: Model, config: OptimizerConfig) -> None:
        super().__init__(config)
        self.model = model
        self.optimizers = [_native(model, i, config) for i in range(len(model.replicas))]
        self._applied_lr = config.lr

    def step(self) -> None:
        if self.lr != self._applied_lr:
            for opt in self.optimizers:
                opt.set_lr(self.lr)
            self._applied_lr = self.lr
        for opt in self.optimizers:
            opt.step()
        self.step_count += 1

    def zero_grad(self) -> None:
        for opt in self.optimizers:
            opt.clear_grad(set_to_zero=False)

    def _transposed(self) -> set[str]:
        return {c for c, t in self.model.private["layout"].values() if t}

    def get_slots(self) -> dict[str, dict[str, np.ndarray]]:
        opt, transposed = self.optimizers[0], self._transposed()
        out: dict[str, dict[str, np.ndarray]] = {}
        for name, p in _named(self.model, 0):
            out[name] = {}
            for slot in STATE_SLOTS[self.config.name]:
                acc = _accumulator(opt, _ACCUMULATOR[slot], p)
                if acc is not None:
                    value = acc.numpy()
                    out[name][slot] = np.ascontiguousarray(value.T) if name in transposed else value
        return out

    def set_slots(self, slots: dict[str, dict[str, np.ndarray]]) -> None:
        transposed = self._transposed()
        block = paddle.static.default_main_program().global_block()
        for replica, opt in enumerate(self.optimizers):
            named = [(n, p) for n, p in _named(self.model, replica) if slots.get(n)]
            opt._create_accumulators(block, [p for _, p in named])  # normally on the 1st step
            for name, p in named:
                for slot, value in slots[name].items():
                    value = np.asarray(value, np.float32)
                    value = value.T if name in transposed else value
                    _accumulator(opt, _ACCUMULATOR[slot], p).set_value(np.ascontiguousarray(value))
                if self.config.name == "adam":  # beta powers follow from the step count
                    for acc, beta in zip(
                        ("beta1_pow_acc", "beta2_pow_acc"), self.config.betas, strict=True
                    ):
                        _accumulator(opt, acc, p).set_value(_beta_power(beta, self.step_count))
