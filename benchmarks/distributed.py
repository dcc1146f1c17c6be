"""Several processes: gradient-sync time and throughput on 1 and 2 processes per backend.

    python -m benchmarks.distributed            # every installed backend, LeNet and ResNet-18
    python -m benchmarks.distributed --quick    # a few steps: a sanity run
    python -m benchmarks.distributed --backends mxnet --models lenet --steps 60

For each backend and model (LeNet on a global batch of 256, ResNet-18 on 32: the
gradients, which are what the sync moves, do not depend on the batch), the model trains
on random samples once as one process and once as two processes on loopback started by
``polytrain launch`` (the framework's own engine: torchrun + gloo,
paddle.distributed.launch + gloo, MXNet's ps-lite ``dist_sync`` with one server), each
process taking its contiguous half of every global batch (the data-order contract in
docs/architecture.md), one thread per process. torch and Paddle run two processes twice:
one collective per parameter (``bucket_mb=0``, the path before buckets) and flat 25 MB
buckets (the default, polytrain.backend.buckets).

A throughput pass times whole steps on rank 0 (samples/s of the global batch); a
second, instrumented pass times ``Backend.sync_gradients`` (the cross-process gradient
sum: the allreduce, or MXNet's push/pull through the server) between device syncs, so
MXNet's asynchronous engine is timed honestly, after the processes meet in a one-number
allreduce, so that it is the sum itself and not the wait for the slower process. Every
figure is a median. Two processes of one thread need two free cores to run side by side:
on a shared machine the 2-process rows move with the load.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

BATCH = {"lenet": 256, "resnet18": 32}
STEPS = {"lenet": 40, "resnet18": 10}  # timed steps (each pass), unless --steps
BUCKETED = ("torch", "paddle")  # backends whose sync has a bucket size
REPO = Path(__file__).resolve().parents[1]


def timed(
    backend: Any, fn: Callable[..., Any], sink: list[float], meet: bool = False
) -> Callable[..., Any]:
    """``fn`` with its duration (between two device syncs) appended to ``sink``;
    ``meet``: the processes first meet in a one-number allreduce, so the duration is
    ``fn``'s own and not the wait for a slower process."""

    def wrapper(*args: Any) -> Any:
        backend.synchronize()
        if meet and backend.world_size > 1:
            backend.allreduce_numbers([0.0])
        t0 = time.perf_counter()
        result = fn(*args)
        backend.synchronize()
        sink.append(time.perf_counter() - t0)
        return result

    return wrapper


def measure(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """One process of the job: median step and sync times of its share of each batch."""
    from polytrain import OptimizerConfig, get_backend, get_model_spec
    from polytrain.distributed.cluster import resolve
    from polytrain.neutral.sharding import shard_bounds
    from polytrain.plugins.registry import cluster_environments
    from polytrain.training.step import StepRunner

    bucket_mb = None if args.bucket_mb is None else float(args.bucket_mb)
    backend = get_backend(name, threads=1, bucket_mb=bucket_mb)
    devices = backend.devices("cpu")
    backend.init_distributed(resolve(environments=cluster_environments()), devices, timeout=120)
    spec = get_model_spec(args.model)
    rng = np.random.default_rng(0)
    x = rng.random((args.batch_size, *spec.input_shape), dtype=np.float32)
    y = rng.integers(0, 10, args.batch_size).astype(np.int64)
    lo, hi = shard_bounds(args.batch_size, backend.world_size, what="ranks")[backend.rank]
    model = backend.build_model(spec, devices)
    backend.set_params(model, spec.init_params(0))
    config = OptimizerConfig(name="momentum", lr=0.05, momentum=0.9)
    runner = StepRunner(backend, model, backend.make_optimizer(model, config))

    def step() -> None:
        runner.train_step(x[lo:hi], y[lo:hi], global_count=args.batch_size)

    steps: list[float] = []
    sync: list[float] = []
    for _ in range(args.warmup):
        step()
    for _ in range(args.steps):  # throughput: whole steps, nothing inside them timed
        timed(backend, step, steps)()
    backend.sync_gradients = timed(backend, backend.sync_gradients, sync, meet=True)  # type: ignore[method-assign]
    for _ in range(args.steps):  # instrumented: the gradient sum alone
        step()
    step_ms = 1000 * float(np.median(steps))
    result: dict[str, Any] = {
        "backend": backend.name,
        "model": args.model,
        "batch": args.batch_size,
        "bucket_mb": bucket_mb,
        "version": backend.version(),
        "processes": backend.world_size,
        "rank": backend.rank,
        "threads": backend.threads(),
        "step_ms": step_ms,
        "sync_ms": 1000 * float(np.median(sync)) if backend.world_size > 1 else None,
    }
    result["samples_per_s"] = args.batch_size / (step_ms / 1000)
    backend.shutdown_distributed()
    return result


def worker(args: argparse.Namespace) -> None:
    """Measure this process; rank 0 writes the JSON result."""
    result = measure(args.worker, args)
    if result["rank"] == 0:
        Path(args.result).write_text(json.dumps(result))


def _worker_command(name: str, result: Path, args: argparse.Namespace) -> list[str]:
    cmd = [sys.executable, "-m", "benchmarks.distributed", "--worker", name,
           "--result", str(result), "--batch-size", str(args.batch_size), "--model", args.model,
           "--steps", str(args.steps), "--warmup", str(args.warmup)]  # fmt: skip
    return cmd if args.bucket_mb is None else [*cmd, "--bucket-mb", str(args.bucket_mb)]


def run(name: str, processes: int, args: argparse.Namespace) -> dict[str, Any]:
    """One measurement: a plain process, or ``polytrain launch`` with 2 processes
    (``args.model``, ``args.bucket_mb``: None is the backend's default)."""
    from polytrain.distributed.network import free_port

    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "POLYTRAIN_THREADS": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": path}
    with tempfile.TemporaryDirectory(prefix="polytrain-bench-") as tmp:
        result = Path(tmp) / "result.json"
        cmd = _worker_command(name, result, args)
        if processes > 1:
            cmd = [sys.executable, "-m", "polytrain", "launch", "--backend", name,
                   "--nproc-per-node", str(processes), "--master", f"127.0.0.1:{free_port()}",
                   "--log-dir", str(Path(tmp) / "logs"), "--", *cmd]  # fmt: skip
        proc = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, check=False)
        if proc.returncode != 0 or not result.exists():
            logs = Path(tmp) / "logs"
            tail = [ln for f in sorted(logs.glob("workerlog.*")) for ln in f.open()]
            lines = (proc.stderr + "\n" + "\n".join(tail)).strip().splitlines() or ["?"]
            return {"backend": name, "model": args.model, "bucket_mb": args.bucket_mb,
                    "batch": args.batch_size,
                    "processes": processes, "error": lines[-1]}  # fmt: skip
        data: dict[str, Any] = json.loads(result.read_text())
        return data


