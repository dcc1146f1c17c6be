"""Plain records passed to training-event hooks and written to the metrics file."""

from __future__ import annotations

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
    start_step: int = 0
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


@dataclass
class EpochRecord:
    """One epoch's metrics; accuracies are fractions in [0, 1]."""

    epoch: int
    train_loss: float
    train_accuracy: float
    test_accuracy: float | None
    seconds: float
    samples_per_second: float
    val_accuracy: float | None = None
    steps: int = 0
    # sequence targets ([N, T] labels) only: exp of the mean token cross-entropy (train:
    # of the training loss, when it is plain cross-entropy) and target tokens per second
    train_perplexity: float | None = None
    test_perplexity: float | None = None
    tokens_per_second: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


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
