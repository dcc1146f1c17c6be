"""The parts of ``scripts/gpu-check`` (:mod:`benchmarks.gpu_check`), each run in its own
process: ``run_part(number, config)`` prints one result line that the driver reads.

Tolerances (float32 on two devices is not bit-equal: other kernels, other summation
orders; the CPU and GPU differ by ~1e-6 relative per step, and SGD amplifies it):

- lockstep GPU vs CPU (each step from the CPU's state): loss 1e-4, gradients 1e-3
  (relative, per parameter, :func:`polytrain.parity.lockstep.grad_differences`), updated
  parameters 1e-4;
- checkpoint GPU -> CPU -> GPU: the first loss after each move 1e-4 (same state, other
  device), every loss 1e-3 of the uninterrupted GPU run;
- two replicas or two processes against one, and torch.compile against eager: these are
  free runs, which float32 cannot hold together (on an H100, with cuDNN's TF32
  convolutions, two replicas parted from one by 4e-2 in the loss within 20 steps, and
  compiled from eager by 0.6 within 100), so the check runs them in float64: parameters
  (replicas, processes) and every loss (compile) within 1e-8; the float32 runs are
  reported with the step at which they part by more than 1e-4;
- training sanity: test accuracy >= 0.6 after a few hundred steps (chance is 0.1).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from polytrain import get_backend, hookimpl
from polytrain.data import ArrayDataset, load_dataset
from polytrain.plugins.records import RunInfo, StepRecord
from polytrain.training.health import DEFAULT_MAX_SKIPPED
from polytrain.training.recipe import Recipe
from polytrain.training.trainer import Datasets, Trainer

from .gpu_check import RESULT_MARK, ROOT, PartResult

ACCURACY_FLOOR = 0.6
# the figures of docs/performance.md's GPU check were taken with SGD momentum 0.9, lr 0.05
# (the default recipe before Adam): pinned, not the Recipe's default
MOMENTUM: dict[str, Any] = {"optimizer": "momentum", "lr": 0.05, "momentum": 0.9}
Figures = dict[str, Any]


class Config:
    """The driver's settings, with the sizes a ``quick`` (dry) run shrinks."""

    def __init__(self, raw: dict[str, Any]) -> None:
        self.device: str = raw["device"]
        self.data_dir: str | None = raw.get("data_dir")
        self.quick: bool = bool(raw.get("quick"))
        self.work_dir = Path(raw["work_dir"])
        self.peak: float | None = raw.get("peak_bf16_tflops")

    def steps(self, full: int, quick: int = 3) -> int:
        return quick if self.quick else full

    def native_device(self) -> str:
        """The torch name of the device under test (``gpu:0`` is ``cuda:0``)."""
        return "cuda:" + self.device.split(":")[1] if self.device.startswith("gpu") else "cpu"


def run_part(number: int, raw: dict[str, Any]) -> int:
    fn, name = PART_FUNCTIONS[number]
    start = time.monotonic()
    try:
        status, summary, figures = fn(Config(raw))
        result = PartResult(number, name, status, summary, figures=figures)
    except Exception as exc:
        line = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
        result = PartResult(number, name, "fail", line, detail=traceback.format_exc()[-3000:])
    result.seconds = time.monotonic() - start
    print(RESULT_MARK + json.dumps(asdict(result), default=float), flush=True)
    return 0


# -- shared pieces ----------------------------------------------------------------------------


def datasets(cfg: Config, train: int, test: int) -> Datasets:
    """The first ``train`` / ``test`` Fashion-MNIST samples from ``--data-dir``."""
    tr = load_dataset("fashion-mnist", "train", data_dir=cfg.data_dir)
    te = load_dataset("fashion-mnist", "test", data_dir=cfg.data_dir)
    return Datasets(tr.subset(min(train, len(tr))), te.subset(min(test, len(te))))


