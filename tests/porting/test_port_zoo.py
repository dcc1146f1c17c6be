"""polytrain port on more of Paddle's and Gluon's own model zoos (AlexNet with several
Linear/Dense layers and Dropout, MobileNet with depthwise convolutions) into PyTorch twins
written here as a PyTorch user would, verified layer by layer."""

from __future__ import annotations

import json
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from port_helpers import check_port, gluon_randomize_bn  # noqa: E402
from torch import nn as tnn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from polytrain import port  # noqa: E402
from polytrain.cli.main import main  # noqa: E402

# -- PyTorch twins, written from the source models' definitions -----------------------------


class InferScaledDropout(tnn.Module):
    """Paddle's ``Dropout(mode="downscale_in_infer")``: no rescaling while training, scaled
    by 1 - p in eval (``torch.nn.Dropout`` rescales while training instead)."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: Any) -> Any:
        return F.dropout(x, self.p, self.training) * (1 - self.p)


class TorchPaddleAlexNet(tnn.Module):
    """paddle.vision.models.AlexNet: five convolutions, then three Linear layers."""

    def __init__(self, num_classes: int = 10, dropout: type[tnn.Module] = InferScaledDropout):
        super().__init__()
        self.features = tnn.Sequential(
            tnn.Conv2d(3, 64, 11, 4, 2), tnn.ReLU(), tnn.MaxPool2d(3, 2),
            tnn.Conv2d(64, 192, 5, 1, 2), tnn.ReLU(), tnn.MaxPool2d(3, 2),
            tnn.Conv2d(192, 384, 3, 1, 1), tnn.ReLU(),
            tnn.Conv2d(384, 256, 3, 1, 1), tnn.ReLU(),
            tnn.Conv2d(256, 256, 3, 1, 1), tnn.ReLU(), tnn.MaxPool2d(3, 2),
        )  # fmt: skip
        self.classifier = tnn.Sequential(
            dropout(0.5), tnn.Linear(256 * 6 * 6, 4096), tnn.ReLU(),
            dropout(0.5), tnn.Linear(4096, 4096), tnn.ReLU(),
            tnn.Linear(4096, num_classes),
        )  # fmt: skip

    def forward(self, x: Any) -> Any:
        return self.classifier(torch.flatten(self.features(x), 1))


class TorchGluonAlexNet(tnn.Module):
    """gluon.model_zoo.vision.AlexNet for 64x64 inputs (256 features after the last pool)."""

    def __init__(self, classes: int = 10, in_features: int = 256) -> None:
        super().__init__()
        self.features = tnn.Sequential(
            tnn.Conv2d(3, 64, 11, 4, 2), tnn.ReLU(), tnn.MaxPool2d(3, 2),
            tnn.Conv2d(64, 192, 5, padding=2), tnn.ReLU(), tnn.MaxPool2d(3, 2),
            tnn.Conv2d(192, 384, 3, padding=1), tnn.ReLU(),
            tnn.Conv2d(384, 256, 3, padding=1), tnn.ReLU(),
            tnn.Conv2d(256, 256, 3, padding=1), tnn.ReLU(), tnn.MaxPool2d(3, 2),
            tnn.Flatten(),
            tnn.Linear(in_features, 4096), tnn.ReLU(), tnn.Dropout(0.5),
            tnn.Linear(4096, 4096), tnn.ReLU(), tnn.Dropout(0.5),
        )  # fmt: skip
        self.output = tnn.Linear(4096, classes)

    def forward(self, x: Any) -> Any:
        return self.output(self.features(x))


def _conv_bn(cin: int, cout: int, k: int, stride: int = 1, groups: int = 1) -> list[Any]:
    return [
        tnn.Conv2d(cin, cout, k, stride, (k - 1) // 2, groups=groups, bias=False),
        tnn.BatchNorm2d(cout),
    ]


class TorchGluonMobileNet(tnn.Module):
    """gluon.model_zoo.vision.mobilenet1_0: depthwise 3x3 then pointwise 1x1, 13 times."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        layers = [*_conv_bn(3, 32, 3, 2), tnn.ReLU()]
        dw_channels = [32, 64, 128, 128, 256, 256] + [512] * 6 + [1024]
        channels = [64, 128, 128, 256, 256] + [512] * 6 + [1024, 1024]
        strides = [1, 2] * 3 + [1] * 5 + [2, 1]
        for dwc, c, s in zip(dw_channels, channels, strides, strict=True):
            layers += [*_conv_bn(dwc, dwc, 3, s, groups=dwc), tnn.ReLU()]
            layers += [*_conv_bn(dwc, c, 1), tnn.ReLU()]
        self.features = tnn.Sequential(*layers, tnn.AdaptiveAvgPool2d(1), tnn.Flatten())
        self.output = tnn.Linear(1024, classes)

    def forward(self, x: Any) -> Any:
        return self.output(self.features(x))


class TorchLinearBottleneck(tnn.Module):
    """Gluon's LinearBottleneck: expand 1x1 (also when t is 1), depthwise 3x3, project 1x1."""

    def __init__(self, cin: int, cout: int, t: int, stride: int) -> None:
        super().__init__()
        hidden = cin * t
        self.use_shortcut = stride == 1 and cin == cout
        self.out = tnn.Sequential(
            *_conv_bn(cin, hidden, 1), tnn.ReLU6(),
            *_conv_bn(hidden, hidden, 3, stride, groups=hidden), tnn.ReLU6(),
            *_conv_bn(hidden, cout, 1),
        )  # fmt: skip

    def forward(self, x: Any) -> Any:
        return self.out(x) + x if self.use_shortcut else self.out(x)


