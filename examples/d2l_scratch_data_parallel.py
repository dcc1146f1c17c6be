"""d2l's "multi-GPU training from scratch", on PyTorch, PaddlePaddle or MXNet.

Ports the scratch program of the d2l multi-GPU seeds (PyTorch and MXNet versions):
the parameters are a plain list of tensors, LeNet is a function of them written with
the backend's functional ops, every device gets its own copy of the parameters, each
device computes the loss of its shard, the gradients are summed over devices
(``allreduce``) and SGD runs on every device with the whole batch size.

    python examples/d2l_scratch_data_parallel.py --backend torch --devices cpu:2
    python examples/d2l_scratch_data_parallel.py --backend mxnet --devices gpu:0,1

``cpu:N`` emulates N devices on the host, so the program runs without GPUs.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from polytrain import get_backend
from polytrain.data import ArrayDataset, BatchLoader, load_dataset


def init_params(seed: int, scale: float = 0.01) -> list[np.ndarray]:
    """d2l's parameters: weights N(0, 0.01), biases zero; dense weights [in, out]."""
    rng = np.random.default_rng(seed)
    shapes = [(20, 1, 3, 3), (20,), (50, 20, 5, 5), (50,), (800, 128), (128,), (128, 10), (10,)]
    return [
        (rng.normal(0.0, scale, s) if len(s) > 1 else np.zeros(s)).astype(np.float32)
        for s in shapes
    ]


def lenet(ops: Any, X: Any, params: Sequence[Any]) -> Any:
    h1_conv = ops.conv2d(X, params[0], params[1])
    h1_activation = ops.relu(h1_conv)
    h1 = ops.avg_pool2d(h1_activation, kernel=2, stride=2)
    h2_conv = ops.conv2d(h1, params[2], params[3])
    h2_activation = ops.relu(h2_conv)
    h2 = ops.avg_pool2d(h2_activation, kernel=2, stride=2)
    h2 = ops.flatten(h2)
    h3_linear = ops.add(ops.matmul(h2, params[4]), params[5])
    h3 = ops.relu(h3_linear)
    return ops.add(ops.matmul(h3, params[6]), params[7])


def get_params(ops: Any, params: Sequence[np.ndarray], device: Any) -> list[Any]:
    """A copy of every parameter on ``device`` that records gradients."""
    return [ops.parameter(p, device) for p in params]


def train_batch(
    backend: Any,
    ops: Any,
    X: np.ndarray,
    y: np.ndarray,
    device_params: Sequence[Sequence[Any]],
    devices: Sequence[Any],
    lr: float,
) -> float:
    X_shards, y_shards = backend.split_and_load(X, devices), backend.split_and_load(y, devices)
    with backend.record():  # each device computes the loss of its own shard
        ls = [
            backend.cross_entropy(lenet(ops, X_shard, device_W), y_shard, "sum")
            for X_shard, y_shard, device_W in zip(X_shards, y_shards, device_params, strict=True)
        ]
    for loss in ls:  # back-propagation on each device
        backend.backward(loss)
    with ops.no_grad():  # sum the gradients of all devices, on every device
        for i in range(len(device_params[0])):
            backend.allreduce([ops.grad(device_params[c][i]) for c in range(len(devices))], "sum")
    for param in device_params:  # each device updates its own copy, with the whole batch size
        ops.sgd_(param, lr, X.shape[0])
    return sum(float(backend.to_numpy(loss)) for loss in ls)


def evaluate_accuracy(
    backend: Any, ops: Any, params: Sequence[Any], data: ArrayDataset, device: Any
) -> float:
    correct = 0
    with ops.no_grad():
        for start in range(0, len(data), 1000):
            X = backend.to_tensor(data.x[start : start + 1000], device)
            y = backend.to_tensor(data.y[start : start + 1000], device)
            correct += int(backend.to_numpy(backend.count_correct(lenet(ops, X, params), y)))
    return correct / len(data)


def train(args: argparse.Namespace) -> list[float]:
    backend = get_backend(args.backend, threads=args.threads)
    ops = backend.functional()
    train_data = load_dataset(args.dataset, "train", data_dir=args.data_dir)
    test_data = load_dataset(args.dataset, "test", data_dir=args.data_dir)
    if args.train_samples:
        train_data = train_data.subset(min(args.train_samples, len(train_data)))
    if args.test_samples:
        test_data = test_data.subset(min(args.test_samples, len(test_data)))
    devices = backend.devices(args.devices)
    names = [backend.device_name(d) for d in devices]
    # copy the model parameters to every device
    device_params = [get_params(ops, init_params(args.seed), d) for d in devices]
    loader = BatchLoader(train_data, args.batch_size, seed=args.seed)
    accuracies = []
    for epoch in range(args.epochs):
        start = time.perf_counter()
        loss_sum = 0.0
        with loader.epoch(epoch) as batches:
            for X, y in batches:
                loss_sum += train_batch(backend, ops, X, y, device_params, devices, args.lr)
        backend.synchronize()  # MXNet and CUDA are asynchronous: wait before timing
        seconds = time.perf_counter() - start
        acc = evaluate_accuracy(backend, ops, device_params[0], test_data, devices[0])
        accuracies.append(acc)
        print(
            f"epoch {epoch + 1}: train loss {loss_sum / len(train_data):.4f}, "
            f"test acc {acc:.3f}, {seconds:.1f} s/epoch on {','.join(names)} ({backend.name})"
        )
    return accuracies


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default=None, help="torch, paddle or mxnet")
    p.add_argument("--devices", default="cpu:2", help="cpu:N (emulated), gpu, gpu:0,1")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--lr", type=float, default=0.2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dataset", default="fashion-mnist")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--train-samples", type=int, default=None, help="use the first N samples")
    p.add_argument("--test-samples", type=int, default=None, help="use the first N samples")
    p.add_argument("--threads", type=int, default=None, help="intra-op threads")
    train(p.parse_args(argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
