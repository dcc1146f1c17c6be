"""Evaluation of a split that a stop request can cut short.

Each process evaluates its contiguous share of the split in batches and looks for a stop
request (SIGINT/SIGTERM) before each batch; the sums and the requests are then added over
every process, so that all of them learn the same metric and the same stop. A cut-short
evaluation says how much of the split it covered (:meth:`Evaluation.partial_note`).

A run evaluates in batches of its own per-process training batch, at most
``EVAL_BATCH``: a stop then waits for at most one forward pass of a training batch (a
third of a step or less), where a 1,000-image batch of ResNet-18 on a CPU took minutes.
Metrics that count (accuracy, top-k) do not depend on the batch; sums of floats (mse, the
loss of sequence targets) only in their last bits.
"""

from __future__ import annotations

import math
import signal
from collections.abc import Callable
from dataclasses import dataclass

from polytrain.backend.base import Backend
from polytrain.backend.collectives import sum_over_processes
from polytrain.data import ArrayDataset
from polytrain.neutral.sharding import share_bounds
from polytrain.training.data import Datasets
from polytrain.training.health import Problem
from polytrain.training.recipe import Recipe
from polytrain.training.step import StepRunner

EVAL_BATCH = 1000  # samples per evaluation batch and process, at most


def eval_batch_size(global_batch: int, world_size: int) -> int:
    """A run's evaluation batch per process: its training batch per process, at most
    ``EVAL_BATCH``."""
    return max(1, min(EVAL_BATCH, -(-global_batch // world_size)))


@dataclass(frozen=True)
class Evaluation:
    """The metric of a split over the samples evaluated (every process)."""

    split: str  # "test", "validation"
    metric: float  # nan when no sample was evaluated
    mean_loss: float  # the mean plain cross-entropy per sample (sequence targets), else 0
    evaluated: int
    total: int
    stop_signal: int = 0  # the stop request that cut it short, 0 if none

    @property
    def partial(self) -> bool:
        return self.evaluated < self.total

    def partial_note(self, label: str, counts: bool) -> str:
        """E.g. ``evaluated 1,000 of 4,000 test samples (test accuracy so far 81.20 %)``."""
        note = f"evaluated {self.evaluated:,} of {self.total:,} {self.split} samples"
        if not self.evaluated:
            return note
        value = f"{100 * self.metric:.2f} %" if counts else f"{self.metric:.5g}"
        return f"{note} ({self.split} {label} so far {value})"

    def problem(self, label: str) -> Problem | None:
        """A non-finite metric or loss over evaluated samples: the model is broken."""
        if not self.evaluated:
            return None
        for what, value in ((label, self.metric), ("loss", self.mean_loss)):
            if not math.isfinite(value):
                return Problem(
                    f"the {self.split} {what} of the evaluation is {value}: the model's "
                    "outputs overflowed, though the training losses were finite",
                    non_finite=True,
                )
        return None


def evaluate_split(
    runner: StepRunner,
    backend: Backend,
    dataset: ArrayDataset,
    split: str,
    *,
    tokens: bool = False,
    stop: Callable[[], int] = lambda: 0,
    progress: Callable[[], None] = lambda: None,
    batch_size: int = EVAL_BATCH,
) -> Evaluation:
    """Evaluate this process's share of ``dataset``, batch by batch until ``stop()`` gives
    a signal number; with ``tokens`` also the mean cross-entropy (perplexity's exponent)."""
    b = backend
    lo, hi = share_bounds(len(dataset), b.world_size, b.rank)
    x, y = dataset.x, dataset.y
    metric_sum, loss_sum, seen, asked = 0.0, 0.0, 0, 0
    for start in range(lo, hi, batch_size):
        if asked := stop():
            break
        end = min(start + batch_size, hi)
        if tokens:
            c, lsum, m = runner.eval_batch_tokens(x[start:end], y[start:end])
            loss_sum += lsum
        else:
            c, m = runner.eval_batch(x[start:end], y[start:end])
        progress()
        metric_sum += c
        seen += m
    asks = [float(asked == signal.SIGTERM), float(asked == signal.SIGINT)]
    metric_sum, loss_sum, seen_all, terms, ints = sum_over_processes(
        b, [metric_sum, loss_sum, seen, *asks]
    )
    asked = signal.SIGTERM if terms else signal.SIGINT if ints else 0
    n = round(seen_all)
    if not n:
        return Evaluation(split, math.nan, math.nan, 0, len(dataset), asked)
    return Evaluation(split, metric_sum / n, loss_sum / n, n, len(dataset), asked)


def evaluate_epoch(
    runner: StepRunner,
    backend: Backend,
    data: Datasets,
    recipe: Recipe,
    *,
    stop: Callable[[], int],
    progress: Callable[[], None],
) -> list[Evaluation]:
    """The test split, then the validation split, of the ones present; the validation
    split is skipped once the test split's evaluation was cut short or is not finite."""
    found: list[Evaluation] = []
    label = recipe.metric_spec().label
    for split, dataset in (("test", data.test), ("validation", data.val)):
        if dataset is None:
            continue
        found.append(
            evaluate_split(
                runner, backend, dataset, split, stop=stop, progress=progress,
                tokens=bool(data.sequence_length(recipe)),
                batch_size=eval_batch_size(recipe.batch_size, backend.world_size),
            )
        )  # fmt: skip
        if found[-1].stop_signal or found[-1].problem(label):
            break
    return found


def first_problem(evaluations: list[Evaluation], label: str) -> Problem | None:
    """The first evaluation's problem (:meth:`Evaluation.problem`), None if all are finite."""
    return next((p for e in evaluations if (p := e.problem(label)) is not None), None)


def by_split(evaluations: list[Evaluation], split: str) -> Evaluation | None:
    return next((e for e in evaluations if e.split == split), None)
