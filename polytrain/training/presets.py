"""Built-in recipes by name: a model, its data and the settings it trains well with.

``polytrain train --recipe NAME`` starts from the preset; every flag written on the command
line overrides the preset's value (as flags override a checkpoint's recipe on ``--resume``).
A preset holds only the fields that differ from :class:`~polytrain.training.recipe.Recipe`'s
defaults, so ``lenet-fashion-mnist`` is the documented default recipe itself.
"""

from __future__ import annotations

from typing import Any

from polytrain.errors import ConfigError
from polytrain.training.recipe import Recipe

PRESETS: dict[str, dict[str, Any]] = {
    "lenet-fashion-mnist": {},
    # vit-tiny (docs/recipes.md): Adam with a linear warm-up and a cosine decay, as small
    # ViTs are trained; three epochs are a few CPU minutes on torch
    "vit-fashion-mnist": {
        "model": "vit-tiny",
        "optimizer": "adam",
        "lr": 0.002,
        "batch_size": 128,
        "epochs": 3,
        "warmup_steps": 200,
        "schedule": "cosine",
    },
    "char-lm-fortunes": {  # docs/recipes.md: measured perplexity and throughput per backend
        "model": "char-transformer",
        "dataset": "fortunes",
        "epochs": 10,
        "batch_size": 32,
        "optimizer": "adam",
        "lr": 0.003,
        "schedule": "cosine:warmup=40",
        "clip_grad_norm": 1.0,
    },
}


def preset_fields(name: str) -> dict[str, Any]:
    """The recipe fields of preset ``name``; an unknown name lists the known ones."""
    try:
        return dict(PRESETS[name])
    except KeyError:
        raise ConfigError(
            f"Unknown recipe {name!r}. Built-in recipes: {', '.join(PRESETS)}."
        ) from None


def preset_recipe(name: str, overrides: dict[str, Any] | None = None) -> Recipe:
    """Preset ``name`` with ``overrides`` (recipe fields) applied on top."""
    return Recipe.from_dict({**preset_fields(name), **(overrides or {})})
