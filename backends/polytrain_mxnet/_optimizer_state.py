"""Gluon's ``Trainer.save_states`` file in canonical terms, read without running its code.

In MXNet 1.x the file is ``pickle.dumps((states, optimizer))`` of the trainer's first
``Updater`` (mxnet/optimizer/optimizer.py ``Updater.get_states(dump_optimizer=True)``):
``states`` maps the index of each updated parameter in the Trainer's parameter list to its
state (for SGD: the momentum NDArray, None without momentum, ``(momentum, float32 weight)``
with ``multi_precision``); ``optimizer`` is the Optimizer object (``lr``, ``wd``,
``momentum``, ``lr_scheduler``, ``_index_update_count``, ...). The Trainer lists the
parameters of a dict sorted by their Gluon names (``dense0_weight``; gluon/trainer.py).
An NDArray pickles as ``{'handle': <NDArray::Save bytes>}``, the array record of a
``.params`` file.

Here the pickle's MXNet classes are inert stand-ins that only keep their data: nothing of
MXNet is imported or called. SGD keeps ``mom = momentum * mom - lr * (g + wd * w)`` and
adds it to the weight, so the canonical buffer (lr outside) is ``-mom / lr``: exact while
the learning rate of the next step is that of the last one.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from functools import cache
from typing import IO, Any

import numpy as np

from polytrain.backend.native_format import PathLike
from polytrain.backend.optimizer_file import OptimizerFile, resolve_hyper
from polytrain.errors import CheckpointError, ConfigError
from polytrain.utils.safe_pickle import RestrictedUnpickler

ArrayParser = Callable[[bytes, str], "np.ndarray | None"]

_STANDINS = ("mxnet.optimizer.optimizer", "mxnet.optimizer", "mxnet.lr_scheduler")
_NDARRAY = ("mxnet.ndarray.ndarray", "NDArray")


class _Standin:
    """An object of a class the pickle names: its constructor arguments and state, kept."""

    module = ""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args = args
        self.state: Any = None

    def __setstate__(self, state: Any) -> None:
        self.state = state

    @property
    def attrs(self) -> dict[str, Any]:
        return self.state if isinstance(self.state, dict) else {}


@cache
def _standin(module: str, name: str) -> type[_Standin]:
    return type(name, (_Standin,), {"module": module})


class _StatesUnpickler(RestrictedUnpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == _NDARRAY or module in _STANDINS:
            return _standin(module, name)
        if (module, name) == ("builtins", "bytearray"):
            return bytearray
        return super().find_class(module, name)


def _unpickle(path: PathLike) -> Any:
    source = os.fspath(path)
    try:
        with open(source, "rb") as fh:
            return _load(fh, source)
    except OSError as exc:
        raise CheckpointError(f"Cannot read {source}: {exc.strerror or exc}.") from exc


def _load(fh: IO[bytes], source: str) -> Any:
    try:
        return _StatesUnpickler(fh, source).load()
    except CheckpointError:
        raise
    except Exception as exc:  # truncated or not a pickle
        raise CheckpointError(f"Cannot read {source} as Trainer states: {exc!r}") from exc


def _array(obj: Any, source: str, parse: ArrayParser) -> np.ndarray:
    if not (isinstance(obj, _Standin) and (obj.module, type(obj).__name__) == _NDARRAY):
        raise CheckpointError(f"{source}: a state is a {type(obj).__name__}, not an NDArray.")
    raw = obj.attrs.get("handle")
    if not isinstance(raw, bytes | bytearray):
        raise CheckpointError(f"{source}: an NDArray without data.")
    array = parse(bytes(raw), source)
    if array is None:
        raise CheckpointError(f"{source}: an empty NDArray.")
    return array


def _order(
    tensors: Mapping[str, np.ndarray], settings: Mapping[str, Any], source: str, weights: PathLike
) -> list[str]:
    """The weights' names in the Trainer's parameter order: the ``order`` file's, or, for
    Gluon's own names (``ParameterDict.save``, ``export``), sorted as the Trainer sorts
    ``net.collect_params()``. ``save_parameters`` names (``fc1.weight``) do not tell it."""
    given = settings.get("order")
    if given is None:
        if any("." in name for name in tensors):
            raise ConfigError(
                f"{source}: Gluon's Trainer indexes its states by its parameters sorted by "
                f"their Gluon names (dense0_weight), which {os.fspath(weights)} does not "
                "record: write them in the Trainer's order, one name of the weights file a "
                "line (see docs/porting.md, Optimizer state), and give "
                "--optimizer-setting order=FILE."
            )
        return sorted(tensors)
    try:
        with open(given, encoding="utf-8") as fh:
            names = [line.strip() for line in fh if line.strip()]
    except OSError as exc:
        raise ConfigError(f"Cannot read the order file {given}: {exc.strerror or exc}.") from exc
    unknown = [n for n in names if n not in tensors]
    if unknown or len(set(names)) != len(names):
        raise ConfigError(
            f"The order file {given} names {', '.join(unknown[:4]) or 'a parameter twice'}: "
            f"it must list names of {os.fspath(weights)}, each once."
        )
    return names


def read_states(
    path: PathLike,
    weights: PathLike,
    tensors: Mapping[str, np.ndarray],
    settings: Mapping[str, Any],
    parse: ArrayParser,
) -> OptimizerFile:
    """The optimizer state of a ``Trainer.save_states`` file, its tensors named as in the
    weights file ``weights`` of the same net, which holds ``tensors`` (the Trainer's order:
    see :func:`_order`); ``parse`` reads one NDArray record."""
    source = os.fspath(path)
    loaded = _unpickle(path)
    if not (isinstance(loaded, tuple) and len(loaded) == 2 and isinstance(loaded[0], dict)):
        raise CheckpointError(
            f"{source} is not a Trainer.save_states file (states and optimizer): save it "
            "with trainer.save_states(path)."
        )
    states, optimizer = loaded
    kind = type(optimizer).__name__
    if not isinstance(optimizer, _Standin) or kind.lower() != "sgd":
        raise CheckpointError(
            f"{source} holds the state of optimizer {kind!r}; polytrain ports Gluon's SGD "
            "(with or without momentum)."
        )
    opt = optimizer.attrs
    names = _order(tensors, settings, source, weights)
    shapes = {n: a.shape for n, a in tensors.items()}
    recorded: dict[str, Any] = {"weight_decay": float(opt.get("wd", 0.0)), "nesterov": False}
    mu = float(opt.get("momentum", 0.0))
    rule = "momentum" if mu > 0 else "sgd"
    if rule == "momentum":
        recorded["momentum"] = mu
    notes = []
    if opt.get("lr_scheduler") is None:
        recorded["lr"] = float(opt["lr"])
    elif "lr" not in settings:
        raise ConfigError(
            f"{source} uses an lr_scheduler ({type(opt['lr_scheduler']).__name__}), which "
            "polytrain does not evaluate: give the learning rate of the last step with "
            "--optimizer-setting lr=VALUE."
        )
    if settings.get("optimizer") not in (None, rule):
        raise ConfigError(f"{source} holds {rule} state, not {settings['optimizer']}.")
    if opt.get("clip_gradient") is not None:
        notes.append(f"clip_gradient={opt['clip_gradient']} is not ported: clip in your loop")
    if any(v != 1.0 for d in ("lr_mult", "wd_mult") for v in (opt.get(d) or {}).values()):
        notes.append("per-parameter lr_mult/wd_mult are not ported")
    hyper, more = resolve_hyper(rule, recorded, {}, settings, source, "MXNet")
    notes += more
    slots: dict[str, dict[str, np.ndarray]] = {}
    masters: dict[str, np.ndarray] = {}
    for index, value in sorted(states.items()):
        if not isinstance(index, int) or not 0 <= index < len(names):
            raise CheckpointError(
                f"{source} has a state for parameter {index!r} of the Trainer, which has "
                f"{len(names)} in the given order: the files are not of the same net."
            )
        name = names[index]
        mom = value
        if isinstance(value, tuple):  # multi_precision: (momentum, float32 weight)
            mom, master = value
            masters[name] = _array(master, source, parse).astype(np.float32)
        slots[name] = {}
        if mom is not None:
            buf = -_array(mom, source, parse).astype(np.float64) / hyper["lr"]
            if buf.shape != shapes[name]:
                raise CheckpointError(
                    f"{source}: the state of parameter {index} has shape {buf.shape}, "
                    f"{name!r} of {os.fspath(weights)} {shapes[name]}: the order is not the "
                    "Trainer's."
                )
            slots[name]["momentum_buffer"] = buf.astype(np.float32)
    if rule == "momentum" and not any(slots.values()):
        raise CheckpointError(f"{source} holds no momentum: the trainer took no step.")
    counts = opt.get("_index_update_count") or {}
    step = max((int(v) for v in counts.values()), default=int(opt.get("num_update", 0)))
    if masters:
        notes.append(f"{len(masters)} float32 master weights (multi_precision) replace the weights")
    return OptimizerFile(rule, hyper, step, slots, {n: shapes[n] for n in slots}, masters, notes)
