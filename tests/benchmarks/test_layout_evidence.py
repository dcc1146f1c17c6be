"""A 2-D tensor's layout is decided by what its layer is (the model, the map, or a name
the framework generated in the file's own name table), never by a name or a shape alone;
without evidence the conversion stops in one line. Maps may be partial, with prefix and
regex entries, and ``--print-map`` shows the map a conversion would use."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest
from polytrain_paddle._format import NAME_TABLE, PaddleFormat

from polytrain import get_model_spec
from polytrain.cli.main import main
from polytrain.errors import CheckpointError, ConfigError
from polytrain.io.convert import load_map, plan_map, read_weights, write_weights
from polytrain.testing import tiny_resnet

LOGIT_ATOL = 1e-5
read_paddle = PaddleFormat().read


def convert(*args: str | Path) -> int:
    return main(["convert", *map(str, args)])


def paddle_file(path: Path, tensors: dict[str, np.ndarray], table: dict[str, str] | None) -> Path:
    """A ``paddle.save`` file of ``tensors`` with the name table ``table`` (as Paddle
    writes it: a pickle of the arrays plus ``StructuredToParameterName@@``)."""
    state: dict[str, object] = dict(tensors)
    if table is not None:
        state[NAME_TABLE] = table
    path.write_bytes(pickle.dumps(state, protocol=4))
    return path


# -- a user-named square Linear, with real Paddle and a PyTorch twin ------------------------------


def paddle_net(weight_name: str):  # type: ignore[no-untyped-def]
    paddle = pytest.importorskip("paddle")
    paddle.seed(0)

    class Net(paddle.nn.Layer):  # type: ignore[name-defined]
        def __init__(self) -> None:
            super().__init__()
            attr = paddle.ParamAttr(name=weight_name)
            self.fc = paddle.nn.Linear(64, 64, weight_attr=attr)  # square: the dangerous case
            self.head = paddle.nn.Linear(64, 10)

        def forward(self, x):  # type: ignore[no-untyped-def]
            return self.head(paddle.nn.functional.relu(self.fc(x)))

    with paddle.utils.unique_name.guard():  # a fresh name space: the names may be reused
        net = Net()
    net.eval()
    return net


def torch_twin():  # type: ignore[no-untyped-def]
    torch = pytest.importorskip("torch")

    class Twin(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(64, 64)
            self.head = torch.nn.Linear(64, 10)

        def forward(self, x):  # type: ignore[no-untyped-def]
            return self.head(torch.relu(self.fc(x)))

    return Twin().eval()


def twin_logits(pt: Path, x: np.ndarray) -> np.ndarray:
    import torch

    twin = torch_twin()
    twin.load_state_dict(torch.load(pt, weights_only=True), strict=True)
    with torch.no_grad():
        return twin(torch.from_numpy(x)).numpy()


@pytest.mark.parametrize("weight_name", ["fc_0.w_0", "proj_weights"])
def test_user_named_square_linear_stops_then_converts_with_a_map(
    weight_name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    paddle = pytest.importorskip("paddle")
    pytest.importorskip("torch")
    net = paddle_net(weight_name)
    paddle.save(net.state_dict(), str(tmp_path / "net.pdparams"))
    x = np.random.default_rng(0).standard_normal((32, 64)).astype(np.float32)
    want = net(paddle.to_tensor(x)).numpy()

    assert convert(tmp_path / "net.pdparams", tmp_path / "net.pt", "--to", "torch") == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and not (tmp_path / "net.pt").exists()
    assert "the layout of 1 2-D tensor(s) is not known: fc.weight (64, 64)" in err, err
    assert "--map" in err and "--model" in err and "polytrain port" in err, err
    assert "head.weight" not in err  # Paddle named that one: linear_N.w_0

    (tmp_path / "map.json").write_text(json.dumps({"fc.weight": {"kind": "Linear"}}))
    assert convert(tmp_path / "net.pdparams", tmp_path / "net.pt", "--to", "torch",
                   "--map", tmp_path / "map.json") == 0  # fmt: skip
    got = twin_logits(tmp_path / "net.pt", x)
    assert np.abs(got - want).max() <= LOGIT_ATOL


def test_print_map_is_a_map_to_edit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    paddle = pytest.importorskip("paddle")
    pytest.importorskip("torch")
    net = paddle_net("proj_weights")
    paddle.save(net.state_dict(), str(tmp_path / "net.pdparams"))
    x = np.random.default_rng(1).standard_normal((8, 64)).astype(np.float32)
    want = net(paddle.to_tensor(x)).numpy()

    assert convert(tmp_path / "net.pdparams", "--to", "torch", "--print-map") == 0
    out = capsys.readouterr()
    printed = json.loads(out.out)
    assert printed["fc.weight"] == {"native": "fc.weight", "transpose": None}
    assert printed["head.weight"] == {"native": "head.weight", "transpose": True,
                                      "shape": [10, 64]}  # fmt: skip
    assert 'set "transpose" where it is null' in out.err and not list(tmp_path.glob("*.pt"))
    (tmp_path / "map.json").write_text(json.dumps(printed))
    assert convert(tmp_path / "net.pdparams", tmp_path / "a.pt", "--to", "torch",
                   "--map", tmp_path / "map.json") == 2  # fmt: skip
    assert "decide it for this tensor" in capsys.readouterr().err
    printed["fc.weight"]["transpose"] = True
    (tmp_path / "map.json").write_text(json.dumps(printed))
    assert convert(tmp_path / "net.pdparams", tmp_path / "a.pt", "--to", "torch",
                   "--map", tmp_path / "map.json") == 0  # fmt: skip
    assert np.abs(twin_logits(tmp_path / "a.pt", x) - want).max() <= LOGIT_ATOL


def test_generated_names_are_evidence(tmp_path: Path) -> None:
    """A square Embedding (as PyTorch) and a Linear ([in, out]) of paddle.nn, names
    generated by Paddle: converted without a map, each laid out as its layer is."""
    paddle = pytest.importorskip("paddle")
    torch = pytest.importorskip("torch")

    class Net(paddle.nn.Layer):  # type: ignore[name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.emb = paddle.nn.Embedding(16, 16)
            self.out = paddle.nn.Linear(16, 16)

        def forward(self, ids):  # type: ignore[no-untyped-def]
            return self.out(self.emb(ids))

    class Twin(torch.nn.Module):  # type: ignore[name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.emb = torch.nn.Embedding(16, 16)
            self.out = torch.nn.Linear(16, 16)

        def forward(self, ids):  # type: ignore[no-untyped-def]
            return self.out(self.emb(ids))

    net = Net()
    paddle.save(net.state_dict(), str(tmp_path / "e.pdparams"))
    assert convert(tmp_path / "e.pdparams", tmp_path / "e.pt", "--to", "torch") == 0
    twin = Twin()
    twin.load_state_dict(torch.load(tmp_path / "e.pt", weights_only=True), strict=True)
    ids = np.arange(16, dtype=np.int64).reshape(4, 4)
    want = net(paddle.to_tensor(ids)).numpy()
    with torch.no_grad():
        got = twin(torch.from_numpy(ids)).numpy()
    assert np.abs(got - want).max() <= LOGIT_ATOL


# -- never from a name alone ----------------------------------------------------------------------

STRUCTURED = ["fc.weight", "linear.weight", "classifier.weight", "emb.weight"]
TABLE = {  # Paddle parameter name -> transposed (True/False), or None: no evidence
    "linear_0.w_0": True,
    "linear_12.w_0": True,
    "embedding_3.w_0": False,
    "conv2d_1.w_0": False,
    "fc_0.w_0": None,  # the form of a generated name, but no layer of paddle.nn is "fc"
    "proj_weights": None,
    "my_linear_0.w_0": None,  # a subclass of Linear: what it does with it is its own
    "linear.weight": None,
    "linear_0.w_0x": None,
    None: None,  # no name table at all
}


@pytest.mark.parametrize("shape", [(3, 5), (4, 4)])
@pytest.mark.parametrize("structured", STRUCTURED)
def test_no_layout_is_guessed_from_a_name(structured: str, shape: tuple[int, int],
                                          tmp_path: Path) -> None:  # fmt: skip
    """Whatever the structured name and shape, the outcome follows the name table alone:
    transposed, as it is, or refused."""
    value = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    for i, (param, transposed) in enumerate(TABLE.items()):
        table = None if param is None else {structured: param, "fc.bias": "linear_0.b_0"}
        bias = np.zeros(shape[1], np.float32)
        path = paddle_file(tmp_path / f"{i}.pdparams", {structured: value, "fc.bias": bias}, table)
        if transposed is None:
            with pytest.raises(CheckpointError, match=rf"not known: {structured} \({shape[0]}"):
                read_weights(path)
            continue
        got = read_weights(path).params[structured]
        np.testing.assert_array_equal(got, value.T if transposed else value, err_msg=str(param))


def test_writing_a_transposing_format_needs_evidence(tmp_path: Path) -> None:
    params = {"a.weight": np.ones((4, 4), np.float32), "b.weight": np.ones((2, 4), np.float32),
              "b.bias": np.zeros(2, np.float32)}  # fmt: skip
    with pytest.raises(CheckpointError, match=r"2 2-D tensor\(s\) is not known: a.weight \(4, 4"):
        write_weights(tmp_path / "x.pdparams", params, "paddle")
    assert not (tmp_path / "x.pdparams").exists()
    mapping = {"a.weight": {"transpose": False}, "b.": {"kind": "Linear"}}
    write_weights(tmp_path / "x.pdparams", params, "paddle", name_map=mapping)
    assert read_paddle(tmp_path / "x.pdparams")["b.weight"].shape == (4, 2)


# -- maps that scale ------------------------------------------------------------------------------


def test_partial_map_with_prefix_and_regex_round_trips(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    spec = tiny_resnet()
    params = {n: rng.standard_normal(s).astype(np.float32)
              for n, s in spec.parameter_shapes().items()}  # fmt: skip
    mapping = {
        "re:^block\\.body\\.(\\w+)\\.": {"native": "stage.\\1."},
        "conv1.": {"native": "stem."},
        "fc.weight": {"kind": "Linear"},
    }
    write_weights(tmp_path / "r.pdparams", params, "paddle", name_map=mapping)  # no --model
    native = read_paddle(tmp_path / "r.pdparams")
    assert {"stem.weight", "stage.bn2._variance", "stage.conv1.weight"} <= set(native)
    assert "bn1._mean" in native and "fc.weight" in native  # the rest by the generic rules
    np.testing.assert_array_equal(native["fc.weight"], params["fc.weight"].T)
    back = read_weights(tmp_path / "r.pdparams", name_map=mapping)
    assert sorted(back.params) == sorted(params)
    for name, value in params.items():
        np.testing.assert_array_equal(back.params[name], value, err_msg=name)
    # over a built-in model: the prefix renames, the layout stays the model's
    shapes = get_model_spec("lenet").parameter_shapes()
    lenet = {n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()}
    rename = {"fc1.": {"native": "classifier.0."}}
    write_weights(tmp_path / "l.pdparams", lenet, "paddle", model="lenet", name_map=rename)
    native = read_paddle(tmp_path / "l.pdparams")
    np.testing.assert_array_equal(native["classifier.0.weight"], lenet["fc1.weight"].T)
    assert "fc2.weight" in native and "fc1.weight" not in native
    again = read_weights(tmp_path / "l.pdparams", model="lenet", name_map=rename).params
    np.testing.assert_array_equal(again["fc1.weight"], lenet["fc1.weight"])


def test_print_map_without_a_framework(tmp_path: Path) -> None:
    """The printed map, fed back, converts exactly as the tool would."""
    rng = np.random.default_rng(2)
    tensors = {
        "enc.weight": rng.standard_normal((3, 5)).astype(np.float32),
        "bn._mean": np.zeros(3, np.float32),
        "bn._variance": np.ones(3, np.float32),
    }
    table = {"enc.weight": "linear_0.w_0", "bn._mean": "batch_norm2d_0.w_1",
             "bn._variance": "batch_norm2d_0.w_2"}  # fmt: skip
    path = paddle_file(tmp_path / "a.pdparams", tensors, table)
    printed, notes = plan_map(path, "neutral")
    assert printed["enc.weight"] == {"native": "enc.weight", "transpose": True, "shape": [5, 3]}
    assert printed["bn.running_var"]["native"] == "bn._variance"
    assert not any("decision" in n for n in notes)
    with_map = read_weights(path, name_map=printed).params
    for name, value in read_weights(path).params.items():
        np.testing.assert_array_equal(with_map[name], value)


@pytest.mark.parametrize(
    "entry, message",
    [
        ({"re:layer(\\d+).": {"native": "stage\\1."}}, r"literal text: write \\\."),
        ({"re:layer(\\d+)\\.(\\d+)\\.": {"native": "stage\\1."}}, "each \\(group\\)"),
        ({"re:layer(\\d+)\\.": {"native": "stage\\3."}}, "a group the pattern lacks"),
        ({"features.": {"native": "backbone"}}, "ends with '.' too"),
        ({"fc.weight": {"kind": "linear"}}, "'kind' is one of .*Linear"),
        ({"fc.weight": {"transpose": None}}, "decide it for this tensor"),
        ({"fc.weight": {"kind": "Linear", "transpose": True}}, "not both"),
        ({"fc.": {"native": "x.", "transpose": True}}, "takes 'native' and 'kind' only"),
    ],
)  # fmt: skip
def test_load_map_says_what_is_wrong(entry: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        load_map(entry)
    assert f"entry {next(iter(entry))!r}" in str(info.value)


def test_regex_entries_read_both_ways() -> None:
    found = load_map({"re:^layer(\\d+)\\.(\\d+)\\.": {"native": "stage\\2.block\\1."}})[None]
    rule, native = found.rule_for_canonical("layer3.1.conv1.weight") or (None, "")
    assert native == "stage1.block3.conv1.weight" and rule is not None
    assert rule.to_canonical(native) == "layer3.1.conv1.weight"
    assert found.rule_for_canonical("fc.weight") is None
