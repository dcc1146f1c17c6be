"""LeNet and ResNet-18 trained by hand on one torch device (a GPU), as a PyTorch user
would: ``nn.Module``, CrossEntropyLoss, torch.optim.SGD with momentum, ``torch.autocast``
for bf16, ``loss.item()`` every step. The yardstick of ``scripts/gpu-check``'s benchmark.

Both models start from polytrain's numpy initial weights (``spec.init_params(seed)``),
loaded by position into the module's state (same order and shapes), and see the same
batches in the same order as polytrain's loop, so their losses are comparable.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from polytrain.neutral.models import get_model_spec

from .common import Clock, Measurement, Workload, batches
from .native_torch import lenet


class Residual(nn.Module):
    """d2l's residual block: two 3x3 convolutions with BatchNorm, a 1x1 shortcut when the
    shape changes."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(cout)
        self.conv3 = nn.Conv2d(cin, cout, 1, stride=stride) if stride != 1 or cin != cout else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        return F.relu(y + (x if self.conv3 is None else self.conv3(x)))


def resnet18() -> nn.Sequential:
    """d2l's ResNet-18 of the multi-GPU chapter (3x3 stem, no max-pool), for 28x28 input."""
    layers: list[nn.Module] = [nn.Conv2d(1, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU()]
    cin = 64
    for i, cout in enumerate((64, 128, 256, 512)):
        stride = 1 if i == 0 else 2
        layers += [Residual(cin, cout, stride), Residual(cout, cout, 1)]
        cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, 10)]
    return nn.Sequential(*layers)


NETS = {"lenet": lenet, "resnet18": resnet18}


def build(model: str, seed: int) -> nn.Module:
    """The hand-written module of ``model`` with polytrain's initial weights of ``seed``."""
    net = NETS[model]()
    weights = get_model_spec(model).init_params(seed)
    state = {k: t for k, t in net.state_dict().items() if not k.endswith("num_batches_tracked")}
    ours = [(k.rsplit(".", 1)[1], tuple(t.shape)) for k, t in state.items()]
    if ours != [(k.rsplit(".", 1)[1], w.shape) for k, w in weights.items()]:
        raise ValueError(f"the native {model} does not have the spec's tensors in its order")
    with torch.no_grad():
        for tensor, w in zip(state.values(), weights.values(), strict=True):
            tensor.copy_(torch.from_numpy(w))
    return net


def run(work: Workload, model: str, device: str, x: np.ndarray, y: np.ndarray) -> Measurement:
    """Time ``work`` on the torch ``device`` (e.g. ``cuda:0``)."""
    dev = torch.device(device)
    net = build(model, work.seed).to(dev)
    step_fn = torch.compile(net) if work.fast else net
    optimizer = torch.optim.SGD(net.parameters(), lr=work.lr, momentum=work.momentum)
    loss_fn = nn.CrossEntropyLoss()
    low = work.precision == "bf16"

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    clock = Clock(work)
    net.train()
    loss = torch.zeros(())
    for step, (xb, yb) in enumerate(batches(x, y, work)):
        inputs, labels = torch.from_numpy(xb).to(dev), torch.from_numpy(yb).to(dev)
        optimizer.zero_grad()
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=low):
            outputs = step_fn(inputs)
            loss = loss_fn(outputs, labels)
        loss.backward()
        optimizer.step()
        loss.item()
        (outputs.argmax(1) == labels).sum().item()
        clock.tick(step, sync)
    return clock.measurement("native", loss.item())


def train_flops_per_sample(model: str, device: str) -> float:
    """FLOPs of one training sample (forward and backward of the convolutions and dense
    layers, as torch's own FlopCounterMode counts them; no input gradient of the images),
    from one step on a batch of 2."""
    from torch.utils.flop_counter import FlopCounterMode

    net = build(model, 0).to(device)
    x = torch.zeros(2, 1, 28, 28, device=device)
    with FlopCounterMode(display=False) as counter:
        F.cross_entropy(net(x), torch.zeros(2, dtype=torch.long, device=device)).backward()
    return counter.get_total_flops() / 2
