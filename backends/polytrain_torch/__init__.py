"""PyTorch backend plugin: registers itself; torch is imported only when the backend is built."""

from __future__ import annotations

from collections.abc import Callable

from polytrain import BackendInfo, hookimpl
from polytrain.backend.base import Backend
from polytrain.backend.factory import backend_factory
from polytrain.backend.model_walker import ModelWalker
from polytrain.backend.native_format import NativeFormat
from polytrain.distributed.launcher import Launcher


def _backend_class() -> type[Backend]:
    from ._backend import TorchBackend

    return TorchBackend


#: A bare ``torch`` requirement downloads the multi-GB CUDA build on Linux: the CPU wheel
#: comes from PyTorch's own index (docs/index.md, "Install").
TORCH_INSTALL = (
    "pip install torch --index-url https://download.pytorch.org/whl/cpu && pip install "
    "'polytrain[torch]' (CPU only; a plain pip install 'polytrain[torch]' downloads the "
    "multi-GB CUDA build)"
)


@hookimpl
def polytrain_register_backends(register: Callable[[BackendInfo], None]) -> None:
    register(
        BackendInfo(
            name="torch",
            framework="torch",
            distribution="torch",
            extra="torch",
            factory=backend_factory(_backend_class),
            description="PyTorch (torch.nn, torch.distributed gloo/nccl)",
            order=10,
            collectives="torch.distributed (gloo)",
            install=TORCH_INSTALL,
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


@hookimpl
def polytrain_register_model_walkers(register: Callable[[ModelWalker], None]) -> None:
    from ._port import TorchWalker

    register(TorchWalker())
