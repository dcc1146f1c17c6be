"""Untrusted files are data (docs/reliability.md, "Untrusted files are data").

A pickle whose loading would create a marker file, given to any option of any command
that reads a file (under every suffix a user could give it), is refused with one line
naming it, and the marker never appears; an output is never one of the inputs (the same
path, a hard link, a symlink); ``port-code`` refuses hostile sources with one line."""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import shlex
import shutil
import sys
import textwrap
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from polytrain.cli.main import main
from polytrain.errors import CheckpointError
from polytrain.io.checkpoint import save_checkpoint
from polytrain.io.native import write_native
from polytrain.neutral.models import get_model_spec
from polytrain.porting.code import files as port_code_files
from polytrain.testing import backends_under_test
from polytrain.training.recipe import Recipe

WALKED = [b for b in backends_under_test() if b in ("torch", "paddle", "mxnet")]
FIXTURES = Path(__file__).parents[1] / "fixtures" / "port_code"


class _Payload:
    """Unpickling this runs ``touch MARKER``: what a hostile weights file does."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return os.system, (f"touch {shlex.quote(str(self.marker))}",)


def _pickle(marker: Path) -> bytes:
    """A plain pickle (what ``paddle.save`` writes), protocol 2: starts with 80 02."""
    return pickle.dumps({"0.weight": _Payload(marker)}, protocol=2)


def _torch_zip(marker: Path) -> bytes:
    """The layout of a ``torch.save`` zip, its ``data.pkl`` the payload."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("archive/data.pkl", _pickle(marker))
        archive.writestr("archive/version", "3\n")
    return buffer.getvalue()


def _npy(marker: Path) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, np.array([_Payload(marker)], dtype=object), allow_pickle=True)
    return buffer.getvalue()


def _npz(marker: Path) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **{"0.weight": np.array([_Payload(marker)], dtype=object)})
    return buffer.getvalue()


# every suffix a weights, optimizer or array file could plausibly have, and each content
HOSTILE: dict[str, Callable[[Path], bytes]] = {
    "pickle.pdparams": _pickle,
    "pickle.pdopt": _pickle,
    "pickle.pt": _pickle,
    "pickle.params": _pickle,
    "pickle.npz": _pickle,
    "pickle.npy": _pickle,
    "zip.pt": _torch_zip,
    "objects.npy": _npy,
    "objects.npz": _npz,
}


class Hostile:
    """Writes hostile files into one folder; ``ran`` says whether any payload ran."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.marker = folder / "MARKER"

    def file(self, name: str, content: Callable[[Path], bytes] = _pickle) -> Path:
        path = self.folder / name
        path.write_bytes(content(self.marker))
        return path

    @property
    def ran(self) -> bool:
        return self.marker.exists()


@pytest.fixture
def hostile(tmp_path: Path) -> Hostile:
    return Hostile(tmp_path)


@pytest.fixture(scope="module")
def nets(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The module name of tiny models, one per framework (Linear 4 -> 3)."""
    folder = tmp_path_factory.mktemp("nets")
    (folder / "untrusted_nets.py").write_text(NETS, encoding="utf-8")
    sys.path.insert(0, str(folder))
    yield "untrusted_nets"
    sys.path.remove(str(folder))


NETS = textwrap.dedent(
    """
    def torch_net():
        import torch
        return torch.nn.Sequential(torch.nn.Linear(4, 3))

    def paddle_net():
        import paddle
        return paddle.nn.Sequential(paddle.nn.Linear(4, 3))

    def mxnet_net():
        from mxnet import gluon
        net = gluon.nn.Sequential()
        net.add(gluon.nn.Dense(3, in_units=4))
        net.initialize()
        return net
    """
)


def _refused(code: int, capsys: pytest.CaptureFixture[str], name: str | Path) -> str:
    """Exit 2 and one line of polytrain's on stderr that names ``name``; the line (a
    framework may log its own lines, e.g. Paddle's OMP_NUM_THREADS warning)."""
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    ours = [line for line in err.splitlines() if line.startswith("polytrain ")]
    assert len(ours) == 1 and "Traceback" not in err and str(name) in ours[0], err
    return ours[0]


# -- a hostile pickle runs nothing, whichever option of whichever command reads it --------------


