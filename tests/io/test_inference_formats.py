"""Inference exports: ``paddle.jit.save``'s ``.pdiparams`` (named and laid out by the
program beside it, ``.json`` with PIR or ``.pdmodel`` without) and Gluon ``export()``'s
``-0000.params`` (kinds and BatchNorm roles from ``-symbol.json``), converted to a PyTorch
twin written here, which loads with strict=True and gives the framework's own logits."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
from convert_helpers import convert
from polytrain_paddle._format import PaddleFormat

REL_TOL = 1e-5
WIDTH = 8  # the square Linear: 8 x 8
PADDLE_MAP = {"conv.": "conv2d_0.", "bn.": "batch_norm2d_0.", "fc.": "proj.", "head.": "linear_1."}
GLUON_LAYERS = {"conv": "conv0", "bn": "batchnorm0", "fc": "dense0", "head": "dense1"}
GLUON_MAP = {f"re:{k}\\.": f"net0_{v}_" for k, v in GLUON_LAYERS.items()}

PADDLE_NET = f"""
import numpy as np
import paddle

WIDTH = {WIDTH}


class Net(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.conv = paddle.nn.Conv2D(3, WIDTH, 3, padding=1)
        self.bn = paddle.nn.BatchNorm2D(WIDTH)
        # square, named by the user: its layout comes from the program's matmul
        self.fc = paddle.nn.Linear(WIDTH, WIDTH, weight_attr=paddle.ParamAttr(name="proj.w"),
                                   bias_attr=paddle.ParamAttr(name="proj.b"))
        self.head = paddle.nn.Linear(WIDTH, 3)

    def forward(self, x):
        y = paddle.nn.functional.relu(self.bn(self.conv(x))).mean(axis=[2, 3])
        return self.head(paddle.nn.functional.relu(self.fc(y)))


def build(seed):
    paddle.seed(seed)
    with paddle.utils.unique_name.guard():
        net = Net()
    rng = np.random.default_rng(seed)
    net.bn._mean.set_value(rng.standard_normal(WIDTH).astype("float32"))
    net.bn._variance.set_value((rng.random(WIDTH) + 0.5).astype("float32"))
    net.bn.weight.set_value(rng.standard_normal(WIDTH).astype("float32"))
    net.eval()
    return net


def save(net, prefix):
    spec = [paddle.static.InputSpec([None, 3, 6, 6], "float32", "x")]
    paddle.jit.save(net, prefix, input_spec=spec)
"""


def paddle_module(tmp_path: Path) -> ModuleType:
    """The Paddle model, from a file (paddle.jit.save reads forward's source)."""
    pytest.importorskip("paddle")
    source = tmp_path / "paddle_net.py"
    source.write_text(PADDLE_NET)
    spec = importlib.util.spec_from_file_location(f"paddle_net_{tmp_path.name}", source)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def torch_twin():  # type: ignore[no-untyped-def]
    torch = pytest.importorskip("torch")

    class Twin(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(3, WIDTH, 3, padding=1)
            self.bn = torch.nn.BatchNorm2d(WIDTH)
            self.fc = torch.nn.Linear(WIDTH, WIDTH)
            self.head = torch.nn.Linear(WIDTH, 3)

        def forward(self, x):  # type: ignore[no-untyped-def]
            y = torch.relu(self.bn(self.conv(x))).mean(dim=(2, 3))
            return self.head(torch.relu(self.fc(y)))

    return Twin().eval()


def twin_logits(pt: Path, x: np.ndarray) -> np.ndarray:
    import torch

    twin = torch_twin()
    twin.load_state_dict(torch.load(pt, weights_only=True), strict=True)
    with torch.no_grad():
        return twin(torch.from_numpy(x)).numpy()


def assert_close(got: np.ndarray, want: np.ndarray) -> None:
    assert np.abs(got - want).max() <= REL_TOL * np.abs(want).max(), (got, want)


def write_map(path: Path, entries: dict[str, str]) -> Path:
    path.write_text(json.dumps(entries))
    return path


def inputs() -> np.ndarray:
    return np.random.default_rng(7).standard_normal((2, 3, 6, 6)).astype(np.float32)


# -- paddle.jit.save -----------------------------------------------------------------------------


def test_pdiparams_with_pir_program_converts_to_a_torch_twin(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    paddle = pytest.importorskip("paddle")
    mod = paddle_module(tmp_path)
    net = mod.build(0)
    mod.save(net, str(tmp_path / "inf" / "net"))
    assert (tmp_path / "inf" / "net.json").is_file()  # Paddle 3: PIR program
    x = inputs()
    want = net(paddle.to_tensor(x)).numpy()

    # the tensors, in the order the program establishes, equal the state dict's
    read = PaddleFormat().read(tmp_path / "inf" / "net.pdiparams")
    state = {v.name: v.numpy() for v in net.state_dict().values()}
    assert sorted(read) == sorted(state)
    for name, value in state.items():
        np.testing.assert_array_equal(read[name], value, err_msg=name)

    mapping = write_map(tmp_path / "map.json", PADDLE_MAP)
    assert convert(tmp_path / "inf" / "net.pdiparams", tmp_path / "net.pt", "--to", "torch",
                   "--map", mapping) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "not the structured names of state_dict()" in out, out
    assert "transposed as Linear weights: linear_1.w_0, proj.w" in out, out
    assert_close(twin_logits(tmp_path / "net.pt", x), want)


@pytest.mark.slow
def test_pdiparams_with_legacy_pdmodel_converts_with_structured_names(tmp_path: Path) -> None:
    pytest.importorskip("paddle")
    pytest.importorskip("torch")
    paddle_module(tmp_path)  # writes paddle_net.py
    script = textwrap.dedent("""
        import sys
        import numpy as np
        sys.path.insert(0, sys.argv[1])
        import paddle, paddle_net
        net = paddle_net.build(0)
        paddle_net.save(net, sys.argv[2])
        x = np.random.default_rng(7).standard_normal((2, 3, 6, 6)).astype("float32")
        np.save(sys.argv[3], net(paddle.to_tensor(x)).numpy())
    """)
    env = {**os.environ, "FLAGS_enable_pir_api": "0"}
    prefix = tmp_path / "leg" / "net"
    args = [str(tmp_path), str(prefix), str(tmp_path / "want.npy")]
    subprocess.run([sys.executable, "-c", script, *args], check=True, env=env, capture_output=True)
    assert (tmp_path / "leg" / "net.pdmodel").is_file()
    assert not (tmp_path / "leg" / "net.json").exists()
    # names from net.pdiparams.info: no map needed
    assert convert(tmp_path / "leg" / "net.pdiparams", tmp_path / "net.pt", "--to", "torch") == 0
    assert_close(twin_logits(tmp_path / "net.pt", inputs()), np.load(tmp_path / "want.npy"))


def test_pdiparams_without_its_program_stops_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mod = paddle_module(tmp_path)
    mod.save(mod.build(0), str(tmp_path / "net"))
    (tmp_path / "net.json").unlink()
    assert convert(tmp_path / "net.pdiparams", tmp_path / "net.pt", "--to", "torch") == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and not (tmp_path / "net.pt").exists()
    assert f"{tmp_path / 'net'}.json" in err and "paddle.jit.save" in err, err


def test_layout_comes_from_the_op_not_the_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A square weight named like a Linear's (``linear_7.w_0``) but used by a matmul with
    transpose_y ([out, in], PyTorch's layout) is not transposed: the conversion stops; the
    user-named ``proj.w`` fed to a plain matmul is transposed (see the PIR test)."""
    paddle = pytest.importorskip("paddle")

    class Tied(paddle.nn.Layer):  # type: ignore[name-defined]
        def __init__(self) -> None:
            super().__init__()
            attr = paddle.ParamAttr(name="linear_7.w_0")
            self.w = self.create_parameter([WIDTH, WIDTH], attr=attr)

        def forward(self, x):  # type: ignore[no-untyped-def]
            return paddle.matmul(x, self.w, transpose_y=True)

    with paddle.utils.unique_name.guard():
        net = Tied()
    spec = [paddle.static.InputSpec([None, WIDTH], "float32", "x")]
    paddle.jit.save(net, str(tmp_path / "net"), input_spec=spec)
    assert convert(tmp_path / "net.pdiparams", tmp_path / "net.pt", "--to", "torch") == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and not (tmp_path / "net.pt").exists()
    assert "linear_7.weight (8, 8)" in err and "program" in err, err


# -- Gluon export() ------------------------------------------------------------------------------


def gluon_export(tmp_path: Path) -> tuple[Path, np.ndarray]:
    mx = pytest.importorskip("mxnet")
    gluon = mx.gluon

    class Net(gluon.HybridBlock):  # type: ignore[name-defined]
        def __init__(self) -> None:
            super().__init__(prefix="net0_")
            with self.name_scope():
                self.conv = gluon.nn.Conv2D(WIDTH, 3, padding=1, in_channels=3)
                self.bn = gluon.nn.BatchNorm(in_channels=WIDTH)
                self.fc = gluon.nn.Dense(WIDTH, in_units=WIDTH)  # square
                self.head = gluon.nn.Dense(3, in_units=WIDTH)

        def hybrid_forward(self, F, x):  # type: ignore[no-untyped-def]
            y = F.mean(F.relu(self.bn(self.conv(x))), axis=(2, 3))
            return self.head(F.relu(self.fc(y)))

    mx.random.seed(0)
    net = Net()
    net.initialize(mx.init.Xavier())
    rng = np.random.default_rng(0)
    net.bn.running_mean.set_data(mx.nd.array(rng.standard_normal(WIDTH)))
    net.bn.running_var.set_data(mx.nd.array(rng.random(WIDTH) + 0.5))
    net.bn.gamma.set_data(mx.nd.array(rng.standard_normal(WIDTH)))
    net.hybridize()
    want = net(mx.nd.array(inputs())).asnumpy()
    net.export(str(tmp_path / "model"))
    return tmp_path / "model-0000.params", want


def test_gluon_export_converts_with_kinds_from_the_symbol(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("torch")
    params, want = gluon_export(tmp_path)
    mapping = write_map(tmp_path / "map.json", GLUON_MAP)
    assert convert(params, tmp_path / "net.pt", "--to", "torch", "--map", mapping) == 0
    out = capsys.readouterr().out
    symbol = tmp_path / "model-symbol.json"
    assert f"layer kinds from {symbol}" in out, out
    assert "4 BatchNorm2d, 2 Conv2d, 4 Linear" in out, out
    assert "net0_batchnorm0_running_mean -> bn.running_mean" in out, out
    assert_close(twin_logits(tmp_path / "net.pt", inputs()), want)


def test_gluon_export_without_symbol_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    params, _ = gluon_export(tmp_path)
    (tmp_path / "model-symbol.json").unlink()
    assert convert(params, tmp_path / "net.pt", "--to", "torch") == 0
    out = capsys.readouterr().out
    assert "without its symbol file model-symbol.json: no layer kinds" in out, out
    assert "layer kinds from" not in out
