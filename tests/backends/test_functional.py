"""Functional ops (d2l's scratch recipes) on every installed (or required) backend."""

from __future__ import annotations

import pytest
from marks import slow

from polytrain import Backend, BackendError, get_backend
from polytrain.testing.functional import FunctionalConformance


class TestFunctional(FunctionalConformance):
    @pytest.fixture
    def backend(self, backend_name: str) -> Backend:  # type: ignore[override]
        return get_backend(backend_name)

    # d2l's scratch steps on several devices and LeNet: CI runs them, --quick not
    test_scratch_data_parallel_step_equals_one_device = slow(
        FunctionalConformance.test_scratch_data_parallel_step_equals_one_device
    )
    test_scratch_lenet_gradients_match_native_lenet = slow(
        FunctionalConformance.test_scratch_lenet_gradients_match_native_lenet
    )


def test_functional_is_optional_for_third_party_backends(backend_name: str) -> None:
    """The ABC's default says which backend lacks the ops (built-ins override it)."""
    with pytest.raises(BackendError, match=f"backend {backend_name} has no functional ops"):
        Backend.functional(get_backend(backend_name))