@pytest.mark.parametrize("framework", WALKED)
@pytest.mark.parametrize("name", HOSTILE)
def test_port_weights_never_run_code(
    framework: str, name: str, hostile: Hostile, nets: str, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip(framework)
    weights = hostile.file(name, HOSTILE[name])
    out = hostile.folder / "out.file"
    net = f"{nets}:{framework}_net"
    code = main(["port", net, net, str(out), "--weights", str(weights), "--input-shape", "2,4"])
    _refused(code, capsys, weights)
    assert not hostile.ran and not out.exists()


@pytest.mark.parametrize("name", ["pickle.npy", "objects.npy", "objects.npz"])
def test_port_input_never_runs_code(
    name: str, hostile: Hostile, nets: str, capsys: pytest.CaptureFixture[str]
) -> None:
    framework = WALKED[0] if WALKED else pytest.skip("no framework with a model walker")
    batch = hostile.file(name, HOSTILE[name])
    net = f"{nets}:{framework}_net"
    code = main(["port", net, net, "--print-map", "--input", str(batch)])
    _refused(code, capsys, batch)
    assert not hostile.ran


def test_port_hints_file_is_data(
    hostile: Hostile, nets: str, capsys: pytest.CaptureFixture[str]
) -> None:
    hints = hostile.file("hints.json")
    net = f"{nets}:torch_net"
    code = main(["port", net, net, "--print-map", "--input-shape", "2,4", "--hints", str(hints)])
    _refused(code, capsys, hints)
    assert not hostile.ran


@pytest.mark.parametrize("name", HOSTILE)
def test_convert_input_never_runs_code(
    name: str, hostile: Hostile, capsys: pytest.CaptureFixture[str]
) -> None:
    source = hostile.file(name, HOSTILE[name])
    out = hostile.folder / "out.npz"
    _refused(main(["convert", str(source), str(out), "--to", "numpy"]), capsys, source)
    assert not hostile.ran and not out.exists()


@pytest.mark.parametrize(("fmt", "name"), [("paddle", "run.pdopt"), ("mxnet", "run.states")])
def test_convert_optimizer_file_never_runs_code(
    fmt: str, name: str, hostile: Hostile, capsys: pytest.CaptureFixture[str]
) -> None:
    weights = hostile.folder / f"w.{fmt}"
    write_native(weights, fmt, {"bias": np.zeros(3, np.float32)})
    states = hostile.file(name)
    out = hostile.folder / "ck"
    argv = ["convert", str(weights), str(out), "--to", "neutral", "--optimizer", str(states)]
    _refused(main(argv), capsys, states)
    assert not hostile.ran and not out.exists()


def test_convert_map_file_is_data(hostile: Hostile, capsys: pytest.CaptureFixture[str]) -> None:
    weights = hostile.folder / "w.npz"
    write_native(weights, "numpy", {"bias": np.zeros(3, np.float32)})
    name_map = hostile.file("map.json")
    argv = ["convert", str(weights), str(hostile.folder / "o.npz"), "--to", "numpy"]
    _refused(main([*argv, "--map", str(name_map)]), capsys, name_map)
    assert not hostile.ran


def _checkpoint(folder: Path) -> Path:
    spec = get_model_spec("mlp")
    params = {n: np.zeros(s, np.float32) for n, s in spec.parameter_shapes().items()}
    recipe = Recipe(model="mlp").to_dict()
    return save_checkpoint(folder / "ck", params=params, spec=spec, recipe=recipe)


def _forge(checkpoint: Path, name: str, data: bytes) -> Path:
    """``name`` in ``checkpoint`` replaced by ``data``, the manifest's size and sha256 made
    to match: only the file's own reader stands between it and the command."""
    (checkpoint / name).write_bytes(data)
    manifest = json.loads((checkpoint / "manifest.json").read_text())
    entry = manifest["files"][name]
    entry.update(size=len(data), sha256=hashlib.sha256(data).hexdigest())
    (checkpoint / "manifest.json").write_text(json.dumps(manifest))
    return checkpoint / name


RESUME = ["--backend", "numpy", "--quiet", "--epochs", "1", "--train-samples", "64",
          "--test-samples", "32", "--batch-size", "32"]  # fmt: skip


@pytest.mark.parametrize(
    ("command", "replaced"),
    [("train", "model.safetensors"), ("train", "manifest.json"), ("convert", "model.safetensors"),
     ("convert", "manifest.json"), ("recipe", "manifest.json")],  # recipe reads the manifest
)  # fmt: skip
def test_a_checkpoints_files_never_run_code(
    command: str, replaced: str, hostile: Hostile, capsys: pytest.CaptureFixture[str]
) -> None:
    checkpoint = _checkpoint(hostile.folder)
    if replaced == "manifest.json":
        bad = hostile.file("ck/manifest.json")
    else:
        bad = _forge(checkpoint, replaced, _pickle(hostile.marker))
    argv = {
        "train": ["train", "--resume", str(checkpoint), *RESUME],
        "convert": ["convert", str(checkpoint), str(hostile.folder / "o.npz"), "--to", "numpy"],
        "recipe": ["recipe", str(checkpoint)],
    }[command]
    _refused(main(argv), capsys, bad)
    assert not hostile.ran


@pytest.mark.parametrize(
    ("option", "name"),
    [("--data", "objects.npz"), ("--data", "pickle.npz"), ("--config", "recipe.toml"),
     ("--model", "spec.json"), ("--model", "spec.toml")],
)  # fmt: skip
def test_train_files_never_run_code(
    option: str, name: str, hostile: Hostile, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = hostile.file(name, HOSTILE.get(name, _pickle))
    code = main(["train", option, str(bad), *RESUME, "--out", str(hostile.folder / "run")])
    _refused(code, capsys, bad)
    assert not hostile.ran


def test_port_code_source_is_data(hostile: Hostile, capsys: pytest.CaptureFixture[str]) -> None:
    source = hostile.file("train.py")
    out = hostile.folder / "out.py"
    _refused(main(["port-code", str(source), "-o", str(out)]), capsys, source)
    assert not hostile.ran and not out.exists()


# -- the one reader still loads what each framework saves ----------------------------------------


def _saved(framework: str, folder: Path) -> tuple[Callable[[], Any], Any, Path]:
    """(a factory, a model, its weights file written by its framework's own saver): Paddle's
    LSTM lists each tensor under two names, MXNet's file holds structural names."""
    path = folder / f"net.{framework}"
    if framework == "torch":
        import torch

        def torch_net() -> Any:
            return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))

        model = torch_net()
        torch.save(model.state_dict(), path)
        return torch_net, model, path
    if framework == "paddle":
        import paddle

        def paddle_net() -> Any:
            return paddle.nn.Sequential(paddle.nn.LSTM(4, 3), paddle.nn.BatchNorm1D(5))

        model = paddle_net()
        paddle.save(model.state_dict(), str(path))
        return paddle_net, model, path
    from mxnet import gluon

    def mxnet_net() -> Any:
        net = gluon.nn.Sequential()
        net.add(gluon.nn.Dense(3, in_units=4), gluon.nn.BatchNorm(in_channels=3))
        net.initialize()
        return net

    model = mxnet_net()
    model.save_parameters(str(path))
    return mxnet_net, model, path


