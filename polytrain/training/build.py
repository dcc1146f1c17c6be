"""The parts of a run built from its recipe and options: the backend object, the batch
loader, the model with its initial parameters, the step runner; and the run's
description (:class:`~polytrain.plugins.records.RunInfo`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from polytrain.backend.base import Backend, BackendOptions, Model
from polytrain.backend.precision import param_dtype
from polytrain.data import ArrayDataset, BatchLoader
from polytrain.neutral.models import ModelSpec
from polytrain.neutral.optim import Optimizer
from polytrain.plugins.records import RunInfo
from polytrain.plugins.registry import get_backend
from polytrain.training.compile_decision import CompileChoice
from polytrain.training.data import Datasets
from polytrain.training.options import TrainerOptions
from polytrain.training.pipeline import pipeline_backend
from polytrain.training.recipe import Recipe
from polytrain.training.step import StepRunner
from polytrain.utils.threads import resolve_threads


def make_backend(
    backend: Backend | str | None, recipe: Recipe, options: TrainerOptions, processes: int
) -> Backend:
    """The backend object passed in, or one built here (threads for ``processes`` on this
    machine, --fast, precision); with --pipeline-split, models become two stages on
    devices[0] and devices[1]."""
    if not isinstance(backend, Backend):
        threads = options.threads
        if threads is not None or processes > 1:
            threads = resolve_threads(threads, processes)
        # else None: the backend's own default (polytrain.utils.threads, docs/performance.md)
        backend_options = BackendOptions(
            threads=threads, fast=options.fast, precision=recipe.precision
        )
        backend = get_backend(backend, options=backend_options)
    if recipe.pipeline_split:
        backend = pipeline_backend(backend, recipe.pipeline_split)
    return backend


def make_loader(train: ArrayDataset, recipe: Recipe, backend: Backend) -> BatchLoader:
    """The training set in the recipe's batches, this process's share of each."""
    return BatchLoader(
        train, recipe.batch_size, seed=recipe.seed, drop_last=recipe.drop_last,
        rank=backend.rank, world_size=backend.world_size, prefetch=2,
    )  # fmt: skip


def build_model(backend: Backend, spec: ModelSpec, devices: list[Any], recipe: Recipe) -> Model:
    """The model on ``devices`` in the recipe's precision, with the recipe seed's initial
    parameters (the same on every backend); the backend's own generator seeded too."""
    model = backend.build_model(spec, devices, dtype=param_dtype(recipe.precision))
    backend.set_params(model, spec.init_params(recipe.seed))
    backend.seed(recipe.seed)
    return model


def make_step_runner(
    backend: Backend, model: Model, optimizer: Optimizer, recipe: Recipe, options: TrainerOptions
) -> StepRunner:
    """The step runner of the recipe's loss, metric, precision, clipping and dropout masks."""
    return StepRunner(
        backend,
        model,
        optimizer,
        accumulate=recipe.accumulate,
        precision=recipe.precision,
        loss=recipe.loss_spec(),
        metric=recipe.metric_spec(),
        clip_grad_norm=recipe.clip_grad_norm,
        clip_grad_value=recipe.clip_grad_value,
        dropout_masks=recipe.parity_masks(backend.rank),
        metrics_every=options.metrics_every,
    )


def describe_run(
    recipe: Recipe,
    backend: Backend,
    model: Model,
    devices: list[Any],
    *,
    steps_per_epoch: int,
    choice: CompileChoice,
    out_dir: Path | None,
    start_epoch: int,
    start_step: int = 0,
    start_global_step: int = 0,
    data: Datasets,
) -> RunInfo:
    """What a run is: printed as its header and written first in the metrics file."""
    replicas = backend.world_size * model.num_devices * recipe.accumulate
    steps, max_steps = steps_per_epoch, recipe.max_steps
    return RunInfo(
        backend=backend.name,
        framework_version=backend.version(),
        model=recipe.model_name,
        dataset=recipe.data or recipe.dataset,
        devices=[backend.device_name(d) for d in devices],
        epochs=recipe.epochs,
        steps_per_epoch=steps if max_steps is None else min(max_steps, steps),
        global_batch=recipe.batch_size,
        per_device_batch=-(-recipe.batch_size // replicas),
        rank=backend.rank,
        world_size=backend.world_size,
        threads=backend.threads(),
        fast=backend.fast,
        fast_reason=choice.reason,
        recipe=recipe.to_dict(),
        out_dir=str(out_dir) if out_dir else None,
        start_epoch=start_epoch,
        start_step=start_step,
        start_global_step=start_global_step,
        data=data.origins(),
    )
