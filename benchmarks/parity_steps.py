"""How far apart do the frameworks drift over a few free-running steps?
``python -m benchmarks.parity_steps --model resnet18 --precision fp64``.

Every backend builds the model in the precision's dtype, loads the same numpy weights,
and takes the same ``--steps`` momentum steps on the same Fashion-MNIST batches (no
lockstep: each continues from its own state). Reported against the first backend: the
largest per-step loss difference, the largest weight or BatchNorm-statistic difference
after the last step, and the largest eval-mode logit difference on one test batch. In
fp32 the answer is rounding amplified by training (~1e-6 and up); in fp64 (the parity
mode) it should stay near 1e-12 for models with BatchNorm too. All frameworks run in
this one process, one after the other: this is a correctness probe, not a timing.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from polytrain import get_backend, get_model_spec
from polytrain.backend.precision import param_dtype
from polytrain.neutral.optim import OptimizerConfig
from polytrain.training.recipe import Recipe
from polytrain.training.step import StepRunner
from polytrain.training.trainer import Datasets, load_datasets

from .run import BACKENDS

Result = tuple[np.ndarray, dict[str, np.ndarray], np.ndarray, float]


def run_backend(name: str, args: argparse.Namespace, data: Datasets) -> Result:
    """Train ``args.steps`` steps on backend ``name``; losses, final params, eval logits."""
    spec = get_model_spec(args.model)
    b = get_backend(name)
    model = b.build_model(spec, dtype=param_dtype(args.precision))
    b.set_params(model, spec.init_params(seed=args.seed))
    opt = b.make_optimizer(model, OptimizerConfig("momentum", lr=args.lr, momentum=0.9))
    runner = StepRunner(b, model, opt, precision=args.precision)
    losses = []
    start = time.perf_counter()
    for i in range(args.steps):
        sl = slice(i * args.batch_size, (i + 1) * args.batch_size)
        result = runner.train_step(data.train.x[sl], data.train.y[sl])
        losses.append(result.loss_sum / result.samples)
    b.synchronize()
    seconds = time.perf_counter() - start
    return np.array(losses), b.get_params(model), runner.predict(data.test.x), seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.parity_steps", description=__doc__)
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--precision", default="fp64", help="fp32 or fp64")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    names = args.backends.split(",")
    data = load_datasets(Recipe(train_samples=args.batch_size * args.steps, test_samples=64))
    results = {}
    for name in names:
        results[name] = run_backend(name, args, data)
        print(f"-- {name}: {args.steps} steps in {results[name][3]:.1f} s", flush=True)
    ref_losses, ref_params, ref_logits, _ = results[names[0]]
    print(
        f"{args.model}, {args.precision}, {args.steps} momentum steps of batch "
        f"{args.batch_size}, seed {args.seed}; differences from {names[0]}:"
    )
    print(f"{'backend':8} {'max |Δloss|':>12} {'max |Δparam|':>13} {'max |Δeval logit|':>18}")
    for name in names[1:]:
        losses, params, logits, _ = results[name]
        dparam = max(float(np.max(np.abs(params[k] - ref_params[k]))) for k in ref_params)
        print(
            f"{name:8} {np.max(np.abs(losses - ref_losses)):12.2e} {dparam:13.2e} "
            f"{np.max(np.abs(logits - ref_logits)):18.2e}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
