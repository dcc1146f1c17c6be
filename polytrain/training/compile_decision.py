"""The automatic compile mode: compile when the planned steps repay the compile, eager
otherwise (docs/performance.md, "Fast execution modes"). :func:`decide_compile` is pure and
deterministic: it reads no clock, only the run's plan and the backend's measured profile."""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any

from polytrain.backend.base import Backend
from polytrain.backend.compilation import Compilation
from polytrain.backend.identity import CompileProfile
from polytrain.backend.precision import param_dtype
from polytrain.neutral.models import ModelSpec, lenet
from polytrain.neutral.work import forward_multiply_adds, layer_count
from polytrain.training.recipe import Recipe


@dataclass(frozen=True)
class CompileChoice:
    """Compiled or eager, and why (printed in the run header)."""

    fast: bool
    reason: str
    fingerprint: str | None = None  # of the model, for the backend's warm-cache marker


@dataclass(frozen=True)
class RunPlan:
    """What the automatic mode needs to know about a run."""

    planned_steps: int  # optimizer steps of the whole run
    batch_per_process: int
    precision: str = "fp32"
    processes: int = 1
    inspect: bool = False  # --inspect compares layer outputs: eager
    pipeline: bool = False  # --pipeline-split: compiled stages not measured
    #: the model's forward multiply-adds per sample over LeNet's (the profile's model), or
    #: None where the spec's work is not modelled (polytrain.neutral.work)
    work: float | None = 1.0
    layers: float = 1.0  # the model's leaf layers over LeNet's: the compile grows with them


def model_fingerprint(spec: dict[str, Any], dtype: str, batch_shape: tuple[int, ...]) -> str:
    """A digest of what a compiled graph depends on (the backend adds its version)."""
    text = json.dumps([spec, dtype, list(batch_shape)], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def compile_seconds(profile: CompileProfile, warm: bool, layers: float = 1.0) -> float:
    """The one-off compile, LeNet's scaled by the model's layer count (never below it)."""
    return (profile.warm_s if warm else profile.cold_s) * max(layers, 1.0)


def break_even_steps(
    profile: CompileProfile, batch: int, warm: bool, work: float = 1.0, layers: float = 1.0
) -> int:
    """Steps after which the compile has paid for itself: the one-off seconds over the
    seconds each compiled step saves (eager step x (1 - 1/speedup), LeNet's eager step
    scaled by the model's ``work``); needs speedup > 1."""
    saved = profile.eager_sample_s * work * max(batch, 1) * (1.0 - 1.0 / profile.speedup)
    return math.ceil(compile_seconds(profile, warm, layers) / saved)


def decide_compile(
    requested: bool | None,
    *,
    fast_default: bool,
    profile: CompileProfile | None,
    plan: RunPlan,
    warm: bool,
) -> CompileChoice:
    """``requested``: --fast (True), --no-fast (False) or nothing (None: automatic)."""
    if requested is not None:
        return CompileChoice(requested, "--fast" if requested else "--no-fast")
    if fast_default:
        return CompileChoice(True, "the backend's default, nothing to repay")
    if profile is None:
        return CompileChoice(False, "no compiled mode that pays on this backend")
    if profile.speedup <= 1.0:
        return CompileChoice(
            False, f"{profile.tool} measured no faster than eager ({profile.speedup:.2f}x)"
        )
    if plan.precision == "fp64":
        return CompileChoice(False, "--precision fp64 keeps the frameworks' own kernels")
    if plan.processes > 1 and not profile.eager_compiles:
        return CompileChoice(False, f"{plan.processes} processes; --fast compiles in each")
    if plan.inspect:
        return CompileChoice(False, "--inspect compares eager layer outputs")
    if plan.pipeline:
        return CompileChoice(False, "--pipeline-split: compiled stages not measured")
    if not plan.work:
        if profile.eager_compiles:
            why = f"op by op compiles each op too, {profile.tool} the step at once"
            return CompileChoice(True, f"this model's step time is not modelled; {why}")
        return CompileChoice(False, "this model's step time is not modelled (sequence or "
                             "attention layers): --fast compiles it")  # fmt: skip
    need = break_even_steps(profile, plan.batch_per_process, warm, plan.work, plan.layers)
    seconds = compile_seconds(profile, warm, plan.layers)
    cached = profile.cold_s != profile.warm_s  # one cost: the tool keeps no cache to name
    cache = f" with a {'warm' if warm else 'cold'} cache" if cached else ""
    cost = f"to repay {profile.tool}{cache} (~{seconds:.{0 if seconds >= 1 else 1}f} s)"
    if plan.planned_steps >= need:
        return CompileChoice(True, f"{plan.planned_steps} planned steps >= {need} {cost}")
    return CompileChoice(False, f"{plan.planned_steps} planned steps < {need} {cost}")


def choose_compile(
    backend: Backend,
    requested: bool | None,
    plan: RunPlan,
    spec: dict[str, Any],
    dtype: str,
    batch_shape: tuple[int, ...],
) -> CompileChoice:
    """:func:`decide_compile` with the backend's profile and cache state for this model."""
    fingerprint = model_fingerprint(spec, dtype, batch_shape)
    compilation = Compilation.of(backend)
    if compilation is None:
        asked = "--fast asked, but " if requested else ""
        return CompileChoice(False, f"{asked}{backend.name} has no compiled mode", fingerprint)
    profile = compilation.compile_profile()
    warm = profile is not None and compilation.compile_cache_warm(fingerprint)
    choice = decide_compile(
        requested, fast_default=backend.fast_default, profile=profile, plan=plan, warm=warm
    )
    return CompileChoice(choice.fast, choice.reason, fingerprint)


def model_work(spec: ModelSpec) -> dict[str, Any]:
    """:class:`RunPlan`'s ``work`` and ``layers``: the model against LeNet, the model the
    backends' compile profiles were measured on."""
    macs, reference = forward_multiply_adds(spec), forward_multiply_adds(lenet())
    work = macs / reference if macs is not None and reference else None
    return {"work": work, "layers": layer_count(spec) / layer_count(lenet())}


def choose_for_run(
    backend: Backend,
    recipe: Recipe,
    spec: ModelSpec,
    steps_per_epoch: int,
    *,
    requested: bool | None,
    inspect: bool,
    auto: bool = True,
) -> CompileChoice:
    """A run's choice (--fast, --no-fast or automatic), applied to ``backend.options``;
    without ``auto`` (a backend object passed in) the backend keeps its own ``fast``."""
    if not auto:
        return CompileChoice(backend.fast, "set on the backend object")
    per_process = -(-recipe.batch_size // backend.world_size)
    plan = RunPlan(
        planned_steps=recipe.total_steps(steps_per_epoch),
        batch_per_process=per_process,
        precision=recipe.precision,
        processes=backend.world_size,
        inspect=inspect,
        pipeline=bool(recipe.pipeline_split),
        **model_work(spec),
    )
    shape = (per_process, *spec.input_shape)
    dtype = param_dtype(recipe.precision)
    choice = choose_compile(backend, requested, plan, spec.to_dict(), dtype, shape)
    backend.options.fast = choice.fast
    backend.options.compile_fingerprint = choice.fingerprint
    return choice
