"""The Paddle MNIST tutorial ("一个案例吃透深度学习", single-device part), on any backend.

The tutorial trains its CNN (conv 20 k5 p2, max-pool, conv 20 k5 p2, max-pool, dense 10)
under ``fluid.dygraph.guard(place)`` with one of four optimizers, prints the loss every
200 batches and saves the model with ``fluid.save_dygraph``. The same program here, with
each fluid call's polytrain equivalent beside it:

    python examples/paddle_mnist.py --backend paddle --optimizer sgd
    python examples/paddle_mnist.py --backend torch --optimizer adam --lr 0.001 --out runs/pm

The model is the built-in spec ``paddle-mnist`` (the tutorial's softmax is part of the
loss). MNIST's training files are not on every machine, so the default dataset is
Fashion-MNIST (same shape, harder); pass ``--dataset mnist`` where MNIST is installed
(``polytrain data mnist`` says where it looks). The saved file is the backend's own
format (.pdparams on Paddle, loadable by plain Paddle code); ``polytrain convert`` turns
it into the others.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from polytrain import OptimizerConfig, get_backend, get_model_spec
from polytrain.data import BatchLoader, load_dataset
from polytrain.neutral.optim import OPTIMIZERS


def main(argv: list[str] | None = None) -> dict[str, float]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--backend", default=None, help="torch, paddle or mxnet")
    p.add_argument("--optimizer", default="sgd", choices=OPTIMIZERS, help="the tutorial's four")
    p.add_argument("--lr", type=float, default=0.01, help="the tutorial uses 0.01 for all four")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=100)
    p.add_argument("--print-every", type=int, default=200, help="print the loss every N batches")
    p.add_argument("--dataset", default="fashion-mnist", help="fashion-mnist (default) or mnist")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--train-samples", type=int, default=None, help="use the first N samples")
    p.add_argument("--devices", default="cpu", help="cpu, gpu:0 (the tutorial's CUDAPlace(0))")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", default=".", help="directory for the saved model 'mnist.<suffix>'")
    args = p.parse_args(argv)

    # with fluid.dygraph.guard(place): -> a backend object and its device
    backend = get_backend(args.backend, threads=args.threads)
    devices = backend.devices(args.devices)
    spec = get_model_spec("paddle-mnist")
    model = backend.build_model(spec, devices)  # model = MNIST()
    backend.set_params(model, spec.init_params(seed=0))  # the same start on every backend
    # fluid.optimizer.SGDOptimizer / MomentumOptimizer / AdagradOptimizer / AdamOptimizer
    optimizer = backend.make_optimizer(model, OptimizerConfig(args.optimizer, lr=args.lr))

    data = load_dataset(args.dataset, "train", data_dir=args.data_dir)  # load_data('train')
    if args.train_samples:
        data = data.subset(min(args.train_samples, len(data)))
    train_loader = BatchLoader(data, args.batch_size, seed=0, prefetch=2)
    print(f"{backend.name} {backend.version()}: paddle-mnist on {args.dataset} "
          f"({len(data)} samples), {args.optimizer} lr {args.lr}")  # fmt: skip

    device = devices[0]
    last = float("nan")
    start = time.perf_counter()
    for epoch_id in range(args.epochs):
        for batch_id, (image_data, label_data) in enumerate(train_loader.epoch(epoch_id)):
            image = backend.to_tensor(image_data, device)  # fluid.dygraph.to_variable
            label = backend.to_tensor(label_data, device)
            optimizer.zero_grad()  # model.clear_gradients() (done before, not after)
            with backend.record():  # MXNet records only inside; a no-op elsewhere
                predict = backend.forward(model, image, train=True)  # predict = model(image)
                # fluid.layers.cross_entropy(softmax, label) + fluid.layers.mean: logits in
                avg_loss = backend.cross_entropy(predict, label, "mean")
            backend.backward(avg_loss)  # avg_loss.backward()
            optimizer.step()  # optimizer.minimize(avg_loss)
            if batch_id % args.print_every == 0:  # the only host copy of the loss
                last = float(backend.to_numpy(avg_loss))
                print(f"epoch: {epoch_id}, batch: {batch_id}, loss is: [{last:.6f}]")
    backend.synchronize()
    seconds = time.perf_counter() - start

    # fluid.save_dygraph(model.state_dict(), 'mnist') -> the backend's own file format
    path = Path(args.out) / f"mnist{backend.native_suffix}"
    backend.save_native(model, str(path))
    print(f"saved {path} ({seconds:.1f} s of training)")
    return {"loss": last, "seconds": seconds}


if __name__ == "__main__":
    main()
