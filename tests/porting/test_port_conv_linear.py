"""polytrain port pairs a 1x1 convolution on a pooled map with a Linear (gluon-cv's
MobileNetV3 classifier against timm's, issue 37): both ways, the derived map reproducing
the weights through ``polytrain convert --map``; any other convolution stays refused."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
tnn = torch.nn

from polytrain import port  # noqa: E402
from polytrain.cli.main import main  # noqa: E402
from polytrain.errors import ConfigError  # noqa: E402


class Net(tnn.Module):
    """Features, a global pool, then the classifier: a Linear, or a Conv2d of ``kernel``
    (on the pooled [N, C, 1, 1] map, or before the pool where ``pooled`` is False)."""

    def __init__(self, head: str, kernel: int = 1, pooled: bool = True) -> None:
        super().__init__()
        self.features, self.pooled = tnn.Conv2d(3, 8, 3), pooled
        self.pool = tnn.AdaptiveAvgPool2d(1) if pooled else tnn.AdaptiveAvgPool2d(3)
        self.head = tnn.Linear(8, 5) if head == "linear" else tnn.Conv2d(8, 5, kernel)

    def forward(self, x: Any) -> Any:
        x = self.pool(torch.relu(self.features(x)))
        if isinstance(self.head, tnn.Linear):
            return self.head(torch.flatten(x, 1))
        return torch.flatten(self.head(x), 1)


def _paddle_net(head: str) -> Any:
    paddle = pytest.importorskip("paddle")

    class PaddleNet(paddle.nn.Layer):
        """Net in Paddle: its Linear is [in, out], its Conv2D [out, in, 1, 1]."""

        def __init__(self) -> None:
            super().__init__()
            self.features = paddle.nn.Conv2D(3, 8, 3)
            self.pool = paddle.nn.AdaptiveAvgPool2D(1)
            linear = head == "linear"
            self.head = paddle.nn.Linear(8, 5) if linear else paddle.nn.Conv2D(8, 5, 1)

        def forward(self, x: Any) -> Any:
            x = self.pool(paddle.nn.functional.relu(self.features(x)))
            if isinstance(self.head, paddle.nn.Linear):
                return self.head(paddle.flatten(x, 1))
            return paddle.flatten(self.head(x), 1)

    return PaddleNet()


def _check(result: Any) -> None:
    """Passed, the head compared ([N, 5, 1, 1] against [N, 5]), its weight the source's."""
    assert result.passed, result.format()
    assert [r.layer for r in result.verification.rows] == ["features", "head", "(output)"]
    head = result.verification.rows[1]
    assert head.relative is not None and head.relative < 1e-6
    pair = next(p for p in result.pairs if p.target.name == "head")
    t = pair.target.tensors["weight"]
    ported = result.state[t.native].T if t.transpose else result.state[t.native]
    s = pair.source.tensors["weight"].canonical
    np.testing.assert_array_equal(s.reshape(5, 8), ported.reshape(5, 8))


@pytest.mark.parametrize(("source", "target"), [("conv", "linear"), ("linear", "conv")])
def test_torch_1x1_conv_and_linear_both_ways(source: str, target: str) -> None:
    torch.manual_seed(0)
    src, tgt = Net(source), Net(target)
    _check(port(src, tgt, input_shape=(2, 3, 6, 6)))


@pytest.mark.parametrize(("source", "target"), [("conv", "linear"), ("linear", "conv")])
def test_torch_into_paddle_both_ways(source: str, target: str) -> None:
    """Into Paddle's Linear [in, out] from a conv, and into its 1x1 Conv2D from a Linear."""
    torch.manual_seed(1)
    src, tgt = Net(source), _paddle_net(target)
    _check(port(src, tgt, input_shape=(2, 3, 6, 6)))


@pytest.mark.parametrize(("source", "target"), [("conv", "linear"), ("linear", "conv")])
def test_paddle_into_torch_and_convert_with_the_map(
    tmp_path: Any, capsys: Any, source: str, target: str
) -> None:
    """The derived map carries the reshape: ``convert --map`` of the .pdparams file alone
    gives the ported weights (Paddle's Linear [in, out] read transposed, then reshaped)."""
    paddle = pytest.importorskip("paddle")
    src, tgt = _paddle_net(source), Net(target)
    paddle.save(src.state_dict(), str(tmp_path / "src.pdparams"))
    result = port(src, tgt, input_shape=(2, 3, 6, 6), map_out=tmp_path / "map.json")
    _check(result)
    want = tgt.state_dict()
    entry = json.loads((tmp_path / "map.json").read_text())["paddle"]["head.weight"]
    assert entry["reshape"] == list(want["head.weight"].shape)
    argv = ["convert", str(tmp_path / "src.pdparams"), str(tmp_path / "out.pt"), "--to",
            "torch", "--map", str(tmp_path / "map.json")]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr()
    converted = torch.load(tmp_path / "out.pt", weights_only=True)
    assert set(converted) == set(want)
    for name, value in want.items():
        assert torch.equal(converted[name], value), name


@pytest.mark.parametrize(
    ("conv", "why"),
    [
        (Net("conv", kernel=3, pooled=False), "kinds differ (Conv2d and Linear)"),
        (Net("conv", kernel=1, pooled=False), "gives [2, 5, 3, 3]"),
    ],
)
def test_a_conv_that_is_no_linear_is_refused(conv: Any, why: str) -> None:
    """A 3x3 kernel at matching; a 1x1 one on a 3x3 map once the traces show it."""
    with pytest.raises(ConfigError, match=r"kinds differ") as info:
        port(conv, Net("linear"), input_shape=(2, 3, 6, 6))
    assert why in str(info.value)
