"""numpy backend plugin: polytrain's verbs with numpy alone (fp32/fp64, emulated devices,
one process). numpy is a dependency of polytrain, so this backend is always there; it
is picked without being named only when it is the only backend (``auto_select=False``)."""

from __future__ import annotations

from collections.abc import Callable

from polytrain import BackendInfo, hookimpl
from polytrain.backend.base import Backend
from polytrain.backend.capabilities import Capabilities
from polytrain.backend.factory import backend_factory
from polytrain.backend.native_format import NativeFormat
from polytrain.distributed.launcher import Launcher


def _backend_class() -> type[Backend]:
    from ._backend import NumpyBackend

    return NumpyBackend


@hookimpl
def polytrain_register_backends(register: Callable[[BackendInfo], None]) -> None:
    register(
        BackendInfo(
            name="numpy",
            framework="numpy",
            distribution="numpy",
            factory=backend_factory(_backend_class),
            description="numpy only: a small autodiff, emulated cpu:N devices, one process",
            order=40,
            collectives="none (one process)",
            auto_select=False,
            capabilities=Capabilities(
                devices=("cpu", "cpu:N"), collectives=("in-place", "returned")
            ),
        )
    )


@hookimpl
def polytrain_register_formats(register: Callable[[NativeFormat], None]) -> None:
    from ._format import NumpyFormat

    register(NumpyFormat())


@hookimpl
def polytrain_register_launchers(register: Callable[[Launcher], None]) -> None:
    from ._launcher import NumpyLauncher

    register(NumpyLauncher())
