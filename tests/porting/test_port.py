"""polytrain port: models from Paddle's and Gluon's own zoos (or written here) into PyTorch
twins written here, matched from the objects and verified layer by layer."""

from __future__ import annotations

import itertools
import json
import textwrap
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
tnn = torch.nn

from port_helpers import RNG, check_port, gluon_randomize_bn, paddle_randomize_bn  # noqa: E402
from torch_twins import ResNet18  # noqa: E402

from polytrain import port  # noqa: E402
from polytrain.cli.main import main  # noqa: E402
from polytrain.errors import ConfigError  # noqa: E402

NAMES = itertools.count()  # Paddle refuses a parameter name used twice in one process


# -- PyTorch twins, written from the source models' definitions -----------------------------


class TorchLeNet(tnn.Module):
    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.features = tnn.Sequential(
            tnn.Conv2d(1, 6, 3, 1, 1), tnn.ReLU(), tnn.MaxPool2d(2, 2),
            tnn.Conv2d(6, 16, 5), tnn.ReLU(), tnn.MaxPool2d(2, 2),
        )  # fmt: skip
        self.fc = tnn.Sequential(
            tnn.Linear(400, 120), tnn.Linear(120, 84), tnn.Linear(84, num_classes)
        )

    def forward(self, x: Any) -> Any:
        return self.fc(torch.flatten(self.features(x), 1))


