"""polytrain: write a training recipe once, run it on PyTorch, PaddlePaddle or MXNet.

The core imports no framework; backends are plugins found through the ``polytrain``
entry-point group and import their framework only when built.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from polytrain._version import __version__
from polytrain.backend.base import Backend, BackendOptions, Model
from polytrain.errors import (
    BackendError,
    CheckpointError,
    ClusterError,
    ConfigError,
    DataError,
    NonFiniteLossError,
    PolytrainError,
)
from polytrain.neutral.losses import LossSpec, MetricSpec
from polytrain.neutral.models import ModelSpec, get_model_spec
from polytrain.neutral.optim import OptimizerConfig
from polytrain.neutral.spec_file import spec_from_dict, spec_from_file, spec_to_dict
from polytrain.plugins.hookspecs import hookimpl, hookspec
from polytrain.plugins.registry import (
    BackendInfo,
    get_backend,
    installed_backends,
    registered_backends,
)

if TYPE_CHECKING:
    from polytrain.porting.api import port
    from polytrain.training.recipe import Recipe
    from polytrain.training.step import StepRunner
    from polytrain.training.trainer import Trainer


# The training layer loads on first use: `polytrain backends` stays fast, and the layers
# below never import it through this package.
_LAZY = {
    "Recipe": "polytrain.training.recipe",
    "StepRunner": "polytrain.training.step",
    "Trainer": "polytrain.training.trainer",
    "port": "polytrain.porting.api",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'polytrain' has no attribute {name!r}")


__all__ = [
    "Backend",
    "BackendError",
    "BackendInfo",
    "BackendOptions",
    "CheckpointError",
    "ClusterError",
    "ConfigError",
    "DataError",
    "LossSpec",
    "MetricSpec",
    "Model",
    "ModelSpec",
    "NonFiniteLossError",
    "OptimizerConfig",
    "PolytrainError",
    "Recipe",
    "StepRunner",
    "Trainer",
    "__version__",
    "get_backend",
    "get_model_spec",
    "hookimpl",
    "hookspec",
    "installed_backends",
    "port",
    "registered_backends",
    "spec_from_dict",
    "spec_from_file",
    "spec_to_dict",
]
