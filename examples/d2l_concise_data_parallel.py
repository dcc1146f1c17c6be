"""d2l's "concise implementation" of multi-GPU training, on PyTorch, PaddlePaddle or MXNet.

Ports the concise program of the d2l multi-GPU seed: a native ResNet-18 (or LeNet)
replicated on every device, weights initialised N(0, 0.01) as d2l's ``init_weights``,
plain SGD, test accuracy after each epoch. polytrain's Trainer does what
``nn.DataParallel`` did in the seed, with one difference: every device computes the
loss of its own shard, so no outputs are gathered on device 0 and device 0 does no
more work than the others.

    python examples/d2l_concise_data_parallel.py --backend paddle --devices cpu:2 \\
        --model lenet --epochs 2
    python examples/d2l_concise_data_parallel.py --backend torch --devices gpu:0,1

ResNet-18 is slow on a CPU: use ``--max-steps`` (and ``--train-samples``) there.
The same run from the command line: ``polytrain train --devices cpu:2 ...``.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence

from polytrain.plugins.records import Summary
from polytrain.training.recipe import Recipe
from polytrain.training.trainer import Trainer


def train(args: argparse.Namespace) -> Summary:
    recipe = Recipe(
        model=args.model,
        dataset=args.dataset,
        data_dir=args.data_dir,
        epochs=args.epochs,
        batch_size=args.batch_size,
        optimizer="sgd",
        lr=args.lr,
        seed=args.seed,
        devices=args.devices,
        train_samples=args.train_samples,
        test_samples=args.test_samples,
        max_steps=args.max_steps,
    )
    trainer = Trainer(recipe, args.backend, threads=args.threads, progress=not args.quiet)
    if args.init == "d2l":  # d2l's init_weights: Linear and Conv2d weights N(0, 0.01)
        spec = dataclasses.replace(trainer.spec, init="normal", init_std=0.01)
        trainer.backend.set_params(trainer.model, spec.init_params(recipe.seed))
    run = trainer.run_info()
    print(
        f"{run.backend}: {run.model} on {','.join(run.devices)}, global batch "
        f"{run.global_batch} = {run.per_device_batch} per device, loss on each device"
    )
    summary = trainer.fit()
    for e in summary.epochs:
        acc = "-" if e.test_accuracy is None else f"{e.test_accuracy:.3f}"
        print(
            f"epoch {e.epoch + 1}: train loss {e.train_loss:.4f}, test acc {acc}, "
            f"{e.seconds:.1f} s/epoch, {e.samples_per_second:.0f} samples/s"
        )
    return summary


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default=None, help="torch, paddle or mxnet")
    p.add_argument("--devices", default="cpu:2", help="cpu:N (emulated), gpu, gpu:0,1")
    p.add_argument("--model", default="resnet18", help="resnet18 (the seed's) or lenet")
    p.add_argument("--init", default="d2l", choices=["d2l", "spec"], help="d2l: N(0, 0.01)")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dataset", default="fashion-mnist")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--train-samples", type=int, default=None, help="use the first N samples")
    p.add_argument("--test-samples", type=int, default=None, help="use the first N samples")
    p.add_argument("--max-steps", type=int, default=None, help="stop each epoch after N steps")
    p.add_argument("--threads", type=int, default=None, help="intra-op threads")
    p.add_argument("--quiet", action="store_true", help="no run header or progress lines")
    train(p.parse_args(argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
