"""Native formats are plugin-declared: a format registered by a plugin the core has never
heard of is detected, read, written and converted like the built-in ones; the numpy
backend's ``.npz`` format converts to and from the frameworks' files."""

from __future__ import annotations

import itertools
import json
import struct
import zipfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from convert_helpers import assert_same, convert, random_params
from polytrain_numpy._format import NumpyFormat
from polytrain_torch._format import TorchFormat

from polytrain import get_model_spec, hookimpl
from polytrain.backend.native_format import LayoutRules, NativeFormat, PathLike
from polytrain.cli.parser import build_parser
from polytrain.errors import CheckpointError
from polytrain.io.convert import read_weights, targets, write_weights
from polytrain.io.native import detect_format, read_native
from polytrain.plugins import registry
from polytrain.testing import tiny_resnet

LENET = get_model_spec("lenet")


# -- a format from a plugin the core does not know ------------------------------------------------

MAGIC = b"TOYW"


def toy_bytes(tensors: Mapping[str, np.ndarray], kinds: Mapping[str, str] | None = None) -> bytes:
    """MAGIC, a JSON header (names, dtypes, shapes, optional layer kinds), raw data."""
    arrays = {k: np.ascontiguousarray(v) for k, v in tensors.items()}
    header: dict[str, Any] = {
        "tensors": [[k, a.dtype.str, list(a.shape)] for k, a in arrays.items()]
    }
    if kinds is not None:
        header["kinds"] = dict(kinds)
    head = json.dumps(header).encode()
    data = b"".join(a.tobytes() for a in arrays.values())
    return MAGIC + struct.pack("<I", len(head)) + head + data


def toy_header(path: PathLike) -> tuple[dict[str, Any], bytes]:
    data = Path(path).read_bytes()
    try:
        (size,) = struct.unpack("<I", data[4:8])
        return json.loads(data[8 : 8 + size]), data[8 + size :]
    except (struct.error, ValueError) as exc:
        raise CheckpointError(f"{path} is truncated or corrupt ({exc}).") from exc


class ToyFormat(NativeFormat):
    """Not canonical in every way the rules allow: BatchNorm weight/running_var renamed,
    Linear weights transposed, a constant per Linear layer."""

    name = "toy"
    label = "Toy .toyw"
    suffix = ".toyw"
    signature = "a toy file (54 4f 59 57)"
    order = 90
    layout = LayoutRules(
        renames={"BatchNorm2d": {"weight": "scale", "running_var": "var"}},
        transposed={"Linear": frozenset({"weight"})},
        constants={"Linear": {"tag": np.array(7, dtype=np.int32)}},
        note="toy layout, Linear [in, out]",
    )

    def sniff(self, head: bytes, path: PathLike) -> bool:
        return head.startswith(MAGIC)

    def read(self, path: PathLike) -> dict[str, np.ndarray]:
        header, data = toy_header(path)
        out, offset = {}, 0
        for name, dtype, shape in header["tensors"]:
            size = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
            if offset + size > len(data):
                raise CheckpointError(f"{path} is truncated: {name} has no data.")
            out[name] = np.frombuffer(data[offset : offset + size], dtype).reshape(shape).copy()
            offset += size
        return out

    def encode(self, tensors: Mapping[str, np.ndarray]) -> bytes:
        return toy_bytes(tensors)

    def layer_kinds(self, path: PathLike) -> dict[str, str] | None:
        return toy_header(path)[0].get("kinds")


