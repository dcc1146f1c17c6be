"""MXNet's optimizers (mxnet/optimizer/optimizer.py) as canonical rules, from the pickled
Optimizer object's attributes; and its ``lr_scheduler`` (mxnet/lr_scheduler.py) as a
canonical schedule. See ``_optimizer_state`` for the table of states."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from polytrain.backend.lr_schedule import CONSTANT, lr_at
from polytrain.errors import CheckpointError, ConfigError

Arrays = list["np.ndarray | None"]
Converter = Callable[[Arrays, Mapping[str, Any]], dict[str, np.ndarray]]

KINDS = {"sgd": "sgd", "ccsgd": "sgd", "nag": "nag", "adam": "adam", "adagrad": "adagrad",
         "rmsprop": "rmsprop", "adadelta": "adadelta", "adamax": "adamax"}  # fmt: skip
"""MXNet Optimizer class (lower case) -> kind"""
NOT_PORTED = {
    "lamb": "torch has no LAMB",
    "nadam": "its momentum schedule is not torch's NAdam's",
    "ftml": "torch has no FTML",
    "signum": "torch has no Signum",
    "lars": "torch has no LARS",
    "lbsgd": "torch has no LBSGD",
    "dcasgd": "torch has no DCASGD",
    "sgld": "torch has no SGLD",
    "ftrl": "torch has no Ftrl",
    "groupadagrad": "torch has no GroupAdaGrad",
}
# the rules that clip after adding weight decay (torch's clip_grad_value_ comes before it)
_CLIP_AFTER_WD = ("adam", "rmsprop", "adamax")


@dataclass
class Rule:
    """How one MXNet optimizer's state becomes a canonical rule's."""

    kind: str
    name: str
    arity: int
    convert: Converter
    recorded: dict[str, Any] = field(default_factory=dict)
    variant: str = ""
    notes: list[str] = field(default_factory=list)


def rule_of(cls: str, opt: Mapping[str, Any], settings: Mapping[str, Any], source: str) -> Rule:
    """The rule of the pickled optimizer ``cls`` with attributes ``opt``; a class polytrain
    does not port, or a user's ``optimizer`` setting that is not its rule, is refused."""
    kind = KINDS.get(cls.lower())
    if kind is None:
        why = NOT_PORTED.get(cls.lower(), "polytrain knows no torch optimizer of that rule")
        raise CheckpointError(
            f"{source} holds the state of MXNet optimizer {cls!r}, which polytrain does not "
            f"port ({why}); it ports SGD, NAG, Adam, AdaGrad, RMSProp, AdaDelta and Adamax."
        )
    rule = _RULES[kind](opt, source)
    given = settings.get("optimizer")
    if given not in (None, rule.name):
        raise ConfigError(
            f"{source} holds the state of MXNet {cls} ({rule.name}), not {given}: drop the "
            "optimizer setting or check the file."
        )
    rule.notes += _gradient_notes(opt, rule, source)
    return rule


def _sgd(opt: Mapping[str, Any], source: str) -> Rule:
    return _momentum(opt, nesterov=False)


def _nag(opt: Mapping[str, Any], source: str) -> Rule:
    if float(opt.get("momentum", 0.0)):
        _no_decay(opt, "NAG", "to its momentum from the weight it has just updated "
                  "(nag_mom_update writes the weight in place first)", source)  # fmt: skip
    return _momentum(opt, nesterov=True)


def _momentum(opt: Mapping[str, Any], nesterov: bool) -> Rule:
    mu = float(opt.get("momentum", 0.0))
    recorded: dict[str, Any] = {"weight_decay": _wd(opt)}
    if mu == 0:
        return Rule("nag" if nesterov else "sgd", "sgd", 1, lambda a, h: {}, recorded)
    recorded.update(momentum=mu, nesterov=nesterov)

    def convert(arrays: Arrays, hyper: Mapping[str, Any]) -> dict[str, np.ndarray]:
        (mom,) = arrays
        if mom is None:
            return {}
        return {"momentum_buffer": _f32(-mom / hyper["lr"])}  # MXNet keeps lr inside

    return Rule("nag" if nesterov else "sgd", "momentum", 1, convert, recorded)


def _adam(opt: Mapping[str, Any], source: str) -> Rule:
    recorded = {"betas": _betas(opt), "eps": float(opt.get("epsilon", 1e-8)),
                "weight_decay": _wd(opt)}  # fmt: skip
    return Rule("adam", "adam", 2, _named("exp_avg", "exp_avg_sq"), recorded, "eps-uncorrected")


