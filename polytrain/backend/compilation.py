"""A compiled execution mode (hybridize, torch.compile, to_static, jax.jit): a capability
(:mod:`polytrain.backend.discovery`); without it ``--fast`` runs eager and the run header
says so. Whether a run compiles is :mod:`polytrain.training.compile_decision`'s choice."""

from __future__ import annotations

from typing import ClassVar

from polytrain.backend.discovery import Capability
from polytrain.backend.identity import CompileProfile


class Compilation(Capability):
    """The name of the compiled mode and what it costs (``BackendOptions.fast`` turns it
    on; the backend reads :attr:`~polytrain.backend.identity.IdentityVerbs.fast`)."""

    label: ClassVar[str] = "compiled mode"
    marks: ClassVar[tuple[str, ...]] = ("compiled_mode",)

    #: The name of the compiled execution (``torch.compile``, ``hybridize``...), for the
    #: run header.
    compiled_mode: ClassVar[str]

    def compile_profile(self) -> CompileProfile | None:
        """The compiled mode's measured costs, or None: no compiled mode worth choosing
        automatically (``--fast`` still asks for it)."""
        return None

    def compile_cache_warm(self, fingerprint: str) -> bool:
        """Whether a model with this fingerprint compiled before into the persistent cache."""
        return False
