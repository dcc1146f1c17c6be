"""The same LeNet training through polytrain's Trainer: the loop every user runs, with
its loader (prefetch thread), hooks, metrics and per-step loss; timed by a plugin."""

from __future__ import annotations

import time

import numpy as np

from polytrain import hookimpl
from polytrain.data import ArrayDataset
from polytrain.plugins.records import RunInfo, StepRecord
from polytrain.training.recipe import Recipe
from polytrain.training.trainer import Datasets, Trainer

from .common import Clock, Measurement, Workload


class StepClock:
    """A training-event plugin that feeds the :class:`Clock` and keeps the last loss."""

    def __init__(self, work: Workload, sync: object) -> None:
        self.clock = Clock(work)
        self.sync = sync
        self.last_loss = float("nan")
        self.started = time.perf_counter()
        self.first_step: float | None = None  # seconds to the end of step 1 (compiles)

    @hookimpl
    def polytrain_step_end(self, run: RunInfo, step: StepRecord) -> None:
        self.last_loss = step.loss
        if self.first_step is None:
            self.first_step = time.perf_counter() - self.started
        self.clock.tick(step.step, self.sync)  # type: ignore[arg-type]


def run(backend_name: str, work: Workload, x: np.ndarray, y: np.ndarray) -> Measurement:
    """The Trainer builds the backend, as ``polytrain train`` does: ``work.fast`` None is
    its automatic mode (the choice and its reason are in the measurement)."""
    recipe = Recipe(
        model=work.model,
        epochs=1,
        batch_size=work.batch_size,
        optimizer=work.optimizer,
        lr=work.lr,
        momentum=work.momentum,
        seed=work.seed,
        precision=work.precision,
    )
    test = ArrayDataset(x[: work.batch_size], y[: work.batch_size], num_classes=10)
    data = Datasets(train=ArrayDataset(x, y, num_classes=10), test=test)
    clock = StepClock(work, lambda: None)
    trainer = Trainer(recipe, backend_name, plugins=[clock], progress=False, datasets=data,
                      threads=work.threads, fast=work.fast)  # fmt: skip
    backend = trainer.backend
    clock.sync = backend.synchronize
    clock.started = time.perf_counter()
    trainer.fit()
    choice = trainer.compile_choice
    return clock.clock.measurement(
        "polytrain", clock.last_loss, threads=backend.threads(),
        first_step_seconds=clock.first_step, fast=backend.fast, fast_reason=choice.reason,
    )  # fmt: skip
