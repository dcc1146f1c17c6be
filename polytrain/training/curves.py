"""Training curves as built-in plugins: a PNG redrawn after every epoch, and TensorBoard
event files (through tensorboardX, which needs neither TensorFlow nor a framework)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from polytrain.errors import ConfigError
from polytrain.neutral.losses import parse_metric
from polytrain.plugins.hookspecs import hookimpl
from polytrain.plugins.records import (
    METRIC_FIELDS,
    EpochRecord,
    RunInfo,
    StepRecord,
    Summary,
    tracker_key,
)
from polytrain.utils.fileio import atomic_path


class CurvesPlot:
    """Redraws ``path`` (loss per step, accuracies per epoch) at each epoch end; rank 0."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.steps: list[tuple[int, float]] = []
        self.epochs: list[EpochRecord] = []

    @hookimpl
    def polytrain_step_end(self, run: RunInfo, step: StepRecord) -> None:
        if run.is_main:
            self.steps.append((step.global_step, step.loss))

    @hookimpl
    def polytrain_epoch_end(self, run: RunInfo, epoch: EpochRecord) -> None:
        if run.is_main:
            self.epochs.append(epoch)
            self.draw(run)

    def draw(self, run: RunInfo) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(11, 4))
        if self.steps:
            xs, ys = zip(*self.steps, strict=True)
            ax_loss.plot(xs, ys, lw=0.8)
        ax_loss.set(title="training loss", xlabel="step", ylabel="cross-entropy")
        epochs = [e.epoch + 1 for e in self.epochs]
        metric = parse_metric(run.recipe.get("metric", "accuracy"))
        scale = 100 if metric.counts else 1  # a share of samples in percent, mse as it is
        for key, label in (("train_metric", "train"), ("test_metric", "test"),
                           ("val_metric", "validation")):  # fmt: skip
            values = [getattr(e, key) for e in self.epochs]
            if any(v is not None for v in values):
                ax_acc.plot(epochs, [scale * (v or 0) for v in values], "o-", label=label)
        ax_acc.set(title=metric.label, xlabel="epoch", ylabel="%" if metric.counts else "")
        ax_acc.xaxis.get_major_locator().set_params(integer=True)
        ax_acc.legend()
        fig.suptitle(f"{run.model} on {run.dataset}: {run.backend} {run.framework_version}")
        fig.tight_layout()
        with atomic_path(self.path) as tmp:
            fig.savefig(tmp, dpi=100, format="png")
        plt.close(fig)


class TensorBoardLogger:
    """Scalars (loss, lr, gradient norm per step; accuracies per epoch) as TensorBoard
    event files in ``log_dir``; open them with ``tensorboard --logdir``. Rank 0 only."""

    def __init__(self, log_dir: str | Path) -> None:
        try:
            from tensorboardX import SummaryWriter
        except ImportError as exc:
            raise ConfigError(
                "--tensorboard needs tensorboardX: pip install 'polytrain[tensorboard]'."
            ) from exc
        self._writer_class = SummaryWriter
        self.log_dir = Path(log_dir)
        self._writer: Any = None
        self._resumed_at = 0  # the global step a resumed run starts from

    def _w(self) -> Any:
        if self._writer is None:  # a resume hides the events of the steps it redoes
            purge = self._resumed_at + 1 if self._resumed_at else None
            self._writer = self._writer_class(logdir=str(self.log_dir), purge_step=purge)
        return self._writer

    @hookimpl
    def polytrain_train_start(self, run: RunInfo) -> None:
        self._resumed_at = run.start_global_step

    @hookimpl
    def polytrain_step_end(self, run: RunInfo, step: StepRecord) -> None:
        if not run.is_main:
            return
        w = self._w()
        w.add_scalar("train/loss", step.loss, step.global_step)
        w.add_scalar("train/lr", step.lr, step.global_step)
        if step.grad_norm is not None:
            w.add_scalar("train/grad_norm", step.grad_norm, step.global_step)

    @hookimpl
    def polytrain_epoch_end(self, run: RunInfo, epoch: EpochRecord) -> None:
        if not run.is_main:
            return
        w = self._w()
        n = epoch.epoch + 1
        w.add_scalar("epoch/train_loss", epoch.train_loss, n)
        for key in METRIC_FIELDS:  # epoch/train_accuracy, epoch/test_mse, ...
            if (value := getattr(epoch, key)) is not None:
                w.add_scalar(f"epoch/{tracker_key(key, epoch.metric)}", value, n)
        w.add_scalar("epoch/samples_per_second", epoch.samples_per_second, n)
        w.flush()

    @hookimpl
    def polytrain_train_end(self, run: RunInfo, summary: Summary) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
