"""Plain records passed to training-event hooks and written to the metrics file."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class RunInfo:
    """What a run is: printed as its header and written first in the metrics file."""

    backend: str
    framework_version: str
    model: str
    dataset: str
    devices: list[str]
    epochs: int
    steps_per_epoch: int
    global_batch: int
    per_device_batch: int
    rank: int = 0
    world_size: int = 1
    threads: dict[str, Any] = field(default_factory=dict)
    recipe: dict[str, Any] = field(default_factory=dict)
    out_dir: str | None = None
    start_epoch: int = 0
    start_step: int = 0  # steps of the start epoch done before (a resume mid-epoch)
    start_global_step: int = 0  # steps done before this run (the checkpoint resumed)
    fast: bool = False  # compiled execution (hybridize, torch.compile, to_static)
    fast_reason: str = ""  # why compiled or eager (polytrain.training.compile_decision)
    data: dict[str, Any] = field(default_factory=dict)  # per split: the folder and files read

    @property
    def is_main(self) -> bool:
        """True on the process that logs and checkpoints (rank 0)."""
        return self.rank == 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class StepRecord:
    """One optimizer step."""

    epoch: int
    step: int
    global_step: int
    loss: float
    lr: float
    samples: int
    grad_norm: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# the epoch record's fields before they were named for any metric (files of older runs)
LEGACY_EPOCH_KEYS = {
    "train_accuracy": "train_metric",
    "test_accuracy": "test_metric",
    "val_accuracy": "val_metric",
}

METRIC_FIELDS = tuple(LEGACY_EPOCH_KEYS.values())


@dataclass
class EpochRecord:
    """One epoch's numbers. ``train_metric``, ``test_metric`` and ``val_metric`` hold the
    recipe's metric, named by ``metric`` (``MetricSpec.label``): a share of samples in
    [0, 1] for ``accuracy`` and ``top-k``, the mean error itself for ``mse``."""

    epoch: int
    train_loss: float
    train_metric: float
    test_metric: float | None
    seconds: float
    samples_per_second: float
    val_metric: float | None = None
    metric: str = "accuracy"
    steps: int = 0
    # sequence targets ([N, T] labels) only: exp of the mean token cross-entropy (train:
    # of the training loss, when it is plain cross-entropy) and target tokens per second
    train_perplexity: float | None = None
    test_perplexity: float | None = None
    tokens_per_second: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], metric: str | None = None) -> EpochRecord:
        """A record as :meth:`to_dict` wrote it, or as an older polytrain did
        (:func:`upgrade_epoch`)."""
        return cls(**upgrade_epoch(data, metric))

    def named_numbers(self) -> dict[str, float | None]:
        """The record's numbers (not ``epoch``, ``steps``), the metric's under the metric's
        name (``train_accuracy``, ``test_mse``, ``val_top_5``): what trackers log."""
        return {
            tracker_key(key, self.metric): value
            for key, value in self.to_dict().items()
            if key not in ("epoch", "steps", "metric")
        }

    # the older names, read-only: scripts that read ``summary.final.test_accuracy`` go on
    @property
    def train_accuracy(self) -> float:
        return self.train_metric

    @property
    def test_accuracy(self) -> float | None:
        return self.test_metric

    @property
    def val_accuracy(self) -> float | None:
        return self.val_metric


def tracker_key(key: str, metric: str) -> str:
    """An epoch record's key as trackers name it: a metric's field by the metric
    (``train_metric`` of accuracy: ``train_accuracy``; ``test_metric`` of mse: ``test_mse``)."""
    return key.replace("metric", metric.replace("-", "_")) if key in METRIC_FIELDS else key


def upgrade_epoch(data: Mapping[str, Any], metric: str | None = None) -> dict[str, Any]:
    """An epoch record's dict with the keys of older files (``test_accuracy``, ...) under
    their names now; ``metric`` (the label of the run's recipe's metric) names the metric
    of a record that does not say (older files held any metric under the accuracy keys)."""
    out = {k: v for k, v in data.items() if k not in LEGACY_EPOCH_KEYS}
    for old, new in LEGACY_EPOCH_KEYS.items():
        if old in data and new not in out:
            out[new] = data[old]
    if metric is not None:
        out.setdefault("metric", metric)
    return out


@dataclass
class Summary:
    """The end of a run."""

    epochs: list[EpochRecord]
    seconds: float
    interrupted: bool = False
    checkpoint: str | None = None
    final_step: int = 0
    stop_reason: str = "completed"
    peak_rss_mb: float | None = None

    @property
    def final(self) -> EpochRecord | None:
        return self.epochs[-1] if self.epochs else None

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "final": self.final.to_dict() if self.final else None}
