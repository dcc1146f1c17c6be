"""The parity harness: one recipe on several backends, compared step by step.

Two checks:

* **free runs**: each backend trains the whole recipe in its own subprocess
  (``python -m polytrain train``: clean timing, no thread pools fighting), from the same
  numpy initial weights and the same sample order. Reported: per-step losses, gradient
  norms, epoch metrics, throughput, memory, and when the trajectories diverge. They do
  diverge: float32 rounding differs by ~1e-7 between frameworks' kernels and SGD
  amplifies it (see :mod:`polytrain.parity.lockstep`), so final metrics agree statistically.
* **lockstep** (:mod:`polytrain.parity.lockstep`): every step from the reference backend's exact
  state on every backend; the per-step loss difference must stay within ``step_loss`` and
  every parameter's gradient within ``grad`` (relative). This is the check that the math
  is the same.

With ``--precision fp64`` (the parity mode) the frameworks' rounding differences are
~1e-16 and free runs no longer diverge, so there the free runs themselves are held to
``step_loss`` over the first ``parity_steps`` steps, as the lockstep is.

The harness exits non-zero when a run fails, a lockstep step breaks ``step_loss`` or a
parameter's gradient breaks ``grad`` (the report names the parameter and the step), a free
run breaks it under fp64, or (when ``test_accuracy_points`` is set) the final test
accuracies of the free runs differ by more than that.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from polytrain.distributed.worker_log import die_with_parent
from polytrain.errors import ConfigError, OutputError, PolytrainError
from polytrain.io.run_dir import METRICS_FILE, lock_run_dir, run_contents, writable_dir
from polytrain.neutral.losses import parse_metric
from polytrain.neutral.models import ModelSpec
from polytrain.parity.lockstep import LockstepResult, lockstep
from polytrain.parity.results import BackendRun, Comparison, PairDiff, Tolerances
from polytrain.plugins.records import upgrade_epoch
from polytrain.training.builtin_plugins import read_metrics
from polytrain.training.native_model import needs_spec
from polytrain.training.recipe import Recipe
from polytrain.training.trainer import load_datasets
from polytrain.utils.fileio import atomic_write_bytes


def train_command(backend: str, recipe: Recipe, out_dir: Path, threads: int | None) -> list[str]:
    """The ``python -m polytrain train`` command line of one backend's run."""
    cmd = [sys.executable, "-m", "polytrain", "train", "--backend", backend, "--out", str(out_dir)]
    cmd.append("--overwrite")  # compare owns out/<backend>: each comparison replaces its runs
    defaults = Recipe()
    for key, value in recipe.to_dict().items():
        if value == getattr(defaults, key) or value is None:
            continue
        if key == "per_layer_weight_decay":
            cmd += ["--layer-weight-decay", ",".join(f"{k}={v}" for k, v in value.items())]
            continue
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            cmd.append(flag)
        else:
            cmd += [flag, str(value)]
    cmd.append("--grad-norm")
    if threads is not None:
        cmd += ["--threads", str(threads)]
    return cmd


def run_backend(
    backend: str, recipe: Recipe, out_dir: Path, *, threads: int | None = None, quiet: bool = False
) -> BackendRun:
    """Train ``recipe`` on ``backend`` in a subprocess; read its metrics."""
    out_dir.mkdir(parents=True, exist_ok=True)
    metrics = out_dir / METRICS_FILE
    if metrics.exists():
        metrics.unlink()
    cmd = train_command(backend, recipe, out_dir, threads)
    if quiet:
        cmd.append("--quiet")
    env = dict(os.environ)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL,
                            preexec_fn=_child_setup(os.getpid()))  # fmt: skip
    try:
        proc.wait()
    except BaseException:  # SIGTERM (the CLI raises it), Ctrl-C: the run saves and stops
        proc.send_signal(signal.SIGTERM)
        proc.wait()
        raise
    if not metrics.exists():
        raise PolytrainError(
            f"The {backend} run wrote no metrics (exit code {proc.returncode}); "
            f"run it alone to see why: {' '.join(cmd)}"
        )
    records = read_metrics(metrics)
    end = next((r for r in records if r["event"] == "end"), {})
    if end.get("stop_reason") == "failed: OSError":  # a full disk, a folder made read-only
        raise OutputError(
            f"The {backend} run could not write its files (its line above names the path "
            "and the fix); nothing was compared."
        )
    return parse_run(backend, records, proc.returncode)


