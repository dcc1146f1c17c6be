"""A model spec: a named tree of neutral layers with its input shape, its number of
outputs and its init rule, and its serialisation (the dict a checkpoint's manifest and a
spec file hold). Canonical parameter names are the dotted paths of the tree
(``conv1.weight``, ``stages.0.0.bn1.running_var``), in PyTorch's layout.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from polytrain.errors import ConfigError
from polytrain.neutral import spec_check
from polytrain.neutral.models.init_rules import init_rule, initial_parameters
from polytrain.neutral.models.layers import (
    LAYER_TYPES,
    Add,
    Layer,
    Residual,
    Sequential,
    walk,
)
from polytrain.neutral.models.parameters import is_buffer, layer_parameters


@dataclass(frozen=True)
class ModelSpec:
    """A named network with its input shape and initialisation rule.

    ``init``: ``fan_in_uniform`` (PyTorch's Conv/Linear defaults; formerly
    ``torch_default``, still accepted), ``xavier_uniform`` (biases zero),
    ``kaiming_normal`` (fan_out, relu; biases zero) or ``normal`` with ``init_std``
    (d2l's scratch recipe; biases zero). BatchNorm starts at 1/0/0/1
    (:mod:`polytrain.neutral.models.init_rules`).
    """

    name: str
    net: Sequential
    input_shape: tuple[int, ...] = (1, 28, 28)  # of one sample, e.g. (C, H, W) or (features,)
    num_classes: int = 10  # outputs per sample: classes, or values of a regression
    init: str = "xavier_uniform"
    init_std: float = 0.01
    has_randomness: bool = False
    description: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "init", init_rule(self.init))
        shape = tuple(self.input_shape)
        if not shape or not all(isinstance(n, int) and n >= 1 for n in shape):
            raise ConfigError(f"input_shape must be sizes >= 1 of one sample, got {shape!r}.")
        object.__setattr__(self, "input_shape", shape)
        if isinstance(self.num_classes, bool) or not (
            isinstance(self.num_classes, int) and self.num_classes >= 1
        ):
            raise ConfigError(f"num_classes must be an integer >= 1, got {self.num_classes!r}.")
        if not isinstance(self.net, Sequential):
            raise ConfigError(f"A model spec's net must be a Sequential, got {self.net!r}.")
        if not (isinstance(self.init_std, int | float) and math.isfinite(self.init_std)):
            raise ConfigError(f"init_std must be a finite number, got {self.init_std!r}.")
        spec_check.check_tree(self.net, self.name)
        spec_check.check_memory(self.name, self.num_parameters())

    # -- walking ----------------------------------------------------------------------------

    def layers(self) -> Iterator[tuple[str, Layer]]:
        """Every leaf layer with its dotted path, in forward order."""
        yield from walk(self.net, "")

    def parameter_shapes(self) -> dict[str, tuple[int, ...]]:
        """Canonical name -> shape of every parameter and buffer, in model order."""
        shapes: dict[str, tuple[int, ...]] = {}
        for path, layer in self.layers():
            for pname, shape in layer_parameters(layer).items():
                shapes[f"{path}.{pname}"] = shape
        return shapes

    def trainable_names(self) -> list[str]:
        return [n for n in self.parameter_shapes() if not is_buffer(n)]

    def num_parameters(self) -> int:
        return sum(math.prod(s) for n, s in self.parameter_shapes().items() if not is_buffer(n))

    # -- initialisation ---------------------------------------------------------------------

    def init_params(self, seed: int = 0) -> dict[str, np.ndarray]:
        """Float32 initial weights from ``seed`` by the spec's init rule (the same on every
        backend: :mod:`polytrain.neutral.models.init_rules`)."""
        return initial_parameters(self.layers(), self.init, self.init_std, seed)

    # -- serialisation ----------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "net": _layer_to_dict(self.net),
            "input_shape": list(self.input_shape),
            "num_classes": self.num_classes,
            "init": self.init,
            "init_std": self.init_std,
            "has_randomness": self.has_randomness,
            "description": self.description,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelSpec:
        try:
            net = _layer_from_dict(_as_sequential(data["net"]))
            if not isinstance(net, Sequential):
                raise ConfigError("A model spec's 'net' must be a Sequential.")
            return cls(
                name=str(data["name"]),
                net=net,
                input_shape=tuple(data["input_shape"]),
                num_classes=data["num_classes"],
                init=str(data.get("init", "xavier_uniform")),
                init_std=data.get("init_std", 0.01),
                has_randomness=bool(data.get("has_randomness", False)),
                description=str(data.get("description", "")),
            )
        except ConfigError:
            raise
        except KeyError as exc:
            raise ConfigError(f"Not a valid model spec: it has no {exc} field.") from None
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"Not a valid model spec: {exc}.") from exc


def _layer_to_dict(layer: Layer) -> dict[str, Any]:
    if isinstance(layer, Sequential):
        return {"type": "Sequential", "layers": [[n, _layer_to_dict(c)] for n, c in layer.layers]}
    if isinstance(layer, Residual):
        return {
            "type": "Residual",
            "body": _layer_to_dict(layer.body),
            "shortcut": None if layer.shortcut is None else _layer_to_dict(layer.shortcut),
        }
    if isinstance(layer, Add):
        return {"type": "Add", "branches": [_layer_to_dict(b) for b in layer.branches]}
    return {"type": type(layer).__name__, **asdict(layer)}


def _as_sequential(data: Any) -> Any:
    """A bare list of layers is a Sequential (the short form of spec files)."""
    return {"type": "Sequential", "layers": data} if isinstance(data, list) else data


def _named_layer(entry: Any, depth: int) -> tuple[str, Layer]:
    """``[name, {type: ...}]`` or ``{name: ..., type: ...}`` (the file form)."""
    if isinstance(entry, dict):
        fields = dict(entry)
        if "name" not in fields:
            raise ConfigError(f"A layer entry has no 'name': {_short(entry)}.")
        name = str(fields.pop("name"))
        return name, _layer_from_dict(fields, depth + 1, name)
    if not isinstance(entry, list | tuple) or len(entry) != 2:
        raise ConfigError(f"A layer entry must be [name, layer] or a table: {_short(entry)}.")
    name, child = entry
    return str(name), _layer_from_dict(_as_sequential(child), depth + 1, str(name))


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _layer_from_dict(data: dict[str, Any], depth: int = 0, name: str = "net") -> Layer:
    if not isinstance(data, dict):
        raise ConfigError(f"A layer must be a table/object with a 'type', got {_short(data)}.")
    if depth > spec_check.MAX_DEPTH:
        raise ConfigError(
            f"The model spec nests layers more than {spec_check.MAX_DEPTH} levels deep (at "
            f"{name!r}); flatten it into fewer Sequential levels."
        )
    kind = data.get("type")
    if kind == "Sequential":
        return Sequential(tuple(_named_layer(entry, depth) for entry in data["layers"]))
    if kind == "Residual":
        body = _layer_from_dict(_as_sequential(data["body"]), depth + 1, "body")
        short = data.get("shortcut")
        shortcut = (
            None if short is None else _layer_from_dict(_as_sequential(short), depth + 1, name)
        )
        if not isinstance(body, Sequential) or not (
            shortcut is None or isinstance(shortcut, Sequential)
        ):
            raise ConfigError("Residual body and shortcut must be Sequential.")
        return Residual(body, shortcut)
    if kind == "Add":
        branches = tuple(
            _layer_from_dict(_as_sequential(b), depth + 1, name) for b in data["branches"]
        )
        if not all(isinstance(b, Sequential) for b in branches):
            raise ConfigError("Add branches must be Sequential (or lists of layers).")
        return Add(branches)  # type: ignore[arg-type]
    if kind not in LAYER_TYPES:
        raise ConfigError(f"Unknown layer type {kind!r} in model spec.")
    fields = {k: v for k, v in data.items() if k != "type"}
    spec_check.check_fields(LAYER_TYPES[kind], fields, f"layer {name!r}")
    try:
        layer: Layer = LAYER_TYPES[kind](**fields)
    except TypeError as exc:
        raise ConfigError(f"Layer {kind}: {exc} (fields given: {sorted(fields)}).") from None
    return layer
