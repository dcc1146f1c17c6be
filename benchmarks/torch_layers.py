"""torch's plain modules vs the torch backend's (in-place ReLUs, Flatten's channels-last
gradient): ``python -m benchmarks.torch_layers [--model lenet] [--repeats 12]``.

One process, one model built twice by the torch backend from the same spec and weights: as
built, and with torch's plain modules put back (ReLUs out of place, ``nn.Flatten``). Each
round trains ``--steps`` steps of each through polytrain's StepRunner (eager, channels-last
as the backend builds it) on the same Fashion-MNIST batches, in ABBA order; prints the
median ms per step of each, their ratio per round (median [95% CI]) and checks that both
reached the same loss (docs/performance.md, "In-place ReLU and gradient layouts (torch)").
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from .stats import median_ci

VARIANTS = ("plain", "polytrain")


def plain_modules(module: Any) -> None:
    """torch's own modules as they come: ReLUs out of place, nn.Flatten."""
    from torch import nn

    for parent in module.modules():
        for name, m in parent.named_children():
            if isinstance(m, nn.ReLU):
                m.inplace = False
            if isinstance(m, nn.Flatten) and type(m) is not nn.Flatten:
                setattr(parent, name, nn.Flatten())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.torch_layers", description=__doc__)
    parser.add_argument("--model", default="lenet")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=12)
    parser.add_argument("--steps", type=int, default=40, help="timed steps per round")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    from polytrain.utils.threads import export_thread_env

    export_thread_env(args.threads)  # before torch is imported
    from polytrain import OptimizerConfig, get_backend, get_model_spec
    from polytrain.training.step import StepRunner

    from .common import interleaved, load_train

    backend = get_backend("torch", threads=args.threads)
    spec = get_model_spec(args.model)
    x, y = load_train(args.batch_size * 4)
    size = args.batch_size
    data = [(x[i : i + size], y[i : i + size]) for i in range(0, len(x), size)]
    params = spec.init_params(seed=0)
    runners = {}
    for variant in VARIANTS:
        model = backend.build_model(spec)
        if variant == "plain":
            plain_modules(model.replicas[0])
        backend.set_params(model, params)
        opt = backend.make_optimizer(model, OptimizerConfig("momentum", lr=0.05, momentum=0.9))
        runners[variant] = StepRunner(backend, model, opt)

    def timed(runner: StepRunner) -> tuple[float, float]:
        runner.train_step(*data[0])  # warm
        start = time.perf_counter()
        for i in range(args.steps):
            loss = runner.train_step(*data[i % len(data)]).loss_sum
        return (time.perf_counter() - start) / args.steps * 1e3, float(loss)

    ms: dict[str, list[float]] = {v: [] for v in VARIANTS}
    losses: dict[str, float] = {}
    for variant in interleaved(0, args.repeats, VARIANTS):
        took, losses[variant] = timed(runners[variant])
        ms[variant].append(took)
    ratios = [p / q for p, q in zip(ms["plain"], ms["polytrain"], strict=True)]
    print(
        f"torch {args.model}, batch {args.batch_size}, eager, {args.threads} threads, "
        f"{args.repeats} ABBA rounds of {args.steps} steps, one process"
    )
    for variant in VARIANTS:
        print(f"{variant:9}: {statistics.median(ms[variant]):8.2f} ms per step")
    print(f"plain/polytrain time per step: {median_ci(ratios)}")
    same = losses["plain"] == losses["polytrain"]  # the same floats, step for step
    print(
        f"last loss sum: plain {losses['plain']!r}, polytrain {losses['polytrain']!r}"
        f" ({'equal' if same else 'DIFFERENT'})"
    )
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
