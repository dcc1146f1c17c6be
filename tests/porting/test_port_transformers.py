"""Attention and transformer blocks between Paddle, Gluon and PyTorch (issue 37, item 1):
Paddle keeps the query, key and value projections as three Linears [in, out], PyTorch's
``nn.MultiheadAttention`` packs them into ``in_proj_weight`` [3E, E]; ``convert`` packs and
unpacks them, ``port`` pairs them (a trio of Linears with a packed layer too) and refuses
a transformer option that differs (norm placement, activation, heads) in one line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

paddle = pytest.importorskip("paddle")
torch = pytest.importorskip("torch")
pnn, tnn = paddle.nn, torch.nn

from port_helpers import check_port  # noqa: E402

from polytrain import port  # noqa: E402
from polytrain.cli.main import main  # noqa: E402
from polytrain.errors import ConfigError  # noqa: E402
from polytrain.io.checkpoint import load_checkpoint  # noqa: E402
from polytrain.io.native import read_native  # noqa: E402
from polytrain.neutral.models import MultiHeadSelfAttention  # noqa: E402
from polytrain.neutral.reference_attention import self_attention  # noqa: E402

X = np.random.default_rng(0).standard_normal((3, 5, 16)).astype("float32")
SETTINGS = [(False, "relu"), (False, "gelu"), (True, "relu"), (True, "gelu")]
LAYER = ("self_attn", "linear1", "linear2", "norm1", "norm2")  # each traced and compared
LINEAR_KINDS = {"re:layers\\.(\\d+)\\.linear(1|2)\\.weight": {"kind": "Linear"}}


def paddle_encoder(normalize_before: bool = False, activation: str = "relu", **kw: Any) -> Any:
    paddle.seed(3)
    layer = pnn.TransformerEncoderLayer(
        16, kw.pop("nhead", 2), 32, dropout=kw.pop("dropout", 0.0), activation=activation,
        normalize_before=normalize_before, **kw,
    )  # fmt: skip
    return pnn.TransformerEncoder(layer, 2)


def torch_encoder(norm_first: bool = False, activation: str = "relu", **kw: Any) -> Any:
    layer = tnn.TransformerEncoderLayer(
        16, kw.pop("nhead", 2), 32, dropout=kw.pop("dropout", 0.0), activation=activation,
        batch_first=True, norm_first=norm_first, **kw,
    )  # fmt: skip
    return tnn.TransformerEncoder(layer, 2, enable_nested_tensor=False)


def paddle_out(net: Any, x: np.ndarray = X) -> np.ndarray:
    net.eval()
    return np.asarray(net(paddle.to_tensor(x)).numpy())


def torch_out(net: Any, x: np.ndarray = X) -> np.ndarray:
    net.eval()
    with torch.no_grad():
        return np.asarray(net(torch.from_numpy(x)).numpy())


def load_paddle(net: Any, path: Path) -> Any:
    """Every tensor of the file into ``net``, whose state must have exactly these names
    (Paddle's set_state_dict only warns about a missing one)."""
    _, tensors = read_native(path)
    assert set(tensors) == set(net.state_dict())
    net.set_state_dict({k: paddle.to_tensor(v) for k, v in tensors.items()})
    return net


def convert(*argv: Any) -> None:
    assert main(["convert", *map(str, argv)]) == 0


# -- TransformerEncoder, both directions ---------------------------------------------------------


@pytest.mark.parametrize(("normalize_before", "activation"), SETTINGS)
def test_a_paddle_encoder_converts_to_torch_and_loads_strictly(
    tmp_path: Path, capsys: Any, normalize_before: bool, activation: str
) -> None:
    source = paddle_encoder(normalize_before, activation)
    paddle.save(source.state_dict(), str(tmp_path / "enc.pdparams"))
    convert(tmp_path / "enc.pdparams", tmp_path / "enc.pt", "--to", "torch")
    assert "records none of the attention's options" in capsys.readouterr().out
    target = torch_encoder(normalize_before, activation)
    target.load_state_dict(torch.load(tmp_path / "enc.pt", weights_only=True), strict=True)
    diff = np.abs(torch_out(target) - paddle_out(source)).max()
    assert diff <= 1e-5
    print(f"CONVERT paddle->torch encoder nb={normalize_before} {activation}: {diff:.2g}")


@pytest.mark.parametrize(("normalize_before", "activation"), SETTINGS)
def test_a_paddle_encoder_ports_to_torch_layer_by_layer(
    normalize_before: bool, activation: str
) -> None:
    source = paddle_encoder(normalize_before, activation)
    target = torch_encoder(normalize_before, activation)
    result = port(source, target, input_shape=(3, 5, 16))
    check_port(result, f"encoder nb={normalize_before} {activation}")
    rows = {r.layer for r in result.verification.rows}  # in call order: norm1 first or not
    assert rows == {f"layers.{i}.{n}" for i in (0, 1) for n in LAYER} | {"(output)"}
    assert np.abs(torch_out(target) - paddle_out(source)).max() <= 1e-5
    packed = result.map_json()["paddle"]["layers.1.self_attn.in_proj_weight"]
    assert packed["native"] == [f"layers.1.self_attn.{p}_proj.weight" for p in "qkv"]


@pytest.mark.parametrize(("norm_first", "activation"), [(False, "gelu"), (True, "relu")])
def test_a_torch_encoder_converts_and_ports_to_paddle(
    tmp_path: Path, norm_first: bool, activation: str
) -> None:
    torch.manual_seed(3)
    source = torch_encoder(norm_first, activation)
    torch.save(source.state_dict(), tmp_path / "enc.pt")
    (tmp_path / "map.json").write_text(json.dumps(LINEAR_KINDS))  # a .pt names no layer kind
    convert(tmp_path / "enc.pt", tmp_path / "enc.pdparams", "--to", "paddle", "--map",
            tmp_path / "map.json")  # fmt: skip
    target = load_paddle(paddle_encoder(norm_first, activation), tmp_path / "enc.pdparams")
    assert np.abs(paddle_out(target) - torch_out(source)).max() <= 1e-5
    result = port(source, paddle_encoder(norm_first, activation), input_shape=(3, 5, 16))
    check_port(result, f"torch->paddle encoder nb={norm_first} {activation}")


# -- options no tensor shows ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("paddle_kw", "torch_kw", "said"),
    [
        (
            {"normalize_before": True},
            {"norm_first": False},
            ("normalize_before=True", "norm_first=False"),
        ),
        ({"activation": "gelu"}, {"activation": "relu"}, ("activation='gelu'", "activation=relu")),
        ({"nhead": 4}, {"nhead": 2}, ("num_heads=4", "num_heads=2")),
        ({"layer_norm_eps": 1e-6}, {}, ("layer_norm_eps=1e-06", "layer_norm_eps=1e-05")),
        ({"bias_attr": False}, {}, ("bias_attr=False", "bias=True")),
    ],
)
def test_an_option_that_differs_is_refused_in_one_line(
    paddle_kw: dict[str, Any], torch_kw: dict[str, Any], said: tuple[str, str]
) -> None:
    with pytest.raises(ConfigError) as info:
        port(paddle_encoder(**paddle_kw), torch_encoder(**torch_kw), input_shape=(3, 5, 16))
    message = str(info.value)
    assert "\n" not in message and message.startswith("Options differ: source layers.0")
    assert f"has {said[0]}, target" in message and f"has {said[1]}:" in message, message


