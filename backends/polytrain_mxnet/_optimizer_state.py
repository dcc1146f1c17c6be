"""Gluon's ``Trainer.save_states`` file in canonical terms, read without running its code.

In MXNet 1.x the file is ``pickle.dumps((states, optimizer))`` of the trainer's first
``Updater`` (mxnet/optimizer/optimizer.py ``Updater.get_states(dump_optimizer=True)``):
``states`` maps the index of each updated parameter in the Trainer's parameter list to its
state (``(state, float32 weight)`` with ``multi_precision`` and float16 weights);
``optimizer`` is the Optimizer object, its class the rule and its attributes the
hyperparameters (``lr``, ``wd``, ``lr_scheduler``, ``_index_update_count``, ...). The
Trainer lists the parameters of a dict sorted by their Gluon names (``dense0_weight``;
gluon/trainer.py). An NDArray pickles as ``{'handle': <NDArray::Save bytes>}``, the array
record of a ``.params`` file. Here the pickle's MXNet classes are inert stand-ins that
only keep their data: nothing of MXNet is imported or called.

The states, and how each becomes torch.optim's (``_optimizer_rules``):

=========  ====================  ====================================================
optimizer  state                 canonical slots
=========  ====================  ====================================================
SGD        mom (or None)         momentum_buffer = -mom / lr (MXNet keeps lr inside:
                                 exact while the rate stays the last step's)
NAG        mom (or None)         the same, Nesterov
Adam       (mean, var)           exp_avg, exp_avg_sq; eps on the uncorrected sqrt(var)
AdaGrad    history               sum = history + eps (MXNet's eps is inside the sqrt;
                                 torch's eps 0)
RMSProp    (n,) / (n, g, delta)  square_avg, grad_avg, velocity = -delta; eps inside
                                 the sqrt
AdaDelta   (acc_g, acc_delta)    square_avg, acc_delta (MXNet takes no lr: 1)
Adamax     (m, u)                exp_avg, exp_inf (MXNet has no eps: torch's 0)
=========  ====================  ====================================================

MXNet 1.9.1 has no AdamW optimizer (only the ``adamw_update`` operator).
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

from ._optimizer_rules import Rule, learning_rate, rule_of

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
    if not isinstance(optimizer, _Standin):
        raise CheckpointError(f"{source} holds no MXNet optimizer beside its states.")
    rule = rule_of(type(optimizer).__name__, optimizer.attrs, settings, source)
    names = _order(tensors, settings, source, weights)
    recorded, notes = dict(rule.recorded), list(rule.notes)
    schedule, lr_notes = learning_rate(optimizer.attrs, rule, recorded, settings, source)
    hyper, more = resolve_hyper(rule.name, recorded, {}, settings, source, "MXNet")
    shapes = {n: a.shape for n, a in tensors.items()}
    slots, masters = _slots(states, names, shapes, rule, hyper, parse, source, weights)
    if rule.kind in ("sgd", "nag") and rule.name == "momentum" and not any(slots.values()):
        raise CheckpointError(f"{source} holds no momentum: the trainer took no step.")
    step = _step(optimizer.attrs, slots, names, rule, source)
    notes += lr_notes + more
    if masters:
        notes.append(f"{len(masters)} float32 master weights (multi_precision) replace the weights")
    return OptimizerFile(rule.name, hyper, step, slots, {n: shapes[n] for n in slots}, masters,
                         notes, rule.variant, schedule)  # fmt: skip


def _slots(
    states: Mapping[Any, Any],
    names: list[str],
    shapes: Mapping[str, tuple[int, ...]],
    rule: Rule,
    hyper: Mapping[str, Any],
    parse: ArrayParser,
    source: str,
    weights: PathLike,
) -> tuple[dict[str, dict[str, np.ndarray]], dict[str, np.ndarray]]:
    """The canonical slots (and float32 master weights) of every parameter with a state."""
    slots: dict[str, dict[str, np.ndarray]] = {}
    masters: dict[str, np.ndarray] = {}
    for index, value in sorted(states.items()):
        if not isinstance(index, int) or not 0 <= index < len(names):
            raise CheckpointError(
                f"{source} has a state for parameter {index!r} of the Trainer, which has "
                f"{len(names)} in the given order: the files are not of the same net."
            )
        name = names[index]
        value, master = _split_master(value, rule.arity)
        if master is not None:
            masters[name] = _array(master, source, parse).astype(np.float32)
        arrays = _arrays(value, rule.arity, source, parse)
        slots[name] = rule.convert(arrays, hyper)
        for slot, array in slots[name].items():
            if array.shape != shapes[name]:
                raise CheckpointError(
                    f"{source}: the {slot} of parameter {index} has shape {array.shape}, "
                    f"{name!r} of {os.fspath(weights)} {shapes[name]}: the order is not the "
                    "Trainer's."
                )
    return slots, masters


def _split_master(value: Any, arity: int) -> tuple[Any, Any]:
    """(state, float32 weight) of a multi_precision state, (state, None) otherwise: a
    state of one array (or None) is never a tuple; one of several is a tuple of arrays."""
    nested = isinstance(value, tuple) and len(value) == 2
    if nested and (arity == 1 or isinstance(value[0], tuple)):
        return value[0], value[1]
    return value, None


def _arrays(value: Any, arity: int, source: str, parse: ArrayParser) -> list[np.ndarray | None]:
    """The state's arrays (a state of one array may be None: SGD without momentum)."""
    if arity == 1:
        return [None if value is None else _array(value, source, parse).astype(np.float64)]
    if not isinstance(value, tuple) or len(value) not in (arity, 1):
        raise CheckpointError(f"{source}: a state is not the optimizer's ({arity} arrays).")
    return [_array(v, source, parse).astype(np.float64) for v in value]


def _step(
    opt: Mapping[str, Any], slots: Mapping[str, Any], names: list[str], rule: Rule, source: str
) -> int:
    """Updates taken: ``_index_update_count``; one count for the rules that correct bias."""
    counts = {int(k): int(v) for k, v in (opt.get("_index_update_count") or {}).items()}
    if not counts:
        return int(opt.get("num_update", 0))
    taken = {counts.get(names.index(n), 0) for n in slots}
    if rule.name in ("adam", "adamax") and len(taken) > 1:
        raise CheckpointError(
            f"{source}: the parameters took different numbers of steps ({sorted(taken)}), "
            "and torch's bias correction counts them per parameter from one step polytrain "
            "writes: not ported."
        )
    return max(taken or counts.values())
