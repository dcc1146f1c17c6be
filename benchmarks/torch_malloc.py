"""glibc's default malloc thresholds vs polytrain's (the torch backend keeps freed CPU
memory for the next step):
``python -m benchmarks.torch_malloc [--repeats 6] [--fast] [--loop polytrain|native]``.

LeNet on Fashion-MNIST through polytrain's Trainer (``benchmarks.through_polytrain``: its
model is channels-last) or the hand-written NCHW loop of ``benchmarks.native_torch``; batch
256, 100 timed steps (``--steps``) after 10 warm-up; each round in two fresh processes, one with
``POLYTRAIN_TORCH_MALLOC=system`` (glibc's defaults) and one with polytrain's setting, in
ABBA order; prints the median samples/s of each, their ratio per round (median, min, max)
and the minor page faults per step (docs/performance.md, "CPU memory reuse (torch)").
Threads: ``--threads`` (default 2).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
from typing import Any

from .common import interleaved
from .run import ROOT

MODES = ("system", "reuse")


def worker(mode: str, loop: str, threads: int, fast: bool, steps: int) -> dict[str, Any]:
    """One timed run of ``loop`` in this process, under ``mode``."""
    os.environ["POLYTRAIN_TORCH_MALLOC"] = mode
    from polytrain_torch._malloc import keep_freed_memory

    state = keep_freed_memory()
    from .common import Workload, load_train
    from .native_torch import run
    from .through_polytrain import run as run_polytrain

    work = Workload(steps=steps, warmup=min(10, steps), threads=threads, fast=fast)
    x, y = load_train(work.train_samples)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    m = run_polytrain("torch", work, x, y) if loop == "polytrain" else run(work, x, y)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    return {
        "mode": mode,
        "state": state,
        "samples_per_second": m.samples_per_second,
        "faults_per_step": faults / work.total_steps,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.torch_malloc", description=__doc__)
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=100, help="timed steps per run")
    parser.add_argument("--loop", choices=("polytrain", "native"), default="polytrain")
    parser.add_argument("--fast", action="store_true", help="torch.compile'd")
    parser.add_argument("--worker", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker, args.loop, args.threads, args.fast, args.steps)))
        return 0
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
    for mode in interleaved(0, args.repeats, MODES):
        cmd = [sys.executable, "-m", "benchmarks.torch_malloc", "--worker", mode]
        cmd += ["--loop", args.loop, "--threads", str(args.threads), "--steps", str(args.steps)]
        cmd += ["--fast"] if args.fast else []
        out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True)
        runs[mode].append(json.loads(out.stdout.strip().splitlines()[-1]))
    ratios = [
        b["samples_per_second"] / a["samples_per_second"]
        for a, b in zip(runs["system"], runs["reuse"], strict=True)
    ]
    print(
        f"torch LeNet ({args.loop} loop), batch 256, {'compiled' if args.fast else 'eager'}, "
        f"{args.threads} threads, {args.repeats} ABBA rounds of one fresh process per mode"
    )
    for mode in MODES:
        sps = statistics.median(r["samples_per_second"] for r in runs[mode])
        faults = statistics.median(r["faults_per_step"] for r in runs[mode])
        print(
            f"{mode:7} ({runs[mode][0]['state']}): {sps:7,.0f} samples/s, "
            f"{faults:8,.0f} page faults per step"
        )
    print(
        f"reuse/system samples/s: median {statistics.median(ratios):.3f} "
        f"[min {min(ratios):.3f}, max {max(ratios):.3f}]"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
