"""Checks that a recipe, its model and its data fit together, before anything is built:
what would otherwise be ignored without a word (a per-layer option naming no layer, a batch
larger than the data) or fail at the first step (a model whose outputs are not its classes)
is one line naming both sides."""

from __future__ import annotations

from typing import TYPE_CHECKING

from polytrain.errors import ConfigError
from polytrain.neutral.models import ModelSpec
from polytrain.neutral.shape_check import sample_output_shape

if TYPE_CHECKING:
    from polytrain.data.loader import ArrayDataset
    from polytrain.training.recipe import Recipe


def check_run_fits(recipe: Recipe, spec: ModelSpec, train: ArrayDataset) -> None:
    """Each check below, in order; the first that fails raises its ConfigError."""
    check_outputs(spec)
    check_layer_names(recipe, spec)
    check_batch(recipe, len(train))


def check_outputs(spec: ModelSpec) -> None:
    """The model's last axis has ``num_classes`` values (classes, or regression outputs)."""
    shape = sample_output_shape(spec)
    if shape is not None and shape[-1] != spec.num_classes:
        raise ConfigError(
            f"Model {spec.name!r} gives {shape[-1]} outputs per sample but its num_classes is "
            f"{spec.num_classes}: make its last layer's output size {spec.num_classes}, or set "
            f"num_classes={shape[-1]}."
        )


def check_layer_names(recipe: Recipe, spec: ModelSpec) -> None:
    """Every name of ``--layer-weight-decay`` is a layer or parameter of the model."""
    check_names(recipe, list(spec.parameter_shapes()), spec.name)


def check_names(recipe: Recipe, names: list[str], model: str) -> None:
    """Every name of ``--layer-weight-decay`` is a layer of, or one of, ``names``."""
    for prefix in recipe.per_layer_weight_decay:
        if not any(n == prefix or n.startswith(prefix + ".") for n in names):
            layers = sorted({n.rpartition(".")[0] for n in names if "." in n})
            shown = ", ".join(layers[:12]) + (", ..." if len(layers) > 12 else "")
            raise ConfigError(
                f"--layer-weight-decay names {prefix!r}, which is no layer or parameter of "
                f"model {model!r}; its layers: {shown}."
            )


def check_batch(recipe: Recipe, samples: int) -> None:
    """The (global) batch is no larger than the training set."""
    if recipe.batch_size > samples:
        raise ConfigError(
            f"--batch-size {recipe.batch_size} is larger than the {samples:,} training samples; "
            f"give --batch-size {samples} or less (one batch is then the whole set)."
        )
