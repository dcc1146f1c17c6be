"""Several processes: gradient-sync time and throughput on 1 and 2 processes per backend.

    python -m benchmarks.distributed            # every installed backend
    python -m benchmarks.distributed --quick    # a few steps: a sanity run
    python -m benchmarks.distributed --backends mxnet --steps 60

For each backend, LeNet trains on a global batch of 256 random samples, once as one
process and once as two processes on loopback started by ``polytrain launch`` (the
framework's own engine: torchrun + gloo, paddle.distributed.launch + gloo, MXNet's
ps-lite ``dist_sync`` with one server), each process taking its contiguous half of
every global batch (the data-order contract in docs/architecture.md), one thread per process.

A throughput pass times whole steps on rank 0 (samples/s of the global batch); a
second, instrumented pass times ``Backend.sync_gradients`` (the cross-process gradient
sum: the allreduce, or MXNet's push/pull through the server) between device syncs, so
MXNet's asynchronous engine is timed honestly; it includes any wait for the slower
process. Every figure is a median. Two processes of one thread need two free cores to
run side by side: on a shared machine the 2-process rows move with the load.
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

BATCH = 256
REPO = Path(__file__).resolve().parents[1]


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


def measure(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """One process of the job: median step and sync times of its share of each batch."""
    from polytrain import OptimizerConfig, get_backend, get_model_spec
    from polytrain.distributed.cluster import resolve
    from polytrain.neutral.sharding import shard_bounds
    from polytrain.plugins.registry import cluster_environments
    from polytrain.training.step import StepRunner

    backend = get_backend(name, threads=1)
    devices = backend.devices("cpu")
    backend.init_distributed(resolve(environments=cluster_environments()), devices, timeout=120)
    spec = get_model_spec("lenet")
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
    backend.sync_gradients = timed(backend, backend.sync_gradients, sync)  # type: ignore[method-assign]
    for _ in range(args.steps):  # instrumented: the gradient sum alone
        step()
    step_ms = 1000 * float(np.median(steps))
    result: dict[str, Any] = {
        "backend": backend.name,
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
    return [sys.executable, "-m", "benchmarks.distributed", "--worker", name,
            "--result", str(result), "--batch-size", str(args.batch_size),
            "--steps", str(args.steps), "--warmup", str(args.warmup)]  # fmt: skip


def run(name: str, processes: int, args: argparse.Namespace) -> dict[str, Any]:
    """One measurement: a plain process, or ``polytrain launch`` with 2 processes."""
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
            return {"backend": name, "processes": processes, "error": lines[-1]}
        data: dict[str, Any] = json.loads(result.read_text())
        return data


def table(results: Sequence[dict[str, Any]], args: argparse.Namespace) -> str:
    head = (
        f"{'backend':<8} {'engine':<31} {'procs':>5} {'samples/s':>10} {'ms/step':>8} "
        f"{'sync ms/step':>12}"
    )
    lines = [
        f"LeNet, global batch {args.batch_size}, {args.steps} timed steps after {args.warmup} "
        "warm-up; 1 thread per process; loopback, CPU",
        head,
        "-" * len(head),
    ]
    engines = {"torch": "torchrun + gloo allreduce", "paddle": "paddle launch + gloo allreduce",
               "mxnet": "ps-lite dist_sync push/pull"}  # fmt: skip
    for res in results:
        engine = engines.get(res["backend"], "?") if res["processes"] > 1 else "one process"
        if "error" in res:
            lines.append(f"{res['backend']:<8} {engine:<31} {res['processes']:>5} failed: "
                         f"{res['error']}")  # fmt: skip
            continue
        sync = "-" if res["sync_ms"] is None else f"{res['sync_ms']:.2f}"
        lines.append(
            f"{res['backend']:<8} {engine:<31} {res['processes']:>5} "
            f"{res['samples_per_s']:>10.0f} {res['step_ms']:>8.1f} {sync:>12}"
        )
    lines.append(
        "sync: Backend.sync_gradients between device syncs on rank 0 (the cross-process "
        "gradient sum, including any wait for the slower process); samples/s: the global "
        "batch over rank 0's median step"
    )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--backends", default=None, help="comma-separated (default: installed)")
    p.add_argument("--batch-size", type=int, default=BATCH, help="global batch")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--quick", action="store_true", help="5 timed steps after 2 warm-up")
    p.add_argument("--json", default=None, help="also write the results here")
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
    results = [run(name, n, args) for name in names for n in (1, 2)]
    print(table(results, args))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": results}, f, indent=2)
    return 1 if any("error" in r for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
