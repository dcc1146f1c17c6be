"""The "9 tips for training fast neural networks with PyTorch" seed, item by item, on any backend.

The seed (a Chinese translation of a PyTorch-Lightning article) lists: DataLoader and its
workers, batch size, gradient accumulation, not keeping graphs alive for logging, moving
to a GPU, 16-bit mixed precision, several GPUs (DataParallel), several nodes (DDP), and
DDP over DataParallel. Each tip below runs on a small slice so the whole tour takes
seconds; each prints what polytrain does for it and what was measured here.

    python examples/speed_tips.py --backend torch
    python examples/speed_tips.py --backend mxnet --train-samples 2048

The default data is Fashion-MNIST (MNIST's training files are not on every machine);
``--dataset mnist`` where they exist.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np

from polytrain import Backend, OptimizerConfig, get_backend, get_model_spec
from polytrain.data import BatchLoader, load_dataset
from polytrain.training.recipe import Recipe
from polytrain.training.step import StepRunner
from polytrain.training.trainer import Datasets, Trainer


def tip(number: str, title: str, text: str) -> None:
    print(f"\n[{number}] {title}\n    {text}")


def run(backend: Backend, data: Datasets, **recipe: Any) -> tuple[float, float]:
    """(samples per second, last epoch's mean loss) of a short recipe."""
    settings = {"epochs": 1, "batch_size": 64, "optimizer": "momentum", "lr": 0.02, **recipe}
    summary = Trainer(Recipe(**settings), backend, progress=False, datasets=data).fit()
    epoch = summary.epochs[-1]
    return epoch.samples_per_second, epoch.train_loss


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--backend", default=None, help="torch, paddle or mxnet")
    p.add_argument("--dataset", default="fashion-mnist")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--train-samples", type=int, default=1024)
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args(argv)

    backend = get_backend(args.backend, threads=args.threads)
    train = load_dataset(args.dataset, "train", data_dir=args.data_dir)
    data = Datasets(train.subset(min(args.train_samples, len(train))), None)
    out: dict[str, Any] = {}
    print(f"{backend.name} {backend.version()}: LeNet on {len(data.train)} {args.dataset} samples")

    tip(
        "1-2",
        "DataLoader and its workers",
        "polytrain.data.BatchLoader shuffles in numpy (the same order on every backend) and "
        "prepares the next batches in a thread: BatchLoader(dataset, 64, prefetch=2).",
    )
    loader = BatchLoader(data.train, 64, seed=0, prefetch=2)
    start = time.perf_counter()
    n = sum(len(y) for _, y in loader.epoch(0))
    out["loader_samples_per_s"] = n / (time.perf_counter() - start)
    print(f"    one epoch of batches alone: {out['loader_samples_per_s']:,.0f} samples/s")

    tip(
        "3",
        "Batch size",
        "raise it as far as memory allows, and scale the learning rate with it "
        "(Recipe(batch_size=..., lr=...), --batch-size/--lr).",
    )
    run(backend, data, max_steps=2)  # warm-up: first calls allocate and pick kernels
    for size in (16, 256):
        speed, _ = run(backend, data, batch_size=size, lr=0.02 * size / 64, max_steps=512 // size)
        out[f"batch_{size}_samples_per_s"] = speed
        print(f"    batch {size:>3}: {speed:8,.0f} samples/s")

    tip(
        "4",
        "Gradient accumulation",
        "Recipe(accumulate=K) / --accumulate K cuts each global batch into K micro-batches "
        "and steps once: the same update as the whole batch at once (the global-batch "
        "gradient contract in docs/architecture.md).",
    )
    out["accumulate_max_diff"] = accumulation_difference(backend, data)
    print(
        f"    batch 128 in one piece vs 4 x 32: max weight difference "
        f"{out['accumulate_max_diff']:.1e}"
    )

    tip(
        "5",
        "Do not keep graphs alive for logging",
        "the seed's fix is losses.append(loss.item()); polytrain's step returns host floats "
        "(StepResult.loss_sum), so nothing holds a graph, and it copies once per step.",
    )

    tip(
        "6",
        "One GPU",
        "devices are neutral names: Recipe(devices='gpu:0') or backend.try_gpu(0), which "
        "falls back to the CPU; model and batches are placed for you (no .cuda()).",
    )
    print(f"    backend.try_gpu(0) here: {backend.device_name(backend.try_gpu(0))}")

    tip(
        "7",
        "16-bit mixed precision",
        "Recipe(precision='bf16' or 'fp16') / --precision; fp16 adds the dynamic loss scale "
        "(GradScaler's defaults). Where a precision would silently run in float32 it is "
        "refused instead.",
    )
    support = getattr(backend, "precision_support", None)
    for precision in ("bf16", "fp16"):
        state = support()[precision] if support else None
        if state is None or not state.supported:
            why = state.detail if state is not None else "no mixed precision in this polytrain"
            print(f"    {precision}: not here ({why})")
            continue
        speed, loss = run(backend, data, precision=precision, max_steps=4)
        out[f"{precision}_loss"] = loss
        print(f"    {precision}: {speed:,.0f} samples/s, loss {loss:.4f}")

    tip(
        "8",
        "Several GPUs (DataParallel)",
        "Recipe(devices='gpu:0,1') splits each batch over the devices and sums the gradients; "
        "'cpu:N' emulates N devices, so it runs here too, with the same numbers as one device.",
    )
    _, one = run(backend, data, max_steps=4)
    _, two = run(backend, data, max_steps=4, devices="cpu:2")
    out["data_parallel_loss_diff"] = abs(one - two)
    print(f"    mean loss, 1 device {one:.6f} vs 2 devices {two:.6f}")

    tip(
        "9-10",
        "Several processes and nodes (DDP, preferred over DataParallel)",
        "one process per device through the framework's own launcher, each taking its share "
        "of every global batch; SLURM, torchrun, paddle and DMLC variables are read for you:",
    )
    print(
        f"    polytrain launch --backend {backend.name} --nproc-per-node 2 -- polytrain train "
        f"--backend {backend.name} --train-samples {len(data.train)}"
    )
    print("    polytrain launch ... --nnodes 2 --node-rank R --master HOST:PORT  (on each node)")
    return out


def accumulation_difference(backend: Backend, data: Datasets) -> float:
    """Max |weight difference| after one step on 128 samples, whole vs 4 micro-batches."""
    spec = get_model_spec("lenet")
    x, y = data.train.x[:128], data.train.y[:128]
    weights = []
    for accumulate in (1, 4):
        model = backend.build_model(spec)
        backend.set_params(model, spec.init_params(seed=0))
        opt = backend.make_optimizer(model, OptimizerConfig("momentum", lr=0.05))
        StepRunner(backend, model, opt, accumulate=accumulate).train_step(x, y)
        weights.append(backend.get_params(model))
    return max(float(np.abs(weights[0][k] - weights[1][k]).max()) for k in weights[0])


if __name__ == "__main__":
    main()
