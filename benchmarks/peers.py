"""polytrain against Keras 3 and the hand-written loops: ``python -m benchmarks.peers
[--quick] [--no-keras] [--channels-last]``.

Per framework (torch, jax) three loops train the same LeNet on Fashion-MNIST (batch 256,
plain SGD lr 0.1, the same initial weights and batches in the same order): polytrain's
Trainer (``polytrain train``'s automatic mode), the hand-written native loop
(``benchmarks/native_<framework>.py``) and Keras 3 on that backend (``model.fit``,
``channels_first``, ``jit_compile`` at Keras' default: off on torch, XLA on jax;
``--channels-last`` adds Keras' default image layout as a fourth loop). Keras runs from its
own venv, ``.venv-peers/``, made and filled by this script (``benchmarks/peers_venv.py``;
without network the Keras rows are skipped with one line), on the project's own torch, jax
and numpy. Each side is one long-lived process per framework (threads fixed before the
import, Keras' process given the project's thread variables); the loops run one discarded
round, then ``repeats`` rounds in ABBA order across the processes. Reported: samples/s
(median, spread), CPU time per sample, each loop's last loss (the same work gives the same
loss) and per round the ratios polytrain/Keras and polytrain/native of samples/s, their
medians with a distribution-free 95 % interval (``benchmarks/stats.py``).

Timings on a shared machine are noisy: read the intervals and the load.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import IO, Any

from .stats import load_average, median_ci

ROOT = Path(__file__).resolve().parent.parent
FRAMEWORKS = ("torch", "jax")
PROJECT_LOOPS = ("polytrain", "native")
LABELS = {
    "polytrain": "polytrain",
    "native": "native (by hand)",
    "keras_channels_first": "Keras channels_first",
    "keras_channels_last": "Keras channels_last",
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.peers", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--quick", action="store_true", help="few steps and rounds: a sanity run")
    p.add_argument("--frameworks", default=",".join(FRAMEWORKS), help="torch,jax")
    p.add_argument("--repeats", type=int, default=None, help="timed rounds (12; quick 3)")
    p.add_argument("--steps", type=int, default=None, help="timed steps (100; quick 12)")
    p.add_argument("--warmup", type=int, default=None, help="untimed steps (10; quick 3)")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--optimizer", default="sgd", choices=("sgd", "momentum"))
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--momentum", type=float, default=0.9, help="with --optimizer momentum")
    p.add_argument("--threads", type=int, default=None, help="per process (polytrain's)")
    p.add_argument("--no-keras", action="store_true", help="polytrain and native loops only")
    p.add_argument("--channels-last", action="store_true",
                   help="also Keras in channels_last (its default layout)")  # fmt: skip
    p.add_argument("--keras-version", default=None, help="default: peers_venv.KERAS_VERSION")
    p.add_argument("--json", default=None, help="also write the results to this file")
    args = p.parse_args(argv)
    args.frameworks = [f.strip() for f in args.frameworks.split(",") if f.strip()]
    unknown = sorted(set(args.frameworks) - set(FRAMEWORKS))
    if unknown:
        p.error(f"unknown framework(s) {', '.join(unknown)}; choose from {', '.join(FRAMEWORKS)}")
    return args


def workload(args: argparse.Namespace) -> Any:
    """The timed run every loop does."""
    from .common import Workload

    return Workload(
        steps=args.steps or (12 if args.quick else 100),
        warmup=args.warmup or (3 if args.quick else 10),
        batch_size=args.batch_size,
        optimizer=args.optimizer,
        lr=args.lr,
        momentum=args.momentum if args.optimizer == "momentum" else 0.0,
        threads=args.threads,
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    work = workload(args)
    repeats = args.repeats or (3 if args.quick else 12)
    keras_python = None if args.no_keras else _keras_python(args.keras_version)
    keras_loops = ["keras_channels_first"] + (["keras_channels_last"] if args.channels_last else [])
    from .common import machine

    info = {"date": datetime.now().astimezone().isoformat(timespec="seconds"),
            "machine": machine(), "load_start": load_average()}  # fmt: skip
    results = []
    for fw in args.frameworks:
        print(f"-- {fw}: {repeats} rounds of {work.steps} steps ...", file=sys.stderr, flush=True)
        loops = list(PROJECT_LOOPS) + (keras_loops if keras_python else [])
        results.append(run_framework(fw, work, repeats, loops, keras_python))
    info["load_end"] = load_average()
    skipped = "--no-keras" if args.no_keras else "installing Keras failed (stderr says why)"
    for line in report(results, work, repeats, info, None if keras_python else skipped):
        print(line)
    if args.json:
        everything = {**info, "work": work.to_dict(), "repeats": repeats, "results": results}
        Path(args.json).write_text(json.dumps(everything, indent=2) + "\n", encoding="utf-8")
    return 0 if all("error" not in r for r in results) else 1


def _keras_python(version: str | None) -> Path | None:
    from .peers_venv import KERAS_VERSION, ensure_keras

    return ensure_keras(version or KERAS_VERSION, lambda line: print(line, file=sys.stderr))


# -- the workers ------------------------------------------------------------------------------


@dataclass
class Worker:
    """One ``benchmarks.peers_worker`` process: a loop's name in, its measurement out."""

    proc: subprocess.Popen[str]
    stderr: IO[str]
    ready: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def start(cls, python: str, side: str, framework: str, work: Any,
              env: dict[str, str]) -> Worker:  # fmt: skip
        cmd = [python, "-m", "benchmarks.peers_worker", side, framework,
               json.dumps(work.to_dict())]  # fmt: skip
        err = tempfile.TemporaryFile("w+", encoding="utf-8")  # noqa: SIM115 - closed by close()
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                                text=True, env=env, cwd=ROOT)  # fmt: skip
        worker = cls(proc, err)
        worker.ready = worker.answer()
        return worker

    def answer(self) -> dict[str, Any]:
        """The worker's next ``PEERS`` line (other output is the frameworks' own)."""
        from .peers_worker import PREFIX

        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(PREFIX):
                return dict(json.loads(line[len(PREFIX) :]))
        self.stderr.seek(0)
        tail = " | ".join(self.stderr.read().strip().splitlines()[-3:])
        return {"error": f"worker exited with {self.proc.wait()}: {tail}"}

    def run(self, loop: str) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(loop + "\n")
        self.proc.stdin.flush()
        return self.answer()

    def close(self) -> None:
        """EOF on its stdin ends the worker; every pipe and file closed."""
        if self.proc.stdin is not None:
            with contextlib.suppress(BrokenPipeError):
                self.proc.stdin.close()
        self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.stderr.close()


