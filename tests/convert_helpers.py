"""Helpers shared by the conversion tests."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from polytrain.cli.main import main
from polytrain.neutral.models import ModelSpec


def random_params(spec: ModelSpec, seed: int = 1) -> dict[str, np.ndarray]:
    """Every tensor random (running_var positive), so a mixed-up name or layout shows."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in spec.parameter_shapes().items():
        value = rng.standard_normal(shape).astype(np.float32)
        out[name] = np.abs(value) + 0.5 if name.endswith("running_var") else value
    return out


def assert_same(got: Mapping[str, np.ndarray], want: Mapping[str, np.ndarray]) -> None:
    assert list(got) == list(want)
    for name in want:
        assert got[name].dtype == want[name].dtype, name
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def convert(*args: str | Path) -> int:
    return main(["convert", *map(str, args)])
