"""LeNet on Fashion-MNIST written by hand, as an MXNet Gluon user would: HybridSequential
(hybridized when ``fast``), SoftmaxCrossEntropyLoss, gluon.Trainer with sgd+momentum,
``asscalar()`` of the loss every step (the Gluon tutorials' metric updates)."""

from __future__ import annotations

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon
from mxnet.gluon import nn

from .common import Clock, Measurement, Workload, batches, initial_weights


def lenet() -> nn.HybridSequential:
    net = nn.HybridSequential()
    net.add(
        nn.Conv2D(20, kernel_size=3, activation="relu", in_channels=1), nn.AvgPool2D(2, 2),
        nn.Conv2D(50, kernel_size=5, activation="relu", in_channels=20), nn.AvgPool2D(2, 2),
        nn.Dense(128, activation="relu", in_units=800),
        nn.Dense(10, in_units=128),
    )  # fmt: skip
    return net


def run(work: Workload, x: np.ndarray, y: np.ndarray) -> Measurement:
    ctx = mx.cpu()
    net = lenet()
    net.initialize(ctx=ctx)
    for p, w in zip(net.collect_params().values(), initial_weights(work.seed), strict=True):
        p.set_data(mx.nd.array(w))
    if work.fast:
        net.hybridize(static_alloc=True, static_shape=True)
    trainer = gluon.Trainer(
        net.collect_params(), "sgd", {"learning_rate": work.lr, "momentum": work.momentum}
    )
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    clock = Clock(work)
    total_loss, correct = 0.0, 0.0
    for step, (xb, yb) in enumerate(batches(x, y, work)):
        data = mx.nd.array(xb, ctx=ctx)
        label = mx.nd.array(yb, ctx=ctx)
        with autograd.record():
            output = net(data)
            loss = loss_fn(output, label)
        loss.backward()
        trainer.step(len(yb))
        total_loss += loss.sum().asscalar()
        correct += (output.argmax(axis=1) == label).sum().asscalar()
        clock.tick(step, mx.nd.waitall)
    return clock.measurement("native", float(loss.mean().asscalar()))
