"""Where polytrain's step time goes: CPU time per step of the Trainer against the hand-written
loop (one thread, alternating rounds), and the measured cost of each per-step piece of
polytrain's loop taken on its own (docs/performance.md, "Where polytrain's step time goes").

    python -m benchmarks.step_overhead torch --rounds 5 --steps 100

CPU time (``time.process_time``: every thread of the process, the loader's prefetch thread
included) rather than wall time: on a shared machine other processes change the wall time
of a step much more than its CPU time.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np


def _per_call_us(fn: Callable[[], Any], calls: int = 2000) -> float:
    """Median CPU microseconds of one call over 5 blocks of ``calls`` calls."""
    fn()
    blocks = []
    for _ in range(5):
        t = time.process_time()
        for _ in range(calls):
            fn()
        blocks.append((time.process_time() - t) / calls * 1e6)
    return statistics.median(blocks)


def loop_cost(name: str, rounds: int, steps: int) -> dict[str, float]:
    """Median CPU us per step of the native loop and of the Trainer, alternating rounds."""
    from polytrain import get_backend

    from . import through_polytrain
    from .common import Workload, load_train

    backend = get_backend(name, threads=1)
    work = Workload(steps=steps, warmup=10, threads=1, fast=backend.fast)
    native = importlib.import_module(f"benchmarks.native_{backend.framework}")
    x, y = load_train(work.train_samples)
    loops = {
        "native": lambda: native.run(work, x, y),
        "polytrain": lambda: through_polytrain.run(name, work, x, y),
    }
    for run_once in loops.values():  # discarded: caches, allocator, kernels
        run_once()
    cpu: dict[str, list[float]] = {k: [] for k in loops}
    for r in range(rounds):
        order = list(loops) if r % 2 == 0 else list(loops)[::-1]  # ABBA
        for key in order:
            m = loops[key]()
            cpu[key].append(m.extra["cpu_seconds"] / work.steps * 1e6)
    out = {f"{k}_us": statistics.median(v) for k, v in cpu.items()}
    out["overhead_us"] = statistics.median(
        p - n for p, n in zip(cpu["polytrain"], cpu["native"], strict=True)
    )
    return out


def piece_costs(name: str, batch_size: int = 256) -> dict[str, float]:
    """CPU us of each per-step piece of polytrain's loop, on a real Trainer."""
    from polytrain import get_backend
    from polytrain.data import ArrayDataset
    from polytrain.plugins.records import StepRecord
    from polytrain.training.recipe import Recipe
    from polytrain.training.trainer import Datasets, Trainer

    from .common import MODEL

    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch_size * 2, 1, 28, 28)).astype(np.float32)
    y = rng.integers(0, 10, batch_size * 2).astype(np.int64)
    backend = get_backend(name, threads=1)
    recipe = Recipe(model=MODEL, epochs=1, batch_size=batch_size, optimizer="momentum", lr=0.05)
    data = Datasets(train=ArrayDataset(x, y, num_classes=10), test=None)
    t = Trainer(recipe, backend, progress=False, datasets=data)
    b, runner, dev = t.backend, t.runner, t.model.devices
    xb, yb = x[:batch_size].copy(), y[:batch_size].copy()
    logits = b.forward(t.model, b.to_tensor(xb, dev[0]), train=True)
    labels = b.to_tensor(yb, dev[0])
    loss = b.loss(logits, labels, runner.loss, "sum")
    count = b.count_correct(logits, labels)
    b.synchronize()
    run = t.run_info()
    record = StepRecord(epoch=0, step=0, global_step=1, loss=1.0, lr=0.05, samples=256,
                        grad_norm=None, extra={})  # fmt: skip
    return {
        "to_tensor(x batch)": _per_call_us(lambda: b.split_and_load(xb, dev), 500),
        "to_tensor(y batch)": _per_call_us(lambda: b.split_and_load(yb, dev)),
        "_cast (float32 no-op)": _per_call_us(lambda: runner._cast(xb)),
        "host read: loss": _per_call_us(lambda: float(b.to_numpy(loss))),
        "host read: correct count": _per_call_us(lambda: float(b.to_numpy(count))),
        "count_correct (device op)": _per_call_us(lambda: b.count_correct(logits, labels)),
        "set_lr (schedule + setter)": _per_call_us(
            lambda: t.optimizer.set_lr(t.schedule.lr_at(3, recipe.lr))
        ),
        "health.observe": _per_call_us(lambda: t.health.observe(1, 2.3, False, False)),
        "StepRecord + step_end hook": _per_call_us(
            lambda: t.pm.hook.polytrain_step_end(
                run=run, step=StepRecord(**record.__dict__), control=t.control
            )
        ),
        "step_extra + grad_norm flag": _per_call_us(
            lambda: runner.mixed_precision.step_extra(False)
        ),
        "sync_gradients (1 device)": _per_call_us(lambda: b.sync_gradients(t.model)),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("backend")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--pieces-only", action="store_true")
    args = parser.parse_args(argv)
    from polytrain.utils.threads import export_thread_env

    export_thread_env(1)  # before any framework import
    import os

    print(f"load average: {os.getloadavg()}")
    if not args.pieces_only:
        for k, v in loop_cost(args.backend, args.rounds, args.steps).items():
            print(f"{k:32s} {v:9.1f}")
    for k, v in piece_costs(args.backend).items():
        print(f"{k:32s} {v:9.1f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
