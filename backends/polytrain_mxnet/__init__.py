"""MXNet backend plugin: registers itself; mxnet is imported only when built."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from polytrain import BackendInfo, hookimpl
from polytrain.backend.native_format import NativeFormat
from polytrain.distributed.launcher import Launcher


def _factory(options: Any) -> Any:
    from polytrain.utils.threads import export_thread_env, resolve_threads

    # One core less by default: the engine's worker thread runs the operators while the
    # Python thread queues the next ones; OpenMP on every core then oversubscribes them
    # (measured: 1 thread 6-18% faster than 2 on 2 cores, docs/performance.md).
    threads = resolve_threads(options.threads, reserve=1)
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
            order=30,
            collectives="kvstore dist_sync (ps-lite)",
        )
    )


@hookimpl
def polytrain_register_formats(register: Callable[[NativeFormat], None]) -> None:
    from ._format import MXNetFormat

    register(MXNetFormat())


@hookimpl
def polytrain_register_launchers(register: Callable[[Launcher], None]) -> None:
    from ._launcher import ParameterServerLauncher

    register(ParameterServerLauncher())
