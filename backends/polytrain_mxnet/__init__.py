"""MXNet backend plugin: registers itself; mxnet is imported only when built."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from polytrain import BackendInfo, hookimpl


def _factory(options: Any) -> Any:
    from polytrain.threads import export_thread_env, resolve_threads

    threads = resolve_threads(options.threads)
    export_thread_env(threads)
    from ._backend import MXNetBackend

    backend = MXNetBackend(options)
    backend.set_threads(threads)
    return backend


@hookimpl
def polytrain_register_backends(register: Callable[[BackendInfo], None]) -> None:
    register(
        BackendInfo(
            name="mxnet",
            framework="mxnet",
            distribution="mxnet",
            factory=_factory,
            description="Apache MXNet 1.9 (Gluon, kvstore local/device/dist_sync)",
        )
    )
