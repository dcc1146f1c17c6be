"""paddle.optimizer applies polytrain's canonical rules natively.

Checked against :func:`polytrain.neutral.optim.numpy_step` by the conformance suite: Paddle's
SGD, Momentum (lr outside the velocity), Adagrad (accumulator starting at 0) and Adam
(its ``lr * sqrt(1-b2^t) / (1-b1^t)`` with ``eps * sqrt(1-b2^t)`` is PyTorch's formula
rearranged) with a float ``weight_decay`` (L2 added to the gradient) are the same
updates. State slots live in Paddle's accumulators, read and written per parameter.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import paddle

from polytrain.backend.base import Model
from polytrain.backend.optimizers import PerReplicaOptimizer
from polytrain.neutral.optim import STATE_SLOTS, OptimizerConfig

from ._model import PaddleModel

_ACCUMULATOR = {  # canonical slot -> Paddle accumulator name
    "momentum_buffer": "velocity",
    "sum": "moment",
    "exp_avg": "moment1",
    "exp_avg_sq": "moment2",
}


def _named(model: Model, replica: int) -> list[tuple[str, paddle.Tensor]]:
    """Trainable parameters with canonical names (BatchNorm buffers are not trainable)."""
    layout = PaddleModel.of(model).layout
    params = model.replicas[replica].named_parameters()
    return [(layout[n][0], p) for n, p in params if not p.stop_gradient]


def _groups(model: Model, replica: int, config: OptimizerConfig) -> list[Any]:
    by_decay: dict[float, list[paddle.Tensor]] = {}
    for name, p in _named(model, replica):
        by_decay.setdefault(config.decay_for(name), []).append(p)
    # A float weight_decay is L2 added to the gradient; None skips the extra op.
    return [{"params": ps, "weight_decay": wd or None} for wd, ps in by_decay.items()]


class _Float64Momentum:
    """Momentum for float64 models (--precision fp64), with the calls PaddleOptimizer
    makes. Paddle's kernel takes ``mu`` as a float32 attribute (0.9 -> 0.899999976), a
    2.6e-9 error per step in float64; here torch's rule runs with float64 scalars. The
    buffer lives where Paddle's own would (``_accumulators["velocity"]``)."""

    def __init__(self, learning_rate: float, momentum: float, parameters: list[dict]) -> None:
        self._lr, self._mu, self._groups = learning_rate, momentum, parameters
        self._accumulators: dict[str, dict[str, paddle.Tensor]] = {"velocity": {}}

    def set_lr(self, lr: float) -> None:
        self._lr = lr

    def _create_accumulators(self, _block: object, params: list[paddle.Tensor]) -> None:
        for p in params:
            self._accumulators["velocity"].setdefault(p.name, paddle.zeros_like(p))

    def clear_grad(self, set_to_zero: bool = False) -> None:
        for group in self._groups:
            for p in group["params"]:
                p.clear_gradient(set_to_zero)

    def step(self) -> None:
        velocity = self._accumulators["velocity"]
        with paddle.no_grad():
            for group in self._groups:
                wd = group["weight_decay"]
                for p in group["params"]:
                    if p.grad is None:
                        continue
                    g = p.grad + wd * p if wd else p.grad
                    if p.name in velocity:
                        paddle.assign(velocity[p.name] * self._mu + g, output=velocity[p.name])
                    else:  # torch: the first buffer is the gradient
                        velocity[p.name] = g.clone()
                    paddle.assign(p - self._lr * velocity[p.name], output=p)


def _native(model: Model, replica: int, config: OptimizerConfig) -> paddle.optimizer.Optimizer:
    groups = _groups(model, replica, config)
    if config.name == "sgd":
        return paddle.optimizer.SGD(learning_rate=config.lr, parameters=groups)
    if config.name == "momentum" and model.dtype == "float64":
        return _Float64Momentum(config.lr, config.momentum, groups)
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


def _beta_power(beta: float, steps: int, dtype: paddle.dtype) -> np.ndarray:
    """Adam's beta-power accumulator after ``steps`` updates, rounded as Paddle's kernel
    does (starts at beta, multiplied by beta in the accumulator's dtype each step)."""
    kind = np.float64 if dtype == paddle.float64 else np.float32
    value = kind(beta)
    for _ in range(steps):
        value = kind(value * kind(beta))
    return np.array([value], kind)


def _set(tensor: paddle.Tensor, value: np.ndarray) -> None:
    """Write ``value`` into an accumulator, in the accumulator's own dtype."""
    kind = np.float64 if tensor.dtype == paddle.float64 else np.float32
    tensor.set_value(np.ascontiguousarray(value, dtype=kind))


class PaddleOptimizer(PerReplicaOptimizer):
    """One paddle.optimizer per replica."""

    def __init__(self, model: Model, config: OptimizerConfig) -> None:
        super().__init__(model, config, _native)

    def _apply_lr(self, optimizer: paddle.optimizer.Optimizer, lr: float) -> None:
        optimizer.set_lr(lr)

    def zero_grad(self) -> None:
        for opt in self.optimizers:
            opt.clear_grad(set_to_zero=False)

    def get_slots(self) -> dict[str, dict[str, np.ndarray]]:
        opt, transposed = self.optimizers[0], PaddleModel.of(self.model).transposed()
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
        transposed = PaddleModel.of(self.model).transposed()
        block = paddle.static.default_main_program().global_block()
        for replica, opt in enumerate(self.optimizers):
            named = [(n, p) for n, p in _named(self.model, replica) if slots.get(n)]
            opt._create_accumulators(block, [p for _, p in named])  # normally on the 1st step
            for name, p in named:
                for slot, value in slots[name].items():
                    value = np.asarray(value)
                    _set(_accumulator(opt, _ACCUMULATOR[slot], p),
                         value.T if name in transposed else value)  # fmt: skip
                if self.config.name == "adam":  # beta powers follow from the step count
                    for acc, beta in zip(
                        ("beta1_pow_acc", "beta2_pow_acc"), self.config.betas, strict=True
                    ):
                        tensor = _accumulator(opt, acc, p)
                        _set(tensor, _beta_power(beta, self.step_count, tensor.dtype))