class TorchGluonMobileNetV2(tnn.Module):
    """gluon.model_zoo.vision.mobilenet_v2_1_0: its classifier is a 1x1 convolution."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        ins = [32, 16, 24, 24, 32, 32, 32] + [64] * 4 + [96] * 3 + [160] * 3
        outs = [16, 24, 24, 32, 32, 32] + [64] * 4 + [96] * 3 + [160] * 3 + [320]
        ts = [1] + [6] * 16
        strides = [1, 2] * 2 + [1, 1, 2] + [1] * 6 + [2] + [1] * 3
        blocks = [
            TorchLinearBottleneck(i, o, t, s)
            for i, o, t, s in zip(ins, outs, ts, strides, strict=True)
        ]
        self.features = tnn.Sequential(
            *_conv_bn(3, 32, 3, 2), tnn.ReLU6(), *blocks,
            *_conv_bn(320, 1280, 1), tnn.ReLU6(), tnn.AdaptiveAvgPool2d(1),
        )  # fmt: skip
        self.output = tnn.Sequential(tnn.Conv2d(1280, classes, 1, bias=False), tnn.Flatten())

    def forward(self, x: Any) -> Any:
        return self.output(self.features(x))


# -- source models ----------------------------------------------------------------------------


def gluon_zoo(name: str, input_shape: tuple[int, ...]) -> Any:
    """A Gluon model-zoo model with 10 classes, Xavier weights, real BatchNorm statistics and
    its deferred shapes set by one call on ``input_shape``."""
    mx = pytest.importorskip("mxnet")
    from mxnet.gluon.model_zoo import vision

    model = vision.get_model(name, classes=10)
    model.initialize(mx.init.Xavier())
    model(mx.nd.zeros(input_shape))
    return gluon_randomize_bn(model)


def gluon_alexnet() -> Any:
    """For the command below: ``test_port_zoo:gluon_alexnet``."""
    return gluon_zoo("alexnet", (1, 3, 64, 64))


# -- Paddle's model zoo -----------------------------------------------------------------------


@pytest.mark.slow
def test_paddle_alexnet_several_linear_layers_and_dropout() -> None:
    vision = pytest.importorskip("paddle.vision.models")
    source = vision.alexnet(num_classes=10)  # its flatten needs 6x6 maps: 224x224 inputs
    result = port(source, TorchPaddleAlexNet(), input_shape=(1, 3, 224, 224))
    check_port(result, "alexnet")
    assert [p.target.kind for p in result.pairs].count("Linear") == 3
    assert result.name_map["classifier.4.weight"] == {
        "native": "_fc7.weight",
        "transpose": True,
        "shape": [4096, 4096],
    }


@pytest.mark.slow
def test_a_twin_with_torch_dropout_fails_at_the_first_linear_after_it() -> None:
    """Paddle's AlexNet scales by 1 - p in eval: a twin with torch's Dropout is off by 2x."""
    vision = pytest.importorskip("paddle.vision.models")
    source = vision.alexnet(num_classes=10)
    target = TorchPaddleAlexNet(dropout=tnn.Dropout)
    result = port(source, target, input_shape=(1, 3, 224, 224))
    first = result.verification.first_failure
    assert first is not None and first.layer == "classifier.1", result.format()
    assert any("downscale_in_infer" in note and "_drop1" in note for note in result.notes)
    assert "downscale_in_infer" in result.format()


# -- Gluon's model zoo ------------------------------------------------------------------------


@pytest.mark.slow
def test_gluon_alexnet_several_dense_layers_with_fused_relu() -> None:
    source = gluon_zoo("alexnet", (1, 3, 64, 64))
    result = port(source, TorchGluonAlexNet(), input_shape=(2, 3, 64, 64))
    check_port(result, "alexnet")
    assert [p.target.kind for p in result.pairs].count("Linear") == 3
    # Gluon's Conv2D(activation="relu") is compared before its activation, as torch's is
    rows = {row.layer: row for row in result.verification.rows}
    assert rows["features.0"].ok and rows["features.14"].ok


def test_gluon_mobilenet_with_depthwise_convolutions() -> None:
    source = gluon_zoo("mobilenet1.0", (1, 3, 64, 64))
    result = port(source, TorchGluonMobileNet(), input_shape=(2, 3, 64, 64))
    check_port(result, "mobilenet1.0")
    assert sum(p.target.groups > 1 for p in result.pairs) == 13


def test_gluon_mobilenet_v2_classifier_convolution() -> None:
    source = gluon_zoo("mobilenetv2_1.0", (1, 3, 64, 64))
    result = port(source, TorchGluonMobileNetV2(), input_shape=(2, 3, 64, 64))
    check_port(result, "mobilenetv2_1.0")
    assert sum(p.target.groups > 1 for p in result.pairs) == 17


@pytest.mark.slow
def test_the_port_command_prints_the_map_of_a_zoo_model(capsys: Any) -> None:
    pytest.importorskip("mxnet")
    code = main([
        "port", "test_port_zoo:gluon_alexnet", "test_port_zoo:TorchGluonAlexNet",
        "--print-map", "--input-shape", "1,3,64,64",
    ])  # fmt: skip
    captured = capsys.readouterr()
    assert code == 0, captured.err
    printed = json.loads(captured.out)["mxnet"]
    assert len(printed) == 16  # 5 convolutions and 3 Dense layers, weight and bias each
    assert printed["output.weight"] == {
        "native": "output.weight",
        "transpose": False,
        "shape": [10, 4096],
    }
    assert "verified" in captured.err
