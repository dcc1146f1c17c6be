"""MXNet backend plugin: registers itself; mxnet is imported only when built."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from polytrain import BackendInfo, hookimpl
from polytrain.backend.base import Backend
from polytrain.backend.factory import backend_factory
from polytrain.backend.model_walker import ModelWalker
from polytrain.backend.native_format import NativeFormat
from polytrain.distributed.launcher import Launcher

from ._compat import mxnet_incompatibility
from ._engine import choose_engine


def _backend_class() -> type[Backend]:
    from ._backend import MXNetBackend

    return MXNetBackend


@dataclass(frozen=True)
class MXNetBackendInfo(BackendInfo):
    """MXNet's entry: unavailable, with the reason, where its pins cannot hold (Python >=
    3.12, numpy >= 1.24), even if an mxnet package is on the path."""

    @property
    def install_hint(self) -> str:
        return mxnet_incompatibility() or super().install_hint

    def available(self) -> bool:
        return mxnet_incompatibility() is None and super().available()


@hookimpl
def polytrain_register_backends(register: Callable[[BackendInfo], None]) -> None:
    register(
        MXNetBackendInfo(
            name="mxnet",
            framework="mxnet",
            distribution="mxnet",
            extra="mxnet",
            # NaiveEngine and every core for one process; the threaded engine and one core
            # less for its worker thread in a parameter-server launch (_engine.py)
            factory=backend_factory(_backend_class, reserve_threads=choose_engine),
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


@hookimpl
def polytrain_register_model_walkers(register: Callable[[ModelWalker], None]) -> None:
    from ._port import GluonWalker

    register(GluonWalker())
