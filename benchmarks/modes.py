"""Execution modes through polytrain: fast (compiled) vs eager, 1 vs 2 threads, and the
mixed precisions each backend supports: ``python -m benchmarks.modes [--quick]``.

Each (backend, threads) pair runs in its own process (thread counts are fixed before the
framework import); inside it the modes alternate over the repetitions. Thread counts
alternate between rounds of processes, so a drift of the machine hits both alike. The
first-step time minus a steady step estimates the one-off cost of compiling/tracing
(torch.compile, to_static, hybridize), reported apart from the steady throughput.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from .run import BACKENDS, ROOT

# (fast, precision) per backend: what the framework can do on a CPU (see the precision
# matrix in docs/performance.md); fp16 on a CPU is measured only with --fp16 (it is slow).
MODES = {
    "torch": [(False, "fp32"), (True, "fp32"), (False, "bf16")],
    "paddle": [(False, "fp32"), (True, "fp32")],
    "mxnet": [(False, "fp32"), (True, "fp32"), (False, "bf16"), (True, "bf16")],
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.modes", description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--threads", default="1,2", help="thread counts to compare")
    parser.add_argument(
        "--rounds", type=int, default=None, help="process rounds (default 2, quick 1)"
    )
    parser.add_argument("--repeats", type=int, default=None, help="per mode and round (default 3)")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--fp16", action="store_true", help="also time fp16 where it runs")
    parser.add_argument("--json", default=None)
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(json.loads(args.worker))

    from .common import Workload

    work = Workload(steps=args.steps or (10 if args.quick else 50), warmup=3 if args.quick else 5)
    rounds = args.rounds or (1 if args.quick else 2)
    repeats = args.repeats or (2 if args.quick else 3)
    threads = [int(t) for t in args.threads.split(",")]
    rows: list[dict[str, Any]] = []
    for name in [b.strip() for b in args.backends.split(",") if b.strip()]:
        modes = list(MODES.get(name, [(False, "fp32"), (True, "fp32")]))
        if args.fp16 and name == "torch":
            modes.append((False, "fp16"))
        for r in range(rounds):
            for t in threads if r % 2 == 0 else list(reversed(threads)):
                print(
                    f"-- {name}, {t} thread(s), round {r + 1}/{rounds}", file=sys.stderr, flush=True
                )
                job = {
                    "backend": name,
                    "work": replace(work, threads=t).to_dict(),
                    "modes": modes,
                    "repeats": repeats,
                }
                rows += run_job(job)
    table(rows)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
    return 0


def run_job(job: dict[str, Any]) -> list[dict[str, Any]]:
    cmd = [sys.executable, "-m", "benchmarks.modes", "--worker", json.dumps(job)]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, check=False)
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("["):
            return list(json.loads(line))
    tail = " ".join(proc.stderr.strip().splitlines()[-3:])
    return [{"backend": job["backend"], "threads": job["work"]["threads"], "error": tail}]


def worker(job: dict[str, Any]) -> int:
    from polytrain.utils.threads import export_thread_env

    from .common import Workload

    work = Workload(**job["work"])
    export_thread_env(work.threads)
    from . import through_polytrain
    from .common import interleaved, load_train

    x, y = load_train(work.train_samples)
    modes = [(bool(f), str(p)) for f, p in job["modes"]]
    keys = [f"{int(f)}:{p}" for f, p in modes]
    works = {k: replace(work, fast=f, precision=p) for k, (f, p) in zip(keys, modes, strict=True)}
    first: dict[str, float] = {}
    samples: dict[str, list[float]] = {k: [] for k in keys}
    step_s: dict[str, list[float]] = {k: [] for k in keys}
    for k in keys:  # the first run of a mode pays its compile/trace: timed apart
        m = through_polytrain.run(job["backend"], works[k], x, y)
        first[k] = float(m.extra["first_step_seconds"])
    for k in interleaved(0, job["repeats"], keys):
        m = through_polytrain.run(job["backend"], works[k], x, y)
        samples[k].append(m.samples_per_second)
        step_s[k].append(m.seconds / works[k].steps)
    rows = []
    for k, (f, p) in zip(keys, modes, strict=True):
        s = sorted(samples[k])
        step = statistics.median(step_s[k])
        rows.append(
            {
                "backend": job["backend"],
                "threads": work.threads,
                "fast": f,
                "precision": p,
                "samples_per_second": s,
                "median": statistics.median(s),
                "first_step_seconds": first[k],
                "one_off_seconds": max(0.0, first[k] - step),
            }
        )
    print(json.dumps(rows), flush=True)
    return 0


def table(rows: list[dict[str, Any]]) -> None:
    """One line per (backend, threads, mode): medians over all rounds."""
    merged: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in rows:
        if "error" in r:
            print(f"{r['backend']} threads {r['threads']}: ERROR {r['error']}")
            continue
        key = (r["backend"], r["threads"], r["fast"], r["precision"])
        m = merged.setdefault(key, {"values": [], "one_off": []})
        m["values"] += r["samples_per_second"]
        m["one_off"].append(r["one_off_seconds"])
    print(
        f"{'backend':8} {'threads':>7} {'mode':8} {'precision':9} {'samples/s':>10} "
        f"{'range':>15} {'one-off s':>9}"
    )
    for (backend, threads, fast, precision), m in sorted(merged.items()):
        v = sorted(m["values"])
        med = statistics.median(v)
        print(
            f"{backend:8} {threads:7d} {'fast' if fast else 'eager':8} {precision:9} "
            f"{med:10,.0f} {f'{v[0]:,.0f}-{v[-1]:,.0f}':>15} {max(m['one_off']):9.1f}"
        )


if __name__ == "__main__":
    sys.exit(main())
