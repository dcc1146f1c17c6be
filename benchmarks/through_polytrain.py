"""The same LeNet training through polytrain's Trainer: the loop every user runs, with
its loader (prefetch thread), hooks, metrics and per-step loss; timed by a plugin."""

from __future__ import annotations

import time

import numpy as np

from polytrain import get_backend, hookimpl
from polytrain.data import ArrayDataset
from polytrain.plugins.records import RunInfo, StepRecord
from polytrain.training.recipe import Recipe
from polytrain.training.trainer import Datasets, Trainer

from .common import MODEL, Clock, Measurement, Workload


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
    backend = get_backend(backend_name, threads=work.threads, fast=work.fast)
    recipe = Recipe(
        model=MODEL,
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
    clock = StepClock(work, backend.synchronize)
    trainer = Trainer(recipe, backend, plugins=[clock], progress=False, datasets=data)
    clock.started = time.perf_counter()
    trainer.fit()
    return clock.clock.measurement(
        "polytrain", clock.last_loss, threads=backend.threads(), first_step_seconds=clock.first_step
    )
