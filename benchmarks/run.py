"""polytrain against hand-written native loops: ``python -m benchmarks.run [--quick]``.

For each backend, one worker process (threads fixed before the framework is imported) trains
the same LeNet/Fashion-MNIST workload (``--model resnet18``: ResNet-18, ``--model vit``: the
zoo's vit-tiny, for the frameworks whose native loops have it) through polytrain's Trainer
(``polytrain train``'s automatic mode unless ``--fast``/``--no-fast``) and through that
framework's idiomatic loop (``benchmarks/native_<framework>.py``), and where the framework
has one, a hand-written static-graph loop (``native_<framework>_static.py``: Paddle; the
faster of its variants, chosen by one untimed run each): one discarded round, then
``repeats`` rounds in ABBA order (who goes first alternates). Per loop and round it records
wall time and CPU time (the process's threads and its children) per sample; it reports
samples/s (median and spread), the ratio polytrain/native of samples/s and of CPU time per
sample (medians of the per-round ratios, so a drift of the machine hits both loops alike,
each with a distribution-free 95 % confidence interval), the achieved GFLOP/s against the
machine's measured matmul peak (the best probe of the run, and per round the probe taken
right after it, in the same process), the CPU model, the load average during the rounds, and
the last loss of each loop (the same weights and batches give the same loss: the two loops
did the same work).

Timings on a shared machine are noisy: read the intervals and the load, and take figures
on a quiet one.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

from .stats import load_average, median_ci

BACKENDS = ("torch", "paddle", "mxnet")
ROOT = Path(__file__).resolve().parent.parent
SPECS = {"vit": "vit-tiny"}  # --model names that are not the zoo's own


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="few steps: a sanity run")
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument(
        "--repeats", type=int, default=None, help="timed rounds (default 12, quick 6)"
    )
    parser.add_argument(
        "--steps", type=int, default=None, help="timed steps (default 100, quick 12)"
    )
    parser.add_argument(
        "--warmup", type=int, default=None, help="untimed steps (default 10, quick 3)"
    )
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument(
        "--model", default="lenet", choices=("lenet", "resnet18", "vit"),
        help="resnet18, vit (the zoo's vit-tiny): for frameworks whose native loops have it "
        "(resnet18: paddle; vit: jax)",
    )  # fmt: skip
    parser.add_argument(
        "--threads", type=int, default=None, help="per process (default: polytrain's)"
    )
    parser.add_argument(
        "--fast",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="compiled execution in both loops (default: polytrain's automatic mode, the "
        "native loop the backend's default)",
    )
    parser.add_argument("--json", default=None, help="also write the results to this file")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--work", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args.worker, json.loads(args.work), args.repeats)

    from .common import Workload, machine

    quick = args.quick
    work = Workload(
        steps=args.steps or (12 if quick else 100),
        warmup=args.warmup or (3 if quick else 10),
        batch_size=args.batch_size,
        threads=args.threads,
        fast=args.fast,
        model=SPECS.get(args.model, args.model),
    )
    repeats = args.repeats or (6 if quick else 12)
    run_info = {
        "date": datetime.now().astimezone().isoformat(timespec="seconds"),
        "machine": machine(),
        "load_start": load_average(),
    }
    results = []
    for name in [b.strip() for b in args.backends.split(",") if b.strip()]:
        print(f"-- {name}: {repeats} rounds of {work.steps} steps ...", file=sys.stderr, flush=True)
        results.append(run_worker(name, work, repeats))
    run_info["load_end"] = load_average()
    report(results, work, repeats, run_info)
    if args.json:
        everything = {**run_info, "repeats": repeats, "results": results}
        Path(args.json).write_text(json.dumps(everything, indent=2) + "\n", encoding="utf-8")
    return 0 if all("error" not in r for r in results) else 1


def run_worker(name: str, work: Any, repeats: int) -> dict[str, Any]:
    """One backend's measurements from a fresh process (threads set before importing)."""
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.run",
        "--worker",
        name,
        "--work",
        json.dumps(work.to_dict()),
        "--repeats",
        str(repeats),
    ]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, check=False)
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("{"):
            return dict(json.loads(line))
    tail = "\n".join(proc.stderr.strip().splitlines()[-5:])
    return {"backend": name, "error": f"worker exited with {proc.returncode}: {tail}"}


