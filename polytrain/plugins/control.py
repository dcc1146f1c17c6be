"""What a training-event hook may do to its run: :class:`TrainControl`.

Every training-event hook (``polytrain_train_start``, ``_step_end``, ``_epoch_end``,
``_train_end``) can take a ``control`` argument; pluggy passes it only to the
implementations that name it, so plugins written without it keep working. The trainer
reads the requests after each hook call; nothing here knows a framework.
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from polytrain.errors import ConfigError
from polytrain.plugins.records import EpochRecord

_MARK_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,63}")
_RESERVED = ("latest", "diverged")


class TrainControl:
    """A run's controls, handed to the training-event hooks as ``control``.

    * ``request_stop(reason)``: a clean stop. From ``polytrain_step_end`` the epoch ends
      after this step and is evaluated and recorded as usual; from ``polytrain_epoch_end``
      the run ends after that epoch. Either way the epoch's record is kept, its checkpoint
      is written (with an output directory), the summary's ``stop_reason`` is
      ``"stopped: <reason>"`` and ``polytrain train`` prints it and exits 0.
    * ``set_lr(lr)``: the learning rate of every step from the next one on, replacing the
      schedule (and warm-up) until set again; ``set_lr(None)`` gives it back to the schedule.
      ``StepRecord.lr`` shows it, and checkpoints keep it, so ``--resume`` goes on with it.
    * ``keep_checkpoint_as(name)``: also keep the epoch's checkpoint as
      ``checkpoints/<name>`` (replaced atomically, never pruned). From ``polytrain_epoch_end``
      it is the checkpoint of that epoch (written just before the hook); from another hook
      the next one written. Nothing is kept without an output directory.
    * ``parameters()``: the model's parameters and buffers, canonical names and layout, as
      read-only numpy copies. Each call copies every tensor from the device to the host:
      call it at epoch ends, not on every step.
    * ``history``: the :class:`EpochRecord` of every finished epoch (those before a resume
      included), oldest first.

    Hooks run on every process of a multi-process run, and each process must decide the
    same: the records hooks see are global (loss, metrics and counts are summed over all
    processes before the hook is called), so a decision that depends only on them, on the
    run's recipe and on the parameters (the same on every replica) is the same on every
    rank. Do not decide on local time, randomness or files only one rank sees.
    """

    def __init__(
        self,
        read_parameters: Callable[[], Mapping[str, Any]],
        read_history: Callable[[], Sequence[EpochRecord]],
    ) -> None:
        self._read_parameters = read_parameters
        self._read_history = read_history
        self.stop_reason: str | None = None  # the summary's stop_reason once a stop is asked
        self.lr: float | None = None  # the lr a plugin set, None: the schedule's
        self.marks: list[str] = []  # checkpoint names asked for and not yet kept

    # -- requests ----------------------------------------------------------------------------

    def request_stop(self, reason: str, *, kind: str = "stopped") -> None:
        """End the run cleanly (see the class docstring); the first request wins. ``kind``
        is the first words of ``stop_reason`` (the built-in early stopping: "early stop")."""
        if self.stop_reason is None:
            self.stop_reason = f"{kind}: {reason}"

    @property
    def stop_requested(self) -> bool:
        return self.stop_reason is not None

    def set_lr(self, lr: float | None) -> None:
        """Use ``lr`` from the next step on (None: the schedule's again)."""
        if lr is not None:
            if (
                isinstance(lr, bool)
                or not isinstance(lr, numbers.Real)
                or not math.isfinite(float(lr))
            ):
                raise ConfigError(f"set_lr({lr!r}): give a finite number >= 0, or None.")
            if lr < 0:
                raise ConfigError(f"set_lr({lr!r}): the learning rate must be >= 0.")
            lr = float(lr)
        self.lr = lr

    def keep_checkpoint_as(self, name: str) -> None:
        """Keep the epoch's checkpoint also as ``checkpoints/<name>``."""
        if not _MARK_NAME.fullmatch(name) or name in _RESERVED or name.startswith("step-"):
            raise ConfigError(
                f"keep_checkpoint_as({name!r}): use a name of letters, digits, '_', '.' or '-' "
                f"that starts with a letter and is not {', '.join(_RESERVED)} or step-N."
            )
        if name not in self.marks:
            self.marks.append(name)

    # -- reading -----------------------------------------------------------------------------

    def parameters(self) -> dict[str, np.ndarray]:
        """Read-only numpy copies of the parameters (one device-to-host copy each call)."""
        copies = {}
        for name, value in self._read_parameters().items():
            array = np.array(value, copy=True)
            array.flags.writeable = False
            copies[name] = array
        return copies

    @property
    def history(self) -> tuple[EpochRecord, ...]:
        return tuple(self._read_history())

    # -- checkpoint state --------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps so that a resumed run goes on the same way."""
        return {"lr": self.lr}

    def load_state_dict(self, state: Mapping[str, Any] | None) -> None:
        lr = (state or {}).get("lr")
        self.lr = None if lr is None else float(lr)
