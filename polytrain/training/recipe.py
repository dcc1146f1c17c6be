"""A training recipe: every choice that changes the numbers, in one serialisable record."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from polytrain.backend.precision import PRECISIONS
from polytrain.errors import ConfigError
from polytrain.neutral.optim import OptimizerConfig

SEED_MAX = 2**32 - 1  # numpy's seed range (np.random.default_rng / RandomState)


@dataclass
class Recipe:
    """What to train and how. The defaults are the documented LeNet/Fashion-MNIST recipe:
    SGD with momentum 0.9, lr 0.05, batch 256, Xavier init (82-85% test accuracy
    after 2 epochs on every backend)."""

    model: str = "lenet"
    dataset: str = "fashion-mnist"
    epochs: int = 2
    batch_size: int = 256
    optimizer: str = "momentum"
    lr: float = 0.05
    momentum: float = 0.9
    warmup_steps: int = 0  # lr rises linearly over the first N steps (0: constant)
    weight_decay: float = 0.0
    per_layer_weight_decay: dict[str, float] = field(default_factory=dict)
    seed: int = 0
    devices: str = "cpu"
    accumulate: int = 1
    precision: str = "fp32"
    pipeline_split: int | None = (
        None  # first top-level layer of stage 2 (polytrain.training.pipeline)
    )
    train_samples: int | None = None
    test_samples: int | None = None
    max_steps: int | None = None
    val_split: float = 0.0
    drop_last: bool = False
    grad_norm: bool = False
    data_dir: str | None = None

    def __post_init__(self) -> None:
        for name in ("epochs", "batch_size", "accumulate"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(
                    f"--{name.replace('_', '-')} must be an integer >= 1, got {value!r}."
                )
        if self.precision not in PRECISIONS:
            raise ConfigError(
                f"Unknown precision {self.precision!r}; use one of {', '.join(PRECISIONS)}."
            )
        if self.batch_size < self.accumulate:
            raise ConfigError(
                f"--batch-size {self.batch_size} cannot be cut into --accumulate "
                f"{self.accumulate} micro-batches; the batch size is the global one."
            )
        for name in ("train_samples", "test_samples", "max_steps", "pipeline_split"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {value!r}.")
        if not isinstance(self.warmup_steps, int) or self.warmup_steps < 0:
            raise ConfigError(f"--warmup-steps must be an integer >= 0, got {self.warmup_steps!r}.")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ConfigError(f"--seed must be an integer, got {self.seed!r}.")
        if not 0 <= self.seed <= SEED_MAX:
            raise ConfigError(
                f"--seed must be in 0..{SEED_MAX} (numpy's seed range), got {self.seed}."
            )
        _check_float("lr", self.lr, "> 0", lambda v: v > 0)
        _check_float("momentum", self.momentum, "in [0, 1)", lambda v: 0 <= v < 1)
        _check_float("weight_decay", self.weight_decay, ">= 0", lambda v: v >= 0)
        _check_float("val_split", self.val_split, "in [0, 1)", lambda v: 0 <= v < 1)
        self.optimizer_config()  # validates optimizer name, lr, decay

    def lr_at(self, step: int) -> float:
        """Learning rate of optimizer step ``step`` (0-based): linear warm-up, then constant."""
        if step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        return self.lr

    def optimizer_config(self) -> OptimizerConfig:
        return OptimizerConfig(
            name=self.optimizer,
            lr=self.lr,
            momentum=self.momentum,
            weight_decay=self.weight_decay,
            per_layer_weight_decay=dict(self.per_layer_weight_decay),
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Recipe:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"Unknown recipe fields: {', '.join(unknown)}.")
        return cls(**data)


def _check_float(name: str, value: object, span: str, ok: Callable[[float], bool]) -> None:
    """One line naming the flag unless ``value`` is a finite number that passes ``ok``."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not (math.isfinite(value) and ok(value))
    ):
        flag = "--" + name.replace("_", "-")
        raise ConfigError(f"{flag} must be a finite number {span}, got {value!r}.")
