"""Which framework's own model object a value is (a torch ``nn.Module``, a Paddle
``nn.Layer``, a Gluon ``Block``), asked of the backend plugins' model walkers (the core
never imports a framework), and how a recipe names such an object."""

from __future__ import annotations

from polytrain.plugins.registry import registered_model_walkers

NATIVE_PREFIX = "native:"  # a native object's model in a recipe's dict: native:torch:pkg.Net


def native_framework(model: object) -> str | None:
    """The framework whose model walker owns ``model`` (``torch``, ``paddle``, ``mxnet``),
    else None; a framework not imported yet owns nothing."""
    if model is None or isinstance(model, str | bytes | int | float | list | tuple | dict):
        return None
    for name, walker in registered_model_walkers().items():
        if walker.owns(model):
            return name
    return None


def native_label(model: object) -> str:
    """How a recipe's dict and a run's records name a native model object."""
    kind = type(model)
    return f"{NATIVE_PREFIX}{native_framework(model)}:{kind.__module__}.{kind.__qualname__}"