def test_the_cli_prints_the_refusal_as_one_line(
    tmp_path: Path, monkeypatch: Any, capsys: Any
) -> None:
    (tmp_path / "twins.py").write_text(
        "import paddle, torch\n"
        "def source():\n"
        "    layer = paddle.nn.TransformerEncoderLayer(16, 2, 32, normalize_before=True)\n"
        "    return paddle.nn.TransformerEncoder(layer, 1)\n"
        "def target():\n"
        "    layer = torch.nn.TransformerEncoderLayer(16, 2, 32, batch_first=True)\n"
        "    return torch.nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    argv = ["port", "twins:source", "twins:target", str(tmp_path / "t.pt"),
            "--input-shape", "2,3,16"]  # fmt: skip
    code = main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and not (tmp_path / "t.pt").exists()
    assert "normalize_before=True" in err and "norm_first=False" in err


def test_dropout_that_differs_is_a_note_not_a_refusal() -> None:
    result = port(paddle_encoder(dropout=0.1), torch_encoder(), input_shape=(3, 5, 16))
    check_port(result)
    notes = " ".join(result.notes)
    assert "source dropout=0.1, target dropout=0" in notes and "training only" in notes


# -- MultiHeadAttention alone, kdim/vdim, trios of Linears ---------------------------------------


