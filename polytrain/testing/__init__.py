"""The conformance suites, shipped as a pytest plugin (entry point ``pytest11`` ->
:mod:`polytrain.testing.conformance`), so a third-party backend tests itself with
``class TestMine(BackendConformance)``."""

from polytrain.testing.conformance import (
    FORWARD_ATOL,
    GRAD_ATOL,
    BackendConformance,
    backends_under_test,
    batch,
    loss_and_grads,
    pooling_spec,
    required_backends,
    tiny_resnet,
)

__all__ = [
    "FORWARD_ATOL",
    "GRAD_ATOL",
    "BackendConformance",
    "backends_under_test",
    "batch",
    "loss_and_grads",
    "pooling_spec",
    "required_backends",
    "tiny_resnet",
]
