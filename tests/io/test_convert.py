"""polytrain convert: native files read without their frameworks, maps that agree with every
backend's native files, bit-exact round trips, logits that survive conversion, and bad
input that fails in one line with nothing written.

Run ``pytest tests/io/test_convert.py -s -k logits`` to see the measured logit differences.
"""

from __future__ import annotations

import importlib
import itertools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from convert_helpers import assert_same, convert, random_params
from polytrain_mxnet._format import MXNetFormat
from polytrain_paddle._format import PaddleFormat
from polytrain_torch._format import TorchFormat

from polytrain import get_backend, get_model_spec
from polytrain.backend.base import Model
from polytrain.data import load_dataset
from polytrain.errors import CheckpointError, ConfigError
from polytrain.io.checkpoint import save_checkpoint
from polytrain.io.convert import NameRule, builtin_map, load_map, read_weights, write_weights
from polytrain.io.native import formats as native_formats
from polytrain.neutral.models import (
    MODELS,
    Linear,
    ModelSpec,
    MultiHeadSelfAttention,
    layer_parameters,
    seq,
)
from polytrain.neutral.optim import OptimizerConfig
from polytrain.testing import backends_under_test, tiny_resnet
from polytrain.training.step import StepRunner

BACKENDS = backends_under_test()
ALL = {"torch", "paddle", "mxnet"}
MNIST_T10K = Path(__file__).parents[1] / "fixtures" / "mnist-t10k"
SPECS = {"lenet": get_model_spec("lenet"), "paddle-mnist": get_model_spec("paddle-mnist"),
         "tiny-resnet": tiny_resnet()}  # fmt: skip
SUFFIX = {"torch": ".pt", "paddle": ".pdparams", "mxnet": ".params"}
LOGIT_ATOL = 1e-5

read_torch, read_paddle, read_mxnet = TorchFormat().read, PaddleFormat().read, MXNetFormat().read
encode_paddle, encode_mxnet = PaddleFormat().encode, MXNetFormat().encode
needs_all = pytest.mark.skipif(not set(BACKENDS) >= ALL, reason="needs all three backends")


# -- the formats, against each framework's own reader and writer ---------------------------------


def test_torch_reader_matches_torch_load(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    t = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    state = {
        "transposed": t.t(), "slice": t[1:3, 2:], "half": t.half(), "int8": t.to(torch.int8),
        "bool": t > 3, "param": torch.nn.Parameter(t.clone()), "scalar": torch.tensor(7),
        "uint16": t.to(torch.uint16),
    }  # fmt: skip
    torch.save(state, tmp_path / "a.pt")
    got = read_torch(tmp_path / "a.pt")
    want = torch.load(tmp_path / "a.pt", weights_only=True)
    for name, tensor in want.items():
        assert got[name].dtype == tensor.detach().numpy().dtype, name
        np.testing.assert_array_equal(got[name], tensor.detach().numpy(), err_msg=name)
    torch.save({"b": t.bfloat16()}, tmp_path / "b.pt")  # numpy has no bfloat16: exact float32
    np.testing.assert_array_equal(read_torch(tmp_path / "b.pt")["b"], t.numpy())
    # a model's own state_dict (OrderedDict with _metadata), nested in a training checkpoint
    net = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3), torch.nn.BatchNorm2d(2))
    torch.save({"epoch": 3, "state_dict": net.state_dict()}, tmp_path / "c.pt")
    got = read_torch(tmp_path / "c.pt")
    assert got["1.num_batches_tracked"].dtype == np.int64
    assert_same(got, {k: v.numpy() for k, v in net.state_dict().items()})


class Evil:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        import os

        return os.system, ("touch pwned",)


def test_torch_reader_refuses_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    torch.save({"w": torch.ones(2), "f": Evil()}, tmp_path / "evil.pt")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CheckpointError, match=r"system, which is not part of a state dict"):
        read_torch(tmp_path / "evil.pt")
    assert not (tmp_path / "pwned").exists()