def _child_setup(parent: int) -> Callable[[], None]:
    """What a backend's run does between fork and exec: a process group of its own (a
    terminal's Ctrl-C reaches compare, which passes it on once) and SIGTERM when compare
    dies, however it dies, so it saves and stops instead of running on."""

    def setup() -> None:
        os.setpgid(0, 0)
        die_with_parent(signal.SIGTERM)
        if os.getppid() != parent:  # compare died before the line above took effect
            os.kill(os.getpid(), signal.SIGTERM)

    return setup


def parse_run(backend: str, records: list[dict[str, Any]], returncode: int = 0) -> BackendRun:
    """A :class:`BackendRun` from the records of a metrics file."""
    start = next((r for r in records if r["event"] == "start"), None)
    end = next((r for r in records if r["event"] == "end"), {})
    if start is None:
        raise PolytrainError(f"The {backend} metrics file has no start record.")
    steps = [r for r in records if r["event"] == "step"]
    label = parse_metric((start.get("recipe") or {}).get("metric", "accuracy")).label
    return BackendRun(
        backend=backend,
        framework_version=start["framework_version"],
        devices=start["devices"],
        threads=start["threads"],
        step_losses=[s["loss"] for s in steps],
        grad_norms=[s.get("grad_norm") for s in steps],
        epochs=[upgrade_epoch(r, label) for r in records if r["event"] == "epoch"],
        seconds=float(end.get("seconds", 0.0)),
        peak_rss_mb=end.get("peak_rss_mb"),
        returncode=returncode,
        fast=start.get("fast"),
    )


def diff_pair(a: BackendRun, b: BackendRun, tol: Tolerances) -> PairDiff:
    n = min(len(a.step_losses), len(b.step_losses), tol.parity_steps)
    per_step = np.abs(np.subtract(a.step_losses[:n], b.step_losses[:n])).tolist() if n else []
    worst = int(np.argmax(per_step)) if per_step else -1
    m = min(len(a.step_losses), len(b.step_losses))
    everywhere = np.abs(np.subtract(a.step_losses[:m], b.step_losses[:m]))
    over = np.nonzero(everywhere > tol.diverged_at)[0]
    acc = None
    if a.final.get("test_metric") is not None and b.final.get("test_metric") is not None:
        acc = 100 * abs(a.final["test_metric"] - b.final["test_metric"])
    loss = None
    if a.final and b.final:
        loss = abs(a.final["train_loss"] - b.final["train_loss"])
    return PairDiff(
        a=a.backend,
        b=b.backend,
        max_step_loss_diff=max(per_step) if per_step else 0.0,
        max_step_loss_diff_at=worst + 1,
        steps_compared=n,
        test_accuracy_diff_points=acc,
        final_train_loss_diff=loss,
        diverged_at_step=int(over[0]) + 1 if len(over) else None,
        per_step=per_step,
    )


def compare_runs(
    runs: list[BackendRun],
    recipe: Recipe,
    tol: Tolerances,
    reference: str | None = None,
    lockstep_result: LockstepResult | None = None,
) -> Comparison:
    """Every pair's differences, and which tolerances they break."""
    reference = reference or runs[0].backend
    pairs = [diff_pair(a, b, tol) for a, b in itertools.combinations(runs, 2)]
    failures = []
    for run in runs:
        if run.returncode != 0:
            failures.append(f"{run.backend} exited with code {run.returncode}")
    if lockstep_result is not None:
        for name in lockstep_result.loss_diff:
            worst = lockstep_result.worst(name)["loss"]
            if worst > tol.step_loss:
                diffs = lockstep_result.loss_diff[name]
                failures.append(
                    f"lockstep {name} vs {lockstep_result.reference}: the loss of one step from "
                    f"the same state differs by {worst:.2e} at step {int(np.argmax(diffs)) + 1} "
                    f"(tolerance {tol.step_loss:.0e})"
                )
        grad_tol = tol.grad_for(recipe.precision)
        for name in lockstep_result.grad_diff:
            if not lockstep_result.grad_diff[name]:
                continue
            step, param, diff = lockstep_result.worst_grad_step(name)
            if not diff <= grad_tol:  # NaN fails too
                failures.append(
                    f"lockstep {name} vs {lockstep_result.reference}: the gradient of {param} "
                    f"differs by {diff:.2e} at step {step} (relative, L2; "
                    f"tolerance {grad_tol:.0e}, --tol-grad)"
                )
    for p in pairs:
        if recipe.precision == "fp64" and p.max_step_loss_diff > tol.step_loss:
            failures.append(
                f"free runs {p.a} vs {p.b} (fp64): the loss differs by "
                f"{p.max_step_loss_diff:.2e} at step {p.max_step_loss_diff_at} "
                f"(tolerance {tol.step_loss:.0e} over the first {tol.parity_steps} steps)"
            )
        acc = p.test_accuracy_diff_points
        limit = tol.test_accuracy_points
        if acc is not None and limit is not None and acc > limit + 1e-9:
            failures.append(
                f"{p.a} vs {p.b}: final test accuracy differs by {acc:.2f} points "
                f"(tolerance {limit})"
            )
    return Comparison(recipe.to_dict(), tol, reference, runs, pairs, failures, lockstep_result)


