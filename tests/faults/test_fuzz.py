"""Property-based fuzzing of the inputs users hand to polytrain: IDX files, checkpoints,
command lines. Every case either succeeds or raises polytrain's own error type: never a
crash, a hang, a framework traceback or a partly written file.

The normal run uses the ``default`` hypothesis profile (50 cases per test); the dedicated
run is ``scripts/fuzz`` (profile ``fuzz``: 2,500 cases per test, >= 10,000 in total).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gzip
import io
import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, event, example, given, settings
from hypothesis import strategies as st

from polytrain.backend.base import parse_devices
from polytrain.cli.main import main
from polytrain.cli.parser import build_parser
from polytrain.cli.recipe_args import recipe_from_args
from polytrain.data.idx import encode_idx, parse_idx
from polytrain.distributed.launcher import LaunchSpec
from polytrain.errors import PolytrainError
from polytrain.io.checkpoint import load_checkpoint, save_checkpoint
from polytrain.io.native import read_native, write_native
from polytrain.neutral.models import get_model_spec
from polytrain.plugins.registry import registered_formats

SUPPRESS = [HealthCheck.too_slow, HealthCheck.function_scoped_fixture]


# -- IDX files ------------------------------------------------------------------------------

VALID_IDX = encode_idx(np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4))


@st.composite
def mutated_idx(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(st.sampled_from([VALID_IDX, gzip.compress(VALID_IDX, mtime=0)])))
    for _ in range(draw(st.integers(0, 4))):
        kind = draw(st.sampled_from(["flip", "truncate", "append", "header"]))
        if kind == "flip" and data:
            i = draw(st.integers(0, len(data) - 1))
            data[i] = draw(st.integers(0, 255))
        elif kind == "truncate":
            del data[draw(st.integers(0, len(data))) :]
        elif kind == "append":
            data += draw(st.binary(max_size=16))
        else:
            data[:8] = draw(st.binary(min_size=8, max_size=8))
    return bytes(data)


@settings(suppress_health_check=SUPPRESS)
@given(st.one_of(mutated_idx(), st.binary(max_size=64)))
def test_idx_reader_fuzz(data: bytes) -> None:
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except Exception:
            return  # the file reader turns this into DataError (tests/data/test_data.py)
    try:
        array = parse_idx(data, "fuzz.idx")
    except PolytrainError:
        return
    assert array.size == int(np.prod(array.shape))


# -- checkpoints ----------------------------------------------------------------------------

SPEC = get_model_spec("mlp")


@pytest.fixture(scope="module")
def good_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("ck") / "good"
    save_checkpoint(path, params=SPEC.init_params(0), spec=SPEC, model_name="mlp",
                    position={"epoch": 1, "step": 0, "global_step": 5})  # fmt: skip
    return path


@st.composite
def damage(draw: st.DrawFn) -> tuple[str, str, int, bytes]:
    file = draw(st.sampled_from(["model.safetensors", "manifest.json"]))
    kind = draw(st.sampled_from(["flip", "truncate", "replace", "json"]))
    return file, kind, draw(st.integers(0, 10**6)), draw(st.binary(max_size=32))


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)


@pytest.mark.slow
@settings(suppress_health_check=SUPPRESS)
@given(damage(), JSON_VALUES, st.booleans())
def test_checkpoint_loader_fuzz(good_checkpoint: Path, hit, value, verify: bool) -> None:  # type: ignore[no-untyped-def]
    file, kind, where, blob = hit
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "ck"
        shutil.copytree(good_checkpoint, path)
        target = path / file
        data = bytearray(target.read_bytes())
        if kind == "flip":
            data[where % len(data)] ^= 1 + where % 255
        elif kind == "truncate":
            del data[where % len(data) :]
        elif kind == "replace":
            data = bytearray(blob)
        else:
            manifest = json.loads((path / "manifest.json").read_text())
            keys = list(manifest)
            manifest[keys[where % len(keys)]] = value
            target, data = path / "manifest.json", bytearray(json.dumps(manifest).encode())
        target.write_bytes(bytes(data))
        before = sorted(p.name for p in path.iterdir())
        try:
            ck = load_checkpoint(path, spec=SPEC, verify=verify)
            assert set(ck.params) == set(SPEC.parameter_shapes())
        except PolytrainError:
            pass
        assert sorted(p.name for p in path.iterdir()) == before  # loading writes nothing


ARRAYS = st.sampled_from(["float32", "float64", "int64", "bool", "complex64", "U3"]).flatmap(
    lambda dt: st.lists(st.integers(0, 3), max_size=3).map(lambda shape: np.zeros(shape, dtype=dt))
)


@settings(suppress_health_check=SUPPRESS)
@given(st.dictionaries(st.text(max_size=6), ARRAYS | st.integers() | st.text(max_size=4),
                       max_size=4))  # fmt: skip
def test_checkpoint_writer_fuzz(params) -> None:  # type: ignore[no-untyped-def]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "ck"
        try:
            save_checkpoint(path, params=params)
        except PolytrainError:
            assert not path.exists()
        else:
            load_checkpoint(path)
        leftovers = [p.name for p in Path(tmp).iterdir() if p.name != "ck"]
        assert leftovers == []


# -- native weight files -------------------------------------------------------------------

FORMATS = registered_formats()
NATIVE_TENSORS = {
    "conv.weight": np.arange(24, dtype=np.float32).reshape(2, 3, 2, 2),
    "bn.running_var": np.ones(3, np.float64),
    "fc.weight": np.arange(6, dtype=np.int64).reshape(2, 3),
}


@functools.cache
def valid_native(name: str) -> bytes:
    """A small file of format ``name`` (empty when writing it needs a missing framework)."""
    try:
        return FORMATS[name].encode(NATIVE_TENSORS)
    except ImportError:
        return b""


@st.composite
def mutated_native(draw: st.DrawFn) -> bytes:
    data = bytearray(valid_native(draw(st.sampled_from(sorted(FORMATS)))))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "truncate", "append", "splice"]))
        if kind == "flip" and data:
            data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
        elif kind == "truncate":
            del data[draw(st.integers(0, len(data))) :]
        elif kind == "append":
            data += draw(st.binary(max_size=16))
        elif data:
            i = draw(st.integers(0, len(data) - 1))
            data[i : i + 8] = draw(st.binary(min_size=8, max_size=8))
    return bytes(data)


@settings(suppress_health_check=SUPPRESS)
@given(st.one_of(mutated_native(), st.binary(max_size=64)))
def test_native_reader_fuzz(data: bytes) -> None:
    """Every registered format's reader: arrays or one CheckpointError, never another error,
    never an array bigger than the file could hold."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "weights"
        path.write_bytes(data)
        try:
            _, tensors = read_native(path)
        except PolytrainError:
            return
        assert all(isinstance(v, np.ndarray) for v in tensors.values())
        assert sum(v.nbytes for v in tensors.values()) <= max(len(data), 1) * 8


