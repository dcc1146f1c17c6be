"""Hook specifications: what a polytrain plugin may implement.

Two groups, by life-cycle phase:

* discovery: ``polytrain_register_backends`` lets a plugin add backends. The three
  built-in backends (torch, paddle, mxnet) are found through the ``polytrain``
  entry-point group exactly like a third-party one.
* training events: called by the recipe loop in :mod:`polytrain.train`; the
  progress bar and the JSON-lines metrics logger are built-in plugins that
  implement them. Per-step work (``allreduce``, ``split_and_load``) never goes
  through hooks: it calls the backend object directly.

Any plugin may implement any hook; all implementations are called.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from .plugins import BackendInfo
    from .records import EpochRecord, RunInfo, StepRecord, Summary

hookspec = pluggy.HookspecMarker("polytrain")
hookimpl = pluggy.HookimplMarker("polytrain")


# -- discovery ---------------------------------------------------------------------------


@hookspec
def polytrain_register_backends(register: Callable[[BackendInfo], None]) -> None:
    """Register backends by calling ``register(BackendInfo(...))`` once per backend.

    Must not import the framework: ``BackendInfo.factory`` is called only when the
    backend is used. Implemented by backend plugins.
    """


# -- training events ---------------------------------------------------------------------


@hookspec
def polytrain_train_start(run: RunInfo) -> None:
    """Training is about to start: the run header (backend, devices, threads, recipe)."""


@hookspec
def polytrain_step_end(run: RunInfo, step: StepRecord) -> None:
    """One optimizer step finished. Keep it cheap: it runs on every step."""


@hookspec
def polytrain_epoch_end(run: RunInfo, epoch: EpochRecord) -> None:
    """One epoch finished and was evaluated."""


@hookspec
def polytrain_train_end(run: RunInfo, summary: Summary) -> None:
    """Training finished (also after an interruption that saved a checkpoint)."""
