"""Toy backends for tests of the contract: each verb handed to a numpy backend, the class
made of exactly the verbs and capabilities a test names."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from polytrain import get_backend
from polytrain.backend.base import Backend, BackendOptions
from polytrain.backend.discovery import Capability

COLLECTIVE_VERBS = ["allreduce", "broadcast"]
NATIVE_IO_VERBS = ["save_native", "load_native"]


def toy_backend(
    verbs: list[str], capabilities: tuple[type[Capability], ...] = (), name: str = "toy"
) -> Backend:
    """A backend class listing ``capabilities`` beside Backend, with only ``verbs``
    (required and capability verbs alike), each handed to a numpy backend."""
    inner = get_backend("numpy")

    def handed(verb: str) -> Callable[..., Any]:
        return lambda self, *args, **kwargs: getattr(inner, verb)(*args, **kwargs)

    namespace: dict[str, Any] = {"name": name, "framework": "numpy", "native_suffix": ".npz"}
    toy = type("ToyBackend", (Backend, *capabilities), namespace | {v: handed(v) for v in verbs})
    return toy(BackendOptions())


def core_verbs() -> list[str]:
    """The required core's verbs: what every backend implements."""
    return sorted(Backend.__abstractmethods__)