def _env(extra: dict[str, str]) -> dict[str, str]:
    path = [str(ROOT), str(ROOT / "backends"), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, **extra, "PYTHONPATH": os.pathsep.join(p for p in path if p)}


def run_framework(framework: str, work: Any, repeats: int, loops: list[str],
                  keras_python: Path | None) -> dict[str, Any]:  # fmt: skip
    """Every loop's measurements on one framework: workers up, rounds, workers down."""
    out: dict[str, Any] = {"framework": framework}
    workers: dict[str, Worker] = {}
    try:
        project = Worker.start(sys.executable, "project", framework, work, _env({}))
        workers["project"] = project
        if "error" in project.ready:
            return {**out, "error": project.ready["error"]}
        out["project"] = project.ready
        if keras_python is not None and len(loops) > len(PROJECT_LOOPS):
            env = _env({**project.ready["env"], "KERAS_BACKEND": framework,
                        "KERAS_HOME": str(ROOT / ".venv-peers" / "keras-home")})  # fmt: skip
            keras = Worker.start(str(keras_python), "keras", framework, work, env)
            workers["keras"] = keras
            if "error" in keras.ready:
                return {**out, "error": keras.ready["error"]}
            out["keras"] = keras.ready
        by_loop = {loop: workers["project" if loop in PROJECT_LOOPS else "keras"]
                   for loop in loops}  # fmt: skip
        return {**out, **rounds(by_loop, repeats)}
    finally:
        for w in workers.values():
            w.close()


def rounds(by_loop: dict[str, Worker], repeats: int) -> dict[str, Any]:
    """One discarded round of every loop, then ``repeats`` rounds in ABBA order."""
    from .common import interleaved

    for loop, worker in by_loop.items():  # caches, allocator, compiled kernels
        first = worker.run(loop)
        if "error" in first:
            return {"error": first["error"]}
    measured: dict[str, list[dict[str, Any]]] = {loop: [] for loop in by_loop}
    order = interleaved(0, repeats, list(by_loop))
    loads = []
    for r in range(repeats):
        loads.append(load_average())
        print(f"   round {r + 1}/{repeats}, load {_num(loads[-1])}", file=sys.stderr, flush=True)
        for loop in order[len(by_loop) * r : len(by_loop) * (r + 1)]:
            m = by_loop[loop].run(loop)
            if "error" in m:
                return {"error": m["error"], "measured": measured}
            measured[loop].append(m)
    loads.append(load_average())
    return {"measured": measured, "loads": loads, "order": order}


# -- the figures ------------------------------------------------------------------------------


