"""torch's LeNet in NCHW vs channels-last order, eager and compiled, on a CPU:
``python -m benchmarks.layout [--steps 30] [--repeats 6] [--threads 2] [--no-compile]``.

The hand-written torch loop of ``benchmarks.native_torch`` (same LeNet, same weights, one
fixed batch of 256 from the training set), with the module and the batch either in torch's
default order or converted with ``memory_format=torch.channels_last``; Adam, as the default
recipe. All variants live in one process and alternate in ABBA rounds; prints the median
and minimum ms per step of each (docs/performance.md, "Channels-last convolutions").
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from .common import initial_weights, load_train
from .native_torch import lenet

BATCH = 256


@dataclass
class Variant:
    run: Any  # the module, or its torch.compile wrapper
    optimizer: torch.optim.Optimizer
    x: torch.Tensor
    y: torch.Tensor


def variant(channels_last: bool, compiled: bool, seed: int = 0) -> Variant:
    """The model, optimizer and batch of one variant."""
    net = lenet()
    with torch.no_grad():
        for p, w in zip(net.parameters(), initial_weights(seed), strict=True):
            p.copy_(torch.from_numpy(w))
    x, y = load_train(BATCH)
    xb, yb = torch.from_numpy(np.ascontiguousarray(x)), torch.from_numpy(y.astype(np.int64))
    if channels_last:
        net = net.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
        xb = xb.contiguous(memory_format=torch.channels_last)
    run = torch.compile(net) if compiled else net
    return Variant(run, torch.optim.Adam(net.parameters(), lr=0.002), xb, yb)


def ms_per_step(v: Variant, steps: int) -> float:
    loss_fn = nn.CrossEntropyLoss()
    start = time.perf_counter()
    for _ in range(steps):
        v.optimizer.zero_grad()
        loss = loss_fn(v.run(v.x), v.y)
        loss.backward()
        v.optimizer.step()
        loss.item()
    return (time.perf_counter() - start) / steps * 1e3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.layout", description=__doc__)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    names = [
        (cl, comp) for comp in ([False, True] if args.compile else [False]) for cl in (False, True)
    ]
    variants = {}
    for cl, comp in names:
        start = time.perf_counter()
        variants[cl, comp] = variant(cl, comp)
        ms_per_step(variants[cl, comp], steps=3)  # warm-up (and the compile)
        print(f"{_label(cl, comp)}: first 3 steps {time.perf_counter() - start:.1f} s", flush=True)
    times: dict[tuple[bool, bool], list[float]] = {k: [] for k in names}
    for r in range(args.repeats):
        for key in names if r % 2 == 0 else names[::-1]:
            times[key].append(ms_per_step(variants[key], steps=args.steps))
    print(
        f"LeNet batch {BATCH}, {args.threads} threads, "
        f"{args.repeats} ABBA rounds of {args.steps} steps"
    )
    for cl, comp in names:
        t = times[cl, comp]
        base = statistics.median(times[False, comp])
        print(
            f"{_label(cl, comp):28} ms/step median {statistics.median(t):6.1f} min {min(t):6.1f}"
            f"  speedup over NCHW {base / statistics.median(t):.2f}"
        )
    return 0


def _label(channels_last: bool, compiled: bool) -> str:
    return f"{'compiled' if compiled else 'eager'} {'channels-last' if channels_last else 'NCHW'}"


if __name__ == "__main__":
    raise SystemExit(main())
