"""Data parallelism in one process: throughput on 1, 2 and 4 emulated CPU devices.

    python -m benchmarks.data_parallel            # every installed backend
    python -m benchmarks.data_parallel --quick    # a few steps: a sanity run
    python -m benchmarks.data_parallel --backends torch --devices 1,2,4 --steps 40

Each backend runs in its own process (frameworks do not share a process, and each
gets the same thread count). For 1, 2 and 4 devices it trains LeNet on the same
global batch (256) through the StepRunner and reports samples/s. A second,
instrumented pass times gradient synchronisation (``Backend.sync_gradients``) and the
update (``Optimizer.step``) between device syncs, so MXNet's asynchronous engine is
timed honestly; it is kept apart from the throughput pass, which it would slow.

The device counts take turns step by step and every figure is a median, which keeps
bursts of load from other processes out of the comparison. The overhead column is
the step time on N devices minus the step time on one device: what the multi-device
path costs on one host, where emulated devices run one after another (the work is
not shared out, so no speed-up is expected beyond what smaller kernels give).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

BATCH = 256


def timed(backend: Any, fn: Callable[..., Any], sink: list[float]) -> Callable[..., Any]:
    """``fn`` with its duration (between two device syncs) appended to ``sink``."""

    def wrapper(*args: Any) -> Any:
        backend.synchronize()
        t0 = time.perf_counter()
        result = fn(*args)
        backend.synchronize()
        sink.append(time.perf_counter() - t0)
        return result

    return wrapper


def measure(backend: Any, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Per device count: median step time, samples/s, sync and update times of LeNet.

    The device counts take turns step by step, so a burst of load from another
    process on a shared machine hits them alike; medians drop the bursts."""
    from polytrain import OptimizerConfig, get_model_spec
    from polytrain.training.step import StepRunner

    spec = get_model_spec("lenet")
    rng = np.random.default_rng(0)
    x = rng.random((args.batch_size, *spec.input_shape), dtype=np.float32)
    y = rng.integers(0, 10, args.batch_size).astype(np.int64)
    runners = {}
    for n in args.device_counts:
        model = backend.build_model(spec, backend.devices(f"cpu:{n}"))
        backend.set_params(model, spec.init_params(0))
        config = OptimizerConfig(name="momentum", lr=0.05, momentum=0.9)
        runners[n] = StepRunner(backend, model, backend.make_optimizer(model, config))
    steps: dict[int, list[float]] = {n: [] for n in runners}
    sync: dict[int, list[float]] = {n: [] for n in runners}
    update: dict[int, list[float]] = {n: [] for n in runners}
    for _ in range(args.warmup):
        for runner in runners.values():
            runner.train_step(x, y)
    for _ in range(args.steps):  # throughput: whole steps, nothing inside them timed
        for n, runner in runners.items():
            timed(backend, runner.train_step, steps[n])(x, y)
    original_sync = backend.sync_gradients
    sync_wrappers = {n: timed(backend, original_sync, sync[n]) for n in runners}
    for n, runner in runners.items():  # on these optimizer objects only
        runner.optimizer.step = timed(backend, runner.optimizer.step, update[n])
    try:  # instrumented steps: sync and update timed between device syncs
        for _ in range(args.steps):
            for n, runner in runners.items():
                backend.sync_gradients = sync_wrappers[n]
                runner.train_step(x, y)
    finally:
        del backend.sync_gradients  # back to the class's method
    rows = []
    for n in runners:
        step = float(np.median(steps[n]))
        rows.append(
            {
                "devices": n,
                "step_ms": 1000 * step,
                "samples_per_s": args.batch_size / step,
                "sync_ms": 1000 * float(np.median(sync[n])),
                "update_ms": 1000 * float(np.median(update[n])),
            }
        )
    return rows


def worker(args: argparse.Namespace) -> None:
    """Measure one backend; print one JSON line."""
    from polytrain import get_backend

    backend = get_backend(args.worker, threads=args.threads)
    rows = measure(backend, args)
    print(
        json.dumps(
            {
                "backend": backend.name,
                "version": backend.version(),
                "threads": backend.threads(),
                "rows": rows,
            }
        )
    )


def run_backend(name: str, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "benchmarks.data_parallel", "--worker", name]
    cmd += [
        "--devices",
        ",".join(map(str, args.device_counts)),
        "--batch-size",
        str(args.batch_size),
    ]
    cmd += ["--steps", str(args.steps), "--warmup", str(args.warmup)]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"backend": name, "error": (proc.stderr.strip().splitlines() or ["?"])[-1]}
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def table(results: Sequence[dict[str, Any]], args: argparse.Namespace) -> str:
    head = (
        f"{'backend':<8} {'devices':>7} {'samples/s':>10} {'ms/step':>8} {'speed-up':>8} "
        f"{'sync ms':>8} {'update ms':>9} {'overhead ms':>11}"
    )
    lines = [
        f"LeNet, global batch {args.batch_size}, {args.steps} timed steps after "
        f"{args.warmup} warm-up; emulated CPU devices in one process",
        head,
        "-" * len(head),
    ]
    for res in results:
        if "error" in res:
            lines.append(f"{res['backend']:<8} failed: {res['error']}")
            continue
        base = res["rows"][0]
        for row in res["rows"]:
            lines.append(
                f"{res['backend']:<8} {row['devices']:>7} {row['samples_per_s']:>10.0f} "
                f"{row['step_ms']:>8.1f} {row['samples_per_s'] / base['samples_per_s']:>7.2f}x "
                f"{row['sync_ms']:>8.2f} {row['update_ms']:>9.2f} "
                f"{row['step_ms'] - base['step_ms']:>+11.1f}"
            )
    threads = {r["backend"]: r["threads"] for r in results if "threads" in r}
    lines.append(f"threads: {threads}")
    lines.append(
        "overhead: ms/step on N devices minus ms/step on the first row (same global batch)"
    )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backends", default=None, help="comma-separated (default: installed)")
    p.add_argument("--devices", default="1,2,4", help="emulated device counts")
    p.add_argument("--batch-size", type=int, default=BATCH, help="global batch")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--threads", type=int, default=None, help="intra-op threads per backend")
    p.add_argument("--quick", action="store_true", help="3 timed steps after 1 warm-up")
    p.add_argument("--json", default=None, help="also write the results here")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.steps, args.warmup = 3, 1
    args.device_counts = [int(n) for n in args.devices.split(",")]
    if args.worker:
        worker(args)
        return 0
    from polytrain.plugins.registry import installed_backends

    names = args.backends.split(",") if args.backends else installed_backends()
    results = [run_backend(name, args) for name in names]
    print(table(results, args))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": results}, f, indent=2)
    return 1 if any("error" in r for r in results) else 0


if __name__ == "__main__":
    raise SystemExit(main())
