"""How a :class:`~polytrain.training.trainer.Trainer` runs a recipe: the choices that do
not change the numbers (where it writes, what it logs, how it resumes), so they live
beside the recipe, not in it.

``Trainer(recipe, backend, out_dir=..., log=...)`` takes them as keywords;
``Trainer(recipe, backend, options=TrainerOptions(...))`` as one object.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from polytrain.distributed.cluster import ClusterInfo
from polytrain.training.health import DEFAULT_MAX_LOSS_GROWTH, DEFAULT_MAX_SKIPPED
from polytrain.training.step import DEFAULT_METRICS_EVERY


@dataclass
class TrainerOptions:
    """Every keyword of ``Trainer``; the defaults are ``polytrain train``'s."""

    out_dir: str | Path | None = None  # --out: metrics, curves, checkpoints (rank 0)
    plugins: Iterable[object] = ()  # plugin objects of the training events
    progress: bool | None = None  # the progress bar; None: on a terminal
    #: a Datasets, {"train": ..., "test": ..., "val": ...} or the training set alone
    #: (polytrain.training.data.as_datasets); None: the recipe's own data
    datasets: Mapping[str, Any] | Any = None
    threads: int | None = None  # per process; None: the backend's own default
    cluster_info: ClusterInfo | None = None  # None: from the environment (launcher, SLURM)
    timeout: float = 120.0  # seconds a rank waits for its peers
    resume: str | Path | None = None  # a run folder or checkpoint to continue from
    checkpoint_every: int | None = None  # steps between checkpoints (besides epoch ends)
    keep_checkpoints: int = 2  # the newest kept
    tensorboard: str | Path | None = None  # a TensorBoard folder
    log: str | Iterable[str] | None = None  # trackers: "csv,mlflow,tensorboard"
    fast: bool | None = None  # compiled; None: the automatic choice for a backend built here
    inspect: str | None = None  # steps whose layer statistics are recorded ("1,5-7")
    overwrite: bool = False  # replace what an earlier run left in out_dir
    max_skipped: float = DEFAULT_MAX_SKIPPED  # share of skipped fp16 steps that stops a run
    max_loss_growth: float = DEFAULT_MAX_LOSS_GROWTH  # loss over its start that stops it
    metrics_every: int = DEFAULT_METRICS_EVERY  # steps between host reads of the metric
