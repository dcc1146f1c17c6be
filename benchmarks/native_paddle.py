"""LeNet on Fashion-MNIST written by hand, as a PaddlePaddle user would: nn.Sequential,
CrossEntropyLoss, paddle.optimizer.Momentum, ``float(loss)`` every step."""

from __future__ import annotations

import numpy as np
import paddle
from paddle import nn

from .common import Clock, Measurement, Workload, batches, initial_weights


def lenet() -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2D(1, 20, kernel_size=3), nn.ReLU(), nn.AvgPool2D(2, 2),
        nn.Conv2D(20, 50, kernel_size=5), nn.ReLU(), nn.AvgPool2D(2, 2),
        nn.Flatten(),
        nn.Linear(800, 128), nn.ReLU(),
        nn.Linear(128, 10),
    )  # fmt: skip


def run(work: Workload, x: np.ndarray, y: np.ndarray) -> Measurement:
    net = lenet()
    for p, w in zip(net.parameters(), initial_weights(work.seed), strict=True):
        p.set_value(w.T if w.ndim == 2 else w)  # Paddle's Linear weight is [in, out]
    model = paddle.jit.to_static(net, full_graph=True) if work.fast else net
    optimizer = paddle.optimizer.Momentum(
        learning_rate=work.lr, momentum=work.momentum, parameters=net.parameters()
    )
    loss_fn = nn.CrossEntropyLoss()
    clock = Clock(work)
    total_loss, correct = 0.0, 0
    model.train()
    for step, (xb, yb) in enumerate(batches(x, y, work)):
        images, labels = paddle.to_tensor(xb), paddle.to_tensor(yb)
        logits = model(images)
        loss = loss_fn(logits, labels)
        loss.backward()
        optimizer.step()
        optimizer.clear_grad()
        total_loss += float(loss) * len(yb)
        correct += int((logits.argmax(axis=1) == labels).sum())
        clock.tick(step, lambda: None)  # float(loss) already waited
    return clock.measurement("native", float(loss))
