"""``polytrain launch --backend jax`` says in one line why it launches nothing here."""

from __future__ import annotations

from polytrain.distributed.launcher import Launcher, LaunchSpec
from polytrain.errors import ConfigError


class JaxLauncher(Launcher):
    """Declares that the jax backend runs one process here."""

    backend = "jax"
    name = "none"
    unsupported = (
        "The jax backend runs in one process here: jax.distributed needs cross-process "
        "collectives that jaxlib 0.4.30 has on GPUs and TPUs only, not between CPU "
        "processes. Run polytrain train --backend jax directly, with --devices cpu:N to "
        "emulate N devices in that process, or launch a backend with CPU collectives "
        "(torch, paddle, mxnet)."
    )

    def launch(self, spec: LaunchSpec, env: dict[str, str], address: str) -> int:
        raise ConfigError(self.unsupported or "")
