"""Marks for tests a suite class inherits from :mod:`polytrain.testing`: marked on a
wrapper, so the library's own functions stay as they are."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import pytest


def slow(test: Callable[..., Any]) -> Callable[..., Any]:
    """``test`` (its parameters and marks kept) marked slow: CI runs it, --quick does not."""

    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> Any:
        return test(*args, **kwargs)

    return pytest.mark.slow(run)
