"""Paddle's optimizer file (``.pdopt``) in canonical terms, read without running its code.

``paddle.save(opt.state_dict(), path)`` writes a pickle of numpy arrays named
``<parameter name>_<accumulator>_<k>`` (paddle/optimizer/optimizer.py ``_add_accumulator``:
``unique_name.generate(param.name + "_" + acc)``, with the optimizer's ``name`` and, for
``multi_precision``, ``_fp32_master_<k>`` between them), plus ``LR_Scheduler`` (the
scheduler's ``last_epoch`` and ``last_lr``, the rate of the next step) when the learning
rate is a scheduler and ``master_weights`` (parameter name -> float32 copy) with
``multi_precision``. The accumulators tell the optimizer (paddle/optimizer/*.py):

=============  ===========================================  ===============================
optimizer      accumulators                                 canonical (torch.optim) slots
=============  ===========================================  ===============================
SGD            none                                         none (say optimizer=sgd)
Momentum       velocity                                     momentum_buffer (lr outside)
Adam, AdamW,   moment1, moment2, beta1_pow_acc,             exp_avg, exp_avg_sq, step
Lamb           beta2_pow_acc (the same for the three)       (Lamb: refused)
Adamax         moment, inf_norm, beta1_pow_acc              exp_avg, exp_inf, step
Adagrad        moment                                       sum
Adadelta       _avg_squared_grad, _avg_squared_update       square_avg, acc_delta
RMSProp        mean_square, mean_grad, momentum             square_avg, grad_avg, velocity
=============  ===========================================  ===============================

A beta power is filled with beta and multiplied by it after each update: beta**(t+1)
after t steps. RMSProp keeps the learning rate inside its ``momentum`` and eps inside the
square root; Adamax adds eps to the decayed norm: their ``variant`` says so. Accumulators
are keyed by parameter names (``linear_0.w_0``); the ``.pdparams`` of the same run maps its
structured names to them (``StructuredToParameterName@@``).
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

from ._lr_schedule import paddle_schedule

NAME_TABLE = "StructuredToParameterName@@"
SCHEDULER = "LR_Scheduler"
MASTER = "master_weights"
_ALLOWED = safe_pickle.SAFE_GLOBALS | {("builtins", "tuple")}
# the accumulators of one parameter -> (family, {accumulator: canonical slot})
FAMILIES: dict[frozenset[str], tuple[str, dict[str, str]]] = {
    frozenset({"velocity"}): ("momentum", {"velocity": "momentum_buffer"}),
    frozenset({"moment1", "moment2", "beta1_pow_acc", "beta2_pow_acc"}): (
        "adam",
        {"moment1": "exp_avg", "moment2": "exp_avg_sq"},
    ),
    frozenset({"moment", "inf_norm", "beta1_pow_acc"}): (
        "adamax",
        {"moment": "exp_avg", "inf_norm": "exp_inf"},
    ),
    frozenset({"moment"}): ("adagrad", {"moment": "sum"}),
    frozenset({"_avg_squared_grad", "_avg_squared_update"}): (
        "adadelta",
        {"_avg_squared_grad": "square_avg", "_avg_squared_update": "acc_delta"},
    ),
    frozenset({"mean_square", "mean_grad", "momentum"}): (
        "rmsprop",
        {"mean_square": "square_avg", "mean_grad": "grad_avg", "momentum": "velocity"},
    ),
}
NOT_PORTED = {  # accumulators of the Paddle optimizers polytrain does not port
    "moment2_max": "Adam(amsgrad=True)",
    "momentum_decay_pow": "NAdam",
    "mu_product": "NAdam",
    "beta2_pow": "NAdam or RAdam",
    "beta1_pow": "RAdam",
    "rho": "RAdam",
    "prevs": "Rprop",
    "learning_rates": "Rprop",
    "d": "ASGD",
    "y": "ASGD",
    "m": "ASGD",
}
_NAMES = sorted({a for f in FAMILIES for a in f} | set(NOT_PORTED), key=len, reverse=True)
_KEY = re.compile(r"(?:(?P<infix>.+)_)?(?P<acc>" + "|".join(_NAMES) + r")_(?P<k>\d+)")
_ACCUMULATOR_NAME = re.compile(  # for telling a .pdopt given as weights: no 1-letter names
    r".+_(?:.+_)?(?:" + "|".join(n for n in _NAMES if len(n) > 1) + r")_\d+"
)
# what a user may name a family (--optimizer-setting optimizer=...)
NAMED = {"adam": ("adam", "adamw", "lamb")}
# paddle.optimizer defaults for what a .pdopt does not record (never nesterov: see _rule)
DEFAULTS: dict[str, dict[str, Any]] = {
    "sgd": {"weight_decay": 0.0},
    "adam": {"betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0},
    "adamw": {"betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01},
    "momentum": {"momentum": 0.9, "weight_decay": 0.0},
    "adamax": {"betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0},
    "adagrad": {"eps": 1e-6, "weight_decay": 0.0},
    "adadelta": {"rho": 0.95, "eps": 1e-6, "weight_decay": 0.0},
    "rmsprop": {"rho": 0.95, "eps": 1e-6, "momentum": 0.0, "weight_decay": 0.0},
}
VARIANTS = {"rmsprop": "eps-in-sqrt", "adamax": "eps-on-decayed-norm"}


def read_pdopt(path: PathLike, weights: PathLike, settings: Mapping[str, Any]) -> OptimizerFile:
    """The optimizer state of a ``.pdopt``, its tensors named as in the ``.pdparams``
    ``weights`` of the same run (Paddle layout)."""
    source = os.fspath(path)
    state = _load(path)
    if not isinstance(state, dict):
        raise CheckpointError(f"{source} holds a {type(state).__name__}, not an optimizer state.")
    structured = _structured_names(weights)
    found = _accumulators(state, structured, source, weights)
    family, slot_names = _family(found, source)
    rule = _rule(family, settings, source)
    recorded: dict[str, Any] = {}
    schedule, notes = _schedule(state.get(SCHEDULER), settings, source)
    if state.get(SCHEDULER) is not None:
        recorded["lr"] = float(state[SCHEDULER]["last_lr"])
    if rule == "rmsprop":
        recorded.update(_centered(found))
    hyper, more = resolve_hyper(rule, recorded, DEFAULTS[rule], settings, source, "Paddle")
    notes += more
    if rule == "adamw" and hyper["weight_decay"]:
        notes.append("AdamW's apply_decay_param_fun and lr_ratio are not in a .pdopt: torch's "
                     "AdamW decays every parameter")  # fmt: skip
    step = 0
    if rule in ("adam", "adamw", "adamax"):
        step = _step(found, hyper, source)
    slots = {
        name: {
            slot_names[acc]: np.array(value, dtype=np.float32)
            for acc, value in accs.items()
            if acc in slot_names and not (acc == "mean_grad" and not hyper.get("centered"))
        }
        for name, accs in found.items()
    }
    if rule == "sgd":  # every parameter, none of BatchNorm's statistics
        slots = {n: {} for n in structured.values() if not n.endswith(("._mean", "._variance"))}
    shapes = {name: next(iter(s.values())).shape for name, s in slots.items() if s}
    masters = _master_weights(state.get(MASTER), structured, source)
    if masters:
        notes.append(f"{len(masters)} float32 master weights (multi_precision) replace the weights")
    return OptimizerFile(rule, hyper, step, slots, shapes, masters, notes,
                         VARIANTS.get(rule, ""), schedule)  # fmt: skip


def _accumulators(
    state: Mapping[Any, Any], structured: Mapping[str, str], source: str, weights: PathLike
) -> dict[str, dict[str, np.ndarray]]:
    """Structured name -> {accumulator: array} of every accumulator in ``state``."""
    found: dict[str, dict[str, np.ndarray]] = {}
    for key, value in state.items():
        if key in (SCHEDULER, MASTER) or (isinstance(key, str) and key.endswith("@@")):
            continue
        param, acc = _owner(str(key), structured, source, weights)
        value = _unwrap(value)
        if not isinstance(value, np.ndarray):
            raise CheckpointError(f"{source}: {key!r} is not an array.")
        if acc in found.setdefault(param, {}):
            raise CheckpointError(
                f"{source} holds two {acc} accumulators for {param!r}: it was "
                "saved from several optimizers; save one optimizer's state_dict()."
            )
        found[param][acc] = value
    return found


def _family(
    found: Mapping[str, Mapping[str, np.ndarray]], source: str
) -> tuple[str | None, dict[str, str]]:
    """The optimizer the accumulators tell (None: there are none, as for SGD)."""
    kinds = {frozenset(accs) for accs in found.values()}
    if not kinds:
        return None, {}
    if len(kinds) != 1 or next(iter(kinds)) not in FAMILIES:
        names = sorted({a for k in kinds for a in k})
        raise CheckpointError(
            f"{source} holds the accumulators {', '.join(names)}, which are no single Paddle "
            "optimizer's (each parameter's should be one optimizer's set): save one "
            "optimizer's state_dict()."
        )
    return FAMILIES[next(iter(kinds))]


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
            if match and match.group("acc") in NOT_PORTED:
                raise CheckpointError(
                    f"{source} holds the state of Paddle {NOT_PORTED[match.group('acc')]} "
                    f"({key!r}), which polytrain does not port (it ports SGD, Momentum, Adam, "
                    "AdamW, Adamax, Adagrad, Adadelta and RMSProp)."
                )
            if match:
                return structured[param], match.group("acc")
            raise CheckpointError(
                f"{source}: {key!r} is an accumulator of {structured[param]!r} that no Paddle "
                "optimizer polytrain ports keeps (it ports SGD, Momentum, Adam, AdamW, Adamax, "
                "Adagrad, Adadelta and RMSProp)."
            )
    raise CheckpointError(
        f"{source}: {key!r} is no accumulator of a parameter of {os.fspath(weights)}: are "
        "both files from the same run?"
    )


def _rule(family: str | None, settings: Mapping[str, Any], source: str) -> str:
    """The rule: the accumulators' (one of NAMED's, for Adam's) as the user says."""
    given = settings.get("optimizer")
    if family is None:
        if given != "sgd":
            raise CheckpointError(
                f"{source} holds no accumulators: it is the state of SGD (say "
                "--optimizer-setting optimizer=sgd) or of an optimizer that took no step, "
                "which has nothing to port."
            )
        return "sgd"
    allowed = NAMED.get(family, (family,))
    if given is None and len(allowed) > 1:
        raise ConfigError(
            f"{source} holds the state of Adam, AdamW or Lamb (the same accumulators): say "
            "which with --optimizer-setting optimizer=adam, optimizer=adamw or optimizer=lamb."
        )
    if given is not None and given not in allowed:
        raise ConfigError(
            f"{source} holds the state of Paddle {' or '.join(allowed)} (its accumulators "
            f"say so), not {given}: drop the optimizer setting or check the file."
        )
    if given == "lamb":
        raise ConfigError(
            f"{source}: torch has no Lamb (its layer-wise trust ratio), and no other "
            "optimizer continues its state: polytrain does not port Paddle Lamb."
        )
    return str(given or family)


