"""Where a run stands: the epoch, the global step, the sums of the epoch so far and the
records of the finished epochs; what a checkpoint saves and a resume restores."""

from __future__ import annotations

import math
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from polytrain.errors import CheckpointError
from polytrain.io.checkpoint import Checkpoint
from polytrain.neutral.losses import parse_metric
from polytrain.plugins.records import EpochRecord, StepRecord, Summary
from polytrain.training.evaluation import Evaluation, by_split
from polytrain.training.step import StepResult


@dataclass
class EpochProgress:
    """Sums of the epoch so far: what a mid-epoch checkpoint must carry."""

    step: int = 0
    loss_sum: float = 0.0
    metric_sum: float = 0  # the metric summed over the samples seen (a count for accuracy)
    seen: int = 0
    seconds: float = 0.0

    def add(self, result: StepResult) -> None:
        self.step += 1
        if not np.isfinite(result.loss_sum):  # an fp16 step the scaler skipped
            return
        self.loss_sum += result.loss_sum
        self.metric_sum += result.metric_sum
        self.seen += result.samples

    @property
    def mean_loss(self) -> float:
        return self.loss_sum / max(self.seen, 1)

    @property
    def mean_metric(self) -> float:
        return self.metric_sum / max(self.seen, 1)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EpochProgress:
        """The sums a checkpoint saved; an older one's ``correct`` is the metric's sum."""
        sums = dict(data)
        if "correct" in sums:
            sums.setdefault("metric_sum", sums.pop("correct"))
        return cls(**sums)

    def record(
        self, epoch: int, evaluations: list[Evaluation], tokens: int, plain_loss: bool,
        metric: str,
    ) -> EpochRecord:  # fmt: skip
        """The finished epoch's record; ``tokens``: positions per sample of sequence
        targets (0: none), ``plain_loss``: the loss is plain cross-entropy, ``metric``:
        the metric's label."""
        test, val = by_split(evaluations, "test"), by_split(evaluations, "validation")
        seconds = self.seconds
        return EpochRecord(
            epoch=epoch,
            train_loss=self.mean_loss,
            train_metric=self.mean_metric,
            test_metric=test.metric if test else None,
            val_metric=val.metric if val else None,
            metric=metric,
            seconds=seconds,
            samples_per_second=self.seen / seconds if seconds else 0.0,
            steps=self.step,
            train_perplexity=perplexity(self.mean_loss) if tokens and plain_loss else None,
            test_perplexity=perplexity(test.mean_loss) if tokens and test else None,
            tokens_per_second=tokens * self.seen / seconds if tokens and seconds else None,
        )


@dataclass
class RunPosition:
    """The epoch (0-based, the one in progress), the optimizer steps taken, the current
    epoch's sums and the records of the epochs finished."""

    epoch: int = 0
    global_step: int = 0
    partial: EpochProgress = field(default_factory=EpochProgress)
    history: list[EpochRecord] = field(default_factory=list)

    def finish_epoch(self, record: EpochRecord) -> None:
        self.history.append(record)
        self.epoch += 1
        self.partial = EpochProgress()

    def step_record(
        self, step: int, loss: float, lr: float, samples: int, grad_norm: float | None
    ) -> StepRecord:
        """The record of the step just taken (``step``: its index in the epoch)."""
        return StepRecord(self.epoch, step, self.global_step, loss, lr, samples, grad_norm)

    def where(self) -> dict[str, int]:
        """A checkpoint's ``position``."""
        return {"epoch": self.epoch, "step": self.partial.step, "global_step": self.global_step}

    def restore(self, checkpoint: Checkpoint) -> None:
        """The position a checkpoint saved; CheckpointError when its manifest is malformed."""
        saved = checkpoint.position
        self.epoch, self.global_step = int(saved["epoch"]), int(saved["global_step"])
        extra = checkpoint.manifest.get("extra") or {}
        try:
            sums = extra.get("partial_epoch", {"step": int(saved["step"])})
            self.partial = EpochProgress.from_dict(sums)
            label = parse_metric((checkpoint.recipe or {}).get("metric", "accuracy")).label
            self.history = [EpochRecord.from_dict(h, label) for h in checkpoint.history or []]
        except (TypeError, ValueError) as exc:
            raise CheckpointError(
                f"{checkpoint.path}: the training position or history in its manifest is "
                f"malformed ({exc}); use an earlier checkpoint."
            ) from exc

    def summary(self, seconds: float, stop_reason: str, checkpoint: Path | None) -> Summary:
        """The end of the run, having taken ``seconds``; ``checkpoint``: the last written."""
        return Summary(
            epochs=list(self.history),
            seconds=seconds,
            interrupted=stop_reason.startswith("interrupted"),
            checkpoint=str(checkpoint) if checkpoint else None,
            final_step=self.global_step,
            stop_reason=stop_reason,
            peak_rss_mb=peak_rss_mb(),
        )

    def state_dict(self) -> dict[str, Any]:
        """The epoch's sums, for a checkpoint's ``extra.partial_epoch``."""
        return asdict(self.partial)


def perplexity(mean_cross_entropy: float) -> float:
    """``exp`` of a mean token cross-entropy (inf past float range, as the loss diverged)."""
    try:
        return math.exp(mean_cross_entropy)
    except OverflowError:
        return math.inf


def peak_rss_mb() -> float | None:
    """Peak resident memory of this process in MiB (Linux/macOS), else None."""
    try:
        import resource
    except ImportError:  # pragma: no cover - Windows
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 1024 if sys.platform != "darwin" else peak / 2**20
