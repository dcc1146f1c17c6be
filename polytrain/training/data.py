"""A run's data: the recipe's dataset or the caller's arrays, as train/test/validation
splits cut to the recipe's sample limits and checked against the loss and the model."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from polytrain.data import ArrayDataset, load_dataset
from polytrain.data.arrays import as_split, load_npz
from polytrain.errors import ConfigError
from polytrain.neutral.losses import check_targets
from polytrain.neutral.models import ModelSpec
from polytrain.neutral.shape_check import sample_output_shape
from polytrain.neutral.spec_file import resolve_model_spec
from polytrain.training.recipe import Recipe

SPLITS = ("train", "test", "val")


@dataclass
class Datasets:
    train: ArrayDataset
    test: ArrayDataset | None
    val: ArrayDataset | None = None

    def parts(self) -> dict[str, ArrayDataset]:
        """The splits present, by name."""
        found = {"train": self.train, "test": self.test, "val": self.val}
        return {name: part for name, part in found.items() if part is not None}

    def origins(self) -> dict[str, dict[str, str]]:
        """Per split, the folder and files it was read from (for the run's records)."""
        return {name: dict(part.origin) for name, part in self.parts().items() if part.origin}

    def sequence_length(self, recipe: Recipe) -> int:
        """Positions per sample of sequence targets ([N, T] class labels: T), else 0."""
        y = self.train.y
        return int(y.shape[1]) if recipe.loss_spec().class_targets and y.ndim == 2 else 0


def load_datasets(
    recipe: Recipe, spec: ModelSpec | None = None, *, unchecked: bool = False
) -> Datasets:
    """Train/test (and validation) datasets of a recipe, cut to its sample limits: the
    ``data`` .npz (checked against ``spec``, default the recipe's model; ``unchecked``: a
    native model's, checked by its probe forward), else the named dataset."""
    train: ArrayDataset
    test: ArrayDataset | None
    if recipe.data is not None:
        spec = None if unchecked else spec or resolve_model_spec(recipe.model)
        splits = load_npz(recipe.data, spec, recipe.loss_spec(), recipe.metric_spec())
        train, test = splits["train"], splits.get("test")
    else:
        train = load_dataset(recipe.dataset, "train", data_dir=recipe.data_dir)
        test = load_dataset(recipe.dataset, "test", data_dir=recipe.data_dir)
    return cut_datasets(recipe, train, test)


def cut_datasets(recipe: Recipe, train: ArrayDataset, test: ArrayDataset | None) -> Datasets:
    """The recipe's validation split and sample limits applied."""
    val = None
    if recipe.val_split:
        train, val = train.split(recipe.val_split, seed=recipe.seed)
    if recipe.train_samples:
        train = train.subset(min(recipe.train_samples, len(train)))
    if recipe.test_samples and test is not None:
        test = test.subset(min(recipe.test_samples, len(test)))
    return Datasets(train, test, val)


def as_datasets(data: Any, recipe: Recipe, spec: ModelSpec | None) -> Datasets:
    """``Trainer(datasets=...)``: a :class:`Datasets`, or ``{"train": ..., "test": ...,
    "val": ...}`` (``test``/``val`` optional) of ``(x, y)`` array pairs, ArrayDatasets or
    indexable objects of ``(x, y)`` samples (:mod:`polytrain.data.arrays`), or one such
    value (the training set); None: the recipe's own data. Targets must suit the loss
    (without a spec, a native model's: checked by its probe forward once it is built)."""
    if data is None:
        found = load_datasets(recipe, spec, unchecked=spec is None)
    elif isinstance(data, Datasets):
        found = data
    else:
        found = _given_datasets(data, recipe, spec)
    if spec is None:
        return found
    loss, metric = recipe.loss_spec(), recipe.metric_spec()
    for name, part in found.parts().items():
        where = part.source or f"the {name} set"
        check_targets(loss, metric, part.y, spec.num_classes, where, sample_output_shape(spec))
    return found


def _given_datasets(data: Any, recipe: Recipe, spec: ModelSpec | None) -> Datasets:
    """The caller's splits (a mapping, or the training set alone) as Datasets."""
    parts = dict(data) if isinstance(data, dict) else {"train": data}
    if set(parts) - set(SPLITS) or "train" not in parts:
        raise ConfigError(
            f"datasets= takes the keys train (required), test and val; got {sorted(parts)}."
        )
    loss, metric = recipe.loss_spec(), recipe.metric_spec()
    split = {
        name: as_split(value, spec, loss, metric, f"datasets[{name!r}]")
        for name, value in parts.items()
        if value is not None
    }
    found = cut_datasets(recipe, split["train"], split.get("test"))
    if "val" in split:
        if found.val is not None:
            raise ConfigError("datasets= has a 'val' split and the recipe a --val-split: one.")
        found.val = split["val"]
    return found
