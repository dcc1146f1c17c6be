"""PaddlePaddle backend plugin: registers itself; paddle is imported only when built.

Loading the plugin also arms :class:`._signals.PaddleCoreFinder`: whenever paddle is
imported in this process (by the backend, a command or the user's code), Paddle's C++
signal handlers are turned off as soon as Paddle installs them (docs/reliability.md,
"polytrain owns the signals")."""

from __future__ import annotations

from collections.abc import Callable

from polytrain import BackendInfo, hookimpl
from polytrain.backend.base import Backend
from polytrain.backend.factory import backend_factory
from polytrain.backend.model_walker import ModelWalker
from polytrain.backend.native_format import NativeFormat
from polytrain.distributed.launcher import Launcher

from ._signals import install_core_finder

install_core_finder()


def _backend_class() -> type[Backend]:
    from ._backend import PaddleBackend

    return PaddleBackend


@hookimpl
def polytrain_register_backends(register: Callable[[BackendInfo], None]) -> None:
    register(
        BackendInfo(
            name="paddle",
            framework="paddle",
            distribution="paddlepaddle",
            extra="paddle",
            factory=backend_factory(_backend_class),
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


@hookimpl
def polytrain_register_model_walkers(register: Callable[[ModelWalker], None]) -> None:
    from ._port import PaddleWalker

    register(PaddleWalker())
