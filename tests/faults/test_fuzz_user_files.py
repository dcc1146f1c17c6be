"""Property-based fuzzing of the files users hand in beside weights and data sets: recipe
files, model specs, ``--data`` arrays and pickled weight/optimizer files (issue 42, item 10).
Every case either succeeds or raises polytrain's own error type: never a traceback, never an
allocation the file merely claims, never code run from a pickle.

Profiles as in tests/faults/test_fuzz.py: 50 cases per property in the normal run, 2,500 under
``scripts/fuzz``.
"""

from __future__ import annotations

import io
import json
import pickle
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import tomli_w
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from polytrain.cli.config_file import apply_config
from polytrain.cli.parser import build_parser
from polytrain.cli.recipe_args import recipe_from_args
from polytrain.data.npz_file import read_npz
from polytrain.errors import PolytrainError
from polytrain.neutral.models import get_model_spec
from polytrain.neutral.spec_file import spec_from_dict, spec_to_dict
from polytrain.utils import safe_pickle

SUPPRESS = [HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**40), 2**40)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=8)
)
JSON_VALUES = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=6,
)


def mutate(data: bytes, draw: st.DrawFn) -> bytes:
    """Flipped bytes, a truncation or appended bytes."""
    out = bytearray(data)
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["flip", "truncate", "append"]))
        if kind == "flip" and out:
            out[draw(st.integers(0, len(out) - 1))] = draw(st.integers(0, 255))
        elif kind == "truncate":
            del out[draw(st.integers(0, len(out))) :]
        else:
            out += draw(st.binary(max_size=16))
    return bytes(out)


# -- recipe files ---------------------------------------------------------------------------

RECIPE_KEYS = ["epochs", "batch_size", "lr", "optimizer", "momentum", "seed", "precision",
               "schedule", "devices", "loss", "metric", "per_layer_weight_decay", "plugin",
               "log", "max_steps", "val_split", "model", "dataset", "nosuchkey"]  # fmt: skip
TOML_VALUES = (
    st.booleans()
    | st.integers(-(2**40), 2**40)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=8)
    | st.lists(st.text(max_size=4), max_size=2)
    | st.dictionaries(st.text(max_size=4), st.floats() | st.text(max_size=4), max_size=2)
)


@st.composite
def recipe_files(draw: st.DrawFn) -> bytes:
    table = draw(st.dictionaries(st.sampled_from(RECIPE_KEYS), TOML_VALUES, max_size=4))
    text = tomli_w.dumps(table).encode()
    return draw(st.sampled_from([text, mutate(text, draw), draw(st.binary(max_size=40))]))


@settings(suppress_health_check=SUPPRESS)
@given(recipe_files())
def test_recipe_file_fuzz(data: bytes) -> None:
    """A recipe file through reading, option checks and recipe validation (no training:
    that is tests/faults/test_fuzz.py's command-line property)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "recipe.toml"
        path.write_bytes(data)
        args = build_parser().parse_args(["train", "--backend", "numpy"])
        args.explicit = set()
        try:
            apply_config(args, args.subparser, path)
            recipe_from_args(args)
        except PolytrainError:
            event("refused")
            return
        event("accepted")


# -- model specs ----------------------------------------------------------------------------

SPEC = spec_to_dict(get_model_spec("lenet"))


def set_path(data: Any, path: list[Any], value: Any) -> Any:
    """``data`` with the item at ``path`` (keys and indices) replaced by ``value``."""
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(data, dict):
        return {**data, head: set_path(data.get(head), rest, value)}
    if isinstance(data, list) and isinstance(head, int) and 0 <= head < len(data):
        return [set_path(v, rest, value) if i == head else v for i, v in enumerate(data)]
    return data


LAYER_FIELDS = ["in_channels", "out_channels", "kernel_size", "stride", "padding",
                "in_features", "out_features", "bias", "type"]  # fmt: skip
TOP_FIELDS = [["input_shape"], ["num_classes"], ["init"], ["init_std"], ["net"]]


@st.composite
def damaged_specs(draw: st.DrawFn) -> Any:
    layer = draw(st.integers(0, len(SPEC["net"]["layers"]) - 1))
    field = draw(st.sampled_from(LAYER_FIELDS))
    where = draw(st.sampled_from([["net", "layers", layer, 1, field], *TOP_FIELDS, [field]]))
    return set_path(SPEC, where, draw(JSON_VALUES))


@settings(suppress_health_check=SUPPRESS)
@given(damaged_specs())
def test_model_spec_fuzz(data: Any) -> None:
    """A damaged spec is refused in one error, or is a spec whose shapes and form are whole."""
    try:
        spec = spec_from_dict(data)
    except PolytrainError:
        event("refused")
        return
    event("accepted")
    assert spec.num_parameters() >= 0
    assert spec_from_dict(json.loads(json.dumps(spec_to_dict(spec)))) == spec


# -- --data arrays --------------------------------------------------------------------------


def npz_bytes() -> bytes:
    buf = io.BytesIO()
    np.savez(buf, x_train=np.zeros((4, 1, 2, 2), np.float32), y_train=np.arange(4))
    return buf.getvalue()


VALID_NPZ = npz_bytes()


@st.composite
def damaged_npz(draw: st.DrawFn) -> bytes:
    return mutate(VALID_NPZ, draw)


@settings(suppress_health_check=SUPPRESS)
@given(damaged_npz() | st.binary(max_size=64))
def test_data_file_fuzz(data: bytes) -> None:
    """A damaged .npz: its arrays, no larger than the file, or one DataError."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "data.npz"
        path.write_bytes(data)
        try:
            arrays = read_npz(path)
        except PolytrainError:
            event("refused")
            return
    event("read")
    assert sum(a.nbytes for a in arrays.values()) <= len(data) * 1100  # deflate's best ratio


# -- pickled weight and optimizer files -----------------------------------------------------


class Payload:
    """What a hostile pickle carries: a call that would leave a marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (self.marker,))


@st.composite
def damaged_pickles(draw: st.DrawFn, marker: Path) -> bytes:
    state = {"fc.weight": np.ones((2, 2), np.float32), "LR_Scheduler": {"last_epoch": 3}}
    if draw(st.booleans()):
        state[draw(st.sampled_from(["fc.bias", "opt", "x"]))] = Payload(marker)  # type: ignore[assignment]
    data = pickle.dumps(state, protocol=draw(st.integers(2, 5)))
    return mutate(data, draw) if draw(st.booleans()) else data


MARKER = Path(tempfile.gettempdir()) / "polytrain-fuzz-pickle-marker"


@settings(suppress_health_check=SUPPRESS)
@given(damaged_pickles(MARKER))
def test_pickled_weights_fuzz(data: bytes) -> None:
    """polytrain's pickle reader (.pdparams, .pdopt): plain data or one CheckpointError;
    a payload never runs."""
    MARKER.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "weights.pdopt"
        path.write_bytes(data)
        try:
            safe_pickle.load(path)
            event("read")
        except PolytrainError:
            event("refused")
    assert not MARKER.exists(), "a pickle's payload ran"
