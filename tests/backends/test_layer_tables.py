"""Each built-in backend builds layers from one ``{LayerType: builder}`` table (issue 38):
every neutral layer type has an entry, and a type with none is refused in one line."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, get_args

import pytest

from polytrain import get_backend
from polytrain.errors import BackendError
from polytrain.neutral.models import LAYER_TYPES, Layer, Linear

#: backend -> (module, its table, its lookup); a third-party backend is skipped
TABLES = {
    "jax": ("polytrain_jax._net", "BUILDERS", "build"),
    "mxnet": ("polytrain_mxnet._layers", "BUILDERS", "build"),
    "numpy": ("polytrain_numpy._layers", "RUNNERS", "runner"),  # it runs the spec itself
    "paddle": ("polytrain_paddle._layers", "BUILDERS", "build"),
    "torch": ("polytrain_torch._layers", "BUILDERS", "build"),
}

#: layer types a backend refuses on purpose, (backend, type name) -> why: none today
REFUSED: dict[tuple[str, str], str] = {}


def _module(backend_name: str) -> Any:
    if backend_name not in TABLES:
        pytest.skip(f"{backend_name}: not a built-in backend with a layer table")
    get_backend(backend_name)  # its modules loaded, as a run loads them (jax's register)
    return importlib.import_module(TABLES[backend_name][0])


def test_every_layer_type_has_a_builder(backend_name: str) -> None:
    table = getattr(_module(backend_name), TABLES[backend_name][1])
    every = {*LAYER_TYPES.values(), *get_args(Layer)}  # the registry and the union
    missing = sorted(
        cls.__name__
        for cls in every
        if cls not in table and (backend_name, cls.__name__) not in REFUSED
    )
    assert not missing, f"{backend_name} has no builder for {missing}"


@dataclass(frozen=True)
class _ThirdPartyLayer:
    """A layer no backend knows."""

    width: int = 3


def test_an_unknown_layer_type_is_refused_in_one_line(backend_name: str) -> None:
    lookup = getattr(_module(backend_name), TABLES[backend_name][2])
    with pytest.raises(BackendError, match=f"{backend_name} backend (cannot|has no builder)"):
        lookup(_ThirdPartyLayer())


@dataclass(frozen=True)
class _NamedLinear(Linear):
    """A user's subclass of a neutral layer: built as its base, as the isinstance chains did."""

    note: str = ""


def test_a_subclass_of_a_layer_type_is_built_as_its_base(backend_name: str) -> None:
    lookup = getattr(_module(backend_name), TABLES[backend_name][2])
    got, want = lookup(_NamedLinear(4, 2)), lookup(Linear(4, 2))
    assert got is want if backend_name == "numpy" else type(got) is type(want)
