"""Hook specifications: what a polytrain plugin may implement.

Two groups, by life-cycle phase:

* discovery: ``polytrain_register_backends``, ``polytrain_register_formats`` and
  ``polytrain_register_launchers`` let a plugin add a backend, its native weight
  format(s) and its launcher; the core knows a framework only through these. The
  built-in backends (``backends/polytrain_<name>/``) are found through the ``polytrain``
  entry-point group exactly like a third-party one.
* training events: called by the recipe loop in :mod:`polytrain.training.trainer`; the
  progress bar and the JSON-lines metrics logger are built-in plugins that
  implement them. Per-step work (``allreduce``, ``split_and_load``) never goes
  through hooks: it calls the backend object directly. Each may also take ``control``, a
  :class:`polytrain.plugins.control.TrainControl` through which it acts on the run (stop
  cleanly, set the learning rate, keep a checkpoint, read the parameters); pluggy passes
  it only to implementations that name it.

Any plugin may implement any hook; all implementations are called.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from polytrain.backend.model_walker import ModelWalker
    from polytrain.backend.native_format import NativeFormat
    from polytrain.distributed.launcher import Launcher
    from polytrain.plugins.control import TrainControl
    from polytrain.plugins.info import BackendInfo
    from polytrain.plugins.records import EpochRecord, RunInfo, StepRecord, Summary

hookspec = pluggy.HookspecMarker("polytrain")
hookimpl = pluggy.HookimplMarker("polytrain")


# -- discovery ---------------------------------------------------------------------------


@hookspec
def polytrain_register_backends(register: Callable[[BackendInfo], None]) -> None:
    """Register backends by calling ``register(BackendInfo(...))`` once per backend.

    Must not import the framework: ``BackendInfo.factory`` is called only when the
    backend is used. Implemented by backend plugins.
    """


@hookspec
def polytrain_register_formats(register: Callable[[NativeFormat], None]) -> None:
    """Register native weight formats by calling ``register(MyFormat())`` once per format
    (:class:`polytrain.backend.native_format.NativeFormat`): detection, reading, writing and
    the name/layout rules that ``polytrain convert`` applies. Must not import the framework.
    """


@hookspec
def polytrain_register_launchers(register: Callable[[Launcher], None]) -> None:
    """Register how ``polytrain launch`` starts processes on a backend, by calling
    ``register(MyLauncher())`` (:class:`polytrain.distributed.launcher.Launcher`). A backend
    that runs in one process only registers a launcher whose ``unsupported`` says why.
    Must not import the framework.
    """


@hookspec
def polytrain_register_model_walkers(register: Callable[[ModelWalker], None]) -> None:
    """Register how ``polytrain port`` walks and traces this framework's model objects, by
    calling ``register(MyWalker())`` (:class:`polytrain.backend.model_walker.ModelWalker`).
    Must not import the framework.
    """


# -- training events ---------------------------------------------------------------------


@hookspec
def polytrain_train_start(run: RunInfo, control: TrainControl) -> None:
    """Training is about to start: the run header (backend, devices, threads, recipe)."""


@hookspec
def polytrain_step_end(run: RunInfo, step: StepRecord, control: TrainControl) -> None:
    """One optimizer step finished. Keep it cheap: it runs on every step."""


@hookspec
def polytrain_epoch_end(run: RunInfo, epoch: EpochRecord, control: TrainControl) -> None:
    """One epoch finished and was evaluated."""


@hookspec
def polytrain_train_end(run: RunInfo, summary: Summary, control: TrainControl) -> None:
    """Training finished (also after an interruption that saved a checkpoint)."""


@hookspec
def polytrain_checkpoint_saved(
    run: RunInfo, path: str, global_step: int, control: TrainControl
) -> None:
    """A checkpoint of the state after ``global_step`` steps was written to ``path``
    (rank 0; the other ranks save nothing). A resume starts from it: what a plugin wrote
    about later steps is redone then."""
