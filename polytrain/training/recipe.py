"""A training recipe: every choice that changes the numbers, in one serialisable record."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from polytrain.backend.precision import PRECISIONS
from polytrain.errors import ConfigError
from polytrain.neutral.dropout_masks import ParityMasks
from polytrain.neutral.dropout_masks import check_mode as check_dropout_masks
from polytrain.neutral.losses import LossSpec, MetricSpec, parse_loss, parse_metric
from polytrain.neutral.models import ModelSpec
from polytrain.neutral.optim import OptimizerConfig
from polytrain.neutral.spec_file import spec_from_dict
from polytrain.training.schedules import Schedule

SEED_MAX = 2**32 - 1  # numpy's seed range (np.random.default_rng / RandomState)


@dataclass
class Recipe:
    """What to train and how. The defaults are the documented LeNet/Fashion-MNIST recipe:
    Adam lr 0.002, batch 256, Xavier init, 2 epochs: the loss never rises above its start
    (2.30) and reaches 84.5 % test accuracy on every backend (docs/default-recipe.md; the
    former default, SGD momentum 0.9 lr 0.05, spiked to 4.4 at step 17)."""

    # a built-in name, pkg.module:factory, a spec .json/.toml (a path too), a ModelSpec, or
    # a native model object of the backend's framework (polytrain.training.native_model)
    model: str | ModelSpec | Any = "lenet"
    dataset: str = "fashion-mnist"
    data: str | None = None  # an .npz of x_train, y_train[, x_test, y_test]: replaces dataset
    loss: str | dict[str, Any] = "cross_entropy"  # a name or {"name": ..., options}
    metric: str | dict[str, Any] = "accuracy"  # accuracy, top_k ({"name": "top_k", "k": 5}), mse
    epochs: int = 2
    batch_size: int = 256
    optimizer: str = "adam"
    lr: float = 0.002
    momentum: float = 0.9  # of optimizer "momentum" only
    warmup_steps: int = 0  # lr rises linearly over the first N steps (0: none)
    schedule: str = "constant"  # NAME[:KEY=VALUE,...], polytrain.training.schedules
    clip_grad_norm: float | None = None  # rescale gradients to this global L2 norm at most
    clip_grad_value: float | None = None  # clamp each gradient element to [-v, v]
    early_stop: int | None = None  # stop after N epochs without a better val accuracy
    weight_decay: float = 0.0
    per_layer_weight_decay: dict[str, float] = field(default_factory=dict)
    seed: int = 0
    dropout_masks: str = "framework"  # or "parity": numpy's masks on every backend
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
        self.model = _model_reference(self.model)
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
        self.loss_spec()
        self.metric_spec()
        self._check_schedule_and_clipping()
        check_dropout_masks(self.dropout_masks)
        if not isinstance(self.devices, str) or not self.devices.strip():
            raise ConfigError(
                f"--devices {self.devices!r} names no device: give 'cpu', 'cpu:N' or 'gpu:0,1'."
            )

    def _check_schedule_and_clipping(self) -> None:
        self.schedule = str(Schedule.parse(self.schedule))  # canonical; one line if malformed
        min_lr = self.lr_schedule().params.get("min_lr", 0.0)  # checks warmup_steps with it
        if isinstance(min_lr, float) and min_lr > self.lr:
            raise ConfigError(f"--schedule {self.schedule}: min_lr must be <= --lr {self.lr}.")
        for name in ("clip_grad_norm", "clip_grad_value"):
            if getattr(self, name) is not None:
                _check_float(name, getattr(self, name), "> 0", lambda v: v > 0)
        if self.early_stop is not None:
            if isinstance(self.early_stop, bool) or not isinstance(self.early_stop, int):
                raise ConfigError(f"--early-stop must be an integer >= 1, got {self.early_stop!r}.")
            if self.early_stop < 1:
                raise ConfigError(f"--early-stop must be an integer >= 1, got {self.early_stop}.")
            if not self.val_split:
                raise ConfigError(
                    f"--early-stop {self.early_stop} watches the validation accuracy: add "
                    "--val-split (e.g. 0.1) to hold out a validation set."
                )

    def parity_masks(self, rank: int = 0) -> ParityMasks | None:
        """The numpy dropout-mask source of ``dropout_masks="parity"`` (None: the
        frameworks' own dropout)."""
        return ParityMasks(self.seed, rank) if self.dropout_masks == "parity" else None

    def lr_schedule(self) -> Schedule:
        """The schedule of ``schedule``, with ``warmup_steps`` as its warm-up."""
        return Schedule.parse(self.schedule).with_warmup(self.warmup_steps)

    def total_steps(self, steps_per_epoch: int) -> int:
        """Optimizer steps of the whole run (``max_steps`` caps each epoch)."""
        return self.epochs * min(steps_per_epoch, self.max_steps or steps_per_epoch)

    def lr_at(self, step: int, total_steps: int | None = None) -> float:
        """Learning rate of optimizer step ``step`` (0-based) under the schedule; cosine and
        onecycle without ``total=`` in the schedule need the run's ``total_steps``."""
        return self.lr_schedule().resolve(total_steps).lr_at(step, self.lr)

    def loss_spec(self) -> LossSpec:
        """The recipe's loss (polytrain.neutral.losses)."""
        return parse_loss(self.loss)

    def metric_spec(self) -> MetricSpec:
        """The recipe's metric, reported as the epochs' train/test accuracy fields."""
        return parse_metric(self.metric)

    def optimizer_config(self) -> OptimizerConfig:
        return OptimizerConfig(
            name=self.optimizer,
            lr=self.lr,
            momentum=self.momentum,
            weight_decay=self.weight_decay,
            per_layer_weight_decay=dict(self.per_layer_weight_decay),
        )

    @property
    def model_name(self) -> str:
        """The model as the run's records name it: the reference, a spec's name, or a
        native object's ``native:FRAMEWORK:module.Class``."""
        if isinstance(self.model, ModelSpec):
            return self.model.name
        return self.model if isinstance(self.model, str) else _native_label(self.model)

    def to_dict(self) -> dict[str, Any]:
        """Plain data (JSON and TOML): a ModelSpec becomes its dict (``spec_to_dict``), a
        native object its :attr:`model_name`."""
        if isinstance(self.model, ModelSpec):
            return {**asdict(replace(self, model="lenet")), "model": self.model.to_dict()}
        if not isinstance(self.model, str):  # never deep-copied by asdict
            return {**asdict(replace(self, model="lenet")), "model": self.model_name}
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Recipe:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"Unknown recipe fields: {', '.join(unknown)}.")
        return cls(**data)


