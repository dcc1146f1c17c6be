"""A run's checkpoints as the trainer keeps them: what a checkpoint holds of the run and
what a resume restores; a state becomes ``latest`` only when its tensors are finite
(:func:`polytrain.training.health.tensor_problem`); a bad state goes to
``checkpoints/diverged/``; the checkpoints plugins asked to keep; and the lines that name
the last good checkpoint and the command that resumes it."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NoReturn, Protocol

import numpy as np

from polytrain.backend.base import Backend, Model
from polytrain.backend.collectives import sum_over_processes
from polytrain.errors import ConfigError, DivergedError, NonFiniteLossError, PolytrainError
from polytrain.io.checkpoint import (
    MANIFEST_FILE,
    Checkpoint,
    CheckpointManager,
    find_checkpoint,
    is_set_aside,
    read_manifest,
)
from polytrain.io.manifest_fields import COUNT, NUMBER, NUMBERS, RATE, check_fields, optional
from polytrain.neutral.models import ModelSpec
from polytrain.neutral.optim import Optimizer
from polytrain.neutral.spec_file import is_spec_reference, resolve_model_spec
from polytrain.plugins.control import TrainControl
from polytrain.training.data import Datasets
from polytrain.training.health import Problem, RunHealth, stop_line, tensor_problem
from polytrain.training.inspection import first_nonfinite
from polytrain.training.position import RunPosition
from polytrain.training.recipe import Recipe
from polytrain.training.step import StepRunner

# Changing these would change the sample order or the model: a resumed run must keep them.
RESUME_INVARIANTS = ("model", "dataset", "batch_size", "seed", "optimizer", "train_samples",
                     "val_split", "drop_last")  # fmt: skip
# The trainer's part of a manifest's ``extra``: (rules, required keys) per key
EXTRA_FIELDS = {
    "partial_epoch": (  # correct: metric_sum's name in older checkpoints
        {
            "step": COUNT,
            "loss_sum": NUMBER,
            "metric_sum": NUMBER,
            "correct": NUMBER,
            "seen": COUNT,
            "seconds": RATE,
        },
        ("step",),
    ),
    "health": ({"first_losses": NUMBERS, "steps": COUNT, "skipped": COUNT}, ()),
    "control": ({"lr": optional(RATE)}, ()),
}


class CheckpointedRun(Protocol):
    """What a checkpoint holds of a run and a resume restores into it (the Trainer)."""

    recipe: Recipe
    backend: Backend
    model: Model
    optimizer: Optimizer
    runner: StepRunner
    spec: ModelSpec | None  # None: the user's native model (its tensors by name, no spec)
    devices: list[Any]
    data: Datasets
    control: TrainControl
    health: RunHealth
    position: RunPosition


class RunCheckpoints:
    """The checkpoints of one run as this process writes them: rank 0 with an output
    folder has a ``manager``; other processes save nothing but judge with rank 0."""

    def __init__(self, run: CheckpointedRun, out_dir: Path | None, keep: int) -> None:
        self.run = run
        self.health = run.health
        self.out_dir = out_dir
        self.manager: CheckpointManager | None = None
        if out_dir is not None and run.backend.rank == 0:
            self.manager = CheckpointManager(out_dir, keep=keep)
        self.last: Path | None = None  # the newest written (or resumed from)

    def save_run(self) -> Path | None:
        """Save the whole training state (rank 0, when there is an output directory) once
        its tensors are found finite (:meth:`judge`); then the checkpoints plugins asked
        to keep. Every process calls it: they judge together."""
        if self.out_dir is None:
            return None
        state = self.judge(self.state())
        path = self.save(state, self.run.position.global_step) if state else None
        self.keep_marked()
        return path

    def state(self) -> dict[str, Any] | None:
        """What a checkpoint holds, read to the host (rank 0 with --out), else None."""
        if self.manager is None:
            return None
        run, backend = self.run, self.run.backend
        return dict(
            params=backend.get_params(run.model),
            optimizer_state=run.optimizer.state_dict(),
            spec=run.spec,
            model_name=run.spec.name if run.spec else run.recipe.model_name,
            backend=backend.name,
            framework_version=backend.version(),
            position=run.position.where(),
            seed=run.recipe.seed,
            recipe=run.recipe.to_dict(),
            scaler=run.runner.mixed_precision.state_dict(),
            history=[e.to_dict() for e in run.position.history],
            extra={
                "partial_epoch": run.position.state_dict(),
                "health": self.health.state_dict(),
                "world_size": backend.world_size,
                "devices": [backend.device_name(d) for d in run.devices],
                "data": run.data.origins(),  # e.g. a text set's vocabulary
                "control": run.control.state_dict(),  # a plugin's lr
            },
            param_dtype=run.model.dtype,
        )

    def judge(self, state: dict[str, Any] | None) -> dict[str, Any] | None:
        """Stop (:meth:`stop_diverged`) when the tensors of ``state`` are not finite;
        without ``--out`` the parameters are judged. Every process calls it: they stop
        together."""
        backend, problem = self.run.backend, None
        if state is not None:
            slots = (state["optimizer_state"] or {}).get("slots")
            problem = tensor_problem(state["params"], slots)
        elif self.out_dir is None:
            problem = tensor_problem(backend.get_params(self.run.model))
        if backend.world_size > 1:
            (bad,) = sum_over_processes(backend, [float(problem is not None)])
            if bad and problem is None:
                problem = Problem("NaN/Inf in the state rank 0 checked", non_finite=True)
        if problem is not None:
            self.stop_diverged(problem, state)
        return state

    def stop_diverged(self, problem: Problem, state: dict[str, Any] | None) -> NoReturn:
        """Stop on a state no run may resume from (its tensors or its evaluation are not
        finite): ``state`` goes to ``checkpoints/diverged/``, ``latest`` to the last good."""
        position = self.run.position
        epoch = position.epoch + (1 if position.partial.step else 0)
        kept = self.set_aside(state)
        raise NonFiniteLossError(
            f"Training stopped after global step {position.global_step} (epoch {epoch}): "
            f"{problem.reason}. Lower --lr, add --weight-decay, or check the data. {kept}"
        )

    def stop_unhealthy(
        self,
        problem: Problem,
        step: int,
        loss: float,
        skipped: bool,
        layers: Callable[[], list[tuple[str, np.ndarray]]],
    ) -> NoReturn:
        """Stop on a step :class:`RunHealth` judged, with the step, the reason and the last
        good checkpoint; checkpoints after it are set aside. ``skipped``: the step's
        update was not applied; ``layers()``: the per-layer outputs of the step's batch,
        to name the first that is not finite."""
        position = self.run.position
        at = (
            f"at epoch {position.epoch + 1}, step {step + 1} "
            f"(global step {position.global_step + 1})"
        )
        kept = self.set_aside(None)
        layer = None
        if problem.non_finite:
            with contextlib.suppress(PolytrainError):  # a backend without layer outputs
                layer = first_nonfinite(layers())
        line = stop_line(problem, at, kept, loss=loss, applied=not skipped, layer=layer)
        raise (NonFiniteLossError if problem.non_finite else DivergedError)(line)

    def check_ending(self) -> None:
        """A run that ended (not interrupted) must end healthy: its last update finite
        (judged here without --out, by the last checkpoint with it) and not too many
        skipped steps."""
        if self.out_dir is None:
            self.judge(None)
        if problem := self.health.skipped_problem():
            raise DivergedError(
                f"The run ended, but {problem.reason}. Use --precision bf16 or fp32, or lower "
                f"--lr. Skipped steps change no weights: the checkpoints are kept."
            )

    def keep_marked(self) -> None:
        """Keep the last checkpoint under the names plugins asked for (rank 0, with --out)."""
        marks = self.run.control.marks
        if self.manager is None or self.last is None:
            return
        while marks:
            self.manager.keep_as(self.last, marks.pop(0))

    def restore(self, checkpoint: Checkpoint) -> None:
        """Continue from a checkpoint written by any backend, on any device count."""
        run, backend = self.run, self.run.backend
        check_resumable(checkpoint, run.recipe)
        backend.set_params(run.model, checkpoint.params)
        if checkpoint.optimizer_state is not None:
            run.optimizer.load_state_dict(checkpoint.optimizer_state)
        elif backend.rank == 0:
            warn(
                f"polytrain: the checkpoint has no optimizer state: {run.optimizer.config.name} "
                "starts fresh"
            )
        run.runner.mixed_precision.load_state_dict(checkpoint.scaler)
        run.position.restore(checkpoint)
        extra = checkpoint.manifest.get("extra") or {}
        self.health.load_state_dict(extra.get("health"))
        run.control.load_state_dict(extra.get("control"))
        self.last = checkpoint.path
        manager = self.manager
        if manager is not None and checkpoint.path.resolve().parent == manager.directory.resolve():
            self.health.good_checkpoint = checkpoint.path.resolve()  # the one resumed is good
        elif backend.rank == 0:
            warn(resumed_aside_warning(checkpoint.path))

    def save(self, state: dict[str, Any], global_step: int) -> Path | None:
        """Write ``state`` (the keyword arguments of ``CheckpointManager.save``) as the
        newest checkpoint, ``latest``; None without a manager."""
        if self.manager is None:
            return None
        self.manager.protected = self.health.good_checkpoint
        self.last = self.manager.save(**state)
        self.health.saved(global_step, self.last)
        return self.last

    def set_aside(self, state: dict[str, Any] | None) -> str:
        """After a stop: ``latest`` back to the last good checkpoint, newer ones and the bad
        ``state`` (when given) into ``checkpoints/diverged/``; the sentence that says so."""
        good = self.health.good_checkpoint
        self.last = good
        if self.manager is None:
            return "Nothing was saved (no --out)." if self.out_dir is None else ""  # rank > 0
        moved = self.manager.set_aside(good)
        if state is not None:
            moved.append(self.manager.save_aside(**state))
        aside = f" (later states are in {moved[0].parent}, not resumed from)" if moved else ""
        if good is None:
            return (
                f"No checkpoint was taken before it went wrong{aside}: start again "
                "(--overwrite replaces this run)."
            )
        return (
            f"The last good checkpoint is {good}, taken before it went wrong{aside}: "
            f"polytrain train --resume {self.out_dir}"
        )

    def resume_hint(self) -> str:
        """What to do after the output failed: free space, then resume from the last good
        checkpoint (named), or start again if there is none."""
        if self.last is None or self.out_dir is None:
            return "Free space or fix the folder's permissions and run again (no checkpoint yet)."
        return (
            f"Free space or fix the permissions; the last good checkpoint is "
            f"{self.last}: polytrain train --resume {self.out_dir}"
        )

    def intact(self) -> str:
        """The checkpoint a stop on user code left intact and how to go on from it."""
        if self.out_dir is None:
            return "Nothing was saved (no --out)."
        if self.last is None:
            return "No checkpoint was written yet: start again (--overwrite replaces this run)."
        return (
            f"The checkpoint {self.last} is intact: once the plugin is fixed, "
            f"polytrain train --resume {self.out_dir} (with the same --plugin)"
        )


def model_spec_for(recipe: Recipe, resume: str | Path | None) -> ModelSpec:
    """The recipe's model; on resume, a user model (factory or file) is the spec the
    checkpoint stores, so a run resumes without the factory or the file."""
    if resume is not None and is_spec_reference(recipe.model):
        saved = (read_manifest(find_checkpoint(resume)).get("model") or {}).get("spec")
        if saved:
            return ModelSpec.from_dict(saved)
    return resolve_model_spec(recipe.model)


def resumed_aside_warning(path: Path) -> str | None:
    """The warning line for resuming a checkpoint a stop set aside, else None."""
    if not is_set_aside(path):
        return None
    return (
        f"polytrain: warning: resuming from {path}, which the run's stop set aside: going "
        "on from it as asked (it may stop again the same way)"
    )


def warn(line: str | None) -> None:
    if line:
        print(line, file=sys.stderr)


def _shown(value: object) -> str:
    """A recipe value in a line: a model spec's dict by its name."""
    if isinstance(value, dict) and "net" in value:
        return f"the spec {value.get('name')!r}"
    return repr(value)


