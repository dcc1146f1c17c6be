"""Paddle's LR schedulers in the canonical form of :mod:`polytrain.backend.lr_schedule`.

A ``.pdopt`` keeps only ``last_epoch`` and ``last_lr`` of its scheduler: the kind and
settings come from the user, as the run's script built it (the constructor call, parsed,
never run), and are checked against ``last_lr``.
"""

from __future__ import annotations

import ast
import itertools
import math
from collections.abc import Mapping
from typing import Any

from polytrain.backend.lr_schedule import CONSTANT, lr_at
from polytrain.errors import ConfigError

# Paddle's class -> (kind, its positional parameters in order, its defaults)
PADDLE: dict[str, tuple[str, tuple[str, ...], dict[str, Any]]] = {
    "StepDecay": ("step", ("learning_rate", "step_size", "gamma"), {"gamma": 0.1}),
    "MultiStepDecay": ("multistep", ("learning_rate", "milestones", "gamma"), {"gamma": 0.1}),
    "ExponentialDecay": ("exponential", ("learning_rate", "gamma"), {}),
    "CosineAnnealingDecay": ("cosine", ("learning_rate", "T_max", "eta_min"), {"eta_min": 0.0}),
    "PolynomialDecay": (
        "polynomial",
        ("learning_rate", "decay_steps", "end_lr", "power", "cycle"),
        {"end_lr": 0.0001, "power": 1.0, "cycle": False},
    ),
    "PiecewiseDecay": ("piecewise", ("boundaries", "values"), {}),
    "LinearWarmup": (
        "warmup",
        ("learning_rate", "warmup_steps", "start_lr", "end_lr"),
        {},
    ),
}
_IGNORED = ("last_epoch", "verbose")


def paddle_schedule(spec: str, state: Mapping[str, Any], source: str) -> dict[str, Any] | None:
    """The schedule of the run from the user's ``spec`` (the Paddle constructor call, e.g.
    ``CosineAnnealingDecay(learning_rate=0.1, T_max=20)``), at the ``.pdopt``'s
    ``LR_Scheduler`` ``state``; None for ``constant``. A spec that does not give the
    file's ``last_lr`` at its ``last_epoch`` is refused."""
    if spec.strip().lower() == CONSTANT:
        return None
    epoch, last_lr = _epoch_and_lr(state, source)
    schedule = _from_call(_parse_call(spec), source)
    if schedule["kind"] == "warmup":
        schedule = _after_warmup(schedule, epoch, source)
        epoch -= schedule.pop("warmup_steps")
    schedule["last_epoch"] = epoch  # of the schedule torch goes on with
    expected = lr_at(schedule, epoch)
    if not math.isclose(expected, last_lr, rel_tol=1e-5, abs_tol=1e-12):
        raise ConfigError(
            f"{source}: the scheduler {spec.strip()!r} gives lr {expected:.6g} after "
            f"{state.get('last_epoch')} steps, the file's LR_Scheduler {last_lr:.6g}: give the "
            "scheduler exactly as the run's script built it."
        )
    return schedule


def _epoch_and_lr(state: Mapping[str, Any], source: str) -> tuple[int, float]:
    try:
        epoch, last_lr = int(state["last_epoch"]), float(state["last_lr"])
    except (KeyError, TypeError, ValueError):
        raise ConfigError(f"{source}: LR_Scheduler has no last_epoch and last_lr.") from None
    if epoch < 0:
        raise ConfigError(f"{source}: the scheduler took no step (last_epoch {epoch}).")
    return epoch, last_lr


def _parse_call(spec: str) -> tuple[str, dict[str, Any]]:
    """(class name, arguments) of ``Name(...)`` / ``paddle.optimizer.lr.Name(...)`` with
    literal arguments (a nested call for LinearWarmup's learning_rate); nothing runs."""
    try:
        node = ast.parse(spec.strip(), mode="eval").body
    except SyntaxError:
        node = None
    if not isinstance(node, ast.Call):
        raise ConfigError(_usage(f"{spec!r} is not a scheduler call"))
    name = node.func.attr if isinstance(node.func, ast.Attribute) else None
    name = node.func.id if isinstance(node.func, ast.Name) else name
    if name not in PADDLE:
        raise ConfigError(_usage(f"{name or spec!r} is not a scheduler polytrain ports"))
    params = PADDLE[name][1]
    if len(node.args) > len(params):
        raise ConfigError(_usage(f"{name} takes at most {len(params)} positional arguments"))
    args = dict(zip(params, node.args, strict=False))
    args.update({k.arg: k.value for k in node.keywords if k.arg})
    return name, {k: _literal(k, v) for k, v in args.items() if k not in _IGNORED}


