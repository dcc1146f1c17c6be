"""The Paddle MNIST tutorial's multi-GPU program (``train_multi_gpu``), on any backend.

The tutorial makes four changes to its single-device loop and starts one process per GPU
with ``python -m paddle.distributed.launch --selected_gpus=0,1,2,3 train_multi_gpu.py``.
Here each change has a polytrain equivalent, and ``polytrain launch`` starts the
processes through the chosen framework's own launcher (torchrun, paddle.distributed.launch,
MXNet's parameter server):

    polytrain launch --backend torch --nproc-per-node 2 --log-dir logs -- \\
        python examples/paddle_mnist_multi.py --backend torch --train-samples 2000
    polytrain launch --backend paddle --nproc-per-node 2 --log-dir logs -- \\
        examples/paddle_mnist_multi.py --backend paddle --train-samples 2000

    tutorial (Paddle 1.x fluid)                     polytrain
    place = CUDAPlace(parallel.Env().dev_id)        info = cluster.resolve(); info.local_rank
    strategy = parallel.prepare_context()           backend.init_distributed(info, devices)
    model = parallel.DataParallel(model, strategy)  StepRunner(backend, model, optimizer)
    distributed_batch_reader(train_loader)          BatchLoader(..., rank=, world_size=)
    avg_loss = model.scale_loss(avg_loss)           inside StepRunner.train_step: the summed
    avg_loss.backward()                               loss / global batch, backward, then
    model.apply_collective_grads()                    backend.sync_gradients (all-reduce)

The gradient is that of the mean loss over the *global* batch (every process's share),
so N processes take the same steps as one process on the whole batch: the losses this
prints do not depend on ``--nproc-per-node``. Run without a launcher it is one process.
The default data is Fashion-MNIST (MNIST's training files are not on every machine);
``--dataset mnist`` where they exist.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from polytrain import Backend, OptimizerConfig, get_backend, get_model_spec
from polytrain.data import BatchLoader, load_dataset
from polytrain.distributed.cluster import resolve
from polytrain.neutral.optim import OPTIMIZERS
from polytrain.plugins.registry import cluster_environments
from polytrain.training.step import StepRunner


def main(argv: list[str] | None = None) -> list[float]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--backend", default=None, help="torch, paddle or mxnet")
    p.add_argument("--optimizer", default="sgd", choices=OPTIMIZERS)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=100, help="global batch (all processes)")
    p.add_argument("--print-every", type=int, default=10)
    p.add_argument("--dataset", default="fashion-mnist")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--train-samples", type=int, default=None)
    p.add_argument("--out", default=None, help="rank 0 saves OUT/mnist.<suffix> and losses.json")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds a peer may be late")
    args = p.parse_args(argv)

    # who am I: the variables of the backends' launchers, SLURM or MPI (Env().dev_id)
    info = resolve(environments=cluster_environments())
    backend = get_backend(args.backend, threads=1 if info.world_size > 1 else None)
    device = "cpu" if not backend.gpu_count() else f"gpu:{info.local_rank}"  # CUDAPlace(dev_id)
    devices = backend.devices(device)
    backend.init_distributed(info, devices, timeout=args.timeout)  # prepare_context()
    try:
        losses = train(args, backend, devices)
    finally:
        backend.shutdown_distributed()
    return losses


def train(args: argparse.Namespace, b: Backend, devices: list[Any]) -> list[float]:
    spec = get_model_spec("paddle-mnist")
    model = b.build_model(spec, devices)
    b.set_params(model, spec.init_params(seed=0))  # the same start on every rank
    optimizer = b.make_optimizer(model, OptimizerConfig(args.optimizer, lr=args.lr))
    runner = StepRunner(b, model, optimizer)  # DataParallel(model, strategy)

    data = load_dataset(args.dataset, "train", data_dir=args.data_dir)
    if args.train_samples:
        data = data.subset(min(args.train_samples, len(data)))
    rank, world = b.rank, b.world_size
    # distributed_batch_reader: every rank takes its contiguous share of each global batch
    loader = BatchLoader(data, args.batch_size, seed=0, rank=rank, world_size=world, prefetch=2)
    if rank == 0:
        print(f"{b.name}: {world} process(es), global batch {args.batch_size}")
    losses = []
    for epoch_id in range(args.epochs):
        sizes = loader.global_batch_sizes(epoch_id)
        for batch_id, (x, y) in enumerate(loader.epoch(epoch_id)):
            # scale_loss + backward + apply_collective_grads + minimize + clear_gradients
            result = runner.train_step(x, y, global_count=sizes[batch_id])
            losses.append(result.loss_sum / result.samples)  # host floats: no graph kept
            if rank == 0 and batch_id % args.print_every == 0:
                print(f"epoch: {epoch_id}, batch_id: {batch_id}, loss is: [{losses[-1]:.6f}]")
    if rank == 0 and args.out:  # fluid.save_dygraph, from one process only
        out = Path(args.out)
        b.save_native(model, str(out / f"mnist{b.native_suffix}"))
        (out / "losses.json").write_text(json.dumps({"world_size": world, "losses": losses}))
    return losses


if __name__ == "__main__":
    main()