# -- the worker ------------------------------------------------------------------------------


def worker(name: str, work_dict: dict[str, Any], repeats: int) -> int:
    from polytrain.utils.threads import export_thread_env

    from .common import Workload

    work = Workload(**work_dict)
    if work.threads is not None:  # before any framework import (docs/architecture.md: traps)
        export_thread_env(work.threads)
    from polytrain import get_backend

    from .common import load_train

    backend = get_backend(name, threads=work.threads)  # sets the framework's own setters
    work = replace(work, threads=backend.threads()["intra_op"])
    x, y = load_train(work.train_samples)
    loops, info = _loops(name, backend, work, x, y)
    measured, rounds = _rounds(loops, repeats)
    out = {
        "backend": name,
        "framework_version": backend.version(),
        "threads": backend.threads(),
        "fast": measured["polytrain"][-1].extra["fast"],
        "fast_reason": measured["polytrain"][-1].extra["fast_reason"],
        **info,
        "work": work.to_dict(),
        **_summaries(work, measured, rounds),
    }
    print(json.dumps(out), flush=True)
    return 0


def _loops(
    name: str, backend: Any, work: Any, x: Any, y: Any
) -> tuple[dict[str, Callable[[], Any]], dict[str, Any]]:
    """The loops to time (polytrain, the native loop, the hand-written static-graph loop
    where the framework has one) and what was chosen for them."""
    import importlib

    from . import through_polytrain
    from .common import MODEL

    native = importlib.import_module(f"benchmarks.native_{backend.framework}")
    if work.model not in getattr(native, "MODELS", {MODEL: None}):
        raise SystemExit(f"the native {backend.framework} loop has no {work.model}")
    native_fast = bool(backend.fast if work.fast is None else work.fast)
    loops: dict[str, Callable[[], Any]] = {
        "polytrain": lambda: through_polytrain.run(name, work, x, y),
        "native": lambda: native.run(replace(work, fast=native_fast), x, y),
    }
    info: dict[str, Any] = {"native_fast": native_fast}
    static = None
    with contextlib.suppress(ModuleNotFoundError):  # a hand-written static-graph loop
        static = importlib.import_module(f"benchmarks.native_{backend.framework}_static")
    if static is not None:
        info["static_variant"] = variant = _fastest_variant(static, work, x, y)
        flag = static.VARIANTS[variant]
        loops["native_static"] = lambda: static.run(work, x, y, flag)
    return loops, info


def _rounds(
    loops: dict[str, Callable[[], Any]], repeats: int
) -> tuple[dict[str, list[Any]], list[dict[str, Any]]]:
    """One discarded round, then ``repeats`` in ABBA order, a matmul probe after each."""
    from polytrain.utils.threads import cpu_count

    from .common import interleaved, matmul_peak_gflops

    for run_once in loops.values():  # one discarded round: caches, allocator, kernels
        run_once()
    measured: dict[str, list[Any]] = {k: [] for k in loops}
    order = interleaved(0, repeats, list(loops))  # ABBA: who goes first alternates
    rounds = []
    for r in range(repeats):
        pair = order[len(loops) * r : len(loops) * (r + 1)]
        load_start = load_average()
        for key in pair:
            measured[key].append(loops[key]())
        load_end = load_average()
        probe = matmul_peak_gflops(cpu_count())  # every core: the machine's peak, this round
        rounds.append(
            {"order": pair, "load_start": load_start, "load_end": load_end, "matmul": probe}
        )
    return measured, rounds