def check_resumable(checkpoint: Checkpoint, recipe: Recipe) -> None:
    """A checkpoint's recipe must agree with the new one where that changes the numbers,
    its position must lie within the recipe, and the trainer's fields of its manifest must
    hold what the trainer reads (one line naming the file and the key)."""
    saved, now = checkpoint.recipe or {}, recipe.to_dict()
    changed = [
        f"{k}: checkpoint {_shown(saved[k])}, now {_shown(now[k])}"
        for k in RESUME_INVARIANTS
        if k in saved and saved[k] != now[k]
    ]
    if changed:
        raise ConfigError(
            "Cannot resume with a different recipe (" + "; ".join(changed) + "). Keep these "
            "values (the checkpoint's recipe is the default on --resume), or start a new run."
        )
    epoch = checkpoint.position["epoch"]
    if epoch > recipe.epochs:
        raise ConfigError(
            f"{checkpoint.path} has trained {epoch} epochs, more than --epochs {recipe.epochs}: "
            f"give --epochs {epoch + 1} or more to train on."
        )
    extra: Mapping[str, Any] = checkpoint.manifest.get("extra") or {}
    file = checkpoint.path / MANIFEST_FILE
    if checkpoint.optimizer_state is not None:  # a trainer's optimizer says which it is
        check_fields(file, "optimizer.config", checkpoint.optimizer_state["config"], {}, ("name",))
    for key, (rules, required) in EXTRA_FIELDS.items():
        if extra.get(key) is not None:
            check_fields(file, f"extra.{key}", extra[key], rules, required)
