"""Shared test settings (hypothesis profiles) and fixtures."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import settings

settings.register_profile("default", max_examples=50, deadline=None)
settings.register_profile("fuzz", max_examples=2500, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


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
