"""The documented default recipe trains smoothly: no loss above the first step's.

The full figures (2 epochs, every backend, accuracy, where float32 free runs part) are in
docs/default-recipe.md; this is their cheap guard: the recipe's first 20 steps of batch 256
on a slice of Fashion-MNIST, where the former default (SGD momentum 0.9, lr 0.05) spiked
from 2.30 to above 4.
"""

from __future__ import annotations

import pytest

from polytrain.testing.recorders import StepLosses
from polytrain.training.recipe import Recipe
from polytrain.training.trainer import Trainer

STEPS = 20
SLICE = dict(train_samples=STEPS * Recipe().batch_size, test_samples=256, epochs=1)


@pytest.mark.slow
def test_default_recipe_loss_never_rises_above_its_start(backend_name: str) -> None:
    losses = StepLosses()
    Trainer(Recipe(**SLICE), backend_name, plugins=[losses], progress=False).fit()  # type: ignore[arg-type]
    first, rest = losses.values[0], losses.values[1:]
    assert len(rest) == STEPS - 1
    worst = max(range(len(rest)), key=rest.__getitem__)
    assert rest[worst] <= first, f"step {worst + 2}: loss {rest[worst]:.3f} > step 1's {first:.3f}"
    assert losses.values[-1] < 0.6 * first  # and it learns
