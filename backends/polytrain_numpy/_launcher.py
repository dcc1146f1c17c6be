"""``polytrain launch --backend numpy`` launches nothing: the numpy backend runs in one
process. Its launcher says so in one line instead; several devices are emulated in that
one process with ``--devices cpu:N``.
"""

from __future__ import annotations

from polytrain.distributed.launcher import Launcher, LaunchSpec
from polytrain.errors import ConfigError


class NumpyLauncher(Launcher):
    """Declares that the numpy backend cannot run several processes."""

    backend = "numpy"
    name = "none"
    unsupported = (
        "The numpy backend runs in one process only; it has no multi-process launcher. "
        "Run polytrain train --backend numpy directly, with --devices cpu:N to emulate N "
        "devices in that process, or launch a backend with collectives (polytrain backends)."
    )

    def launch(self, spec: LaunchSpec, env: dict[str, str], address: str) -> int:
        raise ConfigError(self.unsupported or "")