def test_mxnet_format_is_byte_identical(tmp_path: Path) -> None:
    mx = pytest.importorskip("mxnet")
    rng = np.random.default_rng(0)
    arrays: dict[str, np.ndarray] = {
        "conv.weight": rng.standard_normal((2, 1, 3, 3)).astype(np.float32),
        "i64": np.arange(3, dtype=np.int64), "f16": np.ones(4, np.float16),
        "f64": np.ones((2, 2)), "u8": np.arange(5, dtype=np.uint8),
    }  # fmt: skip
    mx.nd.save(
        str(tmp_path / "m.params"), {k: mx.nd.array(v, dtype=v.dtype) for k, v in arrays.items()}
    )
    assert (tmp_path / "m.params").read_bytes() == encode_mxnet(arrays)
    assert_same(read_mxnet(tmp_path / "m.params"), arrays)


def test_paddle_format_is_byte_identical(tmp_path: Path) -> None:
    paddle = pytest.importorskip("paddle")
    arrays: dict[str, np.ndarray] = {
        "fc.weight": np.arange(6, dtype=np.float32).reshape(2, 3),
        "fc.bias": np.ones(3),
    }
    paddle.save(arrays, str(tmp_path / "p.pdparams"))
    assert (tmp_path / "p.pdparams").read_bytes() == encode_paddle(arrays)
    assert_same(read_paddle(tmp_path / "p.pdparams"), arrays)