def _adagrad(opt: Mapping[str, Any], source: str) -> Rule:
    eps = float(opt.get("float_stable_eps", 1e-7))
    _no_decay(opt, "AdaGrad", "outside the adaptive step (w -= lr * wd * w)", source)

    def convert(arrays: Arrays, hyper: Mapping[str, Any]) -> dict[str, np.ndarray]:
        (history,) = arrays
        assert history is not None
        return {"sum": _f32(history + eps)}  # sqrt(history + eps) = sqrt(sum) + 0

    return Rule("adagrad", "adagrad", 1, convert, {"eps": 0.0, "weight_decay": 0.0},
                notes=[f"MXNet AdaGrad's eps {eps:g} (inside the sqrt) is in the ported sum; "
                       "torch's eps is 0"])  # fmt: skip


def _rmsprop(opt: Mapping[str, Any], source: str) -> Rule:
    if opt.get("clip_weights"):
        raise ConfigError(
            f"{source}: RMSProp clips the weights (clip_weights={opt['clip_weights']}), which "
            "no torch optimizer does: not ported."
        )
    centered = bool(opt.get("centered", False))
    recorded = {"rho": float(opt.get("gamma1", 0.9)), "eps": float(opt.get("epsilon", 1e-8)),
                "centered": centered, "weight_decay": _wd(opt),
                "momentum": float(opt.get("gamma2", 0.9)) if centered else 0.0}  # fmt: skip

    def convert(arrays: Arrays, hyper: Mapping[str, Any]) -> dict[str, np.ndarray]:
        if not centered:
            (n,) = arrays
            assert n is not None
            return {"square_avg": _f32(n), "velocity": np.zeros(n.shape, np.float32)}
        n, g, delta = arrays
        assert n is not None and g is not None and delta is not None
        return {"square_avg": _f32(n), "grad_avg": _f32(g), "velocity": _f32(-delta)}

    return Rule("rmsprop", "rmsprop", 3, convert, recorded, "eps-in-sqrt")


def _adadelta(opt: Mapping[str, Any], source: str) -> Rule:
    _no_decay(opt, "AdaDelta", "outside the step (w -= delta + wd * w)", source)
    recorded = {"rho": float(opt.get("rho", 0.9)), "eps": float(opt.get("epsilon", 1e-5)),
                "weight_decay": 0.0, "lr": 1.0}  # fmt: skip
    return Rule("adadelta", "adadelta", 2, _named("square_avg", "acc_delta"), recorded,
                notes=["MXNet's AdaDelta takes no learning rate: torch's lr is 1"])  # fmt: skip


def _adamax(opt: Mapping[str, Any], source: str) -> Rule:
    recorded = {"betas": _betas(opt), "eps": 0.0, "weight_decay": _wd(opt)}
    return Rule("adamax", "adamax", 2, _named("exp_avg", "exp_inf"), recorded,
                notes=["MXNet's Adamax has no eps: torch's is 0"])  # fmt: skip


_RULES: dict[str, Callable[[Mapping[str, Any], str], Rule]] = {
    "sgd": _sgd, "nag": _nag, "adam": _adam, "adagrad": _adagrad, "rmsprop": _rmsprop,
    "adadelta": _adadelta, "adamax": _adamax,
}  # fmt: skip


def _named(*slots: str) -> Converter:
    def convert(arrays: Arrays, hyper: Mapping[str, Any]) -> dict[str, np.ndarray]:
        return {slot: _f32(a) for slot, a in zip(slots, arrays, strict=True) if a is not None}

    return convert


def _f32(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, dtype=np.float32)


def _wd(opt: Mapping[str, Any]) -> float:
    return float(opt.get("wd", 0.0))


def _betas(opt: Mapping[str, Any]) -> tuple[float, float]:
    return (float(opt.get("beta1", 0.9)), float(opt.get("beta2", 0.999)))


def _no_decay(opt: Mapping[str, Any], name: str, where: str, source: str) -> None:
    if _wd(opt):
        raise ConfigError(
            f"{source}: MXNet {name} applies its weight decay (wd={_wd(opt)}) {where}; torch "
            "adds it to the gradient: not ported with weight decay."
        )


def _gradient_notes(opt: Mapping[str, Any], rule: Rule, source: str) -> list[str]:
    """What MXNet does to the gradient that is no part of a torch optimizer: say so, or
    refuse where the user's loop cannot do the same (clipping after weight decay)."""
    notes = []
    clip = opt.get("clip_gradient")
    if clip is not None and clip > 0:
        if rule.kind in _CLIP_AFTER_WD and _wd(opt):
            raise ConfigError(
                f"{source}: MXNet {rule.kind} clips the gradient (clip_gradient={clip}) after "
                "adding weight decay, which torch.nn.utils.clip_grad_value_ before the step "
                "cannot do: not ported."
            )
        notes.append(
            f"clip_gradient={clip} is no part of a torch optimizer: call "
            f"torch.nn.utils.clip_grad_value_(model.parameters(), {clip}) before each step"
        )
    rescale = float(opt.get("rescale_grad", 1.0))
    if rescale != 1.0:
        notes.append(
            f"the states are of gradients scaled by rescale_grad={rescale:g} "
            "(Trainer.step(batch_size)): the PyTorch loss must be the Gluon loss times that "
            "(its mean where Gluon's was summed over the batch)"
        )
    if any(v != 1.0 for d in ("lr_mult", "wd_mult") for v in (opt.get(d) or {}).values()):
        notes.append("per-parameter lr_mult/wd_mult are not ported")
    return notes


