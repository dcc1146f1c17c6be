"""polytrain: write a training recipe once, run it on PyTorch, PaddlePaddle or MXNet.

The core imports no framework; backends are plugins found through the ``polytrain``
entry-point group and import their framework only when built.
"""

from __future__ import annotations

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
from polytrain.neutral.models import ModelSpec, get_model_spec
from polytrain.neutral.optim import OptimizerConfig
from polytrain.plugins.hookspecs import hookimpl, hookspec
from polytrain.plugins.registry import (
    BackendInfo,
    get_backend,
    installed_backends,
    registered_backends,
)

__version__ = "0.1.0"

__all__ = [
    "Backend",
    "BackendError",
    "BackendInfo",
    "BackendOptions",
    "CheckpointError",
    "ClusterError",
    "ConfigError",
    "DataError",
    "Model",
    "ModelSpec",
    "NonFiniteLossError",
    "OptimizerConfig",
    "PolytrainError",
    "__version__",
    "get_backend",
    "get_model_spec",
    "hookimpl",
    "hookspec",
    "installed_backends",
    "registered_backends",
]