def _literal(key: str, node: ast.expr) -> Any:
    if isinstance(node, ast.Call):
        return _parse_call(ast.unparse(node))
    try:
        return ast.literal_eval(node)
    except ValueError:
        raise ConfigError(_usage(f"{key}={ast.unparse(node)} is not a literal")) from None


def _usage(why: str) -> str:
    return (
        f"Scheduler setting: {why}; give the Paddle scheduler as the run's script built it, "
        "e.g. scheduler='CosineAnnealingDecay(learning_rate=0.1, T_max=20)' (one of "
        f"{', '.join(PADDLE)}), or scheduler=constant."
    )


def _from_call(call: tuple[str, dict[str, Any]], source: str) -> dict[str, Any]:
    """A schedule from a parsed Paddle constructor call (settings in torch's names)."""
    name, given = call
    kind, params, defaults = PADDLE[name]
    args = {**defaults, **given}
    unknown = set(args) - set(params)
    missing = [p for p in params if p not in args]
    if unknown or missing:
        raise ConfigError(_usage(f"{name} takes {', '.join(params)}"))
    if kind == "warmup":
        inner = args["learning_rate"]
        return {"kind": "warmup", "inner": _from_call(inner, source)
                if isinstance(inner, tuple) else None, **args}  # fmt: skip
    if kind == "piecewise":
        return _piecewise(args["boundaries"], args["values"], source)
    out: dict[str, Any] = {"kind": kind, "base_lr": float(args["learning_rate"])}
    if kind == "polynomial":
        if args["end_lr"] != 0 or args["cycle"]:
            raise ConfigError(
                f"{source}: PolynomialDecay with end_lr={args['end_lr']} or cycle=True has no "
                "torch.optim.lr_scheduler (PolynomialLR decays to 0 once): not ported; "
                "scheduler=constant goes on at the file's last rate."
            )
        return {**out, "total_iters": int(args["decay_steps"]), "power": float(args["power"])}
    out.update({k: float(v) for k, v in args.items() if k in ("gamma", "eta_min")})
    if kind == "step":
        out["step_size"] = int(args["step_size"])
    if kind == "cosine":
        out["T_max"] = int(args["T_max"])
    if kind == "multistep":
        out["milestones"] = [int(m) for m in args["milestones"]]
    return out


def _piecewise(boundaries: Any, values: Any, source: str) -> dict[str, Any]:
    """PiecewiseDecay as MultiStepLR, where its values fall by one factor at each boundary."""
    values = [float(v) for v in values]
    if len(values) != len(boundaries) + 1 or values[0] <= 0:
        raise ConfigError(f"{source}: PiecewiseDecay needs one value more than boundaries.")
    ratios = [b / a for a, b in itertools.pairwise(values)] or [1.0]
    if not all(math.isclose(r, ratios[0], rel_tol=1e-9) for r in ratios):
        raise ConfigError(
            f"{source}: PiecewiseDecay values {values} do not fall by one factor, which "
            "torch's MultiStepLR needs: not ported; scheduler=constant goes on at the "
            "file's last rate."
        )
    return {"kind": "multistep", "base_lr": values[0], "gamma": ratios[0],
            "milestones": [int(b) for b in boundaries]}  # fmt: skip


def _after_warmup(warmup: dict[str, Any], epoch: int, source: str) -> dict[str, Any]:
    """The schedule after a LinearWarmup that has ended (the inner one, counted from
    the warm-up's end); a warm-up still under way is refused."""
    steps = int(warmup["warmup_steps"])
    inner = warmup["inner"]
    if epoch < steps:
        raise ConfigError(
            f"{source}: the LinearWarmup is under way (step {epoch} of {steps}), which "
            "torch's LinearLR cannot continue exactly: convert after the warm-up, or "
            "scheduler=constant to go on at the file's last rate."
        )
    if inner is None:  # a constant rate after the warm-up
        inner = {"kind": "exponential", "base_lr": float(warmup["learning_rate"]), "gamma": 1.0}
    return {**inner, "warmup_steps": steps}