def _summaries(
    work: Any, measured: dict[str, list[Any]], rounds: list[dict[str, Any]]
) -> dict[str, Any]:
    """The ratios against each reference loop, the peak fractions and each loop's figures."""
    from polytrain.neutral.models import get_model_spec

    from .common import machine, peak_fractions, per_round_ratios, train_flops_per_sample

    flops = train_flops_per_sample(get_model_spec(work.model))
    round_peaks = [max(r["matmul"].values()) for r in rounds]
    fractions = peak_fractions(measured["polytrain"], round_peaks, flops)
    peak = max((r["matmul"] for r in rounds), key=lambda probe: max(probe.values()))
    loads = [v for r in rounds for v in (r["load_start"], r["load_end"]) if v is not None]
    out: dict[str, Any] = {
        "machine": machine(),
        "train_flops_per_sample": flops,
        "matmul_peak_gflops": peak,  # the best round's probe
        # polytrain's GFLOP/s over the peak probed right after it, per round
        "round_peak_fraction": _ratio_summary(fractions),
        "rounds": rounds,
        "load_max": max(loads, default=None),
    }
    for reference, suffix in (("native", ""), ("native_static", "_static")):
        if reference in measured:
            ratios, cpu_ratios = per_round_ratios(measured["polytrain"], measured[reference])
            out[f"ratio{suffix}"] = _ratio_summary(ratios)
            out[f"cpu_ratio{suffix}"] = _ratio_summary(cpu_ratios)
    for key, ms in measured.items():
        out[key] = _loop_figures(ms, flops)
    return out


def _loop_figures(ms: list[Any], flops: int) -> dict[str, Any]:
    """One loop's samples/s (median, spread), GFLOP/s, last loss and per-sample times."""
    from .common import Summary

    s = Summary([m.samples_per_second for m in ms])
    cpu_us = [1e6 * m.extra["cpu_seconds"] / m.samples for m in ms]
    return {
        "samples_per_second": s.values,
        "median": s.median,
        "spread": s.spread,
        "iqr": s.iqr,
        "gflops": s.median * flops / 1e9,
        "last_loss": ms[-1].last_loss,
        "wall_us_per_sample": [1e6 * m.seconds / m.samples for m in ms],
        "cpu_us_per_sample": cpu_us,
        "cpu_us_per_sample_median": Summary(cpu_us).median,
        "children_cpu_seconds": [m.extra["children_cpu_seconds"] for m in ms],
    }


def _fastest_variant(static: Any, work: Any, x: Any, y: Any) -> str:
    """The static loop's variant with the most samples/s in one untimed try each."""
    speed = {v: static.run(work, x, y, flag).samples_per_second
             for v, flag in static.VARIANTS.items()}  # fmt: skip
    return max(speed, key=speed.__getitem__)


def _ratio_summary(ratios: list[float]) -> dict[str, Any]:
    """Per-round ratios, their median with its distribution-free 95 % interval, min, max."""
    return {
        "rounds": ratios,
        **median_ci(ratios).to_dict(),
        "min": min(ratios),
        "max": max(ratios),
    }


# -- the report ------------------------------------------------------------------------------


