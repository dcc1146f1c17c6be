"""The common interface every backend implements: one docstring per verb states its contract.

Required verbs are abstract, so a third-party backend missing one fails when it is
built, not in the middle of training. Optional behaviour (loss scaling without mixed
precision, gradient synchronisation across replicas) has concrete defaults written
with the required verbs; a backend overrides them only to go faster.

Tensors, devices and models are the framework's own objects; the core never looks
inside them. Names of devices are neutral: ``cpu``, ``cpu:K`` (an emulated device,
so data-parallel logic runs without GPUs) and ``gpu:K``.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from polytrain.backend.functional import FunctionalOps
from polytrain.backend.precision import PrecisionSupport
from polytrain.errors import BackendError, CheckpointError, ConfigError
from polytrain.neutral.models import ModelSpec
from polytrain.neutral.optim import Optimizer, OptimizerConfig
from polytrain.neutral.sharding import shard_bounds

Tensor = Any
Device = Any


@dataclass
class BackendOptions:
    """How a backend is built. ``threads=None`` keeps what :mod:`polytrain.utils.threads` set."""

    threads: int | None = None
    fast: bool | None = None
    precision: str = "fp32"


@dataclass
class Model:
    """A native model and where it lives; what the recipe loop holds.

    ``replicas[i]`` is the native module used on ``devices[i]`` (on MXNet every entry is
    the same block, whose parameters hold one copy per context). ``private`` is the
    backend's own bookkeeping (name maps, layout converters).
    """

    native: Any
    devices: list[Device]
    replicas: list[Any]
    spec: ModelSpec | None = None
    private: dict[str, Any] = field(default_factory=dict)
    dtype: str = "float32"  # of parameters, activations, gradients and optimizer state

    @property
    def num_devices(self) -> int:
        return len(self.devices)


class Backend(ABC):
    """One framework behind the common interface."""

    name: ClassVar[str]
    framework: ClassVar[str]

    #: Compiled execution (hybridize, torch.compile, to_static) when BackendOptions.fast
    #: is None: each backend's default is what measured faster here (docs/performance.md).
    fast_default: ClassVar[bool] = False

    def __init__(self, options: BackendOptions | None = None) -> None:
        self.options = options or BackendOptions()
        self.world_size = 1
        self.rank = 0

    @property
    def fast(self) -> bool:
        """Whether models are built for compiled execution (``--fast/--no-fast``)."""
        return self.fast_default if self.options.fast is None else bool(self.options.fast)

    # -- identity, threads, seeds ---------------------------------------------------------

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

    # -- devices --------------------------------------------------------------------------

    @abstractmethod
    def gpu_count(self) -> int:
        """Number of GPUs the framework can use here (0 on a CPU build)."""

    @abstractmethod
    def device(self, name: str) -> Device:
        """The native device for a neutral name: ``cpu``, ``cpu:K`` or ``gpu:K``."""

    @abstractmethod
    def device_name(self, device: Device) -> str:
        """The neutral name of a native device."""

    def devices(self, spec: str | Sequence[str] = "cpu") -> list[Device]:
        """Devices from a spec: ``cpu``, ``cpu:4`` (four emulated devices), ``gpu``
        (all GPUs, or the CPU if none), ``gpu:0,1`` or a list of neutral names."""
        names = parse_devices(spec, self.gpu_count())
        return [self.device(n) for n in names]

    def try_gpu(self, i: int = 0) -> Device:
        """GPU ``i`` if it exists, else the CPU."""
        return self.device(f"gpu:{i}") if i < self.gpu_count() else self.device("cpu")

    def try_all_gpus(self) -> list[Device]:
        """Every GPU, or ``[cpu]`` when there is none: never empty."""
        n = self.gpu_count()
        return [self.device(f"gpu:{i}") for i in range(n)] or [self.device("cpu")]

    # -- tensors --------------------------------------------------------------------------

    @abstractmethod
    def to_tensor(self, array: np.ndarray, device: Device | None = None) -> Tensor:
        """A native tensor holding a copy of ``array`` (same dtype) on ``device``."""

    @abstractmethod
    def to_numpy(self, tensor: Tensor) -> np.ndarray:
        """A host numpy copy of a native tensor (waits for it on asynchronous engines)."""

    def split_and_load(self, batch: np.ndarray, devices: Sequence[Device]) -> list[Tensor]:
        """One contiguous shard per device, placed there; sizes differ by at most one,
        larger first; nothing is dropped; fewer samples than devices is an error."""
        bounds = shard_bounds(len(batch), len(devices))
        return [self.to_tensor(batch[a:b], d) for (a, b), d in zip(bounds, devices, strict=True)]

    @abstractmethod
    def allreduce(self, tensors: Sequence[Tensor], op: str) -> None:
        """Reduce in place: afterwards every tensor holds the ``op`` ("sum" or "mean") of
        all of them and stays on its device. When a process group is initialised, the
        reduction also spans every process (the framework's own collective)."""

    @abstractmethod
    def broadcast(self, tensors: Sequence[Tensor], src: int = 0) -> None:
        """Copy ``tensors[src]`` into every other tensor in place (and from the rank-0
        process to the others when a process group is initialised)."""

    # -- models ---------------------------------------------------------------------------

    @abstractmethod
    def build_model(
        self,
        model: ModelSpec | Any,
        devices: Sequence[Device] | None = None,
        *,
        dtype: str = "float32",
    ) -> Model:
        """Build a neutral spec (or wrap a user's own native module) on ``devices``.

        A spec is built with the spec's layer names, so native parameter names follow
        the canonical ones. Weights are whatever the framework chose: call
        :meth:`set_params` with ``spec.init_params(seed)`` for identical starts.
        ``dtype`` (``float32`` or ``float64``) is that of the parameters and buffers,
        hence of the whole computation: ``"float64"`` is ``--precision fp64``, the parity
        mode in which the frameworks' rounding differences stay below any training chaos.
        Inputs are cast to it by the caller (:class:`polytrain.training.step.StepRunner`)."""

    @abstractmethod
    def get_params(self, model: Model, replica: int = 0) -> dict[str, np.ndarray]:
        """All parameters and buffers of replica ``replica`` (default 0) as numpy of the
        model's dtype (float32, or float64 under fp64) in the canonical (PyTorch) layout
        and names: conv OIHW, linear [out, in], BatchNorm weight/bias/running_mean/
        running_var (torch's unbiased running_var)."""

    @abstractmethod
    def set_params(self, model: Model, params: dict[str, np.ndarray]) -> None:
        """Load canonical parameters into every replica, cast to the model's dtype.
        Missing, unexpected or wrongly shaped entries are a
        :class:`~polytrain.errors.CheckpointError` naming them."""

    @abstractmethod
    def parameter_names(self, model: Model) -> list[str]:
        """Canonical names of the trainable parameters, in model order."""

    @abstractmethod
    def forward(self, model: Model, x: Tensor, *, replica: int = 0, train: bool = False) -> Tensor:
        """Logits of replica ``replica`` for ``x`` (on that replica's device). With
        ``train=False`` the model is in eval mode and no graph is recorded."""

    @abstractmethod
    def record(self) -> contextlib.AbstractContextManager[None]:
        """Context in which a training forward pass records the graph for backward
        (MXNet's autograd.record; grad-enabled mode elsewhere)."""

    @abstractmethod
    def cross_entropy(
        self,
        logits: Tensor,
        labels: Tensor,
        reduction: str = "mean",
        ignore_index: int | None = None,
    ) -> Tensor:
        """Softmax cross-entropy of integer labels shaped [N] or [N, 1] ("mean", "sum" or
        "none"). Samples labelled ``ignore_index`` contribute 0 and "mean" divides by the
        samples kept (PyTorch's rule; Paddle's own divides by all); None ignores nothing."""

    @abstractmethod
    def count_correct(self, logits: Tensor, labels: Tensor) -> Tensor:
        """Number of rows whose arg-max equals the label, as a native scalar."""

    @abstractmethod
    def backward(self, loss: Tensor) -> None:
        """Accumulate d(loss)/d(parameters) into the gradients of the loss's replica."""

    def scale_loss(self, loss: Tensor, denominator: int, scale: float = 1.0) -> Tensor:
        """What to backpropagate for a shard's *summed* loss: divided by the number of
        samples of the global batch (all shards, processes and micro-batches), times the
        loss scale under mixed precision. So every backend's gradient is the gradient
        of the mean loss over the global batch."""
        return loss * (scale / denominator)

    @abstractmethod
    def gradients(self, model: Model, replica: int = 0) -> dict[str, np.ndarray]:
        """Gradients of one replica as numpy, canonical names and layout."""

    @abstractmethod
    def replica_gradients(self, model: Model) -> list[list[Tensor]]:
        """Per trainable parameter, the native gradient tensor of each replica."""

    def sync_gradients(self, model: Model) -> None:
        """Sum every gradient over replicas (and processes): after it, each replica
        holds the gradient of the whole global batch."""
        if model.num_devices == 1 and self.world_size == 1:
            return
        for grads in self.replica_gradients(model):
            self.allreduce(grads, "sum")

    def grad_norm(self, model: Model) -> float:
        """Global L2 norm of replica 0's gradients (after synchronisation)."""
        grads = self.gradients(model)
        return float(np.sqrt(sum(float(np.sum(g.astype(np.float64) ** 2)) for g in grads.values())))

    def layer_outputs(self, model: Model, x: Tensor) -> list[tuple[str, np.ndarray]]:
        """Eval-mode forward of replica 0 returning every leaf layer's output (and each
        residual block's), in forward order, as numpy: for inspection and for naming the
        first layer whose output went non-finite. Optional verb."""
        raise BackendError(f"Backend {self.name!r} cannot report per-layer outputs.")

    @abstractmethod
    def make_optimizer(self, model: Model, config: OptimizerConfig) -> Optimizer:
        """An optimizer over every replica applying the update rule of
        :mod:`polytrain.neutral.optim`."""

    # -- functional ops -------------------------------------------------------------------

    def functional(self) -> FunctionalOps:
        """Tensor ops for hand-written models (d2l's scratch recipes), in PyTorch's
        semantics: see :mod:`polytrain.backend.functional`. Optional for third-party backends."""
        raise BackendError(
            f"backend {self.name} has no functional ops: implement Backend.functional() "
            "returning a polytrain.backend.functional.FunctionalOps, or use a built-in backend."
        )

    # -- native files ---------------------------------------------------------------------

    native_suffix: ClassVar[str]

    @abstractmethod
    def save_native(self, model: Model, path: str) -> None:
        """Write the framework's own format (.pt / .pdparams / .params), host memory,
        no wrapper prefixes, atomically."""

    @abstractmethod
    def load_native(self, model: Model, path: str) -> None:
        """Read the framework's own format written by :meth:`save_native` or by plain
        framework code (torch loads with ``weights_only=True``)."""

    def encode_weights(self, tensors: dict[str, np.ndarray]) -> bytes:
        """Named arrays as the bytes of the framework's own weights file, for formats only
        the framework can write (a ``.pt`` pickle names torch's own classes);
        :mod:`polytrain.io.native` writes the others with numpy and calls this for those."""
        raise BackendError(f"The {self.name} backend does not encode weight files.")

    # -- processes ------------------------------------------------------------------------

    def init_distributed(
        self, info: Any, devices: Sequence[Device], timeout: float = 120.0
    ) -> None:
        """Join the process group of a :class:`polytrain.distributed.cluster.ClusterInfo`
        through the framework's own engine; afterwards :attr:`rank` and :attr:`world_size`
        are set and :meth:`allreduce`/:meth:`broadcast` span every process. ``timeout`` bounds the
        rendezvous and every collective, so a dead peer cannot hang the others."""
        if getattr(info, "world_size", 1) > 1:
            raise BackendError(f"Backend {self.name!r} does not support several processes.")

    def shutdown_distributed(self) -> None:  # noqa: B027 - optional, identity default
        """Leave the process group (so that no rank aborts at exit)."""

    def allreduce_numbers(self, values: Sequence[float]) -> list[float]:
        """Sum host numbers over every process (float64 on the host; identity alone)."""
        if self.world_size == 1:
            return [float(v) for v in values]
        tensor = self.to_tensor(np.asarray(values, dtype=np.float64), self.device("cpu"))
        self.allreduce([tensor], "sum")
        return [float(v) for v in self.to_numpy(tensor)]

    # -- mixed precision and model parallelism (optional; see polytrain.backend.precision) --------

    @contextlib.contextmanager
    def autocast(self, precision: str) -> Iterator[None]:
        """Run forward passes under ``precision`` ("fp32" needs no support): low-precision
        matmuls and convolutions, float32 losses and parameters."""
        if precision != "fp32":
            raise BackendError(f"Backend {self.name!r} cannot train in {precision} here.")
        yield

    def unscale_gradients(self, model: Model, inv_scale: float) -> bool:
        """Multiply every replica's gradients by ``inv_scale`` in place (undoing the loss
        scale) and return whether all of them are finite. Only fp16 needs it."""
        raise BackendError(f"Backend {self.name!r} cannot unscale gradients (no fp16 support).")

    def precision_support(self, device: Device | None = None) -> dict[str, PrecisionSupport]:
        """Per precision, whether training works on ``device`` (default: GPU 0, else the
        CPU) and why not; answered without training, for errors and ``polytrain doctor``."""
        why = f"the {self.name} backend implements no mixed precision"
        return {
            "fp32": PrecisionSupport("fp32", True),
            "bf16": PrecisionSupport("bf16", False, why),
            "fp16": PrecisionSupport("fp16", False, why),
            "fp64": PrecisionSupport("fp64", False, f"the {self.name} backend has no float64"),
        }

    def supported_precisions(self, device: Device | None = None) -> list[str]:
        """The precisions :meth:`precision_support` says work on ``device``."""
        return [p for p, s in self.precision_support(device).items() if s.supported]

    def copy_to(self, tensor: Tensor, device: Device) -> Tensor:
        """``tensor`` on ``device``, differentiable: in backward its gradient flows back
        to the source device (pipeline stages hand activations over with it)."""
        raise BackendError(f"Backend {self.name!r} cannot move tensors between devices.")


def parse_devices(spec: str | Sequence[str], gpu_count: int) -> list[str]:
    """Neutral device names from a spec (see :meth:`Backend.devices`)."""
    if not isinstance(spec, str):
        names = [str(s) for s in spec]
        if not names:
            raise ConfigError("An empty device list: give at least one device, e.g. 'cpu'.")
        return names
    text = spec.strip().lower()
    if text in ("", "cpu"):
        return ["cpu"]
    if text == "gpu" or text == "gpu:all":
        return [f"gpu:{i}" for i in range(gpu_count)] or ["cpu"]
    kind, _, rest = text.partition(":")
    if kind not in ("cpu", "gpu") or not rest:
        raise ConfigError(
            f"Bad device spec {spec!r}. Use 'cpu', 'cpu:N' (N emulated CPU devices), "
            "'gpu' (all GPUs) or 'gpu:0,1'."
        )
    if kind == "cpu":
        if not rest.isdigit() or int(rest) < 1:
            raise ConfigError(f"Bad device spec {spec!r}: 'cpu:N' needs N >= 1.")
        n = int(rest)
        return ["cpu"] if n == 1 else [f"cpu:{i}" for i in range(n)]
    ids = [s.strip() for s in rest.split(",")]
    if not all(s.isdigit() for s in ids):
        raise ConfigError(f"Bad device spec {spec!r}: GPU ids must be integers, as in 'gpu:0,1'.")
    missing = [int(s) for s in ids if int(s) >= gpu_count]
    if missing:
        raise ConfigError(
            f"Device spec {spec!r} asks for GPU {missing[0]}, but {gpu_count} GPU(s) are "
            "available here. Use 'cpu:N' to emulate devices, or 'gpu' for what exists."
        )
    return [f"gpu:{s}" for s in ids]


def check_params(
    expected: dict[str, Any],
    given: dict[str, np.ndarray],
    shape_of: Callable[[Any], tuple[int, ...]],
) -> None:
    """Raise CheckpointError naming missing, unexpected and misshapen entries."""
    missing = [k for k in expected if k not in given]
    extra = [k for k in given if k not in expected]
    wrong = [
        f"{k}: expected {shape_of(v)}, got {tuple(np.shape(given[k]))}"
        for k, v in expected.items()
        if k in given and tuple(shape_of(v)) != tuple(np.shape(given[k]))
    ]
    if missing or extra or wrong:
        parts = []
        if missing:
            parts.append(f"missing {missing}")
        if extra:
            parts.append(f"unexpected {extra}")
        if wrong:
            parts.append(f"wrong shape {wrong}")
        raise CheckpointError("Parameters do not match the model: " + "; ".join(parts) + ".")