def test_reading_imports_no_framework(tmp_path: Path) -> None:
    """.pt, .pdparams, .params and neutral are read, and the latter three written, without
    importing torch, paddle or mxnet."""
    params = random_params(SPECS["lenet"])
    files = [tmp_path / "a.pdparams", tmp_path / "a.params", tmp_path / "ck"]
    for path, fw in zip(files, ("paddle", "mxnet", "neutral"), strict=True):
        write_weights(path, params, fw, model="lenet")
    if "torch" in BACKENDS:
        files.append(tmp_path / "a.pt")
        write_weights(files[-1], params, "torch", model="lenet")
    code = (
        "import sys; from polytrain.io.convert import convert, read_weights\n"
        f"for f in {[str(f) for f in files]!r}: read_weights(f)\n"
        f"convert({str(files[0])!r}, {str(tmp_path / 'b.params')!r}, 'mxnet')\n"
        "print(sorted({'torch', 'paddle', 'mxnet'} & set(sys.modules)))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]", done.stderr


# -- the built-in maps agree with what every backend writes and reads ----------------------------


@pytest.mark.parametrize("spec_name", list(SPECS))
def test_builtin_maps_match_the_backends(backend_name: str, spec_name: str, tmp_path: Path) -> None:
    b, spec = get_backend(backend_name), SPECS[spec_name]
    params = random_params(spec)
    model = b.build_model(spec)
    b.set_params(model, params)
    b.save_native(model, str(tmp_path / f"saved{b.native_suffix}"))
    assert_same(read_weights(tmp_path / f"saved{b.native_suffix}", model=spec).params, params)

    write_weights(tmp_path / f"ours{b.native_suffix}", params, backend_name, model=spec)
    fresh = b.build_model(spec)
    b.load_native(fresh, str(tmp_path / f"ours{b.native_suffix}"))
    assert_same(b.get_params(fresh), params)
    load_with_framework(backend_name, fresh, tmp_path / f"ours{b.native_suffix}")
    assert_same(b.get_params(fresh), params)


def load_with_framework(backend: str, model: Model, path: Path) -> None:
    """Load ``path`` with the framework's own loader, strictly."""
    native = model.native
    if backend == "torch":
        import torch

        native.load_state_dict(torch.load(path, weights_only=True), strict=True)  # type: ignore[attr-defined]
    elif backend == "paddle":
        import paddle

        missing, unexpected = native.set_state_dict(paddle.load(str(path)))  # type: ignore[attr-defined]
        assert not missing and not unexpected
    elif backend == "mxnet":
        native.load_parameters(str(path))  # type: ignore[attr-defined]  # strict by default
    elif backend == "jax":  # Flax's loader, where Flax is installed (polytrain needs none)
        serialization = pytest.importorskip("flax.serialization")
        tree = serialization.msgpack_restore(path.read_bytes())
        flat = {".".join(k): v for k, v in _flat_items(tree)}
        get_backend(backend).set_params(model, flat)
    else:  # numpy's own loader; the file holds the canonical tensors
        with np.load(path, allow_pickle=False) as archive:
            get_backend(backend).set_params(model, {k: archive[k] for k in archive.files})


def _flat_items(tree: Any, prefix: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    """The leaves of a nested dict with their key paths."""
    if not isinstance(tree, dict):
        return [(prefix, tree)]
    return [item for k, v in tree.items() for item in _flat_items(v, (*prefix, k))]


def assert_native_round_trip(backend: str, spec: ModelSpec, tmp_path: Path) -> None:
    """What ``backend`` writes for ``spec`` reads back canonical, and what polytrain writes in
    that format loads into the backend and into the framework's own loader, strictly."""
    b = get_backend(backend)
    params = random_params(spec)
    model = b.build_model(spec)
    b.set_params(model, params)
    assert_same(b.get_params(model), params)
    assert b.parameter_names(model) == list(params)
    saved = tmp_path / f"saved{b.native_suffix}"
    b.save_native(model, str(saved))
    assert_same(read_weights(saved, model=spec).params, params)
    ours = tmp_path / f"ours{b.native_suffix}"
    write_weights(ours, params, backend, model=spec)
    fresh = b.build_model(spec)
    b.load_native(fresh, str(ours))
    assert_same(b.get_params(fresh), params)
    load_with_framework(backend, fresh, ours)
    assert_same(b.get_params(fresh), params)


def test_builtin_maps_describe_the_layouts() -> None:
    spec = tiny_resnet()
    paddle, mxnet = builtin_map(spec, "paddle"), builtin_map(spec, "mxnet")
    assert paddle.entries["fc.weight"].transpose and not paddle.entries["conv1.weight"].transpose
    assert paddle.entries["bn1.running_var"].native == "bn1._variance"
    assert mxnet.entries["block.body.bn2.weight"].native == "block.body.bn2.gamma"
    assert "bn1.num_batches_tracked" in builtin_map(spec, "torch").constants


# -- polytrain convert ---------------------------------------------------------------------------


@needs_all
def test_round_trip_torch_paddle_mxnet_torch_is_bit_exact(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    spec = SPECS["lenet"]
    params = random_params(spec)
    b = get_backend("torch")
    model = b.build_model(spec)
    b.set_params(model, params)
    b.save_native(model, str(tmp_path / "start.pt"))
    chain = [("torch", "start.pt"), ("paddle", "a.pdparams"), ("mxnet", "b.params"),
             ("torch", "end.pt"), ("neutral", "ck"), ("paddle", "c.pdparams")]  # fmt: skip
    for (_, src), (fw, dst) in itertools.pairwise(chain):
        assert convert(tmp_path / src, tmp_path / dst, "--to", fw) == 0
        assert_same(read_weights(tmp_path / dst).params, params)
    start = torch.load(tmp_path / "start.pt", weights_only=True)
    end = torch.load(tmp_path / "end.pt", weights_only=True)
    assert list(start) == list(end)
    assert all(torch.equal(start[k], end[k]) for k in start)
    for fw, name in chain[1:4] + chain[5:]:  # each framework's own loader takes the file
        load_with_framework(fw, get_backend(fw).build_model(spec), tmp_path / name)


def test_convert_prints_what_it_did(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = SPECS["paddle-mnist"]
    (tmp_path / "m.params").write_bytes(encode_mxnet(random_params(spec)))
    assert convert(tmp_path / "m.params", tmp_path / "ck", "--to", "neutral") == 0
    out = capsys.readouterr().out
    assert "(mxnet) ->" in out and "model paddle-mnist" in out and "6 tensors" in out


def test_user_map_for_own_model(tmp_path: Path) -> None:
    """A Paddle model of the user's own, named differently: the JSON map says how."""
    rng = np.random.default_rng(0)
    w, b = rng.standard_normal((784, 10)).astype(np.float32), np.zeros(10, np.float32)
    (tmp_path / "own.pdparams").write_bytes(encode_paddle({"head.w": w, "head.b": b}))
    mapping = {"fc.weight": {"native": "head.w", "transpose": True, "shape": [10, 784]},
               "fc.bias": "head.b"}  # fmt: skip
    (tmp_path / "map.json").write_text(json.dumps(mapping))
    assert convert(tmp_path / "own.pdparams", tmp_path / "ck", "--to", "neutral",
                   "--map", tmp_path / "map.json") == 0  # fmt: skip
    got = read_weights(tmp_path / "ck").params
    np.testing.assert_array_equal(got["fc.weight"], w.T)
    assert convert(tmp_path / "ck", tmp_path / "back.pdparams", "--to", "paddle",
                   "--map", tmp_path / "map.json") == 0  # fmt: skip
    assert_same(read_paddle(tmp_path / "back.pdparams"), {"head.w": w, "head.b": b})
    # from Python, and between Paddle and MXNet with one map per framework
    two = load_map({"paddle": mapping, "mxnet": {"fc.weight": "out.weight", "fc.bias": "out.bias"}})
    assert two["mxnet"]["fc.weight"].native == "out.weight"
    with pytest.raises(ConfigError, match="write it as"):
        write_weights(tmp_path / "x.params", got, "mxnet", name_map=mapping, other="paddle")


# -- logits on the 10,000 real MNIST test digits survive conversion ------------------------------


@pytest.fixture(scope="module")
def mnist_t10k() -> np.ndarray:
    return load_dataset("mnist", "test", data_dir=MNIST_T10K, download=False).x


def train_briefly(backend: str, steps: int = 12) -> dict[str, np.ndarray]:
    """A LeNet trained for a few steps on a Fashion-MNIST slice."""
    data = load_dataset("fashion-mnist", "train").subset(64 * steps)
    b, spec = get_backend(backend), SPECS["lenet"]
    model = b.build_model(spec)
    b.set_params(model, spec.init_params(seed=0))
    runner = StepRunner(b, model, b.make_optimizer(model, OptimizerConfig("momentum", lr=0.05)))
    for i in range(steps):
        runner.train_step(data.x[64 * i : 64 * (i + 1)], data.y[64 * i : 64 * (i + 1)])
    return b.get_params(model)


def logits(backend: str, path: Path, x: np.ndarray) -> np.ndarray:
    b = get_backend(backend)
    model = b.build_model(SPECS["lenet"])
    b.load_native(model, str(path))
    runner = StepRunner(b, model, b.make_optimizer(model, OptimizerConfig("sgd", lr=0.1)))
    return np.concatenate([runner.predict(x[i : i + 2000]) for i in range(0, len(x), 2000)])


@pytest.mark.slow
@needs_all
def test_logits_agree_after_conversion(mnist_t10k: np.ndarray, tmp_path: Path) -> None:
    assert len(mnist_t10k) == 10_000
    worst: dict[tuple[str, str], float] = {}
    largest = 0.0
    for source in ("torch", "paddle", "mxnet"):
        b = get_backend(source)
        model = b.build_model(SPECS["lenet"])
        b.set_params(model, train_briefly(source))
        src = tmp_path / f"{source}{SUFFIX[source]}"
        b.save_native(model, str(src))
        reference = logits(source, src, mnist_t10k)
        assert reference.shape == (10_000, 10) and np.ptp(reference) > 1.0  # a trained model
        largest = max(largest, float(np.abs(reference).max()))
        for target in ("torch", "paddle", "mxnet"):
            if target == source:
                continue
            dst = tmp_path / f"{source}-to-{target}{SUFFIX[target]}"
            assert convert(src, dst, "--to", target) == 0
            worst[source, target] = float(np.abs(logits(target, dst, mnist_t10k) - reference).max())
    table = "\n".join(f"  {s:>6} -> {t:<6} max |logit difference| {d:.2e}"
                      for (s, t), d in worst.items())  # fmt: skip
    print(f"\nLeNet trained on each framework, converted, MNIST t10k (10,000 digits, "
          f"|logits| up to {largest:.1f}):\n{table}")  # fmt: skip
    assert max(worst.values()) <= LOGIT_ATOL, table


# -- bad input: one line, exit 2, nothing written -------------------------------------------------


def lenet_files(tmp_path: Path) -> dict[str, Path]:
    params = random_params(SPECS["lenet"])
    files = {"paddle": tmp_path / "ok.pdparams", "mxnet": tmp_path / "ok.params"}
    write_weights(files["paddle"], params, "paddle", model="lenet")
    write_weights(files["mxnet"], params, "mxnet", model="lenet")
    if "torch" in BACKENDS:
        files["torch"] = tmp_path / "ok.pt"
        write_weights(files["torch"], params, "torch", model="lenet")
    return files


def run_bad(tmp_path: Path, capsys: pytest.CaptureFixture[str], source: Path, *extra: str) -> str:
    out = tmp_path / "out" / "result.pt"
    before = set(tmp_path.rglob("*"))
    assert convert(source, out, "--to", "torch", *extra) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("polytrain convert: error: ") and "\n" not in err, err
    assert not out.exists() and set(tmp_path.rglob("*")) - before <= {out.parent}
    assert not out.parent.exists() or not any(out.parent.iterdir())
    return err


@pytest.mark.parametrize("fmt", ["torch", "paddle", "mxnet"])
def test_truncated_file(fmt: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    files = lenet_files(tmp_path)
    if fmt not in files:
        pytest.skip("torch is not under test")
    data = files[fmt].read_bytes()
    files[fmt].write_bytes(data[: len(data) * 2 // 3])
    assert "truncated" in run_bad(tmp_path, capsys, files[fmt])


@pytest.mark.parametrize(
    "content, message",
    [(b"", "is empty"), (b"GIF89a....", "not a weights file"),
     (b"PK\x03\x04 not really a zip", "truncated or corrupt"),
     (b"\x12\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x05", "truncated")],
)  # fmt: skip
def test_wrong_magic(content: bytes, message: str, tmp_path: Path,
                     capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    (tmp_path / "bad.pt").write_bytes(content)
    assert message in run_bad(tmp_path, capsys, tmp_path / "bad.pt")


def test_file_of_another_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_weights(tmp_path / "pm.params", random_params(SPECS["paddle-mnist"]), "mxnet",
                  model="paddle-mnist")  # fmt: skip
    err = run_bad(tmp_path, capsys, tmp_path / "pm.params", "--model", "lenet")
    assert "does not match model 'lenet'" in err and "--model paddle-mnist" in err


def test_tensor_with_the_wrong_shape(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    params = random_params(SPECS["lenet"])
    native = builtin_map(SPECS["lenet"], "paddle").to_native(params)
    native["fc1.weight"] = native["fc1.weight"].T  # written in torch's layout by mistake
    (tmp_path / "bad.pdparams").write_bytes(encode_paddle(native))
    err = run_bad(tmp_path, capsys, tmp_path / "bad.pdparams", "--model", "lenet")
    assert "wrong shape fc1.weight (128, 800) (expected (800, 128))" in err


def test_newer_checkpoint_version(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ck = save_checkpoint(tmp_path / "ck", params=random_params(SPECS["lenet"]), spec=SPECS["lenet"])
    manifest = json.loads((ck / "manifest.json").read_text())
    (ck / "manifest.json").write_text(json.dumps({**manifest, "format_version": 99}))
    assert "format version 99" in run_bad(tmp_path, capsys, ck)


def test_writing_pt_without_torch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch now fails
    with pytest.raises(CheckpointError, match=r"pip install 'polytrain\[torch\]'.*--to neutral"):
        write_weights(tmp_path / "a.pt", random_params(SPECS["lenet"]), "torch", model="lenet")
    assert not list(tmp_path.iterdir())


def test_bad_map(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    files = lenet_files(tmp_path)
    (tmp_path / "map.json").write_text('{"fc1.weight": {"nativ": "x"}}')
    err = run_bad(tmp_path, capsys, files["mxnet"], "--map", str(tmp_path / "map.json"))
    assert "entry 'fc1.weight'" in err


# -- float64 weights (a --precision fp64 run) ------------------------------------------------------


def test_fp64_checkpoint_converts_to_float32_native_by_default(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Plain Paddle refuses a float64 tensor for a float32 parameter: native files are
    float32 unless --dtype float64 asks otherwise; neutral copies keep float64."""
    spec = get_model_spec("lenet")
    wide = {k: v.astype(np.float64) / 3 for k, v in random_params(spec).items()}
    save_checkpoint(tmp_path / "ck", params=wide, spec=spec, param_dtype="float64")
    readers = {"torch": read_torch, "paddle": read_paddle, "mxnet": read_mxnet}
    for to, reader in readers.items():
        out = tmp_path / f"m{SUFFIX[to]}"
        assert convert(tmp_path / "ck", out, "--to", to) == 0
        assert "written as float32, what native code expects" in capsys.readouterr().out
        assert {str(a.dtype) for a in reader(out).values()} == {"float32"}, to
        back = read_weights(out, model="lenet").params
        assert_same(back, {k: v.astype(np.float32) for k, v in wide.items()})
        kept = tmp_path / f"m64{SUFFIX[to]}"
        assert convert(tmp_path / "ck", kept, "--to", to, "--dtype", "float64") == 0
        assert {str(a.dtype) for a in reader(kept).values()} == {"float64"}, to
    assert convert(tmp_path / "ck", tmp_path / "copy", "--to", "neutral") == 0
    copy = read_weights(tmp_path / "copy").params
    assert_same(copy, wide)  # float64 kept, values exact
    with pytest.raises(ConfigError, match="Unknown dtype 'float16'"):
        write_weights(tmp_path / "x.pt", wide, "torch", dtype="float16")


def test_generic_rule_notes_say_what_was_renamed(tmp_path: Path) -> None:
    """Gluon's export() names (``net_batchnorm0_gamma``) have no ``.gamma`` leaf: the note
    must not claim the gamma/beta renames happened; with structured names it counts them."""
    rng = np.random.default_rng(0)
    exported = {"net_batchnorm0_gamma": rng.random(3), "net_dense0_weight": rng.random((2, 3))}
    structured = {"bn.gamma": rng.random(3), "bn.beta": rng.random(3), "fc.weight": rng.random(4)}
    notes = {}
    for name, tensors in (("exported", exported), ("structured", structured)):
        source = tmp_path / f"{name}.params"
        source.write_bytes(
            MXNetFormat().encode({k: v.astype(np.float32) for k, v in tensors.items()})
        )
        notes[name] = " ".join(read_weights(source).notes)
    assert "none renamed, no name ends in .gamma or .beta" in notes["exported"]
    assert "2 tensor(s) renamed" in notes["structured"]


def test_a_large_input_is_announced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A conversion of a large file says what it does before the seconds it takes."""
    cli = importlib.import_module("polytrain.cli.convert")
    ck = save_checkpoint(tmp_path / "ck", params=random_params(SPECS["lenet"]), spec=SPECS["lenet"])
    assert convert(ck, tmp_path / "small.pdparams", "--to", "paddle") == 0
    assert "reading" not in capsys.readouterr().err  # small: silent
    monkeypatch.setattr(cli, "LARGE_INPUT_BYTES", 100_000)  # the checkpoint holds ~500 kB
    assert convert(ck, tmp_path / "large.pdparams", "--to", "paddle") == 0
    err = capsys.readouterr().err
    assert f"polytrain convert: reading {ck} (" in err and "large.pdparams ..." in err


def test_one_name_rule_serves_both_directions() -> None:
    """Every registered format's rule names each tensor of every built-in model (and an
    attention layer, whose leaves have dots) as its table says for the layer's own leaf,
    reading that name back gives the canonical one, and its layout is the table's."""
    attention = seq(("attn", MultiHeadSelfAttention(8, 2)), ("head", Linear(8, 4)))
    specs = [get_model_spec(m) for m in MODELS]
    specs.append(ModelSpec("attention", attention, input_shape=(3, 8), num_classes=4))
    for fmt, spec in itertools.product(native_formats(), specs):
        rule = NameRule.of(fmt)
        for path, layer in spec.layers():
            kind = type(layer).__name__
            for leaf in layer_parameters(layer):
                name, native = f"{path}.{leaf}", f"{path}.{rule.layout.native_leaf(kind, leaf)}"
                assert rule.native_name(name, kind) == native, (fmt, name)
                assert rule.canonical_name(native) == name, (fmt, native)
                assert rule.transpose(kind, name, 2) == rule.layout.is_transposed(kind, leaf)
