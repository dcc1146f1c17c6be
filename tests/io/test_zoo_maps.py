"""``polytrain convert --zoo``: the maps polytrain ships for the Paddle and Gluon zoo models
with a torchvision twin (polytrain/io/zoo_maps/, generated and verified against real
torchvision by ``python -m benchmarks.zoo_maps``) convert a zoo model's saved file without
the model objects. Here, without torchvision: every shipped map against its zoo model's
names and shapes, a few zoo models saved and converted (the output's names and shapes are
torchvision's state dict as recorded; logits where tests/torch_twins.py has the twin),
the other direction, a fine-tuned head, and each refusal in one line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from benchmarks.zoo_twins import NO_COUNTERPART, TRIED, TWINS, Twin, build_source, save_source
from polytrain.cli.main import main
from polytrain.io import native as native_io
from polytrain.io.zoo import load_zoo_map, maps_folder, zoo_names

BY_KEY = {twin.key: twin for twin in TWINS}
RNG = np.random.default_rng(5)


def convert(capsys: pytest.CaptureFixture[str], *argv: Any) -> str:
    code = main(["convert", *map(str, argv)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return captured.out


def refused(capsys: pytest.CaptureFixture[str], out: Path, *argv: Any) -> str:
    """``polytrain convert ARGV OUT``: exit 2, one line, nothing written."""
    code = main(["convert", *map(str, argv)])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert err.startswith("polytrain convert: error: ") and "\n" not in err, err
    assert not out.exists()
    return err


def saved(twin: Twin, folder: Path, classes: int | None = None) -> tuple[Any, Path]:
    """The zoo model with random weights, saved as its framework saves it."""
    model = build_source(twin, RNG, classes)
    path = folder / f"{twin.name}{'.pdparams' if twin.zoo == 'paddle' else '.params'}"
    save_source(twin, model, str(path))
    return model, path


def torch_state(path: Path) -> dict[str, tuple[int, ...]]:
    fmt, tensors = native_io.read_native(path)
    assert fmt == "torch"
    return {name: tuple(np.shape(value)) for name, value in tensors.items()}


# -- the shipped maps ------------------------------------------------------------------------------


def test_every_twin_has_a_shipped_map_and_every_other_model_a_reason() -> None:
    assert zoo_names() == [twin.key for twin in TWINS]
    index = json.loads((maps_folder() / "index.json").read_text())
    assert set(index["no_twin"]) == {t.key for t in TRIED} | set(NO_COUNTERPART)
    for key in zoo_names():
        zmap = load_zoo_map(key)
        natives = [t.native for t in zmap.ported()]
        assert len(set(natives)) == len(natives) and zmap.head, key
        assert zmap.verified["round_trip"] == "identical", key
        assert zmap.verified["convert_logit_relative"] <= 1e-5, key


def paddle_shapes(twin: Twin) -> dict[str, tuple[int, ...]]:
    """The names and shapes of the Paddle zoo model's state dict, without its memory."""
    import paddle
    import paddle.vision.models as vision

    with paddle.LazyGuard():
        model = getattr(vision, twin.build_name)(**twin.kwargs)
    return {name: tuple(value.shape) for name, value in model.state_dict().items()}


def gluon_shapes(twin: Twin) -> dict[str, tuple[int, ...]]:
    """The same for Gluon: the shapes inferred on its symbol, by structured name."""
    import mxnet as mx
    from mxnet.gluon.model_zoo import vision

    model = vision.get_model(twin.build_name, **twin.kwargs)
    symbol = model(mx.sym.var("data"))
    args, _, aux = symbol.infer_shape(data=(1, 3, twin.size, twin.size))
    by_symbol = {
        **dict(zip(symbol.list_arguments(), args, strict=True)),
        **dict(zip(symbol.list_auxiliary_states(), aux, strict=True)),
    }
    return {name: by_symbol[p.name] for name, p in model._collect_params_with_prefix().items()}


@pytest.mark.slow
@pytest.mark.parametrize("zoo", ["paddle", "gluon"])
def test_every_shipped_map_fits_its_zoo_model(zoo: str) -> None:
    """The zoo models of the installed framework still have the names and shapes each map
    was generated from (built without their memory)."""
    pytest.importorskip("paddle" if zoo == "paddle" else "mxnet")
    shapes = paddle_shapes if zoo == "paddle" else gluon_shapes
    for key in [k for k in zoo_names() if k.startswith(zoo + ":")]:
        zmap = load_zoo_map(key)
        assert zmap.native_shapes(zmap.classes) == shapes(BY_KEY[key]), key


