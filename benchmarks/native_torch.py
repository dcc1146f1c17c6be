"""LeNet on Fashion-MNIST written by hand, as a PyTorch user would: nn.Sequential,
CrossEntropyLoss, torch.optim.SGD with momentum, ``loss.item()`` every step."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from .common import Clock, Measurement, Workload, batches, initial_weights


def lenet() -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(1, 20, kernel_size=3), nn.ReLU(), nn.AvgPool2d(2, 2),
        nn.Conv2d(20, 50, kernel_size=5), nn.ReLU(), nn.AvgPool2d(2, 2),
        nn.Flatten(),
        nn.Linear(800, 128), nn.ReLU(),
        nn.Linear(128, 10),
    )  # fmt: skip


def run(work: Workload, x: np.ndarray, y: np.ndarray) -> Measurement:
    if work.threads:
        torch.set_num_threads(work.threads)
    net = lenet()
    with torch.no_grad():
        for p, w in zip(net.parameters(), initial_weights(work.seed), strict=True):
            p.copy_(torch.from_numpy(w))
    model = torch.compile(net) if work.fast else net
    optimizer = torch.optim.SGD(net.parameters(), lr=work.lr, momentum=work.momentum)
    loss_fn = nn.CrossEntropyLoss()
    autocast = work.precision == "bf16"
    clock = Clock(work)
    total_loss, correct = 0.0, 0
    net.train()
    for step, (xb, yb) in enumerate(batches(x, y, work)):
        inputs, labels = torch.from_numpy(xb), torch.from_numpy(yb)
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            outputs = model(inputs)
            loss = loss_fn(outputs, labels)
        loss.backward()
        optimizer.step()
        total_loss += loss.item() * len(labels)
        correct += (outputs.argmax(1) == labels).sum().item()
        clock.tick(step, lambda: None)  # CPU torch is synchronous
    return clock.measurement("native", loss.item())
