"""PyTorch twins of other frameworks' models, written here so that polytrain is never
the author of both sides of a port."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn as tnn


class BasicBlock(tnn.Module):
    """torchvision.models.resnet.BasicBlock."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = tnn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = tnn.BatchNorm2d(cout)
        self.relu = tnn.ReLU()
        self.conv2 = tnn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = tnn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = tnn.Sequential(
                tnn.Conv2d(cin, cout, 1, stride, bias=False), tnn.BatchNorm2d(cout)
            )

    def forward(self, x: Any) -> Any:
        out = self.bn2(self.conv2(self.relu(self.bn1(self.conv1(x)))))
        return self.relu(out + (x if self.downsample is None else self.downsample(x)))


class ResNet18(tnn.Module):
    """torchvision.models.resnet18(): the same attributes, so the same state-dict names."""

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.conv1 = tnn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = tnn.BatchNorm2d(64)
        self.relu = tnn.ReLU()
        self.maxpool = tnn.MaxPool2d(3, 2, 1)
        widths = [(64, 64, 1), (64, 128, 2), (128, 256, 2), (256, 512, 2)]
        for i, (cin, cout, stride) in enumerate(widths, start=1):
            blocks = tnn.Sequential(BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1))
            setattr(self, f"layer{i}", blocks)
        self.avgpool = tnn.AdaptiveAvgPool2d(1)
        self.fc = tnn.Linear(512, num_classes)

    def forward(self, x: Any) -> Any:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        for i in range(1, 5):
            x = getattr(self, f"layer{i}")(x)
        return self.fc(torch.flatten(self.avgpool(x), 1))


class Fire(tnn.Module):
    """torchvision.models.squeezenet.Fire: squeeze 1x1, then 1x1 and 3x3 expansions joined."""

    def __init__(self, cin: int, squeeze: int, expand: int) -> None:
        super().__init__()
        self.squeeze = tnn.Conv2d(cin, squeeze, 1)
        self.squeeze_activation = tnn.ReLU()
        self.expand1x1 = tnn.Conv2d(squeeze, expand, 1)
        self.expand1x1_activation = tnn.ReLU()
        self.expand3x3 = tnn.Conv2d(squeeze, expand, 3, padding=1)
        self.expand3x3_activation = tnn.ReLU()

    def forward(self, x: Any) -> Any:
        x = self.squeeze_activation(self.squeeze(x))
        ones = self.expand1x1_activation(self.expand1x1(x))
        return torch.cat([ones, self.expand3x3_activation(self.expand3x3(x))], 1)


class SqueezeNet11(tnn.Module):
    """torchvision.models.squeezenet1_1(): the same attributes, so the same state-dict names."""

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        pool = {"kernel_size": 3, "stride": 2, "ceil_mode": True}
        self.features = tnn.Sequential(
            tnn.Conv2d(3, 64, 3, stride=2), tnn.ReLU(), tnn.MaxPool2d(**pool),
            Fire(64, 16, 64), Fire(128, 16, 64), tnn.MaxPool2d(**pool),
            Fire(128, 32, 128), Fire(256, 32, 128), tnn.MaxPool2d(**pool),
            Fire(256, 48, 192), Fire(384, 48, 192), Fire(384, 64, 256), Fire(512, 64, 256),
        )  # fmt: skip
        self.classifier = tnn.Sequential(
            tnn.Dropout(0.5), tnn.Conv2d(512, num_classes, 1), tnn.ReLU(), tnn.AdaptiveAvgPool2d(1)
        )

    def forward(self, x: Any) -> Any:
        return torch.flatten(self.classifier(self.features(x)), 1)