def _native_label(model: object) -> str:
    from polytrain.training.native_objects import native_label  # it reads the plugins

    return native_label(model)


def _model_reference(model: object) -> str | ModelSpec | Any:
    """``model`` as the recipe keeps it: a path as its string, a spec's dict as the spec, a
    native model object as it is; anything else is one line saying what the field takes."""

    if isinstance(model, ModelSpec):
        return model
    if isinstance(model, dict):
        return spec_from_dict(model)
    if isinstance(model, os.PathLike):
        return os.fsdecode(model)
    if isinstance(model, str) and model:
        return model
    from polytrain.training.native_objects import native_framework  # it reads the plugins

    if native_framework(model) is not None:
        return model
    raise ConfigError(
        f"--model takes a built-in name, pkg.module:factory or a spec file (from Python, a "
        f"ModelSpec or a torch, Paddle or Gluon model object too), got "
        f"{type(model).__name__} {model!r:.60}."
    )


def _check_float(name: str, value: object, span: str, ok: Callable[[float], bool]) -> None:
    """One line naming the flag unless ``value`` is a finite number that passes ``ok``."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not (math.isfinite(value) and ok(value))
    ):
        flag = "--" + name.replace("_", "-")
        raise ConfigError(f"{flag} must be a finite number {span}, got {value!r}.")
