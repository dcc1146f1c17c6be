"""Shared test settings (hypothesis profiles) and fixtures: ``backend_name`` and
``backend`` run a test once per backend under test (``backends_under_test()``)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from polytrain import get_backend
from polytrain.backend.base import Backend
from polytrain.testing import backends_under_test

# The test files sit in area folders (tests/io/, tests/training/, ...: scripts/dev/group-tests)
# and import tests/'s helper modules and each other by bare name (``from convert_helpers
# import ...``, ``from test_convert import ...``): tests/ and every area folder are on sys.path.
TESTS = Path(__file__).resolve().parent
AREAS = sorted(p for p in TESTS.iterdir() if p.is_dir() and any(p.glob("test_*.py")))
for _folder in [TESTS, *AREAS]:
    if str(_folder) not in sys.path:
        sys.path.append(str(_folder))

settings.register_profile("default", max_examples=50, deadline=None)
settings.register_profile("fuzz", max_examples=2500, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


def _default_dtypes() -> dict[str, str]:
    """The process-wide default float dtype of each framework already imported."""
    found = {}
    if "torch" in sys.modules:
        found["torch"] = str(sys.modules["torch"].get_default_dtype())
    if "paddle" in sys.modules and hasattr(sys.modules["paddle"], "get_default_dtype"):
        found["paddle"] = str(sys.modules["paddle"].get_default_dtype())
    return found


@pytest.fixture(autouse=True)
def _no_default_dtype_leak(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail the test that leaves a framework's default dtype changed (a later test in the
    same worker would build float64 layers), and put it back for the next one. A test
    marked ``runs_user_code`` (the user's factory may set it) only gets it put back."""
    yield
    leaked = {name: dtype for name, dtype in _default_dtypes().items() if "float32" not in dtype}
    if leaked:
        if "torch" in leaked:
            sys.modules["torch"].set_default_dtype(sys.modules["torch"].float32)
        if "paddle" in leaked:
            sys.modules["paddle"].set_default_dtype("float32")
        if request.node.get_closest_marker("runs_user_code") is None:
            pytest.fail(f"the test left the default dtype changed: {leaked}")


@pytest.fixture(scope="module", params=backends_under_test())
def backend_name(request: pytest.FixtureRequest) -> str:
    """Each backend under test by name, once per module (the id: ``[torch]``)."""
    return str(request.param)


@pytest.fixture(scope="module")
def backend(backend_name: str) -> Backend:
    """The backend named by ``backend_name``; a file whose ``backend`` means something
    else (a name, one fixed backend) defines its own."""
    return get_backend(backend_name)


@pytest.fixture
def branchy() -> Callable[[str], Any]:
    """A factory of one framework's own model (``"torch"``, ``"paddle"``, ``"mxnet"``)
    whose second layer runs only while ``use_extra`` is set: ``extra(first(x))``, else
    ``first(x)`` (Linear 4 -> 3, then Linear 3 -> 3)."""
    return _branchy


def _branchy(framework: str) -> Any:
    if framework == "torch":
        import torch

        class TorchBranchy(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.use_extra = True
                self.first, self.extra = torch.nn.Linear(4, 3), torch.nn.Linear(3, 3)

            def forward(self, x: Any) -> Any:
                h = self.first(x)
                return self.extra(h) if self.use_extra else h

        return TorchBranchy()
    if framework == "paddle":
        import paddle

        class PaddleBranchy(paddle.nn.Layer):
            def __init__(self) -> None:
                super().__init__()
                self.use_extra = True
                self.first, self.extra = paddle.nn.Linear(4, 3), paddle.nn.Linear(3, 3)

            def forward(self, x: Any) -> Any:
                h = self.first(x)
                return self.extra(h) if self.use_extra else h

        return PaddleBranchy()
    from mxnet import gluon

    class MXNetBranchy(gluon.Block):
        def __init__(self) -> None:
            super().__init__()
            self.use_extra = True
            with self.name_scope():
                self.first = gluon.nn.Dense(3, in_units=4)
                self.extra = gluon.nn.Dense(3, in_units=3)

        def forward(self, x: Any) -> Any:
            h = self.first(x)
            return self.extra(h) if self.use_extra else h

    return MXNetBranchy()