def learning_rate(
    opt: Mapping[str, Any],
    rule: Rule,
    recorded: dict[str, Any],
    settings: Mapping[str, Any],
    source: str,
) -> tuple[dict[str, Any] | None, list[str]]:
    """The schedule to go on with (None: a constant rate); puts the next step's lr into
    ``recorded`` where the file tells it."""
    scheduler, given = opt.get("lr_scheduler"), settings.get("scheduler")
    if given not in (None, CONSTANT):
        raise ConfigError(
            f"{source} records its learning rate{' and lr_scheduler' if scheduler else ''}: "
            "drop the scheduler setting."
        )
    if rule.kind == "adadelta":
        return None, []  # no learning rate at all
    if scheduler is None:
        recorded["lr"] = float(opt["lr"])
        return None, []
    cls = type(scheduler).__name__
    schedule = _schedule(cls, getattr(scheduler, "attrs", {}), int(opt.get("num_update", 0)))
    if schedule is None or given == CONSTANT:
        if given != CONSTANT or "lr" not in settings:
            raise ConfigError(
                f"{source} uses an lr_scheduler ({cls}){_UNPORTED if schedule is None else ''}: "
                "to go on at a constant rate, give --optimizer-setting scheduler=constant and "
                "lr=VALUE (the rate of the next step)."
            )
        return None, [f"lr_scheduler {cls}: continued at the constant lr (scheduler=constant)"]
    if rule.name == "momentum":
        raise ConfigError(
            f"{source}: MXNet's {rule.kind.upper()} keeps the learning rate inside its "
            f"momentum, torch's outside, and under a changing rate ({cls}) they part: not "
            "ported (to go on at a constant rate: --optimizer-setting scheduler=constant "
            "and lr=VALUE)."
        )
    recorded["lr"] = lr_at(schedule, schedule["last_epoch"])
    notes = [f"lr_scheduler {cls}: continued as {schedule['kind']}"]
    floor = getattr(scheduler, "attrs", {}).get("stop_factor_lr")
    if cls == "FactorScheduler" and floor:
        notes.append(f"MXNet stops the factor at stop_factor_lr={floor:g}; torch's StepLR does not")
    if schedule["kind"] == "cosine":
        notes.append(
            f"MXNet's cosine stays at final_lr after max_update={schedule['T_max']}; torch's "
            "CosineAnnealingLR rises again: stop stepping it there"
        )
    return schedule, notes


_UNPORTED = " that polytrain does not port (a warm-up, or no torch scheduler of its kind)"


def _schedule(cls: str, s: Mapping[str, Any], num_update: int) -> dict[str, Any] | None:
    """The canonical schedule of an MXNet scheduler without warm-up, at ``num_update``
    updates; None where there is none. MXNet evaluates its scheduler at the update's
    1-based count, torch's scheduler at the steps taken before it: StepLR's steps are
    MXNet's count - 1 (a factor changes once the count passes step), cosine's and
    polynomial's are the count itself."""
    if s.get("warmup_steps", 0):
        return None
    base = float(s.get("warmup_final_lr", s.get("base_lr", 0.0)))
    if cls == "FactorScheduler":
        return {"kind": "step", "base_lr": base, "step_size": int(s["step"]),
                "gamma": float(s["factor"]), "last_epoch": num_update}  # fmt: skip
    if cls == "MultiFactorScheduler":
        return {"kind": "multistep", "base_lr": base, "gamma": float(s["factor"]),
                "milestones": [int(m) for m in s["step"]], "last_epoch": num_update}  # fmt: skip
    final = float(s.get("final_lr", 0.0))
    if cls not in ("CosineScheduler", "PolyScheduler") or num_update + 1 > int(s["max_update"]):
        return None  # past max_update the rate stays at final_lr: scheduler=constant
    schedule = {"base_lr": float(s["base_lr_orig"]), "last_epoch": num_update + 1}
    if cls == "CosineScheduler":
        return {"kind": "cosine", "T_max": int(s["max_update"]), "eta_min": final, **schedule}
    if final != 0.0:
        return None  # torch's PolynomialLR decays to 0
    return {"kind": "polynomial", "total_iters": int(s["max_update"]),
            "power": float(s["power"]), **schedule}  # fmt: skip