@settings(suppress_health_check=SUPPRESS)
@given(st.dictionaries(st.text(max_size=6), ARRAYS, max_size=4), st.sampled_from(sorted(FORMATS)))
def test_native_writer_fuzz(tensors, name: str) -> None:  # type: ignore[no-untyped-def]
    """Writing is atomic and what is written reads back, or nothing is written."""
    assume(valid_native(name))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"w{FORMATS[name].suffix}"
        try:
            write_native(path, name, tensors)
        except PolytrainError:
            assert not path.exists()
        else:
            fmt, back = read_native(path)
            assert fmt == name and set(back) <= set(tensors)
        assert [p.name for p in Path(tmp).iterdir() if p != path] == []


# -- command lines --------------------------------------------------------------------------

FLAGS = ["--epochs", "--batch-size", "--lr", "--momentum", "--weight-decay", "--seed",
         "--devices", "--accumulate", "--precision", "--train-samples", "--max-steps",
         "--val-split", "--optimizer", "--model", "--dataset", "--threads", "--schedule",
         "--clip-grad-norm", "--clip-grad-value", "--early-stop"]  # fmt: skip
VALUES = st.one_of(
    st.integers(-5, 10**6).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(str),
    st.sampled_from(
        [
            "cpu",
            "cpu:0",
            "cpu:3",
            "gpu",
            "gpu:0,1",
            "tpu",
            "",
            "bf16",
            "fp8",
            "lenet",
            "vgg",
            "adam",
            "nope",
            "mnist",
            "-1",
            "1e309",
        ]
    ),
    st.text(max_size=6),
)


