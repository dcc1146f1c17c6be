"""A torchvision-style ResNet-18 (written here) to Paddle's and Gluon's own ResNet-18 with
`polytrain convert` and a partial map of at most 5 entries, and back; each model is then
run by its own framework on the same input (issue 13, "torch -> Paddle and torch -> Gluon
for a ResNet-18 with a partial map of at most 5 lines"). The maps are docs/porting.md's.

Run ``pytest tests/porting/test_port_resnet.py -s`` to see the measured logit differences.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
paddle = pytest.importorskip("paddle")
mx = pytest.importorskip("mxnet")
tnn = torch.nn

from torch_twins import ResNet18  # noqa: E402

from polytrain.cli.main import main  # noqa: E402
from polytrain.errors import ConfigError  # noqa: E402
from polytrain.io.name_map import load_map  # noqa: E402

# torch -> Paddle: the names agree; only the layout of the one 2-D tensor needs saying
PADDLE_MAP = {"fc.weight": {"kind": "Linear"}}
# torch -> Gluon: gluon.model_zoo.vision.resnet18_v1 numbers its layers (save_parameters)
GLUON_MAP = {
    "conv1.": "features.0.",
    "bn1.": "features.1.",
    "fc.": "output.",
    "re:^layer(1|2|3|4)\\.(\\d+)\\.(conv1|bn1|conv2|bn2)\\.":
        "features.\\1(4|5|6|7).\\2.body.\\3(0|1|3|4).",
    "re:^layer(2|3|4)\\.(\\d+)\\.downsample\\.": "features.\\1(5|6|7).\\2.downsample.",
}  # fmt: skip
RTOL = 1e-4  # of the largest |logit|
BATCH = np.random.default_rng(13).standard_normal((2, 3, 64, 64)).astype(np.float32)


def seeded_torch_resnet() -> ResNet18:
    """torch's default initialisation, seeded; BatchNorm's affine parameters and running
    statistics random too, so a misplaced one changes the logits."""
    torch.manual_seed(0)
    net = ResNet18()
    with torch.no_grad():
        for module in net.modules():
            if isinstance(module, tnn.BatchNorm2d):
                module.weight.uniform_(0.5, 1.5)
                module.bias.normal_(0, 0.1)
                module.running_mean.normal_(0, 0.1)
                module.running_var.uniform_(0.5, 1.5)
    return net.eval()


def torch_logits(net: ResNet18) -> np.ndarray:
    with torch.no_grad():
        return net.eval()(torch.from_numpy(BATCH)).numpy()


def paddle_logits(net: Any) -> np.ndarray:
    net.eval()
    with paddle.no_grad():
        return net(paddle.to_tensor(BATCH)).numpy()


def gluon_logits(net: Any) -> np.ndarray:
    return net(mx.nd.array(BATCH)).asnumpy()  # outside autograd.record: inference mode


def assert_close(got: np.ndarray, want: np.ndarray, what: str) -> None:
    assert got.shape == want.shape == (2, 1000)
    scale = float(np.abs(want).max())
    diff = float(np.abs(got - want).max())
    print(f"{what}: max |logit difference| {diff:.2e}, {diff / scale:.1e} of the largest")
    assert diff <= RTOL * scale, f"{what}: logits differ by {diff:.3g} (largest {scale:.3g})"


def convert(source: Path, target: Path, to: str, name_map: dict[str, Any] | None) -> None:
    args = ["convert", str(source), str(target), "--to", to]
    if name_map is not None:
        map_file = target.with_suffix(".map.json")
        map_file.write_text(json.dumps(name_map, indent=1))
        args += ["--map", str(map_file)]
    assert main(args) == 0
    assert target.exists()


def load_torch(path: Path) -> ResNet18:
    """The converted state dict into a fresh twin, strictly: nothing missing (BatchNorm's
    num_batches_tracked, which no Paddle or Gluon file has, is written as 0), nothing
    unexpected."""
    net = ResNet18()
    net.load_state_dict(torch.load(path, weights_only=True), strict=True)
    return net.eval()


def test_maps_are_at_most_five_entries() -> None:
    assert len(PADDLE_MAP) <= 5 and len(GLUON_MAP) <= 5


def test_translated_groups_read_both_ways() -> None:
    user = load_map(GLUON_MAP)[None]
    pairs = {
        "conv1.weight": "features.0.weight",
        "layer1.0.conv1.weight": "features.4.0.body.0.weight",
        "layer3.1.bn2.running_var": "features.6.1.body.4.running_var",
        "layer4.0.downsample.1.gamma": "features.7.0.downsample.1.gamma",
        "fc.bias": "output.bias",
    }
    for canonical, native in pairs.items():
        assert (user.rule_for_canonical(canonical) or (None, ""))[1] == native
        assert (user.rule_for_native(native) or (None, ""))[1] == canonical
    assert user.rule_for_canonical("layer1.0.downsample.0.weight") is None


@pytest.mark.parametrize(
    "native, message",
    [
        ("features.\\1(4|5|6).", "as many different plain alternatives"),
        ("features.\\1(4|4|5|6).", "repeats a name"),
    ],
)
def test_translations_that_cannot_read_back_are_refused(native: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_map({"re:^layer(1|2|3|4)\\.": native})
    with pytest.raises(ConfigError, match="as many different plain alternatives"):
        load_map({"re:^layer(\\d)\\.": "features.\\1(4|5)."})


@pytest.mark.slow
def test_torch_resnet18_to_paddle_zoo(tmp_path: Path) -> None:
    net = seeded_torch_resnet()
    torch.save(net.state_dict(), tmp_path / "resnet18.pt")
    convert(tmp_path / "resnet18.pt", tmp_path / "resnet18.pdparams", "paddle", PADDLE_MAP)
    target = paddle.vision.models.resnet18()
    missing, unexpected = target.set_state_dict(paddle.load(str(tmp_path / "resnet18.pdparams")))
    assert not missing and not unexpected
    assert_close(paddle_logits(target), torch_logits(net), "torch -> paddle")


@pytest.mark.slow
def test_torch_resnet18_to_gluon_zoo(tmp_path: Path) -> None:
    net = seeded_torch_resnet()
    torch.save(net.state_dict(), tmp_path / "resnet18.pt")
    convert(tmp_path / "resnet18.pt", tmp_path / "resnet18.params", "mxnet", GLUON_MAP)
    target = mx.gluon.model_zoo.vision.resnet18_v1()
    # allow_missing and ignore_extra False: every parameter named, nothing left over
    target.load_parameters(str(tmp_path / "resnet18.params"), ctx=mx.cpu())
    assert_close(gluon_logits(target), torch_logits(net), "torch -> gluon")


@pytest.mark.slow
def test_paddle_zoo_resnet18_to_torch_without_a_map(tmp_path: Path) -> None:
    """The reverse needs no map: paddle.save's name table says fc is a Linear."""
    paddle.seed(1)
    source = paddle.vision.models.resnet18()
    rng = np.random.default_rng(1)
    for layer in source.sublayers():  # BatchNorm off its initial 1, 0, 0, 1
        if isinstance(layer, paddle.nn.BatchNorm2D):
            for param, low, high in [
                (layer.weight, 0.5, 1.5),
                (layer._variance, 0.5, 1.5),
                (layer.bias, -0.1, 0.1),
                (layer._mean, -0.1, 0.1),
            ]:
                param.set_value(rng.uniform(low, high, param.shape).astype(np.float32))
    paddle.save(source.state_dict(), str(tmp_path / "resnet18.pdparams"))
    convert(tmp_path / "resnet18.pdparams", tmp_path / "resnet18.pt", "torch", None)
    assert_close(torch_logits(load_torch(tmp_path / "resnet18.pt")), paddle_logits(source),
                 "paddle -> torch")  # fmt: skip


@pytest.mark.slow
def test_gluon_zoo_resnet18_to_torch_with_the_same_map(tmp_path: Path) -> None:
    """The map reads both ways: Gluon's own initialisation back into the torch twin."""
    mx.random.seed(1)
    source = mx.gluon.model_zoo.vision.resnet18_v1()
    source.initialize(mx.init.Xavier(), ctx=mx.cpu())
    source(mx.nd.array(BATCH))  # finishes the deferred initialisation
    rng = np.random.default_rng(1)
    for name, param in source.collect_params().items():
        if name.endswith(("gamma", "running_var")):
            param.set_data(mx.nd.array(rng.uniform(0.5, 1.5, param.shape)))
        elif name.endswith(("beta", "running_mean")):
            param.set_data(mx.nd.array(rng.normal(0, 0.1, param.shape)))
    source.save_parameters(str(tmp_path / "resnet18.params"))
    convert(tmp_path / "resnet18.params", tmp_path / "resnet18.pt", "torch", GLUON_MAP)
    assert_close(torch_logits(load_torch(tmp_path / "resnet18.pt")), gluon_logits(source),
                 "gluon -> torch")  # fmt: skip