class StepLosses:
    """A training-event plugin keeping every step's loss (and fp16's extra)."""

    def __init__(self) -> None:
        self.losses: list[float] = []
        self.skipped = 0
        self.loss_scale: float | None = None

    @hookimpl
    def polytrain_step_end(self, run: RunInfo, step: StepRecord) -> None:
        self.losses.append(step.loss)
        self.skipped += bool(step.extra.get("skipped"))
        self.loss_scale = step.extra.get("loss_scale", self.loss_scale)


def train(
    recipe: Recipe, data: Datasets, *, fast: bool | None = None, **kwargs: Any
) -> tuple[Trainer, StepLosses, Any]:
    """Train ``recipe`` in this process; returns the trainer, its losses and the summary."""
    losses = StepLosses()
    backend = get_backend("torch", fast=fast)
    trainer = Trainer(recipe, backend, plugins=[losses], progress=False, datasets=data, **kwargs)
    summary = trainer.fit()
    return trainer, losses, summary


def worst(a: list[float] | np.ndarray, b: list[float] | np.ndarray) -> float:
    """The largest absolute difference of two equally long sequences."""
    if len(a) != len(b):
        raise ValueError(f"{len(a)} values against {len(b)}")
    return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))


def parted_at(a: list[float], b: list[float], tol: float = 1e-4) -> int | None:
    """The first step (1-based) at which two loss curves differ by more than ``tol``."""
    over = np.flatnonzero(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)) > tol)
    return int(over[0]) + 1 if over.size else None


FREE_RUN_TOL = 1e-8  # float64 free runs (replicas, processes, compile)


