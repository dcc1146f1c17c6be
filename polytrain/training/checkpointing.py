"""A run's checkpoints as the trainer keeps them: a state becomes ``latest`` only when its
tensors are finite (:func:`polytrain.training.health.tensor_problem`); a bad state goes to
``checkpoints/diverged/``; and the lines that name the last good checkpoint and the
command that resumes it."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from polytrain.errors import ConfigError
from polytrain.io.checkpoint import MANIFEST_FILE, Checkpoint, CheckpointManager, is_set_aside
from polytrain.io.manifest_fields import COUNT, NUMBER, NUMBERS, RATE, check_fields, optional
from polytrain.training.health import RunHealth
from polytrain.training.recipe import Recipe

# Changing these would change the sample order or the model: a resumed run must keep them.
RESUME_INVARIANTS = ("model", "dataset", "batch_size", "seed", "optimizer", "train_samples",
                     "val_split", "drop_last")  # fmt: skip
# The trainer's part of a manifest's ``extra``: (rules, required keys) per key
EXTRA_FIELDS = {
    "partial_epoch": (
        {"step": COUNT, "loss_sum": NUMBER, "correct": NUMBER, "seen": COUNT, "seconds": RATE},
        ("step",),
    ),
    "health": ({"first_losses": NUMBERS, "steps": COUNT, "skipped": COUNT}, ()),
    "control": ({"lr": optional(RATE)}, ()),
}


class RunCheckpoints:
    """The checkpoints one process writes (rank 0 with ``--out``: ``manager``; else none)."""

    def __init__(
        self, manager: CheckpointManager | None, health: RunHealth, out_dir: Path | None
    ) -> None:
        self.manager = manager
        self.health = health
        self.out_dir = out_dir
        self.last: Path | None = None  # the newest written (or resumed from)

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