@pytest.mark.parametrize("framework", WALKED)
def test_port_weights_load_what_the_framework_saved(framework: str, tmp_path: Path) -> None:
    pytest.importorskip(framework)
    from polytrain.porting.api import load_weights, walker_for

    factory, model, path = _saved(framework, tmp_path)
    fresh = factory()
    walker = walker_for(fresh, "source")
    load_weights(walker, fresh, path)
    expected = walker.state(model)
    assert set(walker.state(fresh)) == set(expected)
    for name, value in walker.state(fresh).items():
        np.testing.assert_array_equal(value, expected[name], err_msg=name)
    write_native(tmp_path / "other.npz", "numpy", {"w": np.zeros(3, np.float32)})
    with pytest.raises(
        CheckpointError, match=f"NumPy .npz file, but the source model is a {framework}"
    ):
        load_weights(walker, fresh, tmp_path / "other.npz")


def test_port_weights_load_a_gluon_file_of_parameter_names(tmp_path: Path) -> None:
    """``collect_params().save`` (the older ``save_params``) names tensors ``dense0_weight``."""
    pytest.importorskip("mxnet")
    import mxnet as mx

    from polytrain.porting.api import load_weights, walker_for

    _, model, _ = _saved("mxnet", tmp_path)
    model.collect_params().save(str(tmp_path / "legacy.params"))
    weight = model[0].weight.data().asnumpy()
    model[0].weight.set_data(mx.nd.zeros((3, 4)))
    load_weights(walker_for(model, "source"), model, tmp_path / "legacy.params")
    np.testing.assert_array_equal(model[0].weight.data().asnumpy(), weight)