def _cna(cin: int, cout: int, k: int = 3, stride: int = 1, groups: int = 1) -> Any:
    return tnn.Sequential(
        tnn.Conv2d(cin, cout, k, stride, (k - 1) // 2, groups=groups, bias=False),
        tnn.BatchNorm2d(cout),
        tnn.ReLU6(),
    )


class TorchInvertedResidual(tnn.Module):
    def __init__(self, inp: int, oup: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden = round(inp * expand)
        self.use_res = stride == 1 and inp == oup
        layers = [_cna(inp, hidden, 1)] if expand != 1 else []
        layers += [
            _cna(hidden, hidden, 3, stride, groups=hidden),  # depthwise
            tnn.Conv2d(hidden, oup, 1, 1, 0, bias=False),
            tnn.BatchNorm2d(oup),
        ]
        self.conv = tnn.Sequential(*layers)

    def forward(self, x: Any) -> Any:
        return x + self.conv(x) if self.use_res else self.conv(x)


class TorchMobileNetV2(tnn.Module):
    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        features = [_cna(3, 32, stride=2)]
        cin = 32
        for t, c, n, s in [
            [1, 16, 1, 1], [6, 24, 2, 2], [6, 32, 3, 2], [6, 64, 4, 2],
            [6, 96, 3, 1], [6, 160, 3, 2], [6, 320, 1, 1],
        ]:  # fmt: skip
            for i in range(n):
                features.append(TorchInvertedResidual(cin, c, s if i == 0 else 1, t))
                cin = c
        features.append(_cna(cin, 1280, 1))
        self.features = tnn.Sequential(*features)
        self.pool2d_avg = tnn.AdaptiveAvgPool2d(1)
        self.classifier = tnn.Sequential(tnn.Dropout(0.2), tnn.Linear(1280, num_classes))

    def forward(self, x: Any) -> Any:
        return self.classifier(torch.flatten(self.pool2d_avg(self.features(x)), 1))


class TorchGluonBlock(tnn.Module):
    """Gluon's BasicBlockV1: body, then downsample."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.body = tnn.Sequential(
            tnn.Conv2d(cin, cout, 3, stride, 1, bias=False), tnn.BatchNorm2d(cout), tnn.ReLU(),
            tnn.Conv2d(cout, cout, 3, 1, 1, bias=False), tnn.BatchNorm2d(cout),
        )  # fmt: skip
        self.downsample = None
        if cin != cout:
            self.downsample = tnn.Sequential(
                tnn.Conv2d(cin, cout, 1, stride, bias=False), tnn.BatchNorm2d(cout)
            )

    def forward(self, x: Any) -> Any:
        residual = x if self.downsample is None else self.downsample(x)
        return torch.relu(self.body(x) + residual)


class TorchGluonResNet18(tnn.Module):
    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        stages = []
        cin = 64
        for i, cout in enumerate((64, 128, 256, 512)):
            stride = 1 if i == 0 else 2
            stages.append(
                tnn.Sequential(TorchGluonBlock(cin, cout, stride), TorchGluonBlock(cout, cout, 1))
            )
            cin = cout
        self.features = tnn.Sequential(
            tnn.Conv2d(3, 64, 7, 2, 3, bias=False), tnn.BatchNorm2d(64), tnn.ReLU(),
            tnn.MaxPool2d(3, 2, 1), *stages, tnn.AdaptiveAvgPool2d(1),
        )  # fmt: skip
        self.output = tnn.Linear(512, classes)

    def forward(self, x: Any) -> Any:
        return self.output(torch.flatten(self.features(x), 1))


class TorchMLP(tnn.Module):
    def __init__(self, swapped: bool = False) -> None:
        super().__init__()
        self.fc1 = tnn.Linear(64, 64)
        self.fc2 = tnn.Linear(64, 64)
        self.head = tnn.Linear(64, 10)
        self.swapped = swapped

    def forward(self, x: Any) -> Any:
        first, second = (self.fc2, self.fc1) if self.swapped else (self.fc1, self.fc2)
        return self.head(torch.relu(second(torch.relu(first(x)))))


# -- helpers --------------------------------------------------------------------------------


def _paddle_mlp() -> Any:
    import paddle

    class PaddleMLP(paddle.nn.Layer):
        def __init__(self) -> None:
            super().__init__()
            # user-named parameters: the names say nothing of the layout
            self.fc1 = paddle.nn.Linear(
                64, 64, weight_attr=paddle.ParamAttr(name=f"fc_{next(NAMES)}.w_0")
            )
            self.fc2 = paddle.nn.Linear(
                64, 64, weight_attr=paddle.ParamAttr(name=f"proj_w{next(NAMES)}")
            )
            self.head = paddle.nn.Linear(64, 10)

        def forward(self, x: Any) -> Any:
            relu = paddle.nn.functional.relu
            return self.head(relu(self.fc2(relu(self.fc1(x)))))

    return PaddleMLP()


# -- Paddle's model zoo -----------------------------------------------------------------------


def test_paddle_lenet_to_a_torch_twin(tmp_path: Any) -> None:
    vision = pytest.importorskip("paddle.vision.models")
    target = TorchLeNet()
    result = port(
        vision.LeNet(), target, input_shape=(2, 1, 28, 28), out=tmp_path / "lenet.pt",
        map_out=tmp_path / "map.json", report_out=tmp_path / "report.json",
    )  # fmt: skip
    check_port(result, "LeNet")
    saved = torch.load(tmp_path / "lenet.pt", weights_only=True)
    assert torch.equal(saved["fc.0.weight"], target.fc[0].weight.detach())
    mapped = json.loads((tmp_path / "map.json").read_text())["paddle"]
    assert mapped["fc.0.weight"] == {
        "native": "fc.0.weight",
        "transpose": True,
        "shape": [120, 400],
    }
    assert json.loads((tmp_path / "report.json").read_text())["verification"]["passed"]


@pytest.mark.slow
def test_paddle_resnet18_to_a_torch_twin() -> None:
    vision = pytest.importorskip("paddle.vision.models")
    source = paddle_randomize_bn(vision.resnet18(num_classes=10))
    result = port(source, ResNet18(num_classes=10), input_shape=(2, 3, 64, 64))
    check_port(result, "resnet18")
    assert "layer4.1.bn2.num_batches_tracked" in result.kept
    assert result.name_map["bn1.running_var"]["native"] == "bn1._variance"


def test_paddle_mobilenet_v2_with_depthwise_convolutions() -> None:
    vision = pytest.importorskip("paddle.vision.models")
    source = paddle_randomize_bn(vision.mobilenet_v2(num_classes=10))
    result = port(source, TorchMobileNetV2(), input_shape=(2, 3, 64, 64))
    check_port(result, "mobilenet_v2")
    assert any(p.target.groups > 1 for p in result.pairs)


def test_a_square_user_named_linear_is_transposed_from_the_object() -> None:
    pytest.importorskip("paddle")
    source, target = _paddle_mlp(), TorchMLP()
    result = port(source, target, input_shape=(4, 64))
    check_port(result)
    np.testing.assert_array_equal(target.fc1.weight.detach().numpy(), source.fc1.weight.numpy().T)
    assert result.name_map["fc1.weight"]["transpose"] is True


def test_a_swapped_twin_fails_verification_and_names_the_layer(tmp_path: Any) -> None:
    pytest.importorskip("paddle")
    result = port(_paddle_mlp(), TorchMLP(swapped=True), input_shape=(4, 64), out=tmp_path / "x.pt")
    assert not result.passed
    first = result.verification.first_failure
    assert first is not None and first.layer == "fc2"
    assert "FAILED: first layer beyond 0.0001: fc2" in result.format()
    assert not (tmp_path / "x.pt").exists()


def test_layers_out_of_order_stop_with_a_hint_and_hints_resolve_them() -> None:
    pytest.importorskip("paddle")

    class HeadFirst(tnn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.head = tnn.Linear(64, 10)
            self.fc1 = tnn.Linear(64, 64)
            self.fc2 = tnn.Linear(64, 64)

        def forward(self, x: Any) -> Any:
            return self.head(torch.relu(self.fc2(torch.relu(self.fc1(x)))))

    with pytest.raises(ConfigError, match=r"'fc1' and target 'head'.*SOURCE_LAYER=TARGET_LAYER"):
        port(_paddle_mlp(), HeadFirst(), input_shape=(4, 64))
    result = port(_paddle_mlp(), HeadFirst(), input_shape=(4, 64), hints={"head": "head"})
    check_port(result)
    with pytest.raises(ConfigError, match="did you mean head"):
        port(_paddle_mlp(), HeadFirst(), input_shape=(4, 64), hints={"haed": "head"})


# -- Gluon ------------------------------------------------------------------------------------


@pytest.mark.slow
def test_gluon_model_zoo_resnet18_to_a_torch_twin() -> None:
    mx = pytest.importorskip("mxnet")
    from mxnet.gluon.model_zoo import vision

    source = vision.resnet18_v1(classes=10)
    source.initialize(mx.init.Xavier())
    source(mx.nd.zeros((1, 3, 64, 64)))  # Gluon sets deferred shapes on the first call
    gluon_randomize_bn(source)
    result = port(source, TorchGluonResNet18(), input_shape=(2, 3, 64, 64))
    check_port(result, "resnet18_v1")
    assert result.name_map["features.1.weight"]["native"] == "features.1.gamma"


def test_gluon_dense_layers_to_a_torch_twin() -> None:
    mx = pytest.importorskip("mxnet")
    from mxnet.gluon import nn

    class GluonMLP(nn.Block):
        def __init__(self) -> None:
            super().__init__()
            with self.name_scope():
                self.fc1 = nn.Dense(64, in_units=64)
                self.fc2 = nn.Dense(64, in_units=64)
                self.head = nn.Dense(10, in_units=64)

        def forward(self, x: Any) -> Any:
            return self.head(mx.nd.relu(self.fc2(mx.nd.relu(self.fc1(x)))))

    source = GluonMLP()
    source.initialize(mx.init.Xavier())
    target = TorchMLP()
    check_port(port(source, target, input_shape=(4, 64)))
    np.testing.assert_array_equal(
        target.fc2.weight.detach().numpy(), source.fc2.weight.data().asnumpy()
    )
    assert not port(source, TorchMLP(swapped=True), input_shape=(4, 64)).passed


# -- the command ------------------------------------------------------------------------------

MODELS = """
import itertools
import paddle
import torch

NAMES = itertools.count()

def paddle_mlp():
    class PaddleMLP(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            attr = paddle.ParamAttr(name=f"w_a{next(NAMES)}")
            self.fc1 = paddle.nn.Linear(64, 64, weight_attr=attr)
            self.fc2 = paddle.nn.Linear(64, 64)
        def forward(self, x):
            return self.fc2(paddle.nn.functional.relu(self.fc1(x)))
    return PaddleMLP()

class TorchMLP(torch.nn.Module):
    def __init__(self, swapped=False):
        super().__init__()
        self.fc1 = torch.nn.Linear(64, 64)
        self.fc2 = torch.nn.Linear(64, 64)
        self.swapped = swapped
    def forward(self, x):
        a, b = (self.fc2, self.fc1) if self.swapped else (self.fc1, self.fc2)
        return b(torch.relu(a(x)))

def torch_swapped():
    return TorchMLP(swapped=True)
"""


def test_the_port_command(tmp_path: Any, monkeypatch: Any, capsys: Any) -> None:
    paddle = pytest.importorskip("paddle")
    (tmp_path / "portmodels.py").write_text(textwrap.dedent(MODELS))
    monkeypatch.syspath_prepend(str(tmp_path))
    import portmodels  # type: ignore[import-not-found]

    source = portmodels.paddle_mlp()
    paddle.save(source.state_dict(), str(tmp_path / "mlp.pdparams"))
    common = ["--weights", str(tmp_path / "mlp.pdparams"), "--input-shape", "3,64"]
    code = main([
        "port", "portmodels:paddle_mlp", "portmodels:TorchMLP", str(tmp_path / "mlp.pt"),
        *common, "--map-out", str(tmp_path / "map.json"), "--report", str(tmp_path / "r.json"),
    ])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0, out
    assert "verified" in out and "wrote" in out
    saved = torch.load(tmp_path / "mlp.pt", weights_only=True)
    np.testing.assert_array_equal(saved["fc1.weight"].numpy(), source.fc1.weight.numpy().T)

    code = main(
        [
            "port",
            "portmodels:paddle_mlp",
            "portmodels:torch_swapped",
            str(tmp_path / "x.pt"),
            *common,
        ]
    )
    assert code == 1
    assert "first layer beyond 0.0001: fc2" in capsys.readouterr().out

    code = main(["port", "portmodels:paddle_mlp", "portmodels:TorchMLP", "--print-map", *common])
    printed = capsys.readouterr().out
    assert code == 0 and json.loads(printed)["paddle"]["fc1.weight"]["transpose"] is True

    np.save(tmp_path / "batch.npy", RNG.standard_normal((5, 64)).astype("float32"))
    (tmp_path / "hints.json").write_text(json.dumps({"fc2": "fc2"}))
    code = main([
        "port", "portmodels:paddle_mlp", "portmodels:TorchMLP", str(tmp_path / "b.pt"),
        "--input", str(tmp_path / "batch.npy"), "--hints", str(tmp_path / "hints.json"),
    ])  # fmt: skip
    assert code == 0 and "fc1       fc1           5x64" in capsys.readouterr().out
    assert main(["port", "portmodels:nothing", "portmodels:TorchMLP", "--print-map"]) == 2
    assert "portmodels has no 'nothing'" in capsys.readouterr().err

    # the derived map converts the .pdparams file alone to the same weights
    code = main([
        "convert", str(tmp_path / "mlp.pdparams"), str(tmp_path / "conv.pt"), "--to", "torch",
        "--map", str(tmp_path / "map.json"),
    ])  # fmt: skip
    assert code == 0, capsys.readouterr()
    converted = torch.load(tmp_path / "conv.pt", weights_only=True)
    for name, value in saved.items():
        assert torch.equal(converted[name], value), name


# -- verification that is right (issue 37, item 4) ---------------------------------------------


def _paddle_fused_bn() -> Any:
    """Paddle's fluid-style BatchNorm with a fused activation (densenet121's norm0)."""
    paddle = pytest.importorskip("paddle")

    class Net(paddle.nn.Layer):
        def __init__(self) -> None:
            super().__init__()
            self.conv = paddle.nn.Conv2D(1, 4, 3)
            self.norm = paddle.nn.BatchNorm(4, act="relu")
            self.fc = paddle.nn.Linear(4 * 6 * 6, 3)

        def forward(self, x: Any) -> Any:
            return self.fc(paddle.flatten(self.norm(self.conv(x)), 1))

    net = Net()
    paddle_randomize_bn(net)
    return net


class TorchFusedBN(tnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv, self.norm = tnn.Conv2d(1, 4, 3), tnn.BatchNorm2d(4)
        self.relu, self.fc = tnn.ReLU(), tnn.Linear(4 * 6 * 6, 3)

    def forward(self, x: Any) -> Any:
        return self.fc(torch.flatten(self.relu(self.norm(self.conv(x))), 1))


def test_a_fused_activation_is_compared_before_it() -> None:
    """Paddle's BatchNorm(act="relu") is traced before its activation, as torch's
    BatchNorm2d gives it (port failed densenet121 at features.norm0 with relative 0.9)."""
    result = port(_paddle_fused_bn(), TorchFusedBN(), input_shape=(2, 1, 8, 8))
    assert result.passed, result.format()
    row = next(r for r in result.verification.rows if r.layer == "norm")
    assert row.relative is not None and row.relative < 1e-5


def test_a_failed_ports_map_is_refused_until_the_user_checks_it(tmp_path: Any, capsys: Any) -> None:
    paddle = pytest.importorskip("paddle")
    source = _paddle_mlp()
    paddle.save(source.state_dict(), str(tmp_path / "mlp.pdparams"))
    result = port(source, TorchMLP(swapped=True), input_shape=(4, 64), map_out=tmp_path / "m.json")
    assert not result.passed
    saved = json.loads((tmp_path / "m.json").read_text())
    assert saved["unverified"].startswith("polytrain port failed verification: layer fc2")
    argv = ["convert", str(tmp_path / "mlp.pdparams"), str(tmp_path / "o.pt"), "--to", "torch",
            "--map", str(tmp_path / "m.json")]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "written by a port that did not verify" in err and 'delete its "unverified"' in err
    assert not (tmp_path / "o.pt").exists()
    del saved["unverified"]  # the user checked the entries
    (tmp_path / "m.json").write_text(json.dumps(saved))
    assert main(argv) == 0, capsys.readouterr()