@pytest.mark.slow
@settings(suppress_health_check=SUPPRESS)
@given(st.lists(st.tuples(st.sampled_from(FLAGS), VALUES), max_size=6))
def test_train_arguments_fuzz(pairs) -> None:  # type: ignore[no-untyped-def]
    argv = ["train"] + [x for flag, value in pairs for x in (flag, value)]
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse's own usage error (exit 2)
        assert exc.code == 2
        return
    try:
        recipe = recipe_from_args(args)
        parse_devices(recipe.devices, gpu_count=0)
        get_model_spec(recipe.model)
    except PolytrainError:
        return


# Values for a short run: valid ones, each flag's edges and beyond, NaN/inf and junk; the
# counts stay tiny (the run is at most 2 epochs x 2 steps of batch <= 3 on 16 samples).
RUN_VALUES = {
    "--epochs": ["0", "1", "2"],
    "--batch-size": ["-1", "0", "1", "2", "3"],
    "--accumulate": ["0", "1", "2", "3"],
    "--lr": ["0", "-1", "0.01", "1e30", "nan", "inf"],
    "--momentum": ["-0.1", "0", "0.5", "1", "nan"],
    "--weight-decay": ["-1", "0", "0.1", "inf"],
    "--warmup-steps": ["-1", "0", "3"],
    "--schedule": ["constant", "cosine:warmup=3", "onecycle", "step:step_size=1", "x:y=1"],
    "--clip-grad-norm": ["0", "0.5", "nan", "inf"],
    "--clip-grad-value": ["-1", "0.01", "nan"],
    "--early-stop": ["0", "1"],
    "--seed": ["-1", "0", "7", str(2**32 - 1), str(2**32)],
    "--optimizer": ["sgd", "momentum", "adagrad", "adam", "nope"],
    "--precision": ["fp32", "fp64", "bf16", "fp16", "fp8"],
    "--model": ["mlp", "lenet", "vgg"],
    "--dataset": ["fashion-mnist", "mnist", "cifar"],
    "--devices": ["cpu", "cpu:2", "gpu", "tpu"],
    "--val-split": ["0", "0.5", "1", "nan"],
    "--train-samples": ["0", "1", "4", "8"],
    "--test-samples": ["0", "2"],
    "--max-steps": ["0", "1", "2"],
    "--threads": ["0", "1", "2", "100000"],
    "--timeout": ["-1", "0", "5", "1e300", "nan", "inf"],
    "--checkpoint-every": ["0", "1", "2"],
    "--keep-checkpoints": ["0", "1", "3"],
    "--inspect": ["1", "every:1", "every:0", "x"],
    "--layer-weight-decay": ["fc1=0.1", "fc1=nan", "x"],
    "--max-skipped": ["0", "0.5", "1", "1.5", "nan"],
    "--max-loss-growth": ["0.5", "2", "inf", "nan"],
}
JUNK = ["", "-0", "1e309", "-inf", "x", "1.5"]
PROFILE_EXAMPLES = settings.default.max_examples if settings.default else 50
RUN_EXAMPLES = 8 if PROFILE_EXAMPLES <= 50 else 200  # ~1 s per run that trains


