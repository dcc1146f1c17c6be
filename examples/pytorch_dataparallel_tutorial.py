"""The PyTorch DataParallel tutorial program, on PyTorch, PaddlePaddle or MXNet.

Ports the single-machine multi-GPU tutorial of the pytorch-dataparallel seed: its CNN
(conv 64, conv 128, max-pool, dense 1024, dropout, dense 10), Adam, a global batch of
64 per device, train and test accuracy after each epoch, then the state dict saved
from host memory so that it loads on any number of devices. Two of the tutorial's
fixes are built in:

* "loss inside the model": each device computes the loss (and the correct count) of
  its own shard; only numbers leave the devices, no outputs are gathered on device 0.
* "save from the CPU": ``save_native`` writes host tensors without the ``module.``
  prefixes of a DataParallel wrapper, and the neutral checkpoint (safetensors + JSON)
  loads into any backend. Both are reloaded here on a different device count.

    python examples/pytorch_dataparallel_tutorial.py --backend torch --devices cpu:2
    python examples/pytorch_dataparallel_tutorial.py --backend paddle --devices gpu:0,1

The tutorial trains on MNIST; pass ``--dataset mnist`` once it is downloaded
(``polytrain data --download mnist``). The model has dropout, so runs on different
frameworks do not give identical numbers (their random streams differ).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from polytrain import OptimizerConfig, get_backend, get_model_spec
from polytrain.data import ArrayDataset, BatchLoader, load_dataset
from polytrain.io.checkpoint import load_checkpoint, save_checkpoint


def model_with_loss(backend: Any, model: Any, replica: int, x: Any, labels: Any) -> tuple[Any, Any]:
    """The tutorial's ``forward(inputs, labels)``: replica ``replica`` returns its shard's
    summed loss and correct count, computed on its own device."""
    outputs = backend.forward(model, x, replica=replica, train=True)
    return backend.cross_entropy(outputs, labels, "sum"), backend.count_correct(outputs, labels)


def train_step(
    backend: Any, model: Any, optimizer: Any, x: np.ndarray, y: np.ndarray
) -> tuple[float, int]:
    optimizer.zero_grad()
    xs, ys = backend.split_and_load(x, model.devices), backend.split_and_load(y, model.devices)
    with backend.record():
        results = [
            model_with_loss(backend, model, i, xi, yi)
            for i, (xi, yi) in enumerate(zip(xs, ys, strict=True))
        ]
    for loss, _ in results:  # the mean over the whole batch: each shard's sum / batch size
        backend.backward(backend.scale_loss(loss, len(x)))
    backend.sync_gradients(model)  # sum the gradients over the devices
    optimizer.step()
    loss_sum = sum(float(backend.to_numpy(loss)) for loss, _ in results)
    return loss_sum, sum(int(backend.to_numpy(c)) for _, c in results)


def evaluate(backend: Any, model: Any, data: ArrayDataset, batch_size: int = 500) -> float:
    correct = 0
    for start in range(0, len(data), batch_size):
        x, y = data.x[start : start + batch_size], data.y[start : start + batch_size]
        devices = model.devices[: min(len(x), model.num_devices)]
        xs, ys = backend.split_and_load(x, devices), backend.split_and_load(y, devices)
        for i, (xi, yi) in enumerate(zip(xs, ys, strict=True)):
            outputs = backend.forward(model, xi, replica=i, train=False)
            correct += int(backend.to_numpy(backend.count_correct(outputs, yi)))
    return correct / len(data)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default=None, help="torch, paddle or mxnet")
    p.add_argument("--devices", default="cpu:2", help="cpu:N (emulated), gpu, gpu:0,1")
    p.add_argument("--reload-devices", default=None, help="default: cpu, or cpu:2 after cpu")
    p.add_argument("--epochs", type=int, default=5, help="the tutorial runs 50")
    p.add_argument("--batch-size", type=int, default=64, help="per device, as the tutorial")
    p.add_argument("--lr", type=float, default=1e-3, help="Adam's default")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dataset", default="fashion-mnist", help="the tutorial's is mnist")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--train-samples", type=int, default=None, help="use the first N samples")
    p.add_argument("--test-samples", type=int, default=None, help="use the first N samples")
    p.add_argument("--out", default=None, help="where to save (default: a temporary directory)")
    p.add_argument("--threads", type=int, default=None, help="intra-op threads")
    args = p.parse_args(argv)

    backend = get_backend(args.backend, threads=args.threads)
    data_train = load_dataset(args.dataset, "train", data_dir=args.data_dir)
    data_test = load_dataset(args.dataset, "test", data_dir=args.data_dir)
    if args.train_samples:
        data_train = data_train.subset(min(args.train_samples, len(data_train)))
    if args.test_samples:
        data_test = data_test.subset(min(args.test_samples, len(data_test)))

    devices = backend.devices(args.devices)
    spec = get_model_spec("torch-dp-cnn")
    model = backend.build_model(spec, devices)  # one replica per device
    backend.set_params(model, spec.init_params(args.seed))
    backend.seed(args.seed)  # dropout
    optimizer = backend.make_optimizer(model, OptimizerConfig(name="adam", lr=args.lr))
    loader = BatchLoader(data_train, args.batch_size * len(devices), seed=args.seed)
    names = ",".join(backend.device_name(d) for d in devices)
    print(f"{backend.name}: torch-dp-cnn on {names}, global batch {loader.batch_size}")

    steps = 0
    for epoch in range(args.epochs):
        print(f"Epoch {epoch}/{args.epochs}\n----------")
        running_loss, running_correct = 0.0, 0
        start = time.perf_counter()
        with loader.epoch(epoch) as batches:
            for x_train, y_train in batches:
                loss_sum, correct = train_step(backend, model, optimizer, x_train, y_train)
                running_loss += loss_sum
                running_correct += correct
                steps += 1
        test_acc = evaluate(backend, model, data_test)
        print(
            f"Loss is:{running_loss / len(data_train):.4f}, "
            f"Train Accuracy is:{100 * running_correct / len(data_train):.4f}%, "
            f"Test Accuracy is:{100 * test_acc:.4f} ({time.perf_counter() - start:.1f} s)"
        )

    out = Path(args.out or tempfile.mkdtemp(prefix="polytrain-dp-tutorial-"))
    out.mkdir(parents=True, exist_ok=True)
    native = out / f"model_parameter{backend.native_suffix}"
    backend.save_native(model, str(native))  # host memory, no "module." prefixes
    checkpoint = save_checkpoint(
        out / "checkpoint",
        params=backend.get_params(model),
        spec=spec,
        model_name=spec.name,
        backend=backend.name,
        framework_version=backend.version(),
        position={"epoch": args.epochs, "step": 0, "global_step": steps},
        seed=args.seed,
    )
    print(f"saved {native} and {checkpoint}")

    reload_devices = args.reload_devices or ("cpu" if len(devices) > 1 else "cpu:2")
    trained = evaluate(backend, model, data_test)
    for what, path in (("native", native), ("neutral", checkpoint)):
        again = backend.build_model(spec, backend.devices(reload_devices))
        if what == "native":
            backend.load_native(again, str(path))
        else:
            backend.set_params(again, load_checkpoint(path, spec=spec).params)
        acc = evaluate(backend, again, data_test)
        print(f"{what} state dict reloaded on {reload_devices}: test accuracy {100 * acc:.4f}")
        if acc != trained:
            print(f"MISMATCH: the trained model has {100 * trained:.4f}")
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
