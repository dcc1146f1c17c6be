"""The plugin manager of a run's training events: the built-in plugins (progress bar,
metrics file, curves), the trackers of ``--log``, ``--early-stop`` and the user's."""

from __future__ import annotations

from pathlib import Path

import pluggy

from polytrain.errors import ConfigError
from polytrain.io.run_dir import CURVES_FILE, METRICS_FILE
from polytrain.plugins.registry import make_plugin_manager
from polytrain.training.builtin_plugins import JsonlLogger, ProgressBar
from polytrain.training.curves import CurvesPlot
from polytrain.training.early_stopping import EarlyStopping
from polytrain.training.options import TrainerOptions
from polytrain.training.recipe import Recipe
from polytrain.training.trackers import make_trackers


def event_plugins(
    recipe: Recipe, options: TrainerOptions, out: Path | None
) -> pluggy.PluginManager:
    """Every plugin of the run registered, ``out`` the run folder; hooks run on every
    rank (plugins check ``run.is_main``)."""
    manager = make_plugin_manager()
    manager.register(ProgressBar(options.progress), name="polytrain.progress")
    if out is not None:
        manager.register(JsonlLogger(out / METRICS_FILE), name="polytrain.metrics")
        manager.register(CurvesPlot(out / CURVES_FILE), name="polytrain.training.curves")
    for name, tracker in make_trackers(options.log, out, options.tensorboard).items():
        manager.register(tracker, name=f"polytrain.{name}")
    if recipe.early_stop:
        metric = recipe.metric_spec()
        early = EarlyStopping(
            recipe.early_stop,
            lower_is_better=metric.name == "mse",  # the one error metric; the rest are rates
            label=metric.label,
        )
        manager.register(early, name="polytrain.early_stop")
    for plugin in options.plugins:
        register_plugin(manager, plugin)
    return manager


def register_plugin(pm: pluggy.PluginManager, plugin: object) -> None:
    """Register a user plugin; one line saying what is wrong when pluggy rejects it (a
    misspelt hook name or argument)."""
    try:
        pm.register(plugin)
    except (pluggy.PluginValidationError, ValueError) as exc:
        raise ConfigError(f"plugin {type(plugin).__name__}: {exc}".replace("\n", " ")) from exc
