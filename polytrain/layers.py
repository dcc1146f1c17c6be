"""The neutral layer set, to declare your own model (see docs/user-models.md)::

from polytrain import ModelSpec
from polytrain.layers import Flatten, Linear, ReLU, seq

spec = ModelSpec("tiny", seq(("flatten", Flatten()), ("fc", Linear(784, 10))))

Every layer type of :data:`LAYER_TYPES` is here (a test checks it).
"""

from __future__ import annotations

from polytrain.neutral.models.layers import *  # noqa: F403 (its __all__: the layer set)
from polytrain.neutral.models.layers import __all__ as __all__
