"""One MXNet convolution (+ ReLU, forward and backward) at its own channel count against
the same convolution with its channels padded by zeros to a multiple of 16, next to what
polytrain's plan (``polytrain_mxnet._channel_blocks``) decides for it:
``python -m benchmarks.mxnet_channels [--repeats 7]``.

Three families of shapes: ``c -> c`` (3x3, 14x14, batch 64; input and output padded, the
input with a gradient, as a layer inside a network), a first layer ``ic -> 20`` (3x3,
28x28, batch 64; only the output padded, the input without a gradient, as a data batch),
and ``ic -> oc sliced`` (the output padded and sliced back at once, as before a BatchNorm).
One process, NaiveEngine, 2 threads; ms per pass, median of ``--repeats`` alternating
(ABBA) pairs. docs/performance.md, "MXNet's convolution channels".
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

INNER = (2, 4, 6, 10, 12, 14, 18, 20, 24, 28, 36, 44, 50, 60, 76, 100, 120)
FIRST = (1, 3, 6, 12)
SLICED = ((3, 20), (16, 20), (16, 50), (32, 100))


def _pass(
    mx: Any, ic: int, oc: int, hw: int, input_grad: bool, then: str = "relu", keep: int = 0
) -> Callable[[], None]:
    """A recorded convolution and ``then`` (``relu``; ``slice``: the first ``keep``
    channels, as before a layer the padding cannot pass, such as a BatchNorm; ``nothing``),
    its backward and a wait, on fresh random arrays."""
    import numpy as np
    from mxnet import autograd

    rng = np.random.default_rng(0)
    x = mx.nd.array(rng.random((64, ic, hw, hw), dtype=np.float32))
    w = mx.nd.array(rng.normal(0, 0.1, (oc, ic, 3, 3)).astype(np.float32))
    b = mx.nd.zeros((oc,))
    for a in (w, b, x) if input_grad else (w, b):
        a.attach_grad()

    def run() -> None:
        with autograd.record():
            y = mx.nd.Convolution(x, w, b, kernel=(3, 3), pad=(1, 1), num_filter=oc)
            if then == "relu":
                y = mx.nd.Activation(y, act_type="relu")
            elif then == "slice":
                y = mx.nd.slice_axis(y, axis=1, begin=0, end=keep)
        y.backward()
        mx.nd.waitall()

    return run


def _ms(run: Callable[[], None]) -> float:
    start = time.perf_counter()
    run()
    return (time.perf_counter() - start) * 1e3


def _compare(plain: Callable[[], None], padded: Callable[[], None], repeats: int) -> str:
    for run in (plain, padded, plain, padded):  # oneDNN primitives built, caches warm
        run()
    a: list[float] = []
    p: list[float] = []
    for i in range(repeats):
        order = ((plain, a), (padded, p)) if i % 2 == 0 else ((padded, p), (plain, a))
        for run, times in order:
            times.append(_ms(run))
    ma, mp = statistics.median(a), statistics.median(p)
    return f"{ma:8.2f} {mp:8.2f} {ma / mp:7.2f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.mxnet_channels", description=__doc__
    )
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    from polytrain.utils.threads import export_thread_env

    export_thread_env(args.threads)
    from polytrain import get_backend

    backend = get_backend("mxnet", threads=args.threads)  # before mxnet: NaiveEngine
    import mxnet as mx
    from polytrain_mxnet._channel_blocks import padded_channels, plan_channels

    from polytrain.neutral.models import Conv2d, ReLU

    print(f"mxnet {backend.version()}, {backend.threads()}, median of {args.repeats} pairs")
    print(f"{'shape':>14} {'plain ms':>8} {'padded':>8} {'speedup':>7}  plan pads")
    for c in INNER:  # the plan pads the output when the input is padded or whole blocks
        pads = plan_channels([Conv2d(16, c, 3), ReLU()]) is not None
        times = _compare(
            _pass(mx, c, c, 14, True), _pass(mx, padded_channels(c), padded_channels(c), 14, True),
            args.repeats,
        )  # fmt: skip
        print(f"{f'{c} -> {c}':>14} {times}  {'yes' if pads else 'no'}")
    for ic in FIRST:
        pads = plan_channels([Conv2d(ic, 20, 3), ReLU()]) is not None
        times = _compare(
            _pass(mx, ic, 20, 28, False),
            _pass(mx, ic, padded_channels(20), 28, False),
            args.repeats,
        )
        print(f"{f'{ic} -> 20 (first)':>14} {times}  {'yes' if pads else 'no'}")
    for ic, oc in SLICED:  # padded output sliced at once: worth it or not
        times = _compare(
            _pass(mx, ic, oc, 14, ic > 3, then="nothing"),
            _pass(mx, ic, padded_channels(oc), 14, ic > 3, then="slice", keep=oc),
            args.repeats,
        )  # fmt: skip
        print(f"{f'{ic} -> {oc} sliced':>14} {times}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
