"""jax backend plugin: polytrain's verbs over JAX (fp32/fp64, emulated cpu:N devices as
XLA host devices, several processes through ``jax.distributed`` with Gloo's CPU
collectives, the training step ``jax.jit``-compiled); native files in Flax's msgpack.
Install with ``pip install 'polytrain[jax]'``."""

from __future__ import annotations

from collections.abc import Callable

from polytrain import BackendInfo, hookimpl
from polytrain.backend.base import Backend
from polytrain.backend.capabilities import Capabilities
from polytrain.backend.factory import backend_factory
from polytrain.backend.native_format import NativeFormat
from polytrain.distributed.launcher import Launcher

#: every neutral layer type, fp32 and fp64, emulated devices; arrays are immutable, so
#: collectives return new arrays, within a process and across processes
CAPABILITIES = Capabilities(devices=("cpu", "cpu:N"), collectives=("returned", "processes"))


def _backend_class() -> type[Backend]:
    from . import _env

    _env.before_import()  # XLA_FLAGS: read once, when jax starts its CPU client
    from ._backend import JaxBackend

    return JaxBackend


@hookimpl
def polytrain_register_backends(register: Callable[[BackendInfo], None]) -> None:
    register(
        BackendInfo(
            name="jax",
            framework="jax",
            distribution="jax",
            factory=backend_factory(_backend_class),
            extra="jax",
            description="JAX: the step jax.jit-compiled, emulated cpu:N devices, processes",
            order=50,
            collectives="gloo (jax.distributed's CPU collectives)",
            capabilities=CAPABILITIES,
        )
    )


@hookimpl
def polytrain_register_formats(register: Callable[[NativeFormat], None]) -> None:
    from ._format import FlaxMsgpackFormat

    register(FlaxMsgpackFormat())


@hookimpl
def polytrain_register_launchers(register: Callable[[Launcher], None]) -> None:
    from ._launcher import JaxLauncher

    register(JaxLauncher())