class ToyPlugin:
    @hookimpl
    def polytrain_register_formats(self, register: Callable[[NativeFormat], None]) -> None:
        register(ToyFormat())


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The toy plugin installed beside the built-in ones (as its entry point would)."""
    pm = registry.make_plugin_manager()
    pm.register(ToyPlugin(), name="toy")
    monkeypatch.setattr(registry, "default_plugin_manager", lambda: pm)
    yield


def test_plugin_format_is_detected_read_written_and_converted(toy: None, tmp_path: Path) -> None:
    assert "toy" in targets()
    assert build_parser().parse_args(["convert", "a", "b", "--to", "toy"]).to == "toy"
    params = random_params(LENET)
    write_weights(tmp_path / "a.toyw", params, "toy", model="lenet")
    assert detect_format(tmp_path / "a.toyw") == "toy"
    fmt, native = read_native(tmp_path / "a.toyw")  # the toy plugin's names and layout
    assert fmt == "toy" and native["fc1.tag"] == 7
    np.testing.assert_array_equal(native["fc1.weight"], params["fc1.weight"].T)
    weights = read_weights(tmp_path / "a.toyw")  # the model is detected through toy's rules
    assert weights.spec is not None and weights.spec.name == "lenet"
    assert_same(weights.params, params)
    # to and from the other formats, through the command line
    chain = ["a.toyw", "b.params", "c.toyw", "d.pdparams", "e.toyw", "ck", "f.toyw"]
    tos = {".toyw": "toy", ".params": "mxnet", ".pdparams": "paddle", "": "neutral"}
    for src, dst in itertools.pairwise(chain):
        assert convert(tmp_path / src, tmp_path / dst, "--to", tos[Path(dst).suffix]) == 0
        assert_same(read_weights(tmp_path / dst).params, params)
    assert (tmp_path / "a.toyw").read_bytes() == (tmp_path / "f.toyw").read_bytes()


def test_plugin_format_layout_rules_per_layer_kind(toy: None, tmp_path: Path) -> None:
    spec = tiny_resnet()
    params = random_params(spec)
    write_weights(tmp_path / "r.toyw", params, "toy", model=spec)
    native = read_native(tmp_path / "r.toyw")[1]
    assert {"bn1.scale", "bn1.var", "bn1.bias", "bn1.running_mean", "fc.tag"} <= set(native)
    assert "bn1.weight" not in native and "bn1.running_var" not in native
    assert_same(read_weights(tmp_path / "r.toyw", model=spec).params, params)
    native["fc.weight"] = native["fc.weight"].T  # canonical layout by mistake
    (tmp_path / "bad.toyw").write_bytes(toy_bytes(native))
    with pytest.raises(CheckpointError, match=r"\(toy layout, Linear \[in, out\]\): wrong shape"):
        read_weights(tmp_path / "bad.toyw", model=spec)


def test_plugin_format_generic_rules_for_an_unknown_model(toy: None, tmp_path: Path) -> None:
    """Renames undone everywhere; a 2-D tensor is transposed only as the file's own
    layer record says, and refused without one."""
    rng = np.random.default_rng(0)
    own = {"head.weight": rng.standard_normal((3, 5)).astype(np.float32),
           "proj.weight": rng.standard_normal((4, 3)).astype(np.float32),
           "norm.scale": np.ones(4, np.float32), "norm.var": np.ones(4, np.float32),
           "norm.running_mean": np.zeros(4, np.float32)}  # fmt: skip
    (tmp_path / "bare.toyw").write_bytes(toy_bytes(own))
    with pytest.raises(
        CheckpointError,
        match=r"layout of 2 2-D tensor\(s\) is not known: head.weight \(3, 5\), proj.weight "
        r"\(4, 3\)\. Toy \.toyw stores Linear weights transposed",
    ):
        read_weights(tmp_path / "bare.toyw")
    kinds = {"head.weight": "Linear", "proj.weight": "Conv1x1"}
    (tmp_path / "own.toyw").write_bytes(toy_bytes(own, kinds))
    weights = read_weights(tmp_path / "own.toyw")
    np.testing.assert_array_equal(weights.params["head.weight"], own["head.weight"].T)
    np.testing.assert_array_equal(weights.params["proj.weight"], own["proj.weight"])
    assert {"norm.weight", "norm.running_var"} <= set(weights.params)
    note = "generic toy rules (scale/var -> weight/running_var: 2 tensor(s) renamed)"
    assert any(note in n for n in weights.notes), weights.notes
    assert any("transposed as Linear weights" in n and "head.weight" in n for n in weights.notes)
    # the kinds read from the file carry over; plain arrays carry none and are refused
    write_weights(tmp_path / "x.toyw", weights, "toy")
    np.testing.assert_array_equal(read_native(tmp_path / "x.toyw")[1]["head.weight"],
                                  own["head.weight"])  # fmt: skip
    with pytest.raises(CheckpointError, match=r"Toy \.toyw stores Linear weights transposed"):
        write_weights(tmp_path / "y.toyw", dict(weights.params), "toy")
    assert not (tmp_path / "y.toyw").exists()


def test_unknown_file_message_lists_the_registered_formats(toy: None, tmp_path: Path) -> None:
    (tmp_path / "x.bin").write_bytes(b"GIF89a....")
    with pytest.raises(CheckpointError, match=r"a Paddle pickle \(80 \.\.\).*a toy file"):
        detect_format(tmp_path / "x.bin")


def test_without_plugins_no_format_is_known(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    pm = registry.make_plugin_manager(autoload=False)
    monkeypatch.setattr(registry, "default_plugin_manager", lambda: pm)
    (tmp_path / "a.params").write_bytes(b"\x12\x01" + bytes(14))
    with pytest.raises(CheckpointError, match="none is installed"):
        detect_format(tmp_path / "a.params")
    assert targets() == ("neutral",)


# -- the numpy backend's .npz ----------------------------------------------------------------------

NPZ = NumpyFormat()
needs_numpy_plugin = pytest.mark.skipif(
    "numpy" not in registry.registered_formats(), reason="the numpy backend is not registered"
)


def test_npz_round_trips_and_is_what_numpy_reads(tmp_path: Path) -> None:
    arrays: dict[str, np.ndarray] = {
        "conv.weight": np.arange(18, dtype=np.float32).reshape(2, 1, 3, 3),
        "f64": np.ones((2, 2)), "i64": np.arange(3), "flag": np.array([True, False]),
        "file": np.zeros(1, np.float16), "scalar": np.array(3.5),
    }  # fmt: skip
    NPZ.write(tmp_path / "a.npz", arrays)
    assert_same(NPZ.read(tmp_path / "a.npz"), arrays)
    with np.load(tmp_path / "a.npz", allow_pickle=False) as archive:  # numpy's own reader
        assert_same({k: archive[k] for k in archive.files}, arrays)
    np.savez(tmp_path / "b.npz", **{k: v for k, v in arrays.items() if k != "file"})
    assert_same(NPZ.read(tmp_path / "b.npz"), {k: v for k, v in arrays.items() if k != "file"})
    with zipfile.ZipFile(tmp_path / "a.npz") as archive:  # equal arrays, equal bytes
        assert {entry.date_time for entry in archive.infolist()} == {(1980, 1, 1, 0, 0, 0)}


def test_npz_is_told_from_a_torch_zip(tmp_path: Path) -> None:
    NPZ.write(tmp_path / "a.npz", {"w": np.ones(2, np.float32)})
    head = (tmp_path / "a.npz").read_bytes()[:16]
    assert NPZ.sniff(head, tmp_path / "a.npz") and not TorchFormat().sniff(head, tmp_path / "a.npz")
    torch = pytest.importorskip("torch")
    torch.save({"w": torch.ones(2)}, tmp_path / "a.pt")
    head = (tmp_path / "a.pt").read_bytes()[:16]
    assert TorchFormat().sniff(head, tmp_path / "a.pt") and not NPZ.sniff(head, tmp_path / "a.pt")


def test_npz_refuses_object_arrays_without_unpickling(tmp_path: Path) -> None:
    np.savez(tmp_path / "obj.npz", w=np.ones(2), o=np.array([{"a": 1}], dtype=object))
    with pytest.raises(CheckpointError, match=r"'o' is not a numeric array \(object\)"):
        NPZ.read(tmp_path / "obj.npz")
    np.savez(tmp_path / "str.npz", s=np.array(["a"]))
    with pytest.raises(CheckpointError, match="'s' is not a numeric array"):
        NPZ.read(tmp_path / "str.npz")
    with pytest.raises(CheckpointError, match="numeric arrays only"):
        NPZ.encode({"s": np.array(["a"])})


def test_npz_claiming_more_than_it_holds_is_refused_before_allocating(tmp_path: Path) -> None:
    with zipfile.ZipFile(tmp_path / "lie.npz", "w") as archive, archive.open("w.npy", "w") as fh:
        header = {"descr": "<f4", "fortran_order": False, "shape": (10**12,)}  # 4 TB
        np.lib.format.write_array_header_1_0(fh, header)
        fh.write(bytes(8))
    with pytest.raises(
        CheckpointError, match=r"'w' of shape \(1000000000000,\) needs 4000000000000"
    ):
        NPZ.read(tmp_path / "lie.npz")


@needs_numpy_plugin
@pytest.mark.parametrize("other", ["torch", "paddle", "mxnet"])
@pytest.mark.parametrize("spec_name", ["lenet", "tiny-resnet"])
def test_npz_converts_to_and_from_the_frameworks(
    other: str, spec_name: str, tmp_path: Path
) -> None:
    if other not in registry.registered_formats():
        pytest.skip(f"the {other} backend is not registered")
    spec = tiny_resnet() if spec_name == "tiny-resnet" else get_model_spec(spec_name)
    params = random_params(spec)
    write_weights(tmp_path / "a.npz", params, "numpy", model=spec)
    assert_same(NPZ.read(tmp_path / "a.npz"), params)  # canonical names and layout
    suffix = registry.registered_formats()[other].suffix
    if spec_name == "lenet":  # a built-in model: the command line detects it
        assert convert(tmp_path / "a.npz", tmp_path / f"b{suffix}", "--to", other) == 0
        assert convert(tmp_path / f"b{suffix}", tmp_path / "c.npz", "--to", "numpy") == 0
    else:  # through Python, with the spec
        weights = read_weights(tmp_path / "a.npz", model=spec)
        write_weights(tmp_path / f"b{suffix}", weights, other, model=spec)
        back = read_weights(tmp_path / f"b{suffix}", model=spec)
        write_weights(tmp_path / "c.npz", back, "numpy", model=spec)
    assert_same(read_weights(tmp_path / f"b{suffix}", model=spec).params, params)
    assert_same(NPZ.read(tmp_path / "c.npz"), params)


# -- Paddle's name table through the format's hook -------------------------------------------------


def test_paddle_name_table_decides_the_transposed_tensors(tmp_path: Path) -> None:
    paddle = pytest.importorskip("paddle")

    class Own(paddle.nn.Layer):  # type: ignore[name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.head = paddle.nn.Linear(5, 3)
            self.table = self.create_parameter([4, 6])  # 2-D, not a Linear weight

    net = Own()
    paddle.save(net.state_dict(), str(tmp_path / "own.pdparams"))
    # ``table`` is the custom layer's own parameter (own_0.w_0): how that layer uses it is
    # its own code's business, so the file is no evidence of its layout
    with pytest.raises(CheckpointError, match=r"not known: table \(4, 6\)"):
        read_weights(tmp_path / "own.pdparams")
    weights = read_weights(tmp_path / "own.pdparams", name_map={"table": {"transpose": False}})
    np.testing.assert_array_equal(weights.params["head.weight"], net.head.weight.numpy().T)
    np.testing.assert_array_equal(weights.params["table"], net.table.numpy())
    assert any("transposed as Linear weights" in n for n in weights.notes), weights.notes
