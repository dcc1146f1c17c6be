"""Functional ops (d2l's scratch recipes) on every installed (or required) backend."""

from __future__ import annotations

import pytest

from polytrain import Backend, BackendError, get_backend
from polytrain.testing.functional import FunctionalConformance


class TestFunctional(FunctionalConformance):
    @pytest.fixture
    def backend(self, backend_name: str) -> Backend:  # type: ignore[override]
        return get_backend(backend_name)


def test_functional_is_optional_for_third_party_backends(backend_name: str) -> None:
    """The ABC's default says which backend lacks the ops (built-ins override it)."""
    with pytest.raises(BackendError, match=f"backend {backend_name} has no functional ops"):
        Backend.functional(get_backend(backend_name))
