"""Paddle's optimizer file (``.pdopt``) in canonical terms, read without running its code.

``paddle.save(opt.state_dict(), path)`` writes a pickle of numpy arrays named
``<parameter name>_<accumulator>_<k>`` (paddle/optimizer/optimizer.py ``_add_accumulator``:
``unique_name.generate(param.name + "_" + acc)``, with the optimizer's ``name`` and, for
``multi_precision``, ``_fp32_master_<k>`` between them), plus ``LR_Scheduler`` (the
scheduler's state dict, ``last_lr`` the rate of the next step) when the learning rate is a
scheduler and ``master_weights`` (parameter name -> float32 copy) with ``multi_precision``.
The accumulators (adam.py, momentum.py, adagrad.py):

===============  ===========================  =========================================
Adam, AdamW      moment1, moment2             exp_avg, exp_avg_sq
                 beta1_pow_acc, beta2_pow_acc beta**(t+1) after t steps: filled with beta
                                              and multiplied by beta after each update
Momentum         velocity                     momentum_buffer (same rule, lr outside)
Adagrad          moment                       sum
===============  ===========================  =========================================

Accumulators are keyed by parameter names (``linear_0.w_0``); the ``.pdparams`` of the same
run maps its structured names to them (``StructuredToParameterName@@``).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from polytrain.backend.native_format import PathLike
from polytrain.backend.optimizer_file import OptimizerFile, resolve_hyper
from polytrain.errors import CheckpointError, ConfigError
from polytrain.utils import safe_pickle

NAME_TABLE = "StructuredToParameterName@@"
SCHEDULER = "LR_Scheduler"
MASTER = "master_weights"
_ALLOWED = safe_pickle.SAFE_GLOBALS | {("builtins", "tuple")}
# accumulator -> (family, canonical slot); beta powers become the step count
ACCUMULATORS: dict[str, tuple[str, str | None]] = {
    "moment1": ("adam", "exp_avg"),
    "moment2": ("adam", "exp_avg_sq"),
    "beta1_pow_acc": ("adam", None),
    "beta2_pow_acc": ("adam", None),
    "velocity": ("momentum", "momentum_buffer"),
    "moment": ("adagrad", "sum"),
}
_KEY = re.compile(
    r"(?:(?P<infix>.+)_)?(?P<acc>moment2_max|moment1|moment2|beta1_pow_acc|beta2_pow_acc"
    r"|velocity|moment)_(?P<k>\d+)"
)
_ACCUMULATOR_NAME = re.compile(r".+_" + _KEY.pattern)
# paddle.optimizer defaults for what a .pdopt does not record
DEFAULTS: dict[str, dict[str, Any]] = {
    "adam": {"betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0},
    "adamw": {"betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01},
    "momentum": {"momentum": 0.9, "weight_decay": 0.0, "nesterov": False},
    "adagrad": {"eps": 1e-6, "weight_decay": 0.0},
}


def read_pdopt(path: PathLike, weights: PathLike, settings: Mapping[str, Any]) -> OptimizerFile:
    """The optimizer state of a ``.pdopt``, its tensors named as in the ``.pdparams``
    ``weights`` of the same run (Paddle layout)."""
    source = os.fspath(path)
    state = _load(path)
    if not isinstance(state, dict):
        raise CheckpointError(f"{source} holds a {type(state).__name__}, not an optimizer state.")
    structured = _structured_names(weights)
    found: dict[str, dict[str, np.ndarray]] = {}
    for key, value in state.items():
        if key in (SCHEDULER, MASTER) or (isinstance(key, str) and key.endswith("@@")):
            continue
        name, acc = _owner(str(key), structured, source, weights)
        value = _unwrap(value)
        if not isinstance(value, np.ndarray):
            raise CheckpointError(f"{source}: {key!r} is not an array.")
        if acc in found.setdefault(name, {}):
            raise CheckpointError(
                f"{source} holds two {acc} accumulators for {name!r}: it was saved from "
                "several optimizers; save one optimizer's state_dict()."
            )
        found[name][acc] = value
    if not found:
        raise CheckpointError(
            f"{source} holds no accumulators: the optimizer took no step before it was saved."
        )
    families = {ACCUMULATORS[a][0] for accs in found.values() for a in accs}
    if len(families) != 1:
        raise CheckpointError(f"{source} mixes the accumulators of {sorted(families)}.")
    family = families.pop()
    rule = _rule(family, settings, source)
    recorded: dict[str, Any] = {}
    notes = []
    scheduler = state.get(SCHEDULER)
    if isinstance(scheduler, dict) and "last_lr" in scheduler:
        recorded["lr"] = float(scheduler["last_lr"])
        notes.append(
            f"learning rate {recorded['lr']:g} from LR_Scheduler (last_epoch "
            f"{scheduler.get('last_epoch')}); the schedule itself is not ported"
        )
    hyper, more = resolve_hyper(rule, recorded, DEFAULTS[rule], settings, source, "Paddle")
    notes += more
    step = _step(found, hyper, source) if family == "adam" else 0
    slots: dict[str, dict[str, np.ndarray]] = {}
    for name, accs in found.items():
        slots[name] = {
            slot: np.array(value, dtype=np.float32)
            for acc, value in accs.items()
            if (slot := ACCUMULATORS[acc][1]) is not None
        }
    shapes = {name: next(iter(s.values())).shape for name, s in slots.items() if s}
    masters = _master_weights(state.get(MASTER), structured, source)
    if masters:
        notes.append(f"{len(masters)} float32 master weights (multi_precision) replace the weights")
    return OptimizerFile(rule, hyper, step, slots, shapes, masters, notes)


def refuse_optimizer_state(state: Mapping[Any, Any], source: str) -> None:
    """Stop when a file read as weights is a ``.pdopt``: every tensor an accumulator."""
    keys = [str(k) for k in state if not str(k).endswith("@@") and k != SCHEDULER]
    if keys and (SCHEDULER in state or all(_ACCUMULATOR_NAME.fullmatch(k) for k in keys)):
        raise CheckpointError(
            f"{source} is an optimizer state (.pdopt: {keys[0]!r}), not weights: convert "
            "the .pdparams of the run and give this file with --optimizer (docs/porting.md, "
            "Optimizer state)."
        )


def _load(path: PathLike) -> Any:
    """The pickle, tensors as arrays. A state dict with nested tensors (``master_weights``)
    is pickled whole, each tensor as ``tuple((name, array))`` (paddle/framework/io.py
    ``reduce_varbase``): building a tuple is all that this allows beyond arrays and dicts."""
    source = os.fspath(path)
    try:
        with open(source, "rb") as fh:
            return safe_pickle.RestrictedUnpickler(fh, source, _ALLOWED).load()
    except CheckpointError:
        raise
    except FileNotFoundError:
        raise CheckpointError(f"No such file: {source}.") from None
    except Exception as exc:  # truncated or not a pickle at all
        raise CheckpointError(f"Cannot read {source} as a pickle: {exc!r}") from exc


def _unwrap(value: Any) -> Any:
    """An array pickled as ``(name, array)`` (see :func:`_load`) as the array."""
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], np.ndarray):
        return value[1]
    return value


def _structured_names(weights: PathLike) -> dict[str, str]:
    """Paddle parameter name -> structured name, from the .pdparams name table."""
    state = safe_pickle.load(weights)
    table = state.get(NAME_TABLE) if isinstance(state, dict) else None
    if not isinstance(table, dict) or not table:
        raise CheckpointError(
            f"{os.fspath(weights)} has no {NAME_TABLE} name table, which ties the .pdopt's "
            "accumulators to the weights: save the weights with paddle.save(layer.state_dict())."
        )
    return {str(param): str(name) for name, param in table.items()}


def _owner(
    key: str, structured: Mapping[str, str], source: str, weights: PathLike
) -> tuple[str, str]:
    """(structured name, accumulator) of an accumulator key: the longest parameter name
    it starts with, then ``[<optimizer name or master>_]<accumulator>_<k>``."""
    for param in sorted(structured, key=len, reverse=True):
        if key.startswith(param + "_"):
            match = _KEY.fullmatch(key[len(param) + 1 :])
            if match:
                acc = match.group("acc")
                if acc == "moment2_max":
                    raise CheckpointError(
                        f"{source} is the state of Adam(amsgrad=True) ({key!r}), which "
                        "polytrain does not port."
                    )
                return structured[param], acc
    raise CheckpointError(
        f"{source}: {key!r} is no accumulator of a parameter of {os.fspath(weights)} "
        "(polytrain ports Adam, AdamW, Momentum and Adagrad): are both files from the "
        "same run?"
    )


def _rule(family: str, settings: Mapping[str, Any], source: str) -> str:
    given = settings.get("optimizer")
    allowed = ("adam", "adamw") if family == "adam" else (family,)
    if given is None and family == "adam":
        raise ConfigError(
            f"{source} holds Adam or AdamW state (the same accumulators): say which with "
            "--optimizer-setting optimizer=adam or optimizer=adamw."
        )
    if given is not None and given not in allowed:
        raise ConfigError(f"{source} holds {family} state, not {given}.")
    return str(given or family)


def _step(found: Mapping[str, Mapping[str, np.ndarray]], hyper: Mapping[str, Any],
          source: str) -> int:  # fmt: skip
    """Updates taken, from beta1_pow_acc = beta1**(t+1) (beta2's where beta1's has
    underflowed), checked against beta2_pow_acc: they disagree when the betas are not
    the run's."""
    b1, b2 = hyper["betas"]
    steps = set()
    for name, accs in found.items():
        try:
            p1 = float(np.asarray(accs["beta1_pow_acc"]).reshape(-1)[0])
            p2 = float(np.asarray(accs["beta2_pow_acc"]).reshape(-1)[0])
        except KeyError as exc:
            raise CheckpointError(f"{source}: {name!r} has no {exc.args[0]}.") from None
        t1 = _power(p1, b1)
        t2 = _power(p2, b2)
        est = t1 if t1 is not None and p1 > 1e-30 else t2
        if est is None:
            raise CheckpointError(f"{source}: {name!r} has beta powers {p1}, {p2}.")
        t = round(est) - 1
        slack = 0.05 + 1e-4 * max(t, 0)
        if (
            t < 0
            or abs(est - 1 - t) > slack
            or (t2 is not None and abs(t2 - 1 - t) > slack + 5e-5 * t)
        ):
            raise ConfigError(
                f"{source}: the beta powers of {name!r} ({p1:.6g}, {p2:.6g}) are not "
                f"betas {b1}, {b2} to one integer power: give the run's betas with "
                "--optimizer-setting betas=B1,B2."
            )
        steps.add(t)
    if len(steps) != 1:
        raise CheckpointError(
            f"{source}: the parameters took different numbers of steps ({sorted(steps)}); "
            "polytrain ports one step count."
        )
    return steps.pop()


def _power(p: float, beta: float) -> float | None:
    """k with beta**k == p (None where that says nothing)."""
    if not (0 < p < 1) or not (0 < beta < 1):
        return None
    return math.log(p) / math.log(beta)


def _master_weights(
    masters: Any, structured: Mapping[str, str], source: str
) -> dict[str, np.ndarray]:
    if not masters:
        return {}
    if not isinstance(masters, dict):
        raise CheckpointError(f"{source}: {MASTER} is not a dict.")
    out = {}
    for param, value in masters.items():
        if str(param) not in structured or not isinstance(_unwrap(value), np.ndarray):
            raise CheckpointError(f"{source}: master weight {param!r} is of no parameter.")
        out[structured[str(param)]] = np.asarray(_unwrap(value), dtype=np.float32)
    return out