# -- converting --------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    "key", ["paddle:densenet121", "paddle:mobilenet_v3_small", "paddle:shufflenet_v2_x0_5",
            "gluon:densenet121"],
)  # fmt: skip
def test_a_zoo_models_file_converts_into_torchvisions_state_dict(
    key: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    twin = BY_KEY[key]
    pytest.importorskip("paddle" if twin.zoo == "paddle" else "mxnet")
    pytest.importorskip("torch")
    _, source = saved(twin, tmp_path)
    out = tmp_path / "out.pt"
    printed = convert(capsys, source, out, "--to", "torch", "--zoo", key)
    zmap = load_zoo_map(key)
    assert torch_state(out) == zmap.target_shapes(zmap.classes)
    assert f"zoo map {key}: {zmap.source} -> {zmap.twin}" in printed


def torch_logits(model: Any, path: Path, batch: np.ndarray) -> np.ndarray:
    import torch

    model.load_state_dict(torch.load(path, weights_only=True), strict=True)
    with torch.no_grad():
        return np.asarray(model.eval()(torch.from_numpy(batch)).numpy())


@pytest.mark.slow
@pytest.mark.parametrize(
    ("key", "classes", "twin_class"),
    [("paddle:resnet18", 10, "ResNet18"), ("gluon:resnet18_v1", None, "ResNet18"),
     ("gluon:squeezenet1.1", None, "SqueezeNet11")],
)  # fmt: skip
def test_the_converted_file_gives_the_zoo_models_logits(
    key: str, classes: int | None, twin_class: str, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """Into a torchvision twin written in tests/torch_twins.py, loaded strictly; Paddle's
    ResNet-18 fine-tuned to 10 classes (the head's class count differs from the map's)."""
    twin = BY_KEY[key]
    pytest.importorskip("paddle" if twin.zoo == "paddle" else "mxnet")
    pytest.importorskip("torch")
    import torch_twins

    from benchmarks.zoo_twins import source_logits

    model, source = saved(twin, tmp_path, classes)
    out = tmp_path / "out.pt"
    printed = convert(capsys, source, out, "--to", "torch", "--zoo", key)
    batch = RNG.standard_normal((2, 3, 224, 224)).astype(np.float32)
    want = source_logits(twin, model, batch)
    got = torch_logits(getattr(torch_twins, twin_class)(classes or 1000), out, batch)
    assert np.max(np.abs(got - want)) <= 1e-4 * np.max(np.abs(want))
    if classes:
        assert f"{classes} classes (the zoo's 1000)" in printed
        assert "num_classes=10" in printed


def test_a_torchvision_file_converts_into_the_zoo_models_format(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same map the other way: the zoo model's file back, bit for bit."""
    twin = BY_KEY["gluon:squeezenet1.1"]
    pytest.importorskip("mxnet")
    pytest.importorskip("torch")
    _, source = saved(twin, tmp_path)
    convert(capsys, source, tmp_path / "tv.pt", "--to", "torch", "--zoo", twin.key)
    back = tmp_path / "back.params"
    convert(capsys, tmp_path / "tv.pt", back, "--to", "mxnet", "--zoo", twin.key)
    original, returned = native_io.read_native(source)[1], native_io.read_native(back)[1]
    assert list(returned) == list(original)
    for name, value in original.items():
        np.testing.assert_array_equal(returned[name], value, err_msg=name)


# -- refusals -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gluon_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("mxnet")
    return saved(BY_KEY["gluon:squeezenet1.1"], tmp_path_factory.mktemp("zoo"))[1]


@pytest.mark.parametrize(
    ("zoo", "extra", "expected"),
    [
        ("gluon:squeezenet11", (), "did you mean gluon:squeezenet1.1"),
        ("squeezenet1.1", (), "is not ZOO:MODEL"),
        ("gluon:resnet50_v2", (), "pre-activation ResNet (v2): torchvision has none"),
        ("gluon:resnet50_v1", (), "strides its first 1x1 convolution"),
        ("gluon:squeezenet1.0", (), "wrong shape features.0.weight (64, 3, 3, 3) (expected (96,"),
        ("paddle:resnet18", (), "is no file of paddle:resnet18"),
        ("gluon:squeezenet1.1", ("--map", "m.json"), "gives the map: drop --map"),
    ],
)  # fmt: skip
def test_a_zoo_name_or_file_that_does_not_fit_is_refused_in_one_line(
    gluon_file: Path, zoo: str, extra: tuple[str, ...], expected: str, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    out = tmp_path / "out.pt"
    err = refused(capsys, out, gluon_file, out, "--to", "torch", "--zoo", zoo, *extra)
    assert expected in err


def test_a_file_of_another_depth_and_a_target_without_its_names_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("paddle")
    _, source = saved(BY_KEY["paddle:shufflenet_v2_x0_5"], tmp_path)
    out = tmp_path / "out.pt"
    err = refused(capsys, out, source, out, "--to", "torch", "--zoo", "paddle:shufflenet_v2_x1_0")
    assert "wrong shape" in err and "polytrain port" in err
    out = tmp_path / "out.params"
    err = refused(capsys, out, source, out, "--to", "mxnet", "--zoo", "paddle:shufflenet_v2_x0_5")
    assert "give --to torch" in err
