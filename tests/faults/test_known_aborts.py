"""The recognizer of jaxlib 0.4.30's known abort after SIGTERM (tests/marks.py) is narrow:
only that death, on jax, becomes an expected failure; every other ending is judged."""

from __future__ import annotations

import signal

import pytest
from marks import known_jaxlib_abort

GLIBC = "corrupted size vs. prev_size while consolidating\n"


def test_the_known_abort_is_recognized() -> None:
    assert known_jaxlib_abort("jax", -signal.SIGABRT, GLIBC)


@pytest.mark.parametrize(
    ("backend", "code", "stderr"),
    [
        ("torch", -signal.SIGABRT, GLIBC),  # only jax has the defect
        ("jax", 128 + signal.SIGTERM, GLIBC),  # not a death by SIGABRT
        ("jax", -signal.SIGABRT, "Fatal Python error: Aborted\n"),  # another abort
        ("jax", -signal.SIGSEGV, GLIBC),
        ("jax", None, ""),  # a hang
    ],
)
def test_every_other_ending_is_judged(backend: str, code: int | None, stderr: str) -> None:
    assert not known_jaxlib_abort(backend, code, stderr)