def loop_figures(ms: list[dict[str, Any]]) -> dict[str, Any]:
    """One loop's samples/s (median, spread), CPU microseconds per sample, last loss."""
    from .common import Summary

    speed = Summary([m["samples_per_second"] for m in ms])
    cpu = Summary([1e6 * m["extra"]["cpu_seconds"] / m["samples"] for m in ms])
    return {"median": speed.median, "spread": speed.spread, "samples_per_second": speed.values,
            "cpu_us_per_sample": cpu.median, "last_loss": ms[-1]["last_loss"]}  # fmt: skip


def ratio(ours: list[dict[str, Any]], theirs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per round polytrain's samples/s over the other loop's: median, 95 % interval."""
    per_round = [a["samples_per_second"] / b["samples_per_second"]
                 for a, b in zip(ours, theirs, strict=True)]  # fmt: skip
    return {"rounds": per_round, **median_ci(per_round).to_dict()}


def summarize(result: dict[str, Any]) -> dict[str, Any]:
    """Figures per loop and the ratios of polytrain to every other loop."""
    measured = result["measured"]
    figures = {loop: loop_figures(ms) for loop, ms in measured.items()}
    ratios = {loop: ratio(measured["polytrain"], ms)
              for loop, ms in measured.items() if loop != "polytrain"}  # fmt: skip
    return {"figures": figures, "ratios": ratios}


# -- the report -------------------------------------------------------------------------------


def report(results: list[dict[str, Any]], work: Any, repeats: int, info: dict[str, Any],
           keras_skipped: str | None = None) -> list[str]:  # fmt: skip
    """The report's lines: header, one row per loop, one row of ratios per framework."""
    m = info["machine"]
    ok = [r for r in results if "error" not in r]
    versions = [f"{r['framework']} {r['project']['version']}" for r in ok]
    versions += [f"keras {r['keras']['version']}" for r in ok[:1] if "keras" in r]
    loads = [v for r in ok for v in r["loads"] if v is not None]
    opt = "SGD" if work.optimizer == "sgd" else f"SGD momentum {work.momentum}"
    lines = [
        f"polytrain vs Keras 3 and native loops, {info['date']}; {', '.join(versions)}",
        f"machine: {m['cpu']}, {m['cpus']} CPUs ({m['usable_cpus']} usable); Python "
        f"{m['python']}, numpy {m['numpy']}; 1-min load {_num(info['load_start'])} at start, "
        f"{_num(info['load_end'])} at end, max {_num(max(loads, default=None))}",
        f"LeNet / Fashion-MNIST, batch {work.batch_size}, {opt} lr {work.lr}, {work.steps} "
        f"timed steps after {work.warmup} warm-up, one discarded round, then {repeats} rounds "
        "in ABBA order; samples/s: median ±half the range; ratio: polytrain's samples/s over "
        "the loop's, per round, median [95% CI]",
    ]
    if keras_skipped:
        lines.append(f"Keras rows skipped: {keras_skipped}")
    lines += loop_table(results)
    return lines


def loop_table(results: list[dict[str, Any]]) -> list[str]:
    header = (f"{'framework':9} {'loop':21} {'mode':16} {'threads':7} {'samples/s':>14} "
              f"{'CPU us/sample':>13} {'last loss':>9} {'polytrain / loop':>22}")  # fmt: skip
    lines = [header, "-" * len(header)]
    for r in results:
        if "error" in r:
            lines.append(f"{r['framework']:9} ERROR {r['error']}")
            continue
        s = summarize(r)
        for loop, f in s["figures"].items():
            q = s["ratios"].get(loop)
            cell = f"{q['median']:.3f} [{q['lo']:.2f}, {q['hi']:.2f}]" if q else "-"
            lines.append(
                f"{r['framework']:9} {LABELS[loop]:21} {mode(r, loop):16} "
                f"{threads(r, loop):7} {f['median']:>8,.0f} ±{50 * f['spread']:2.0f}% "
                f"{f['cpu_us_per_sample']:13.1f} {f['last_loss']:9.5f} {cell:>22}"
            )
    return lines


def mode(result: dict[str, Any], loop: str) -> str:
    """How the loop executes: compiled (jit) or eager."""
    if loop == "polytrain":
        fast = result["measured"]["polytrain"][-1]["extra"]["fast"]
    elif loop == "native":  # native_jax.py always jits its step
        fast = result["project"]["native_fast"] or result["framework"] == "jax"
    else:
        jit = result["measured"][loop][-1]["extra"]["jit_compile"]
        return f"jit_compile {'on' if jit else 'off'}"
    return "compiled" if fast else "eager"


def threads(result: dict[str, Any], loop: str) -> str:
    side = result["project"] if loop in PROJECT_LOOPS else result["keras"]
    return ",".join(str(v) for v in side["threads"].values())


def _num(value: float | None) -> str:
    return "?" if value is None else f"{value:.2f}"


if __name__ == "__main__":
    sys.exit(main())