@st.composite
def run_command_line(draw: st.DrawFn) -> list[str]:
    flags = draw(st.permutations(sorted(RUN_VALUES)))[: draw(st.integers(0, 4))]
    argv = []
    for flag in flags:
        argv += [flag, draw(st.sampled_from(RUN_VALUES[flag]) | st.sampled_from(JUNK))]
    return argv


def restore_environ(saved: dict[str, str]) -> None:
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture(scope="module")
def tiny_datasets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """16 random train and test samples of each dataset, as raw IDX files."""
    from polytrain.data.registry import get_dataset

    root = tmp_path_factory.mktemp("tiny-data")
    rng = np.random.default_rng(0)
    for name in ("fashion-mnist", "mnist"):
        (root / name).mkdir()
        for split in ("train", "test"):
            files = get_dataset(name).split(split)
            images = rng.integers(0, 256, (16, 28, 28), dtype=np.uint8)
            labels = rng.integers(0, 10, 16, dtype=np.uint8)
            (root / name / files.images.raw_name).write_bytes(encode_idx(images))
            (root / name / files.labels.raw_name).write_bytes(encode_idx(labels))
    return root


@pytest.mark.slow
@settings(suppress_health_check=SUPPRESS, max_examples=RUN_EXAMPLES)
@given(run_command_line())
@example(["--seed", str(2**32 - 1), "--threads", "1", "--checkpoint-every", "1"])  # trains
@example(["--seed", "-1"])
@example(["--schedule", "cosine:min_lr=0.001", "--clip-grad-norm", "0.5", "--clip-grad-value",
          "0.01", "--val-split", "0.5", "--early-stop", "1"])  # fmt: skip
def test_train_command_runs_fuzz(tiny_datasets: Path, extra: list[str]) -> None:
    """A generated command line either trains (1-2 steps on the numpy backend, metrics
    written) or stops with exit 2 and one line of polytrain's own: never a traceback."""
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        stack.callback(restore_environ, dict(os.environ))  # the run exports its threads
        err = stack.enter_context(contextlib.redirect_stderr(io.StringIO()))
        stack.enter_context(contextlib.redirect_stdout(io.StringIO()))
        argv = ["train", "--backend", "numpy", "--model", "mlp", "--epochs", "1",
                "--batch-size", "2", "--train-samples", "8", "--test-samples", "4",
                "--max-steps", "1", "--data-dir", str(tiny_datasets), "--quiet", "--json",
                "--out", str(Path(tmp) / "run"), *extra]  # fmt: skip
        try:
            code: int | str | None = main(argv)
        except SystemExit as exc:  # argparse's own usage error
            code = exc.code
        lines = err.getvalue().strip().splitlines()
        event("trained" if code == 0 else "refused")
        if code == 0:
            assert (Path(tmp) / "run" / "metrics.jsonl").exists()
        else:
            assert code == 2, (argv, code, lines)
            assert lines[-1].startswith("polytrain train: error: "), (argv, lines)


@settings(suppress_health_check=SUPPRESS)
@given(st.text(max_size=12), st.integers(-2, 5), st.integers(-2, 5), st.integers(-2, 5))
def test_launch_arguments_fuzz(master: str, nproc: int, nnodes: int, node_rank: int) -> None:
    with contextlib.suppress(PolytrainError):
        LaunchSpec(
            "torch",
            ["true"],
            nproc_per_node=nproc,
            nnodes=nnodes,
            node_rank=node_rank,
            master=master,
        )


@settings(suppress_health_check=SUPPRESS, max_examples=25)
@given(st.sampled_from(["env", "data", "backends", "convert"]),
       st.lists(st.text(min_size=1, max_size=8).filter(lambda s: not s.startswith("-")),
                max_size=3))  # fmt: skip
def test_cheap_commands_fuzz(command: str, words: list[str]) -> None:
    assume(command != "data" or all("/" not in w for w in words))
    try:
        code = main([command, *words])
    except SystemExit as exc:
        assert exc.code in (0, 2)
        return
    assert code in (0, 1, 2)


def test_parser_builds() -> None:
    assert isinstance(build_parser(), argparse.ArgumentParser)
