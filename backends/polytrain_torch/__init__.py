"""PyTorch backend plugin: registers itself; torch is imported only when the backend is built."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from polytrain import BackendInfo, hookimpl
from polytrain.backend.native_format import NativeFormat
from polytrain.distributed.launcher import Launcher


def _factory(options: Any) -> Any:
    from polytrain.utils.threads import export_thread_env, resolve_threads

    threads = resolve_threads(options.threads)
    export_thread_env(threads)
    from ._backend import TorchBackend

    backend = TorchBackend(options)
    backend.set_threads(threads)
    return backend


@hookimpl
def polytrain_register_backends(register: Callable[[BackendInfo], None]) -> None:
    register(
        BackendInfo(
            name="torch",
            framework="torch",
            distribution="torch",
            factory=_factory,
            description="PyTorch (torch.nn, torch.distributed gloo/nccl)",
            order=10,
            collectives="torch.distributed (gloo)",
        )
    )


@hookimpl
def polytrain_register_formats(register: Callable[[NativeFormat], None]) -> None:
    from ._format import TorchFormat

    register(TorchFormat())


@hookimpl
def polytrain_register_launchers(register: Callable[[Launcher], None]) -> None:
    from ._launcher import TorchrunLauncher

    register(TorchrunLauncher())
