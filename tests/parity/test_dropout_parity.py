"""Dropout masks drawn in numpy (``dropout_masks="parity"``): the same on every backend."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from polytrain.data import ArrayDataset
from polytrain.errors import ConfigError
from polytrain.neutral.dropout_masks import ParityMasks, parity_mask
from polytrain.neutral.models import Dropout, Flatten, Linear, ModelSpec, ReLU, seq
from polytrain.parity.compare import train_command
from polytrain.parity.lockstep import lockstep
from polytrain.testing import backends_under_test
from polytrain.training.recipe import Recipe


def dropout_recipe(tmp_path: Path, masks: str) -> Recipe:
    net = seq(
        ("flatten", Flatten()),
        ("fc1", Linear(16, 12)),
        ("relu", ReLU()),
        ("drop", Dropout(0.5)),
        ("fc2", Linear(12, 3)),
    )
    spec = ModelSpec("tiny-dropout", net, input_shape=(1, 4, 4), num_classes=3, has_randomness=True)
    path = tmp_path / "tiny-dropout.json"
    path.write_text(spec.to_json())
    return Recipe(model=str(path), batch_size=4, lr=0.1, precision="fp64", dropout_masks=masks)


def tiny_data() -> ArrayDataset:
    rng = np.random.default_rng(5)
    return ArrayDataset(rng.standard_normal((12, 1, 4, 4)), rng.integers(0, 3, 12), num_classes=3)


@pytest.mark.slow
def test_parity_masks_match_across_backends_in_lockstep(tmp_path: Path) -> None:
    """fp64 lockstep of a model with dropout 0.5: every backend within 1e-10 per step."""
    backends = backends_under_test()
    result = lockstep(backends, dropout_recipe(tmp_path, "parity"), 3, train=tiny_data())
    assert result.steps == 3
    for name in backends[1:]:
        worst = result.worst(name)
        assert worst["loss"] < 1e-10 and worst["params"] < 1e-10, (name, worst)


def test_framework_masks_differ_across_backends(tmp_path: Path) -> None:
    """The default keeps each framework's own generator: the losses part at once."""
    result = lockstep(
        ["numpy", "torch"], dropout_recipe(tmp_path, "framework"), 2, train=tiny_data()
    )
    assert max(result.loss_diff["torch"]) > 1e-6


def test_masks_are_keyed_by_seed_step_and_call() -> None:
    masks = ParityMasks(seed=3)
    with masks.step(7):
        first, second = parity_mask((400,), 0.25, "float32"), parity_mask((400,), 0.25, "float32")
    with masks.step(7):
        again = parity_mask((400,), 0.25, "float32")
    assert first is not None and second is not None and again is not None
    assert first.dtype == np.float32 and set(np.unique(first)) == {0.0, np.float32(1 / 0.75)}
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, second)
    assert 0.15 < float((first == 0).mean()) < 0.35
    assert parity_mask((4,), 0.5, "float64") is None  # no step open: the framework's own


def test_recipe_switch_is_checked_and_passed_to_the_runs(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--dropout-masks must be one of framework, parity"):
        Recipe(dropout_masks="numpy")
    cmd = train_command("torch", Recipe(dropout_masks="parity"), tmp_path, None)
    assert cmd[cmd.index("--dropout-masks") + 1] == "parity"
