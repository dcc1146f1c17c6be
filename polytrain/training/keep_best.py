"""``--keep-best METRIC``: keep the checkpoint of the best epoch so far as ``checkpoints/best``,
written with the control API only (a plugin like any user's)."""

from __future__ import annotations

import math
from dataclasses import fields

from polytrain.errors import ConfigError
from polytrain.plugins.control import TrainControl
from polytrain.plugins.hookspecs import hookimpl
from polytrain.plugins.records import LEGACY_EPOCH_KEYS, EpochRecord, RunInfo
from polytrain.training.recipe import Recipe

# EpochRecord fields a run can be ranked by; speeds and counts are not a model's quality
_NOT_QUALITY = {"epoch", "metric", "seconds", "samples_per_second", "steps", "tokens_per_second"}
METRICS = tuple(f.name for f in fields(EpochRecord) if f.name not in _NOT_QUALITY)


class KeepBest:
    """After each epoch whose ``metric`` (an :class:`EpochRecord` field, e.g.
    ``val_metric``; the older names such as ``val_accuracy`` too) is strictly the best so
    far (epochs before a resume count), that epoch's checkpoint is also kept as
    ``checkpoints/<name>``. Losses and perplexities count lower as better, and so do the
    metric fields of an error metric (mse)."""

    def __init__(self, metric: str = "val_metric", name: str = "best") -> None:
        field = LEGACY_EPOCH_KEYS.get(metric, metric)
        if field not in METRICS:
            raise ConfigError(f"--keep-best {metric!r}: choose one of {', '.join(METRICS)}.")
        self.metric = field
        self.name = name
        self.lower_is_better = metric.endswith(("_loss", "_perplexity"))

    @hookimpl
    def polytrain_train_start(self, run: RunInfo) -> None:
        recipe = Recipe.from_dict(run.recipe)
        if self.metric.startswith("val_") and not recipe.val_split:
            raise ConfigError(
                f"--keep-best {self.metric} needs a validation set: add --val-split (e.g. 0.1)."
            )
        if self.metric.endswith("_metric") and recipe.metric_spec().name == "mse":
            self.lower_is_better = True

    @hookimpl
    def polytrain_epoch_end(self, epoch: EpochRecord, control: TrainControl) -> None:
        value = getattr(epoch, self.metric)
        if value is None:
            raise ConfigError(
                f"--keep-best {self.metric}: epoch {epoch.epoch + 1} has no {self.metric} "
                "(no such split in this run); choose a metric the run measures."
            )
        if math.isnan(value):
            return
        before = [v for e in control.history[:-1] if (v := getattr(e, self.metric)) is not None]
        before = [v for v in before if not math.isnan(v)]
        best = (
            min(before, default=math.inf)
            if self.lower_is_better
            else max(before, default=-math.inf)
        )
        if (value < best) if self.lower_is_better else (value > best):
            control.keep_checkpoint_as(self.name)
