"""Marks for tests a suite class inherits from :mod:`polytrain.testing`: marked on a
wrapper, so the library's own functions stay as they are."""

from __future__ import annotations

import functools
import signal
from collections.abc import Callable
from typing import Any

import pytest


def slow(test: Callable[..., Any]) -> Callable[..., Any]:
    """``test`` (its parameters and marks kept) marked slow: CI runs it, --quick does not."""

    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> Any:
        return test(*args, **kwargs)

    return pytest.mark.slow(run)


#: what glibc prints when it finds the heap corrupt; jaxlib 0.4.30 (the newest jax beside
#: MXNet's numpy<1.24) dies so, rarely, after a SIGTERM (docs/distributed.md, "Known defect")
GLIBC_HEAP_CHECKS = ("corrupted size vs. prev_size", "corrupted double-linked list")


def known_jaxlib_abort(backend: str, returncode: int | None, stderr: str) -> bool:
    """Did a jax process die of that known abort (SIGABRT with glibc's message)? Any other
    ending, on jax too, goes on to the test's own checks."""
    aborted = returncode == -signal.SIGABRT
    return backend == "jax" and aborted and any(m in stderr for m in GLIBC_HEAP_CHECKS)


def xfail_known_jaxlib_abort(backend: str, returncode: int | None, stderr: str) -> None:
    """The test as an expected failure when :func:`known_jaxlib_abort` says so."""
    if known_jaxlib_abort(backend, returncode, stderr):
        pytest.xfail(f"jaxlib 0.4.30 aborted after SIGTERM: {stderr.strip().splitlines()[-1]}")