# -- an output is never an input ----------------------------------------------------------------

ALIASES = ["same path", "hard link", "symlink"]


def _alias(path: Path, how: str) -> Path:
    """``path`` itself, or a hard link or symlink to it in a folder beside it."""
    if how == "same path":
        return path
    folder = path.parent.parent / "links"
    folder.mkdir(exist_ok=True)
    alias = folder / f"alias{path.suffix}"
    os.link(path, alias) if how == "hard link" else alias.symlink_to(path)
    return alias


def _unchanged_after(
    argv: list[str], path: Path, option: str, capsys: pytest.CaptureFixture[str]
) -> None:
    before = path.read_bytes()
    err = _refused(main(argv), capsys, "is the same file as the input given to")
    assert err.endswith(f"given to {option}; choose another output path.")
    assert path.read_bytes() == before


def _weights(folder: Path) -> Path:
    (folder / "in").mkdir()
    path = folder / "in" / "net.pdparams"
    write_native(path, "paddle", {"0.weight": np.ones((4, 3), np.float32)})
    return path


@pytest.mark.parametrize("how", ALIASES)
@pytest.mark.parametrize("output", ["OUT", "--map-out", "--report"])
def test_port_never_writes_over_its_weights(
    how: str, output: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    weights = _weights(tmp_path)
    target = str(_alias(weights, how))
    net = "untrusted_nets:paddle_net"  # never imported: the paths are checked first
    argv = ["port", net, net, str(tmp_path / "o.pt"), "--weights", str(weights)]
    if output == "OUT":
        argv[3] = target
    else:
        argv += [output, target]
    _unchanged_after(argv, weights, "--weights", capsys)


@pytest.mark.parametrize("how", ALIASES)
def test_port_never_writes_over_its_input_batch(
    how: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "in").mkdir()
    batch = tmp_path / "in" / "batch.npy"
    np.save(batch, np.ones((2, 4), np.float32))
    net = "untrusted_nets:paddle_net"
    argv = ["port", net, net, str(_alias(batch, how)), "--input", str(batch)]
    _unchanged_after(argv, batch, "--input", capsys)


@pytest.mark.parametrize("how", ALIASES)
def test_convert_never_writes_over_its_input(
    how: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    weights = _weights(tmp_path)
    argv = ["convert", str(weights), str(_alias(weights, how)), "--to", "paddle"]
    _unchanged_after(argv, weights, "INPUT", capsys)


@pytest.mark.parametrize("how", ALIASES)
def test_convert_never_writes_over_its_optimizer_file(
    how: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    weights = _weights(tmp_path)
    states = weights.with_name("net.pdopt")
    states.write_bytes(pickle.dumps({"LR_Scheduler": {}}))
    argv = ["convert", str(weights), str(tmp_path / "o.pt"), "--to", "torch", "--optimizer",
            str(states), "--optimizer-out", str(_alias(states, how))]  # fmt: skip
    _unchanged_after(argv, states, "--optimizer", capsys)


@pytest.mark.parametrize("how", ALIASES)
def test_convert_never_writes_over_a_checkpoints_file(
    how: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = _checkpoint(tmp_path) / "model.safetensors"
    argv = ["convert", str(model.parent), str(_alias(model, how)), "--to", "numpy"]
    _unchanged_after(argv, model, "INPUT (model.safetensors)", capsys)


@pytest.mark.parametrize("how", ALIASES)
def test_recipe_never_writes_over_its_checkpoint(
    how: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = _checkpoint(tmp_path) / "manifest.json"
    argv = ["recipe", str(manifest.parent), "-o", str(_alias(manifest, how))]
    _unchanged_after(argv, manifest, "RUN_DIR (manifest.json)", capsys)


@pytest.mark.parametrize("how", ALIASES)
def test_port_code_never_writes_over_its_source(
    how: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "in").mkdir()
    source = tmp_path / "in" / "train.py"
    source.write_text("import paddle\ny = paddle.exp(x)\n", encoding="utf-8")
    argv = ["port-code", str(source), "-o", str(_alias(source, how)), "--overwrite"]
    _unchanged_after(argv, source, "SRC", capsys)


def test_port_code_never_replaces_a_folder_holding_its_source(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    project = tmp_path / "proj"
    project.mkdir()
    (project / "a.py").write_text("import paddle\n", encoding="utf-8")
    (tmp_path / "notes.txt").write_text("mine", encoding="utf-8")
    code = main(["port-code", str(project), "-o", str(tmp_path), "--overwrite"])
    _refused(code, capsys, "holds the input given to SRC")
    assert (project / "a.py").exists() and (tmp_path / "notes.txt").exists()


def test_two_outputs_that_are_one_file_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    net = "untrusted_nets:paddle_net"
    out = str(tmp_path / "o.json")
    code = main(["port", net, net, "--print-map", "--map-out", out, "--report", out])
    _refused(code, capsys, "is given both as --map-out and as --report")
    assert not Path(out).exists()


# -- port-code on hostile sources ---------------------------------------------------------------


def _special(kind: str, tmp_path: Path) -> Path:
    if kind == "/dev/zero":
        return Path("/dev/zero")
    fifo = tmp_path / "proj" / "pipe.py"
    fifo.parent.mkdir()
    os.mkfifo(fifo)
    return fifo if kind == "FIFO" else fifo.parent


@pytest.mark.parametrize(
    ("kind", "found"),
    [("/dev/zero", "a character device"), ("FIFO", "a FIFO"), ("folder", "a FIFO")],
)
def test_port_code_refuses_what_is_not_a_regular_file(
    kind: str, found: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = _special(kind, tmp_path)
    code = main(["port-code", str(source), "-o", str(tmp_path / "out")])
    err = _refused(code, capsys, f"{found}")
    assert "not a regular file" in err and not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b"import paddle\n\0\0\0", "holds NUL bytes"),
        ("x = 'caf\u00e9'\n".encode("latin-1"), "is not UTF-8 text"),
        (b"# padding\n" * ((1 << 20) // 10 + 1), "is 1.0 MB; polytrain reads at most 1 MB"),
        (("x = " + "1 + " * 5000 + "1\n").encode(), "nests expressions too deeply"),
        (("x = " + "f(" * 150 + ")" * 150 + "\n").encode(), "nests expressions too deeply"),
    ],
    ids=["binary", "latin-1", "over 1 MiB", "deep", "deep for libcst"],
)
def test_port_code_refuses_a_hostile_source_in_one_line(
    content: bytes, says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "train.py"
    source.write_bytes(content)
    code = main(["port-code", str(source), "-o", str(tmp_path / "out.py")])
    assert says in _refused(code, capsys, source)
    assert not (tmp_path / "out.py").exists()


@pytest.mark.slow
def test_port_code_says_what_it_converts_when_it_takes_long(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(port_code_files, "PROGRESS_AFTER", 0.0)
    project = tmp_path / "proj"
    project.mkdir()
    shutil.copy(FIXTURES / "paddle_mnist_single.py", project / "train.py")
    (project / "ops.py").write_text("import paddle\nz = paddle.abs(x)\n", encoding="utf-8")
    assert main(["port-code", str(project), "-o", str(tmp_path / "out")]) == 0
    err = capsys.readouterr().err
    assert "polytrain port-code: converting " in err and "(file 1 of 2)" in err


@pytest.mark.parametrize("target", ["file", "folder"])
def test_port_code_never_copies_what_a_link_points_to_outside_the_source(
    target: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A link in the project to a file (or folder) outside it would copy that file's bytes
    into the converted output: refused in one line, nothing written."""
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "key.txt").write_text("not for the output\n")
    project = tmp_path / "proj"
    project.mkdir()
    (project / "train.py").write_text("import paddle\n")
    (project / "link").symlink_to(secret / "key.txt" if target == "file" else secret)
    code = main(["port-code", str(project), "-o", str(tmp_path / "out")])
    err = _refused(code, capsys, "is a symbolic link to")
    assert "outside" in err and not (tmp_path / "out").exists()