def report(
    results: list[dict[str, Any]], work: Any, repeats: int, run_info: dict[str, Any]
) -> None:
    ok = [r for r in results if "error" not in r]
    m = run_info["machine"]
    versions = ", ".join(f"{r['backend']} {r['framework_version']}" for r in ok)
    print(f"polytrain vs native loops, {run_info['date']}; {versions}")
    # the machine's peak: the best matmul probe of any worker and round, every core
    peak = max((max(r["matmul_peak_gflops"].values()) for r in ok), default=float("nan"))
    print(
        f"machine: {m['cpu']}, {m['cpus']} CPUs ({m['usable_cpus']} usable); "
        f"Python {m['python']}, numpy {m['numpy']}; fp32 matmul peak {peak:.0f} GFLOP/s "
        "(all cores)"
    )
    loads = [r["load_max"] for r in ok if r.get("load_max") is not None]
    print(
        f"load (1-min average, the benchmark's own busy threads included): "
        f"{_load(run_info['load_start'])} at start, {_load(run_info['load_end'])} at end, "
        f"max {_load(max(loads, default=None))} at the rounds' starts and ends"
    )
    model = {"lenet": "LeNet", "resnet18": "ResNet-18", "vit-tiny": "ViT-tiny"}[work.model]
    print(
        f"{model} / Fashion-MNIST, batch {work.batch_size}, {work.steps} timed steps after "
        f"{work.warmup} warm-up, one discarded round, then {repeats} rounds in ABBA order; "
        "samples/s: median (± half the range); ratio: polytrain/native samples/s per round; "
        "cpu ratio: native/polytrain CPU time per sample (process + children) per round; "
        "both: median [95% CI]"
    )
    if ok:
        print(f"{ok[0]['train_flops_per_sample'] / 1e6:.2f} MFLOP per training sample")
    header = (
        f"{'backend':8} {'fast':5} {'threads':8} {'polytrain':>15} {'native':>15} "
        f"{'ratio [95% CI]':>21} {'CPU us/sample p/n':>17} {'cpu ratio [95% CI]':>21} "
        f"{'GFLOP/s':>8} {'% peak':>6} {'% round peak [95% CI]':>21} {'load max':>8} "
        f"{'last loss p/n':>17}"
    )
    print(header)
    print("-" * len(header))
    for r in results:
        if "error" in r:
            print(f"{r['backend']:8} ERROR {r['error']}")
            continue
        p, n = r["polytrain"], r["native"]
        threads = ",".join(str(v) for v in r["threads"].values())
        cpu = f"{p['cpu_us_per_sample_median']:.0f}/{n['cpu_us_per_sample_median']:.0f}"
        print(
            f"{r['backend']:8} {('yes' if r['fast'] else 'no'):5} {threads:8} "
            f"{_cell(p):>15} {_cell(n):>15} {_ci(r['ratio']):>21} {cpu:>17} "
            f"{_ci(r['cpu_ratio']):>21} {p['gflops']:8.1f} {100 * p['gflops'] / peak:5.1f}% "
            f"{_percent_ci(r['round_peak_fraction']):>21} "
            f"{_load(r.get('load_max')):>8} {p['last_loss']:8.5f}/{n['last_loss']:.5f}"
        )
    _static_table([r for r in ok if "ratio_static" in r])
    for r in ok:
        print(f"{r['backend']}: polytrain {'fast' if r['fast'] else 'eager'} ({r['fast_reason']})")
    if ok:
        q = ok[0]["ratio"]
        lo, hi = q["ranks"]
        print(
            f"95% CI: order statistics {lo}..{hi} of the {len(q['rounds'])} per-round ratios "
            f"(distribution-free), exact coverage {100 * q['coverage']:.1f}%"
            + (" (too few rounds for 95%)" if q["coverage"] < q["confidence"] else "")
        )


def _static_table(rows: list[dict[str, Any]]) -> None:
    """polytrain against the hand-written static-graph loop (Paddle), where there is one."""
    if not rows:
        return
    print("polytrain vs the hand-written static-graph loop (the faster of its variants):")
    header = (
        f"{'backend':8} {'static loop':>15} {'variant':>17} {'ratio [95% CI]':>21} "
        f"{'cpu ratio [95% CI]':>21} {'last loss p/s':>17}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        p, n = r["polytrain"], r["native_static"]
        print(
            f"{r['backend']:8} {_cell(n):>15} {r['static_variant']:>17} "
            f"{_ci(r['ratio_static']):>21} {_ci(r['cpu_ratio_static']):>21} "
            f"{p['last_loss']:8.5f}/{n['last_loss']:.5f}"
        )


def _percent_ci(q: dict[str, Any]) -> str:
    return f"{100 * q['median']:.1f} [{100 * q['lo']:.1f}, {100 * q['hi']:.1f}]"


def _cell(s: dict[str, Any]) -> str:
    return f"{s['median']:,.0f} ±{50 * s['spread']:.0f}%"


def _ci(q: dict[str, Any]) -> str:
    return f"{q['median']:.3f} [{q['lo']:.2f}, {q['hi']:.2f}]"


def _load(value: float | None) -> str:
    return "?" if value is None else f"{value:.2f}"


if __name__ == "__main__":
    sys.exit(main())
