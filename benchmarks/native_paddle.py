"""LeNet (or ResNet-18) on Fashion-MNIST written by hand, as a PaddlePaddle user would:
nn.Sequential, CrossEntropyLoss, paddle.optimizer.Momentum, ``float(loss)`` every step."""

from __future__ import annotations

from typing import Any

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


class Block(nn.Layer):
    """d2l's residual block: conv-BN-ReLU-conv-BN, plus a 1x1 conv shortcut where the shape
    changes, then ReLU."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2D(cin, cout, 3, stride, 1)
        self.bn1 = nn.BatchNorm2D(cout)
        self.conv2 = nn.Conv2D(cout, cout, 3, 1, 1)
        self.bn2 = nn.BatchNorm2D(cout)
        self.short = nn.Conv2D(cin, cout, 1, stride) if stride != 1 or cin != cout else None

    def forward(self, x: Any) -> Any:
        y = self.bn2(self.conv2(nn.functional.relu(self.bn1(self.conv1(x)))))
        return nn.functional.relu(y + (x if self.short is None else self.short(x)))


def resnet18() -> nn.Sequential:
    """The zoo's ResNet-18 (d2l: 3x3 stem, no max-pool, 64/128/256/512 stages of two
    blocks, global average pool, dense) for 1x28x28 inputs."""
    layers: list[nn.Layer] = [nn.Conv2D(1, 64, 3, 1, 1), nn.BatchNorm2D(64), nn.ReLU()]
    cin = 64
    for i, cout in enumerate((64, 128, 256, 512)):
        layers += [Block(cin, cout, 1 if i == 0 else 2), Block(cout, cout, 1)]
        cin = cout
    layers += [nn.AdaptiveAvgPool2D(1), nn.Flatten(), nn.Linear(512, 10)]
    return nn.Sequential(*layers)


MODELS = {"lenet": lenet, "resnet18": resnet18}


def load_weights(net: nn.Layer, work: Workload) -> None:
    """The spec's initial weights, in order (parameters and BatchNorm statistics alike)."""
    weights = initial_weights(work.seed, work.model)
    for tensor, w in zip(net.state_dict().values(), weights, strict=True):
        value = w.T if w.ndim == 2 else w  # Paddle's Linear weight is [in, out]
        assert tuple(tensor.shape) == value.shape, (tensor.shape, value.shape)
        tensor.set_value(np.ascontiguousarray(value))


def run(work: Workload, x: np.ndarray, y: np.ndarray) -> Measurement:
    net = MODELS[work.model]()
    load_weights(net, work)
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
