"""The first part of the required core: which framework, its threads, seeds and clock."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar


@dataclass
class BackendOptions:
    """How a backend is built. ``threads=None`` keeps what :mod:`polytrain.utils.threads` set."""

    threads: int | None = None
    fast: bool | None = None
    precision: str = "fp32"
    bucket_mb: float | None = None  # gradient sync buckets: polytrain.backend.buckets
    #: set with ``fast``: the model's fingerprint (polytrain.training.compile_decision), for
    #: the backend to mark its persistent compile cache warm once the model compiled
    compile_fingerprint: str | None = None


@dataclass(frozen=True)
class CompileProfile:
    """What a backend's compiled mode costs and gives, measured on LeNet on this CPU
    (docs/performance.md, "Fast execution modes"): the automatic mode's inputs."""

    tool: str  # e.g. "torch.compile"
    speedup: float  # steady eager step time / compiled step time
    cold_s: float  # one-off compile seconds with an empty cache (train and eval graphs)
    warm_s: float  # the same with the persistent cache warm
    eager_sample_s: float  # eager seconds per sample, for the eager step time
    #: eager execution compiles each op on its first use too (jax): then several
    #: processes, each compiling, are no reason to stay eager
    eager_compiles: bool = False


class IdentityVerbs(ABC):
    """Identity, threads, seeds: what every other part of the contract builds on."""

    name: ClassVar[str]
    framework: ClassVar[str]

    #: Compiled execution (hybridize, torch.compile, to_static) when BackendOptions.fast
    #: is None, for a backend with a compiled mode (:mod:`polytrain.backend.compilation`):
    #: each backend's default is what measured faster here (docs/performance.md). The
    #: Trainer's automatic mode (polytrain.training.compile_decision) keeps a True default
    #: and otherwise weighs ``compile_profile`` against the planned steps.
    fast_default: ClassVar[bool] = False

    def __init__(self, options: BackendOptions | None = None) -> None:
        self.options = options or BackendOptions()
        self.world_size = 1
        self.rank = 0

    @property
    def fast(self) -> bool:
        """Whether models are built for compiled execution (``--fast/--no-fast``)."""
        return self.fast_default if self.options.fast is None else bool(self.options.fast)

    @abstractmethod
    def version(self) -> str:
        """The framework's version string."""

    @abstractmethod
    def threads(self) -> dict[str, int]:
        """The framework's thread settings as they are now (for the run header)."""

    @abstractmethod
    def set_threads(self, n: int) -> None:
        """Use ``n`` intra-op threads from now on."""

    @abstractmethod
    def seed(self, seed: int) -> None:
        """Seed the framework's own generators (dropout). Weights come from numpy."""

    @abstractmethod
    def synchronize(self) -> None:
        """Wait until all queued work is done (MXNet is asynchronous; time only after this)."""
