"""Plugins that record what a run did, for tests that compare runs step by step."""

from __future__ import annotations

from polytrain.plugins.hookspecs import hookimpl
from polytrain.plugins.records import RunInfo, StepRecord


class StepLosses:
    """Every step's loss, in order: ``Trainer(..., plugins=[losses])``, then ``losses.values``."""

    def __init__(self) -> None:
        self.values: list[float] = []

    @hookimpl
    def polytrain_step_end(self, run: RunInfo, step: StepRecord) -> None:
        self.values.append(step.loss)
