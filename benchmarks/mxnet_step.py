"""MXNet's step graphs and shared batches against the same backend op by op, and against
the hand-written Gluon loop: ``python -m benchmarks.mxnet_step [--repeats 12]``; with
``--before plain-channels`` the backend's padded convolution channels against the same
backend without them.

One process (NaiveEngine, as polytrain picks it; threads fixed before mxnet is imported)
trains the benchmark's LeNet three ways, in interleaved rounds (ABC, CBA, ...):
``native`` (benchmarks/native_mxnet.py), ``op-by-op`` (polytrain's Trainer with the
backend's cross-entropy and accuracy-count graphs and its shared batches switched off, as
the backend ran before them) and ``polytrain`` (the Trainer as it is). Prints samples/s
and the per-round ratios (median [95% CI]) of samples/s and of CPU time per sample, and
checks that ``op-by-op`` and ``polytrain`` reached the same loss (docs/performance.md,
"MXNet's step graphs"). ``plain-channels`` (the Trainer with every convolution at its own
channel count, docs/performance.md "MXNet's convolution channels") replaces ``op-by-op``
under ``--before plain-channels``; its last loss differs by float32 rounding only.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
from collections.abc import Callable, Iterator
from typing import Any

from .stats import median_ci

BEFORE = ("op-by-op", "plain-channels")


@contextlib.contextmanager
def op_by_op() -> Iterator[None]:
    """The MXNet backend without its step graphs and shared batches, while inside."""
    from polytrain_mxnet import _backend

    from polytrain.backend.base import Backend

    fits, shares = _backend.fits_graph, _backend.MXNetBackend.load_shard
    _backend.fits_graph = lambda logits, labels: False
    _backend.MXNetBackend.load_shard = Backend.load_shard  # type: ignore[method-assign]
    try:
        yield
    finally:
        _backend.fits_graph = fits
        _backend.MXNetBackend.load_shard = shares  # type: ignore[method-assign]


@contextlib.contextmanager
def plain_channels() -> Iterator[None]:
    """Models built inside keep every convolution at its own channel count."""
    from polytrain_mxnet import _layers

    plan = _layers.plan_channels
    _layers.plan_channels = lambda layers: None
    try:
        yield
    finally:
        _layers.plan_channels = plan


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.mxnet_step", description=__doc__)
    parser.add_argument("--repeats", type=int, default=12)
    parser.add_argument("--steps", type=int, default=100, help="timed steps per round")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--before", choices=BEFORE, default="op-by-op")
    args = parser.parse_args(argv)
    from polytrain.utils.threads import export_thread_env

    export_thread_env(args.threads)  # before mxnet is imported
    from polytrain import get_backend

    backend = get_backend("mxnet", threads=args.threads)  # before mxnet: picks NaiveEngine
    from . import native_mxnet, through_polytrain
    from .common import Measurement, Workload, interleaved, load_train

    work = Workload(
        steps=args.steps, warmup=args.warmup, batch_size=args.batch_size,
        threads=args.threads, fast=True,
    )  # fmt: skip
    x, y = load_train(work.train_samples)

    before = args.before
    variants = ("native", before, "polytrain")

    def old() -> Measurement:
        with op_by_op() if before == "op-by-op" else plain_channels():
            return through_polytrain.run("mxnet", work, x, y)

    loops: dict[str, Callable[[], Measurement]] = {
        "native": lambda: native_mxnet.run(work, x, y),
        before: old,
        "polytrain": lambda: through_polytrain.run("mxnet", work, x, y),
    }
    for run_once in loops.values():  # discarded: caches, memory pools, graphs
        run_once()
    got: dict[str, list[Measurement]] = {v: [] for v in variants}
    for variant in interleaved(0, args.repeats, variants):
        got[variant].append(loops[variant]())
    print(
        f"mxnet {backend.version()} LeNet, batch {args.batch_size}, hybridized, "
        f"{backend.threads()}, {args.repeats} interleaved rounds of {args.steps} steps"
    )
    for variant in variants:
        speed = statistics.median(m.samples_per_second for m in got[variant])
        print(f"{variant:14}: {speed:8.0f} samples/s")
    for a, b in (("polytrain", "native"), (before, "native"), ("polytrain", before)):
        print(f"{a}/{b}: {_ratios(got[a], got[b])}")
    last = {v: got[v][-1].last_loss for v in variants}
    same = last[before] == last["polytrain"]  # op-by-op: the same floats, step for step
    print(
        f"last loss: native {last['native']!r}, {before} {last[before]!r}, "
        f"polytrain {last['polytrain']!r} ({'equal' if same else 'DIFFERENT'})"
    )
    return 0 if same or before == "plain-channels" else 1


def _ratios(a: list[Any], b: list[Any]) -> str:
    """Samples/s ratio and CPU-per-sample ratio of ``a`` over ``b``, per round."""
    from .common import per_round_ratios

    speed, cpu = per_round_ratios(a, b)
    return f"samples/s {median_ci(speed)}, CPU time per sample {median_ci(cpu)}"


if __name__ == "__main__":
    raise SystemExit(main())