class PaddleAttention(pnn.Layer):  # type: ignore[misc]
    """Self-attention (or with kdim/vdim, attention over the input's first columns)."""

    def __init__(self, kdim: int | None = None, vdim: int | None = None) -> None:
        super().__init__()
        self.attn = pnn.MultiHeadAttention(16, 2, kdim=kdim, vdim=vdim)

    def forward(self, x: Any) -> Any:
        return self.attn(x, x[..., : self.attn.kdim], x[..., : self.attn.vdim])


class TorchAttention(tnn.Module):  # type: ignore[misc]
    def __init__(self, kdim: int | None = None, vdim: int | None = None) -> None:
        super().__init__()
        self.attn = tnn.MultiheadAttention(16, 2, batch_first=True, kdim=kdim, vdim=vdim)

    def forward(self, x: Any) -> Any:
        key, value = x[..., : self.attn.kdim], x[..., : self.attn.vdim]
        return self.attn(x, key, value, need_weights=False)[0]


class TorchTrio(tnn.Module):  # type: ignore[misc]
    """An attention written with four Linears (how many custom models write it)."""

    def __init__(self) -> None:
        super().__init__()
        self.attn = tnn.Module()
        for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
            setattr(self.attn, name, tnn.Linear(16, 16))

    def forward(self, x: Any) -> Any:
        a, (n, t, e) = self.attn, x.shape
        q, k, v = (
            p(x).reshape(n, t, 2, e // 2).transpose(1, 2) for p in (a.q_proj, a.k_proj, a.v_proj)
        )
        probs = torch.softmax(q @ k.transpose(-1, -2) / (e // 2) ** 0.5, dim=-1)
        return a.out_proj((probs @ v).transpose(1, 2).reshape(n, t, e))


@pytest.mark.parametrize("dims", [(None, None), (8, 12)], ids=["packed", "kdim-vdim"])
def test_multihead_attention_alone_converts_both_ways(
    tmp_path: Path, dims: tuple[Any, Any]
) -> None:
    paddle.seed(5)
    source = PaddleAttention(*dims)
    paddle.save(source.attn.state_dict(), str(tmp_path / "attn.pdparams"))  # names at the root
    convert(tmp_path / "attn.pdparams", tmp_path / "attn.pt", "--to", "torch")
    target = TorchAttention(*dims)
    state = torch.load(tmp_path / "attn.pt", weights_only=True)
    assert ("in_proj_weight" in state) is (dims == (None, None))
    target.attn.load_state_dict(state, strict=True)
    assert np.abs(torch_out(target) - paddle_out(source)).max() <= 1e-5
    # and back: PyTorch's attention names say what its tensors are, no map needed
    convert(tmp_path / "attn.pt", tmp_path / "back.pdparams", "--to", "paddle")
    back = PaddleAttention(*dims)
    load_paddle(back.attn, tmp_path / "back.pdparams")
    assert np.abs(paddle_out(back) - paddle_out(source)).max() <= 1e-6


@pytest.mark.parametrize("dims", [(None, None), (8, 12)], ids=["packed", "kdim-vdim"])
def test_multihead_attention_ports_both_ways(dims: tuple[Any, Any]) -> None:
    check_port(port(PaddleAttention(*dims), TorchAttention(*dims), input_shape=(3, 5, 16)))
    check_port(port(TorchAttention(*dims), PaddleAttention(*dims), input_shape=(3, 5, 16)))
    with pytest.raises(ConfigError, match=r"source attn .* has kdim=8, target attn .* kdim=16"):
        port(PaddleAttention(8, 12), TorchAttention(), input_shape=(3, 5, 16))


def test_a_trio_of_linears_pairs_with_a_packed_attention() -> None:
    """Packed source -> four-Linear target and back: the trio's output is compared at its
    output projection."""
    source, target = PaddleAttention(), TorchTrio()
    result = port(source, target, input_shape=(3, 5, 16))
    check_port(result)
    assert result.verification.rows[0].layer == "attn"
    assert result.pairs[0].target.output == "attn.out_proj"
    assert np.abs(torch_out(target) - paddle_out(source)).max() <= 1e-5
    back = port(target, TorchAttention(), input_shape=(3, 5, 16))
    check_port(back)
    assert "attn.in_proj_weight" in back.name_map


def test_a_gluon_attention_of_four_dense_layers_ports_to_torch() -> None:
    """MXNet 1.9.1 has no attention block (gluon.nn and gluon.contrib.nn: none; only fused
    ops): a Gluon attention is written of Dense layers, which pair as a trio."""
    mx = pytest.importorskip("mxnet")
    gnn = mx.gluon.nn

    class GluonAttention(mx.gluon.Block):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            with self.name_scope():
                self.attn = mx.gluon.Block()
                with self.attn.name_scope():
                    for name in ("query", "key", "value", "proj"):
                        setattr(self.attn, name, gnn.Dense(16, in_units=16, flatten=False))

        def forward(self, x: Any) -> Any:
            a, (n, t, e) = self.attn, x.shape
            q, k, v = (
                p(x).reshape((n, t, 2, e // 2)).transpose((0, 2, 1, 3)).reshape((-1, t, e // 2))
                for p in (a.query, a.key, a.value)
            )
            probs = mx.nd.softmax(mx.nd.batch_dot(q, k, transpose_b=True) / (e // 2) ** 0.5)
            joined = mx.nd.batch_dot(probs, v).reshape((n, 2, t, e // 2)).transpose((0, 2, 1, 3))
            return a.proj(joined.reshape((n, t, e)))

    source = GluonAttention()
    source.initialize(mx.init.Normal(0.3))
    target = TorchAttention()
    result = port(source, target, input_shape=(3, 5, 16))
    check_port(result, "gluon dense-trio attention")
    assert result.name_map["attn.in_proj_weight"]["native"] == [
        "attn.query.weight", "attn.key.weight", "attn.value.weight",
    ]  # fmt: skip


# -- decoder, whole Transformer, neutral checkpoint ----------------------------------------------


class PaddleTransformer(pnn.Layer):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        paddle.seed(7)
        self.t = pnn.Transformer(16, 2, 1, 2, 32, dropout=0.0, normalize_before=True)

    def forward(self, x: Any) -> Any:
        return self.t(x, x[:, :4])


class TorchTransformer(tnn.Module):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self.t = tnn.Transformer(16, 2, 1, 2, 32, dropout=0.0, batch_first=True, norm_first=True)

    def forward(self, x: Any) -> Any:
        return self.t(x, x[:, :4])


@pytest.mark.filterwarnings("ignore:enable_nested_tensor is True")  # torch: norm_first
def test_a_paddle_transformer_ports_and_converts_with_one_map_entry(tmp_path: Path) -> None:
    source = PaddleTransformer()
    check_port(port(source, TorchTransformer(), input_shape=(3, 5, 16)), "transformer")
    paddle.save(source.state_dict(), str(tmp_path / "t.pdparams"))
    # Paddle's decoder layer calls its second attention cross_attn, PyTorch's multihead_attn
    rename = {"re:t\\.decoder\\.layers\\.(\\d+)\\.multihead_attn\\.": {
        "native": "t.decoder.layers.\\1.cross_attn."}}  # fmt: skip
    (tmp_path / "map.json").write_text(json.dumps(rename))
    convert(tmp_path / "t.pdparams", tmp_path / "t.pt", "--to", "torch", "--map",
            tmp_path / "map.json")  # fmt: skip
    target = TorchTransformer()
    target.load_state_dict(torch.load(tmp_path / "t.pt", weights_only=True), strict=True)
    assert np.abs(torch_out(target) - paddle_out(source)).max() <= 1e-5


def test_attention_through_a_neutral_checkpoint(tmp_path: Path) -> None:
    """Paddle's q/k/v Linears are stored in the neutral checkpoint under PyTorch's packed
    names, which polytrain's own MultiHeadSelfAttention reads; and written back."""
    paddle.seed(9)
    source = PaddleAttention()
    paddle.save(source.state_dict(), str(tmp_path / "a.pdparams"))
    convert(tmp_path / "a.pdparams", tmp_path / "ck", "--to", "neutral")
    params = load_checkpoint(tmp_path / "ck").params
    leaves = {k.removeprefix("attn."): v.astype("float64") for k, v in params.items()}
    mine, _ = self_attention(MultiHeadSelfAttention(16, 2), leaves, X.astype("float64"))
    assert np.abs(mine - paddle_out(source)).max() <= 1e-5
    convert(tmp_path / "ck", tmp_path / "back.pdparams", "--to", "paddle")
    back = load_paddle(PaddleAttention(), tmp_path / "back.pdparams")
    assert np.abs(paddle_out(back) - paddle_out(source)).max() == 0
    shutil.rmtree(tmp_path / "ck")


def test_a_ports_packed_map_converts_the_file_alone(tmp_path: Path) -> None:
    """The map port derives lists the three parts of in_proj_weight; convert --map reads it."""
    source = paddle_encoder(True, "gelu")
    paddle.save(source.state_dict(), str(tmp_path / "e.pdparams"))
    port(source, torch_encoder(True, "gelu"), input_shape=(3, 5, 16), map_out=tmp_path / "m.json")
    convert(tmp_path / "e.pdparams", tmp_path / "e.pt", "--to", "torch",
            "--map", tmp_path / "m.json")  # fmt: skip
    target = torch_encoder(True, "gelu")
    target.load_state_dict(torch.load(tmp_path / "e.pt", weights_only=True), strict=True)
    assert np.abs(torch_out(target) - paddle_out(source)).max() <= 1e-5


def test_named_q_k_v_weights_stay_apart(tmp_path: Path) -> None:
    """Packed without a map and with one that only lays them out (as --print-map writes
    it); a map giving the q/k/v weights a kind keeps them Linears (for a target written
    with four)."""
    paddle.seed(5)
    source = PaddleAttention()
    paddle.save(source.state_dict(), str(tmp_path / "a.pdparams"))
    convert(tmp_path / "a.pdparams", tmp_path / "packed.pt", "--to", "torch")
    assert "attn.in_proj_weight" in torch.load(tmp_path / "packed.pt", weights_only=True)
    layout = {f"attn.{p}_proj.weight": {"transpose": True} for p in "qkv"}
    (tmp_path / "layout.json").write_text(json.dumps(layout))
    convert(tmp_path / "a.pdparams", tmp_path / "laid.pt", "--to", "torch",
            "--map", tmp_path / "layout.json")  # fmt: skip
    assert "attn.in_proj_weight" in torch.load(tmp_path / "laid.pt", weights_only=True)
    keep = {f"attn.{p}_proj.weight": {"kind": "Linear"} for p in "qkv"}
    (tmp_path / "map.json").write_text(json.dumps(keep))
    convert(tmp_path / "a.pdparams", tmp_path / "a.pt", "--to", "torch",
            "--map", tmp_path / "map.json")  # fmt: skip
    target = TorchTrio()
    target.load_state_dict(torch.load(tmp_path / "a.pt", weights_only=True), strict=True)
    assert np.abs(torch_out(target) - paddle_out(source)).max() <= 1e-5


def test_the_optimizer_state_of_a_packed_attention_is_refused_in_one_line(
    tmp_path: Path, capsys: Any
) -> None:
    """Adam's moments of q/k/v would need the same packing: refused, not misread as a
    file of another run."""
    source = PaddleAttention()
    opt = paddle.optimizer.Adam(parameters=source.parameters())
    source(paddle.to_tensor(X)).mean().backward()
    opt.step()
    paddle.save(source.state_dict(), str(tmp_path / "a.pdparams"))
    paddle.save(opt.state_dict(), str(tmp_path / "a.pdopt"))
    argv = ["convert", str(tmp_path / "a.pdparams"), str(tmp_path / "a.pt"), "--to", "torch",
            "--optimizer", str(tmp_path / "a.pdopt")]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "optimizer state of packed attention tensors" in err
    assert not (tmp_path / "a.pt").exists()


def test_a_gluon_layer_norm_epsilon_is_compared() -> None:
    """Every LayerNorm's epsilon is an option no tensor shows: Gluon's 1e-6 against
    torch's default 1e-5 is refused (the outputs would agree to ~1e-6 and pass)."""
    mx = pytest.importorskip("mxnet")

    class GluonNorm(mx.gluon.Block):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            with self.name_scope():
                self.fc = mx.gluon.nn.Dense(16, in_units=16, flatten=False)
                self.norm = mx.gluon.nn.LayerNorm(epsilon=1e-6, in_channels=16)

        def forward(self, x: Any) -> Any:
            return self.norm(self.fc(x))

    source = GluonNorm()
    source.initialize()
    target = tnn.Sequential(tnn.Linear(16, 16), tnn.LayerNorm(16))
    with pytest.raises(
        ConfigError, match=r"source norm .* has epsilon=1e-06, target 1 .* eps=1e-05"
    ):
        port(source, target, input_shape=(3, 5, 16))
    target[1].eps = 1e-6
    check_port(port(source, target, input_shape=(3, 5, 16)))