def _centered(found: Mapping[str, Mapping[str, np.ndarray]]) -> dict[str, Any]:
    """What RMSProp's accumulators tell of ``centered``: the mean gradient stays zero
    unless it is; nothing where no gradient has been seen either."""
    if any(np.any(accs["mean_grad"]) for accs in found.values()):
        return {"centered": True}
    if any(np.any(accs["mean_square"]) for accs in found.values()):
        return {"centered": False}
    return {}


def _schedule(
    scheduler: Any, settings: Mapping[str, Any], source: str
) -> tuple[dict[str, Any] | None, list[str]]:
    """The schedule to go on with (None: a constant rate) and a note saying which."""
    if scheduler is None:
        if settings.get("scheduler") not in (None, "constant"):
            raise ConfigError(
                f"{source} has no LR_Scheduler: the run's rate was constant; drop the "
                "scheduler setting."
            )
        return None, []
    if not isinstance(scheduler, dict) or "last_lr" not in scheduler:
        raise CheckpointError(f"{source}: LR_Scheduler has no last_lr.")
    last = f"last_epoch {scheduler.get('last_epoch')}, lr {float(scheduler['last_lr']):g}"
    spec = settings.get("scheduler")
    if spec is None:
        raise ConfigError(
            f"{source} was saved with an LR scheduler ({last}), whose kind the file does not "
            "record: give it as the run's script built it, e.g. --optimizer-setting "
            "scheduler='CosineAnnealingDecay(learning_rate=0.1, T_max=20)', or "
            "scheduler=constant to go on at the last lr."
        )
    schedule = paddle_schedule(spec, scheduler, source)
    if schedule is None:
        return None, [f"LR_Scheduler ({last}): continued at the constant lr (scheduler=constant)"]
    return schedule, [f"LR_Scheduler ({last}): continued as {schedule['kind']}"]


def _step(found: Mapping[str, Mapping[str, np.ndarray]], hyper: Mapping[str, Any],
          source: str) -> int:  # fmt: skip
    """Updates taken, from beta1_pow_acc = beta1**(t+1) (beta2's where beta1's has
    underflowed), checked against beta2_pow_acc (Adamax has none): they disagree when
    the betas are not the run's."""
    b1, b2 = hyper["betas"]
    steps = set()
    for name, accs in found.items():
        p1 = float(np.asarray(accs["beta1_pow_acc"]).reshape(-1)[0])
        p2 = float(np.asarray(accs.get("beta2_pow_acc", [math.nan])).reshape(-1)[0])
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
    if not (0 < p < 1) or not (0 < beta < 1):  # NaN too
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
