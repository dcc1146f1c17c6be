"""Neutral model specs: a framework-free description each backend builds natively.

One room per concern; this package re-exports their names, so
``from polytrain.neutral.models import ModelSpec, Linear, get_model_spec`` keeps working:

* :mod:`~polytrain.neutral.models.layers`: the layer records, :func:`seq`, :func:`walk`;
* :mod:`~polytrain.neutral.models.parameters`: canonical parameter names and shapes;
* :mod:`~polytrain.neutral.models.init_rules`: initial weights in numpy from the seed;
* :mod:`~polytrain.neutral.models.spec`: :class:`ModelSpec` and its serialisation;
* :mod:`~polytrain.neutral.models.zoo`: the built-in models by name.
"""

from __future__ import annotations

from polytrain.neutral.models import layers
from polytrain.neutral.models.init_rules import INIT_ALIASES, INIT_RULES, init_rule
from polytrain.neutral.models.layers import *  # noqa: F403 (its __all__: the layer set)
from polytrain.neutral.models.layers import SequenceLayer, walk
from polytrain.neutral.models.parameters import BUFFER_SUFFIXES, is_buffer, layer_parameters
from polytrain.neutral.models.spec import ModelSpec
from polytrain.neutral.models.zoo import (
    MODELS,
    char_transformer,
    get_model_spec,
    lenet,
    lenet_scratch,
    mlp,
    paddle_mnist,
    resnet18,
    torch_dp_cnn,
    vit_tiny,
)
from polytrain.neutral.recurrent import RecurrentLayer

__all__ = [
    *layers.__all__,
    "BUFFER_SUFFIXES",
    "INIT_ALIASES",
    "INIT_RULES",
    "MODELS",
    "ModelSpec",
    "RecurrentLayer",
    "SequenceLayer",
    "char_transformer",
    "get_model_spec",
    "init_rule",
    "is_buffer",
    "layer_parameters",
    "lenet",
    "lenet_scratch",
    "mlp",
    "paddle_mnist",
    "resnet18",
    "torch_dp_cnn",
    "vit_tiny",
    "walk",
]