def compare(
    backends: list[str],
    recipe: Recipe,
    out_dir: str | Path,
    *,
    tolerances: Tolerances | None = None,
    threads: int | None = None,
    reference: str | None = None,
    quiet: bool = False,
    lockstep_steps: int = 200,
) -> Comparison:
    """Run ``recipe`` on each backend (one subprocess each, one after another), then
    ``lockstep_steps`` lockstep steps, and compare; writes ``comparison.json``,
    ``comparison.png`` and ``comparison.html`` into ``out_dir``."""
    if len(backends) < 1:
        raise ConfigError("Name at least one backend to compare, e.g. --backends torch,paddle.")
    if len(set(backends)) != len(backends):
        raise ConfigError(f"A backend is listed twice: {', '.join(backends)}.")
    if reference is not None and reference not in backends:
        raise ConfigError(f"--reference {reference!r} is not among --backends {backends}.")
    needs_spec(recipe, "polytrain compare")
    reference = reference or backends[0]
    backends = [reference] + [b for b in backends if b != reference]
    tol = tolerances or Tolerances()
    out = writable_dir(out_dir, "--out")
    if run_contents(out):
        raise ConfigError(
            f"--out {out} holds a training run ({', '.join(run_contents(out))}); compare "
            "writes one run per backend into its own folder: choose another --out."
        )
    held = lock_run_dir(out)
    try:
        return _compare(backends, recipe, out, tol, threads, reference, quiet, lockstep_steps)
    finally:
        held.release()


def _compare(
    backends: list[str],
    recipe: Recipe,
    out: Path,
    tol: Tolerances,
    threads: int | None,
    reference: str,
    quiet: bool,
    lockstep_steps: int,
) -> Comparison:
    from polytrain.parity.html_report import write_html
    from polytrain.parity.report import write_json, write_plot

    if isinstance(recipe.model, ModelSpec):  # each run is a process: it reads the spec file
        spec_file = out / "model.json"
        atomic_write_bytes(spec_file, json.dumps(recipe.model.to_dict(), indent=2).encode())
        recipe = replace(recipe, model=str(spec_file))
    runs = []
    for name in backends:
        if not quiet:
            print(f"== {name}: free run ==", file=sys.stderr, flush=True)
        runs.append(run_backend(name, recipe, out / name, threads=threads, quiet=quiet))
    locked = None
    steps, why = lockstep_length(runs, lockstep_steps)
    if steps and len(backends) > 1:
        if not quiet:
            print(f"== lockstep: {steps} steps from {reference}'s state on every backend "
                  f"({why}) ==", file=sys.stderr, flush=True)  # fmt: skip
        train = load_datasets(recipe).train
        progress = None if quiet else ProgressLine("lockstep", steps)
        modes = {run.backend: run.fast for run in runs}  # each free run's path, checked
        locked = lockstep(backends, recipe, steps, train=train, threads=threads,
                          progress=progress, modes=modes)  # fmt: skip
    result = compare_runs(runs, recipe, tol, reference, locked)
    write_json(result, out / "comparison.json")
    write_plot(result, out / "comparison.png")
    write_html(result, out / "comparison.html", out / "comparison.png")
    return result


def lockstep_length(runs: list[BackendRun], limit: int) -> tuple[int, str]:
    """The lockstep's number of steps, and why: at most the steps the free runs took
    (their longest), and at most ``limit`` (--parity-steps)."""
    took = max((len(run.step_losses) for run in runs), default=0)
    if took < limit:
        return took, f"the free runs took {took} steps; --parity-steps {limit}"
    return limit, f"--parity-steps {limit}; the free runs took {took}"


class ProgressLine:
    """``lockstep: step 40/200 (12 s)`` on stderr, at most every ``every`` seconds and at
    the end: long work shows that it moves."""

    def __init__(self, what: str, total: int, every: float = 10.0) -> None:
        self.what, self.total, self.every = what, total, every
        self.start = self.last = time.monotonic()

    def __call__(self, done: int) -> None:
        now = time.monotonic()
        if done < self.total and now - self.last < self.every:
            return
        self.last = now
        print(f"   {self.what}: step {done}/{self.total} ({now - self.start:.0f} s)",
              file=sys.stderr, flush=True)  # fmt: skip