def _engine(res: dict[str, Any]) -> str:
    if res["processes"] == 1:
        return "one process"
    engines = {"torch": "torchrun + gloo", "paddle": "paddle launch + gloo",
               "mxnet": "ps-lite dist_sync push/pull"}  # fmt: skip
    engine = engines.get(res["backend"], "?")
    if res["backend"] not in BUCKETED:
        return engine
    mb = res.get("bucket_mb")
    return f"{engine}, " + ("per parameter" if mb == 0 else f"{mb or 25:g} MB buckets")


def table(results: Sequence[dict[str, Any]], args: argparse.Namespace) -> str:
    head = (
        f"{'backend':<8} {'model':<15} {'engine, sync':<36} {'procs':>5} {'samples/s':>10} "
        f"{'ms/step':>8} {'sync ms/step':>12}"
    )
    lines = [
        f"global batch in parentheses; {args.warmup} warm-up steps; 1 thread per process; "
        "loopback, CPU",
        head,
        "-" * len(head),
    ]
    for res in results:
        model = f"{res['model']} ({res.get('batch', '?')})"
        start = f"{res['backend']:<8} {model:<15} {_engine(res):<36} {res['processes']:>5}"
        if "error" in res:
            lines.append(f"{start} failed: {res['error']}")
            continue
        sync = "-" if res["sync_ms"] is None else f"{res['sync_ms']:.2f}"
        lines.append(f"{start} {res['samples_per_s']:>10.0f} {res['step_ms']:>8.1f} {sync:>12}")
    lines.append(
        "sync: Backend.sync_gradients between device syncs on rank 0, after the processes "
        "meet (the cross-process gradient sum alone); samples/s: the global batch over "
        "rank 0's median step"
    )
    return "\n".join(lines)


def plan(name: str) -> list[tuple[int, str | None]]:
    """(processes, bucket_mb) of each run of one backend: per parameter before buckets."""
    if name in BUCKETED:
        return [(1, None), (2, "0"), (2, None)]
    return [(1, None), (2, None)]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--backends", default=None, help="comma-separated (default: installed)")
    p.add_argument("--models", default="lenet,resnet18", help="comma-separated")
    p.add_argument("--batch-size", type=int, default=None, help="global batch (per model)")
    p.add_argument("--steps", type=int, default=None, help="timed steps (per model)")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--quick", action="store_true", help="5 timed steps after 2 warm-up")
    p.add_argument("--json", default=None, help="also write the results here")
    p.add_argument("--model", default="lenet", help=argparse.SUPPRESS)
    p.add_argument("--bucket-mb", default=None, help=argparse.SUPPRESS)
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--result", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.steps, args.warmup = 5, 2
    if args.worker:
        worker(args)
        return 0
    from polytrain.plugins.registry import installed_backends

    names = args.backends.split(",") if args.backends else installed_backends()
    fixed_batch, fixed_steps = args.batch_size, args.steps
    results = []
    for model in args.models.split(","):
        if model not in BATCH:
            p.error(f"--models: {model!r} is not one of {', '.join(BATCH)}")
        for name in names:
            for processes, bucket_mb in plan(name):
                args.model, args.bucket_mb = model, bucket_mb
                args.batch_size = fixed_batch or BATCH[model]
                args.steps = fixed_steps or STEPS[model]
                results.append(run(name, processes, args))
                print(table(results[-1:], args).splitlines()[-2], flush=True)
    print(table(results, args))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": results}, f, indent=2)
    return 1 if any("error" in r for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