def param_diff(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    return max(float(np.max(np.abs(a[k] - b[k]))) for k in a)


def verdict(problems: list[str], summary: str, figures: Figures) -> tuple[str, str, Figures]:
    return ("fail", "; ".join(problems), figures) if problems else ("pass", summary, figures)


# -- 1: the conformance suite ----------------------------------------------------------------


def conformance(cfg: Config) -> tuple[str, str, Figures]:
    """The shipped suite (tests/backends/test_conformance.py, TestConformance) for torch on the
    device: ``POLYTRAIN_TEST_DEVICE`` moves its models and tensors there."""
    import importlib.metadata
    import os
    import xml.etree.ElementTree as ET

    report = cfg.work_dir / "conformance.xml"
    cmd = [sys.executable, "-m", "pytest", "tests/backends/test_conformance.py", "-q", "-k",
           "TestConformance", f"--junitxml={report}", "-o", "junit_family=xunit2"]  # fmt: skip
    if not any(ep.name == "polytrain" for ep in importlib.metadata.entry_points(group="pytest11")):
        cmd[3:3] = ["-p", "polytrain.testing.conformance"]  # not installed: load it by name
    if cfg.quick:
        cmd += ["-x", "--maxfail=1", "-k", "TestConformance and (allreduce or gradients_match)"]
    env = {**os.environ, "POLYTRAIN_TEST_BACKENDS": "torch", "POLYTRAIN_TEST_DEVICE": cfg.device}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    if not report.is_file():
        raise RuntimeError(f"pytest wrote no report (exit {proc.returncode}): {proc.stdout[-500:]}")
    suite = ET.parse(report).getroot()
    suite = suite if suite.tag == "testsuite" else suite[0]
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    failed = [
        f"{case.get('name')}: {(case[0].get('message') or '').splitlines()[0][:160]}"
        for case in suite.iter("testcase")
        if len(case) and case[0].tag in ("failure", "error")
    ]
    figures = {**counts, "failed": failed[:20], "device": cfg.device}
    passed = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    summary = f"{passed} passed, {counts['skipped']} skipped on {cfg.device}"
    problems = [f"{len(failed)} failed (first: {failed[0]})"] if failed else []
    if counts["tests"] == 0:
        problems.append("no test ran")
    return verdict(problems, summary, figures)


# -- 2: training with an accuracy sanity check ----------------------------------------------


def training(cfg: Config) -> tuple[str, str, Figures]:
    """LeNet (one epoch, batch 256) and ResNet-18 (200 steps of 128) in fp32, bf16, fp16."""
    data = datasets(cfg, 60000, cfg.steps(2000, 64))
    figures: Figures = {}
    problems = []
    plans = {"lenet": (256, cfg.steps(234)), "resnet18": (128, cfg.steps(200, 2))}
    for model, (batch, steps) in plans.items():
        for precision in ("fp32", "bf16", "fp16"):
            recipe = Recipe(model=model, epochs=1, batch_size=8 if cfg.quick else batch,
                            max_steps=steps, devices=cfg.device, precision=precision,
                            **MOMENTUM)  # fmt: skip
            # a dry run's couple of fp16 steps may all overflow (the scale starts at 2^16)
            _, losses, summary = train(
                recipe, data, max_skipped=1.0 if cfg.quick else DEFAULT_MAX_SKIPPED
            )
            final = summary.final
            key = f"{model}/{precision}"
            figures[key] = {
                "steps": len(losses.losses),
                "train_loss": final.train_loss,
                "test_accuracy": final.test_metric,  # an accuracy: the recipe's metric
                "samples_per_second": final.samples_per_second,
                "skipped_steps": losses.skipped,
                "loss_scale": losses.loss_scale,
            }
            if not np.isfinite(final.train_loss):
                problems.append(f"{key}: loss {final.train_loss}")
            elif not cfg.quick and (final.test_metric or 0) < ACCURACY_FLOOR:
                problems.append(f"{key}: test accuracy {final.test_metric:.3f} < {ACCURACY_FLOOR}")
    accs = ", ".join(f"{k} {v['test_accuracy']:.3f}" for k, v in figures.items())
    return verdict(problems, f"test accuracy {accs}", figures)


# -- 3: lockstep GPU against CPU ---------------------------------------------------------------


def lockstep_part(cfg: Config) -> tuple[str, str, Figures]:
    """Every step both devices start from the CPU's state (parameters and momentum)
    and take it on the same batch; their losses, gradients and updates are compared."""
    from polytrain.data import BatchLoader
    from polytrain.neutral.models import get_model_spec
    from polytrain.parity.lockstep import _Runner, grad_differences

    steps = cfg.steps(50)
    recipe = Recipe(model="lenet", batch_size=64, devices="cpu", **MOMENTUM)
    data = datasets(cfg, steps * 64, 64).train
    cpu = _Runner(get_backend("torch"), recipe)
    dev = _Runner(get_backend("torch"), replace(recipe, devices=cfg.device))
    params = get_model_spec("lenet").init_params(recipe.seed)
    state = None
    diffs: dict[str, list[float]] = {"loss": [], "grad": [], "params": []}
    loader = BatchLoader(data, recipe.batch_size, seed=recipe.seed)
    for x, y in list(loader.epoch(0))[:steps]:
        ref = cpu.step_from(params, state, x, y, recipe.lr)
        got = dev.step_from(params, state, x, y, recipe.lr)
        diffs["loss"].append(abs(got.loss - ref.loss))
        diffs["grad"].append(max(grad_differences(got.grads, ref.grads).values()))
        diffs["params"].append(param_diff(got.params, ref.params))
        params, state = ref.params, ref.optimizer_state
    top = {k: max(v) for k, v in diffs.items()}
    limits = {"loss": 1e-4, "grad": 1e-3, "params": 1e-4}
    problems = [
        f"worst {k} difference {top[k]:.2e} > {limits[k]:g}" for k in top if top[k] > limits[k]
    ]
    summary = f"{steps} steps, worst loss {top['loss']:.1e}, grad {top['grad']:.1e}, "
    summary += f"params {top['params']:.1e}"
    return verdict(problems, summary, {"steps": steps, "worst": top, "limits": limits})


# -- 4: checkpoint on the GPU, resumed on the CPU and back ------------------------------------


def checkpoint_part(cfg: Config) -> tuple[str, str, Figures]:
    steps = cfg.steps(10)
    data = datasets(cfg, 10 * 256, 256)
    base = Recipe(model="lenet", max_steps=steps, devices=cfg.device, **{**MOMENTUM, "lr": 0.02})
    _, straight, _ = train(replace(base, epochs=3), data)
    run = cfg.work_dir / "checkpoint-run"
    _, first, _ = train(replace(base, epochs=1), data, out_dir=run, overwrite=True)
    _, on_cpu, _ = train(replace(base, epochs=2, devices="cpu"), data, out_dir=run, resume=run)
    _, back, _ = train(replace(base, epochs=3), data, out_dir=run, resume=run)
    moved = first.losses + on_cpu.losses + back.losses
    every = worst(moved, straight.losses)
    at_move = max(abs(moved[i] - straight.losses[i]) for i in (steps, 2 * steps))
    problems = []
    if at_move > 1e-4:
        problems.append(f"first loss after a device change differs by {at_move:.2e} > 1e-4")
    if every > 1e-3:
        problems.append(f"a loss differs by {every:.2e} > 1e-3 from the uninterrupted run")
    figures = {"steps_per_leg": steps, "first_after_move": at_move, "worst": every}
    return verdict(
        problems, f"3 x {steps} steps, at the moves {at_move:.1e}, worst {every:.1e}", figures
    )


# -- 5: two replicas on one GPU ----------------------------------------------------------------


def replicas(cfg: Config) -> tuple[str, str, Figures]:
    steps = cfg.steps(20)
    data = datasets(cfg, steps * 256, 256)
    kind, _, index = cfg.device.partition(":")
    two = f"{kind}:{index},{index}" if kind == "gpu" else "cpu:2"
    figures: Figures = {}
    for precision in ("fp32", "fp64"):
        base = Recipe(model="lenet", epochs=1, max_steps=steps, devices=cfg.device,
                      precision=precision, **MOMENTUM)  # fmt: skip
        one_run, one, _ = train(base, data)
        two_run, both, _ = train(replace(base, devices=two), data)
        diff = param_diff(
            one_run.backend.get_params(one_run.model), two_run.backend.get_params(two_run.model)
        )
        names = [two_run.backend.device_name(d) for d in two_run.devices]
        figures[precision] = {
            "param_diff": diff,
            "loss_diff": worst(one.losses, both.losses),
            "parted_at_step": parted_at(one.losses, both.losses),
        }
    figures["devices"] = names
    diff = figures["fp64"]["param_diff"]
    problems = (
        [f"fp64 parameters differ by {diff:.2e} > {FREE_RUN_TOL}"] if diff > FREE_RUN_TOL else []
    )
    if len(names) != 2:
        problems.append(f"--devices {two} gave {names}")
    fp32 = figures["fp32"]
    return verdict(
        problems,
        f"--devices {two} ({names}) vs one: fp64 params {diff:.1e}; fp32 params "
        f"{fp32['param_diff']:.1e}, parted at step {fp32['parted_at_step']}",
        figures,
    )


# -- 6: two processes on one GPU ----------------------------------------------------------------

#: Two processes share GPU 0 only when it is named: in a multi-process run ``gpu`` means
#: each process's own GPU by local rank, and rank 1 has none on a one-GPU machine.
SHARED_GPU = "gpu:0"


def processes(cfg: Config) -> tuple[str, str, Figures]:
    from polytrain.io.checkpoint import load_checkpoint

    steps = cfg.steps(20)
    devices = SHARED_GPU if cfg.device.startswith("gpu") else "cpu"
    runs = {n: cfg.work_dir / f"processes-{n}" for n in (1, 2)}
    train_cmd = ["polytrain", "train", "--backend", "torch", "--devices", devices, "--epochs", "1",
                 "--max-steps", str(steps), "--train-samples", str(steps * 256),
                 "--test-samples", "256", "--precision", "fp64", "--quiet",
                 "--overwrite"]  # fmt: skip
    if cfg.data_dir:
        train_cmd += ["--data-dir", cfg.data_dir]
    launch = [sys.executable, "-m", "polytrain", "launch", "--backend", "torch",
              "--nproc-per-node", "2", "--master", f"127.0.0.1:{free_port()}",
              "--log-dir", str(cfg.work_dir / "processes-logs"), "--"]  # fmt: skip
    commands = {
        1: [sys.executable, "-m", "polytrain", *train_cmd[1:], "--out", str(runs[1])],
        2: [*launch, *train_cmd, "--out", str(runs[2])],
    }
    for n, cmd in commands.items():
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            logs = sorted((cfg.work_dir / "processes-logs").glob("workerlog.*")) if n == 2 else []
            worker = logs[-1].read_text(errors="replace")[-1500:] if logs else ""
            raise RuntimeError(
                f"{n} process(es) exited with {proc.returncode}: "
                f"{(proc.stderr or proc.stdout).strip()[-800:]} {worker}"
            )
    params = {n: load_checkpoint(runs[n]).params for n in runs}
    diff = param_diff(params[1], params[2])
    figures = {"devices": devices, "steps": steps, "precision": "fp64", "param_diff": diff}
    problems = (
        [f"2 processes differ from 1 by {diff:.2e} > {FREE_RUN_TOL}"] if diff > FREE_RUN_TOL else []
    )
    return verdict(problems, f"2 processes on {devices} vs 1: fp64 params {diff:.1e}", figures)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- 7: torch.compile ---------------------------------------------------------------------------


def compile_part(cfg: Config) -> tuple[str, str, Figures]:
    steps = cfg.steps(100)
    data = datasets(cfg, steps * 256, 256)
    figures: Figures = {"steps": steps}
    for precision in ("fp32", "fp64"):
        recipe = Recipe(model="lenet", epochs=1, max_steps=steps, devices=cfg.device,
                        precision=precision, **MOMENTUM)  # fmt: skip
        _, eager, eager_summary = train(recipe, data, fast=False)
        start = time.perf_counter()
        _, compiled, summary = train(recipe, data, fast=True)
        figures[precision] = {
            "loss_diff": worst(eager.losses, compiled.losses),
            "parted_at_step": parted_at(eager.losses, compiled.losses),
            "seconds_with_compile": time.perf_counter() - start,
            "eager_samples_per_second": eager_summary.final.samples_per_second,
            "compiled_samples_per_second": summary.final.samples_per_second,
        }
    diff = figures["fp64"]["loss_diff"]
    problems = (
        [f"fp64 compiled losses differ by {diff:.2e} > {FREE_RUN_TOL}"]
        if diff > FREE_RUN_TOL
        else []
    )
    fp32 = figures["fp32"]
    return verdict(
        problems,
        f"{steps} steps, fp64 losses within {diff:.1e}; fp32 parted at step "
        f"{fp32['parted_at_step']}, {fp32['seconds_with_compile']:.0f} s with compiling",
        figures,
    )


# -- 8: polytrain against the hand-written loop ------------------------------------------------

RATIO_TARGET = 0.97  # polytrain/native for ResNet-18 in bf16 (issue 14)


def benchmark(cfg: Config) -> tuple[str, str, Figures]:
    from . import native_torch_gpu
    from .common import Workload

    plans = {"lenet": cfg.steps(100), "resnet18": cfg.steps(50, 1)}
    train_set = datasets(cfg, 60000, 1).train
    figures: Figures = {}
    for model, steps in plans.items():
        flops = native_torch_gpu.train_flops_per_sample(model, cfg.native_device())
        for precision in ("fp32", "bf16"):
            work = Workload(steps=steps, warmup=cfg.steps(10, 1), precision=precision,
                            batch_size=4 if cfg.quick else 256, fast=False)  # fmt: skip
            x, y = train_set.x[: work.train_samples], train_set.y[: work.train_samples]
            entry = compare_loops(cfg, work, model, x, y)
            entry["train_gflop_per_sample"] = flops / 1e9
            entry["tflops"] = entry["polytrain_samples_per_second"] * flops / 1e12
            if cfg.peak:
                entry["percent_of_bf16_peak"] = 100 * entry["tflops"] / cfg.peak
            figures[f"{model}/{precision}"] = entry
    key = "resnet18/bf16"
    ratio = figures[key]["ratio"]
    problems = [] if cfg.quick or ratio >= RATIO_TARGET else [
        f"{key} polytrain/native {ratio:.3f} < {RATIO_TARGET}"
    ]  # fmt: skip
    cells = [
        f"{k} {v['polytrain_samples_per_second']:,.0f}/s x{v['ratio']:.3f}"
        for k, v in figures.items()
    ]
    if "percent_of_bf16_peak" in figures[key]:
        cells.append(f"{key} {figures[key]['percent_of_bf16_peak']:.1f}% of bf16 peak")
    return verdict(problems, "; ".join(cells), figures)


def compare_loops(cfg: Config, work: Any, model: str, x: np.ndarray, y: np.ndarray) -> Figures:
    """polytrain's loop and the hand-written one, one discarded round each, then
    interleaved rounds (ABBA); samples/s medians and the median per-round ratio."""
    from . import native_torch_gpu
    from .common import Summary, interleaved

    loops: dict[str, Callable[[], Any]] = {
        "polytrain": partial(polytrain_loop, cfg, work, model, x, y),
        "native": partial(native_torch_gpu.run, work, model, cfg.native_device(), x, y),
    }
    for fn in loops.values():
        fn()  # kernels chosen, allocator warm
    measured: dict[str, list[Any]] = {k: [] for k in loops}
    for key in interleaved(0, 1 if cfg.quick else 3, list(loops)):
        measured[key].append(loops[key]())
    pairs = zip(measured["polytrain"], measured["native"], strict=True)
    ratios = [p.samples_per_second / n.samples_per_second for p, n in pairs]
    return {
        "polytrain_samples_per_second": Summary(
            [m.samples_per_second for m in measured["polytrain"]]
        ).median,
        "native_samples_per_second": Summary(
            [m.samples_per_second for m in measured["native"]]
        ).median,
        "ratio": Summary(ratios).median,
        "ratio_min": min(ratios),
        "last_loss": [measured[k][-1].last_loss for k in loops],
    }


def polytrain_loop(cfg: Config, work: Any, model: str, x: np.ndarray, y: np.ndarray) -> Any:
    """One timed run through polytrain's Trainer (as benchmarks.through_polytrain, on
    the device under test and for any model)."""
    from .through_polytrain import StepClock

    backend = get_backend("torch", fast=work.fast)
    recipe = Recipe(model=model, epochs=1, batch_size=work.batch_size,
                    optimizer=work.optimizer, lr=work.lr, momentum=work.momentum,
                    seed=work.seed, precision=work.precision,
                    devices=cfg.device)  # fmt: skip
    test = ArrayDataset(x[: work.batch_size], y[: work.batch_size], num_classes=10)
    data = Datasets(train=ArrayDataset(x, y, num_classes=10), test=test)
    clock = StepClock(work, backend.synchronize)
    trainer = Trainer(recipe, backend, plugins=[clock], progress=False, datasets=data)
    clock.started = time.perf_counter()
    trainer.fit()
    return clock.clock.measurement("polytrain", clock.last_loss)


PART_FUNCTIONS: dict[int, tuple[Callable[[Config], tuple[str, str, Figures]], str]] = {
    1: (conformance, "conformance"),
    2: (training, "training"),
    3: (lockstep_part, "lockstep"),
    4: (checkpoint_part, "checkpoint"),
    5: (replicas, "replicas"),
    6: (processes, "processes"),
    7: (compile_part, "compile"),
    8: (benchmark, "benchmark"),
}
