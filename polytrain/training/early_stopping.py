"""Early stopping on the validation metric, a pure function of the run's epoch history
(which checkpoints hold, so a resumed run stops where an uninterrupted one would), and the
built-in plugin that acts on it through the run's control."""

from __future__ import annotations

from collections.abc import Sequence

from polytrain.plugins.control import TrainControl
from polytrain.plugins.hookspecs import hookimpl
from polytrain.plugins.records import EpochRecord


def early_stop_reason(
    history: Sequence[EpochRecord],
    patience: int | None,
    *,
    lower_is_better: bool = False,
    label: str = "accuracy",
) -> str | None:
    """Why to stop now, or None: the validation metric (``val_metric``; an error such
    as MSE with ``lower_is_better``) has not beaten its best (strictly; the first epoch
    that reached it counts) for ``patience`` epochs."""
    if not patience:
        return None
    scores = [e.val_metric for e in history if e.val_metric is not None]
    if not scores or len(scores) != len(history):
        return None
    best = scores.index(min(scores) if lower_is_better else max(scores))
    stale = len(scores) - 1 - best
    if stale < patience:
        return None
    return (
        f"early stop: validation {label} has not improved for {stale} "
        f"epoch{'s' if stale > 1 else ''} "
        f"(best {scores[best]:.4f} at epoch {best + 1}, --early-stop {patience})"
    )


class EarlyStopping:
    """``--early-stop PATIENCE`` as a plugin: after each epoch, a clean stop through the
    run's :class:`~polytrain.plugins.control.TrainControl` when :func:`early_stop_reason`
    gives one (the history includes the epochs before a resume)."""

    def __init__(self, patience: int, *, lower_is_better: bool = False, label: str = "accuracy"):
        self.patience = patience
        self.lower_is_better = lower_is_better
        self.label = label

    @hookimpl
    def polytrain_epoch_end(self, control: TrainControl) -> None:
        reason = early_stop_reason(
            control.history, self.patience, lower_is_better=self.lower_is_better, label=self.label
        )
        if reason is not None:
            control.request_stop(reason.removeprefix("early stop: "), kind="early stop")
