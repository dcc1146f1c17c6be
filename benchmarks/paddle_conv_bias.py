"""Paddle's LeNet with Conv2D's own bias vs polytrain's ``_Conv2D`` (the bias added by one
PyLayer whose backward is one reduction), on a CPU:
``python -m benchmarks.paddle_conv_bias [--steps 10] [--repeats 6] [--optimizer momentum|adam]``.

The hand-written Paddle LeNet of ``benchmarks.native_paddle`` (same weights, one fixed batch
of 256 from the training set), once as written and once with each Conv2D replaced by
polytrain's; both in one process, alternating in ABBA rounds; prints the median wall and CPU
ms per training step of each and the last loss (docs/performance.md, "Paddle's convolution
bias"). Threads: Paddle's setting from ``OMP_NUM_THREADS`` (set it before running).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import paddle
import paddle.nn.functional as F
from paddle import nn
from polytrain_paddle._layers import _Conv2D

from .common import initial_weights, load_train
from .native_paddle import lenet

BATCH = 256


def model(polytrains_conv: bool) -> nn.Sequential:
    """The native LeNet with the common initial weights; its convolutions polytrain's."""
    net = lenet()
    if polytrains_conv:
        for i, layer in enumerate(net):
            if isinstance(layer, nn.Conv2D):
                ours = _Conv2D(layer._in_channels, layer._out_channels, layer._kernel_size)
                net[i] = ours
    for p, w in zip(net.parameters(), initial_weights(0), strict=True):
        p.set_value(w.T if w.ndim == 2 else w)  # Paddle's Linear weight is [in, out]
    return net


def optimizer(name: str, net: nn.Layer) -> Any:
    if name == "adam":
        return paddle.optimizer.Adam(learning_rate=0.002, parameters=net.parameters())
    return paddle.optimizer.Momentum(0.05, momentum=0.9, parameters=net.parameters())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.paddle_conv_bias", description=__doc__
    )
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--optimizer", choices=("momentum", "adam"), default="momentum")
    args = parser.parse_args(argv)
    x, y = load_train(BATCH)
    xb, yb = paddle.to_tensor(x), paddle.to_tensor(y.astype("int64"))
    names = ("Conv2D's bias", "polytrain's _Conv2D")
    nets = {n: model(i == 1) for i, n in enumerate(names)}
    opts = {n: optimizer(args.optimizer, nets[n]) for n in names}
    last: dict[str, float] = {}

    def steps(name: str, count: int) -> tuple[float, float]:
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(count):
            loss = F.cross_entropy(nets[name](xb), yb)
            loss.backward()
            opts[name].step()
            opts[name].clear_grad()
            last[name] = float(loss)
        return (time.perf_counter() - wall) / count * 1e3, (time.process_time() - cpu) / count * 1e3

    for name in names:
        steps(name, 2)  # warm-up
    times: dict[str, list[tuple[float, float]]] = {n: [] for n in names}
    for r in range(args.repeats):
        for name in names if r % 2 == 0 else names[::-1]:
            times[name].append(steps(name, args.steps))
    print(
        f"LeNet batch {BATCH}, {args.optimizer}, {args.repeats} ABBA rounds of {args.steps} steps"
    )
    base = statistics.median(t[0] for t in times[names[0]])
    for name in names:
        wall = statistics.median(t[0] for t in times[name])
        cpu = statistics.median(t[1] for t in times[name])
        print(
            f"{name:22} wall ms/step {wall:6.1f}  CPU ms/step {cpu:6.1f}"
            f"  speedup {base / wall:.2f}  last loss {last[name]:.6f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
