"""The shipped conformance suite, run against every installed (or required) backend."""

from __future__ import annotations

import pytest

from polytrain.testing import BackendConformance, backends_under_test


@pytest.fixture(scope="module", params=backends_under_test())
def backend_name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


class TestConformance(BackendConformance):
    @pytest.fixture
    def backend(self, backend_name: str):  # type: ignore[override]
        from polytrain import get_backend

        return get_backend(backend_name)
