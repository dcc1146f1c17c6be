"""PaddlePaddle backend plugin: registers itself; paddle is imported only when built."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from polytrain import BackendInfo, hookimpl
from polytrain.backend.native_format import NativeFormat
from polytrain.distributed.launcher import Launcher


def _factory(options: Any) -> Any:
    from polytrain.utils.threads import export_thread_env, resolve_threads

    # Importing paddle sets OMP_NUM_THREADS=1 when unset: export ours first.
    threads = resolve_threads(options.threads)
    export_thread_env(threads)
    from ._backend import PaddleBackend

    backend = PaddleBackend(options)
    backend.set_threads(threads)
    return backend


@hookimpl
def polytrain_register_backends(register: Callable[[BackendInfo], None]) -> None:
    register(
        BackendInfo(
            name="paddle",
            framework="paddle",
            distribution="paddlepaddle",
            factory=_factory,
            description="PaddlePaddle (paddle.nn, paddle.distributed gloo/nccl)",
            order=20,
            collectives="paddle.distributed (gloo)",
        )
    )


@hookimpl
def polytrain_register_formats(register: Callable[[NativeFormat], None]) -> None:
    from ._format import PaddleFormat

    register(PaddleFormat())


@hookimpl
def polytrain_register_launchers(register: Callable[[Launcher], None]) -> None:
    from ._launcher import PaddleLauncher

    register(PaddleLauncher())
