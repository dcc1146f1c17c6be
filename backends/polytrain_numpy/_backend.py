"""The numpy backend: the whole Backend contract with numpy alone, in one process.

Tensors are numpy arrays on emulated devices (``cpu``, ``cpu:K``: replicas in host
memory), with the small reverse-mode autodiff of :mod:`._tensor`; models are neutral
specs run layer by layer (:mod:`._layers`), so parameters carry the canonical names
and PyTorch's layout as they are. fp32 and fp64; no mixed precision, no GPU, no
process group. It needs nothing but numpy, a dependency of polytrain itself, so an
install without any framework can still train and compare.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from polytrain.backend.base import (
    Backend,
    Collectives,
    Device,
    Inspection,
    Model,
    NativeIO,
    Precision,
    check_params,
)
from polytrain.backend.collectives import check_reduce_op
from polytrain.backend.devices import split_device_name
from polytrain.backend.functional import FunctionalOps
from polytrain.backend.precision import PrecisionSupport, check_dtype
from polytrain.errors import BackendError
from polytrain.neutral.losses import LossSpec, class_positions
from polytrain.neutral.models import ModelSpec
from polytrain.neutral.optim import Optimizer, OptimizerConfig
from polytrain.utils.fileio import atomic_write_bytes
from polytrain.utils.malloc import keep_freed_memory

from . import _autograd as A
from . import _blas
from ._format import NumpyFormat
from ._layers import NumpyModel, NumpyNet
from ._losses import named_loss
from ._optim import NumpyOptimizer
from ._tensor import CPU, NumpyDevice, Tensor, backward, no_grad

ONE_PROCESS = (
    "the numpy backend runs in one process only (it has no collective engine): use "
    "--devices cpu:N for data parallelism in one process, or a framework backend "
    "(torch, paddle, mxnet) for several processes"
)
_ONLY = "it computes in float32 or float64 only"
MALLOC_VAR = "POLYTRAIN_NUMPY_MALLOC"  # "reuse" (the default) or "system"
# freed heap kept for the next step: a LeNet step of batch 256 frees more than glibc's own
# largest trim threshold (64 MiB) and faulted ~12,000 pages in per step with it
# (docs/performance.md, "The main job's time")
TRIM_THRESHOLD = 128 << 20


def _nets(model: Model) -> list[NumpyNet]:
    """The replicas of a model this backend built."""
    return NumpyModel.of(model).nets


def _tensor(value: Any) -> Tensor:
    return value if isinstance(value, Tensor) else Tensor(np.asarray(value))


def _input(x: Any, net: NumpyNet) -> Tensor:
    """``x`` as a tensor; floats in the model's dtype (as the StepRunner casts them)."""
    x = _tensor(x)
    if x.dtype.kind == "f" and x.dtype != net.dtype:
        return Tensor(x.data.astype(net.dtype), x.device)
    return x


class NumpyBackend(Backend, Collectives, Precision, NativeIO, Inspection):
    name = "numpy"
    framework = "numpy"
    native_suffix = ".npz"

    def __init__(self, options: Any = None) -> None:
        super().__init__(options)
        self.rng = np.random.default_rng()  # dropout; seed() makes it reproducible
        self.malloc = keep_freed_memory(MALLOC_VAR, TRIM_THRESHOLD)

    # -- identity, threads, seeds ---------------------------------------------------------

    def version(self) -> str:
        return str(np.__version__)

    def threads(self) -> dict[str, int]:
        n = _blas.get_threads()
        if n is None:
            n = int(
                os.environ.get("OPENBLAS_NUM_THREADS") or os.environ.get("OMP_NUM_THREADS") or 1
            )
        return {"intra_op": n}

    def set_threads(self, n: int) -> None:
        _blas.set_threads(n)

    def seed(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def synchronize(self) -> None:
        """Nothing to wait for: numpy computes eagerly."""

    # -- devices --------------------------------------------------------------------------

    def gpu_count(self) -> int:
        return 0

    def device(self, name: str) -> Device:
        kind, index = split_device_name(name)
        if kind != "cpu":
            raise BackendError(
                f"The numpy backend has no GPU ({name!r}): use cpu or cpu:K (emulated devices)."
            )
        return CPU if index is None else NumpyDevice(index)

    def device_name(self, device: Device) -> str:
        return str(device)

    # -- tensors --------------------------------------------------------------------------

    def to_tensor(self, array: np.ndarray, device: Device | None = None) -> Tensor:
        return Tensor(np.array(array, copy=True, order="C"), device or CPU)

    def to_numpy(self, tensor: Any) -> np.ndarray:
        return np.array(tensor.data if isinstance(tensor, Tensor) else tensor, copy=True)

    def allreduce(self, tensors: Sequence[Tensor], op: str) -> None:
        check_reduce_op(op)
        with np.errstate(all="ignore"):
            total = tensors[0].data.copy()
            for t in tensors[1:]:
                total += t.data
            if op == "mean":
                total /= len(tensors)
        for t in tensors:
            t.data[...] = total

    def broadcast(self, tensors: Sequence[Tensor], src: int = 0) -> None:
        source = tensors[src].data.copy()
        for i, t in enumerate(tensors):
            if i != src:
                t.data[...] = source

    # -- models ---------------------------------------------------------------------------

    def build_model(
        self,
        model: ModelSpec | Any,
        devices: Sequence[Device] | None = None,
        *,
        dtype: str = "float32",
    ) -> Model:
        devices = list(devices) if devices else [CPU]
        check_dtype(dtype)
        if not isinstance(model, ModelSpec):
            raise BackendError(
                f"The numpy backend builds polytrain ModelSpecs (it has no module class of its "
                f"own to wrap), not {type(model).__name__}: describe the model as a spec."
            )
        nets = [NumpyNet(model, d, dtype) for d in devices]
        return NumpyModel(nets[0], devices, list(nets), model, dtype, nets=nets)

    def get_params(self, model: Model, replica: int = 0) -> dict[str, np.ndarray]:
        return {k: v.copy() for k, v in _nets(model)[replica].state().items()}

    def set_params(self, model: Model, params: dict[str, np.ndarray]) -> None:
        net = _nets(model)[0]
        check_params(net.shapes, params, tuple)
        for replica in _nets(model):
            for name, array in replica.state().items():
                array[...] = np.asarray(params[name]).astype(array.dtype, copy=False)

    def parameter_names(self, model: Model) -> list[str]:
        return list(_nets(model)[0].params)

    def forward(self, model: Model, x: Tensor, *, replica: int = 0, train: bool = False) -> Tensor:
        net = _nets(model)[replica]
        x = _input(x, net)
        if train:
            return net(x, train=True, rng=self.rng)
        with no_grad():
            return net(x, train=False, rng=self.rng)

    def record(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()  # recording is on unless inside no_grad (PyTorch's)

    def cross_entropy(
        self,
        logits: Tensor,
        labels: Tensor,
        reduction: str = "mean",
        ignore_index: int | None = None,
    ) -> Tensor:
        return A.cross_entropy(_tensor(logits), _tensor(labels), reduction, ignore_index)

    def count_correct(self, logits: Tensor, labels: Tensor) -> Tensor:
        hits = logits.data.argmax(axis=1) == np.asarray(labels.data).reshape(-1)
        return Tensor(np.asarray(hits.sum(), dtype=np.int64), logits.device)

    def sum_counts(self, counts: Sequence[Tensor]) -> Tensor:
        # host arrays already: one numpy sum, no graph nodes
        total = np.sum([np.asarray(c.data) for c in counts], axis=0)
        return Tensor(np.asarray(total), counts[0].device)

    def loss(
        self, outputs: Tensor, targets: Tensor, loss: LossSpec, reduction: str = "sum"
    ) -> Tensor:
        if loss.plain and class_positions(tuple(outputs.shape), tuple(targets.shape)) == 1:
            return self.cross_entropy(outputs, targets, reduction)  # the verb, bit for bit
        return named_loss(_tensor(outputs), _tensor(targets), loss, reduction)

    def backward(self, loss: Tensor) -> None:
        backward(loss)

    def gradients(self, model: Model, replica: int = 0) -> dict[str, np.ndarray]:
        return {name: g.copy() for name, g in _nets(model)[replica].grads().items()}

    def replica_gradients(self, model: Model) -> list[list[Tensor]]:
        nets = _nets(model)
        per_net = [list(net.grads().values()) for net in nets]
        return [
            [Tensor(g, net.device) for g, net in zip(grads, nets, strict=True)]
            for grads in zip(*per_net, strict=True)
        ]

    def unscale_gradients(self, model: Model, inv_scale: float) -> bool:
        finite = True
        with np.errstate(all="ignore"):
            for net in _nets(model):
                for g in net.grads().values():
                    g *= inv_scale
                    finite = finite and bool(np.isfinite(g).all())
        return finite

    def scale_gradients(self, model: Model, factor: float) -> None:
        for net in _nets(model):
            for g in net.grads().values():
                g *= factor

    def clip_gradients(self, model: Model, limit: float) -> None:
        for net in _nets(model):
            for g in net.grads().values():
                np.clip(g, -limit, limit, out=g)

    def layer_outputs(self, model: Model, x: Tensor) -> list[tuple[str, np.ndarray]]:
        captured: list[tuple[str, np.ndarray]] = []
        net = _nets(model)[0]
        x = _input(x, net)
        with no_grad():
            net(x, train=False, rng=self.rng, hook=lambda n, t: captured.append((n, t.data.copy())))
        return captured

    def make_optimizer(self, model: Model, config: OptimizerConfig) -> Optimizer:
        return NumpyOptimizer(model, config)

    # -- precision and model parallelism ----------------------------------------------------

    def precision_support(self, device: Device | None = None) -> dict[str, PrecisionSupport]:
        return {
            "fp32": PrecisionSupport("fp32", True),
            "bf16": PrecisionSupport("bf16", False, f"numpy has no bfloat16 type; {_ONLY}"),
            "fp16": PrecisionSupport("fp16", False, f"no float16 mixed precision; {_ONLY}"),
            "fp64": PrecisionSupport("fp64", True),
        }

    def copy_to(self, tensor: Tensor, device: Device) -> Tensor:
        return A.copy_to(tensor, device)

    # -- processes ------------------------------------------------------------------------

    def init_distributed(
        self, info: Any, devices: Sequence[Device], timeout: float = 120.0
    ) -> None:
        world, servers = getattr(info, "world_size", 1), getattr(info, "num_servers", 0)
        if world > 1 or servers > 0:
            raise BackendError(
                f"Cannot join a job of {world} worker(s) and {servers} server(s): {ONE_PROCESS}."
            )

    # -- functional ops -------------------------------------------------------------------

    def functional(self) -> FunctionalOps:
        from ._ops import NumpyOps

        return NumpyOps(self)

    # -- native files ---------------------------------------------------------------------

    def save_native(self, model: Model, path: str) -> None:
        atomic_write_bytes(path, NumpyFormat().encode(self.get_params(model)))

    def load_native(self, model: Model, path: str) -> None:
        self.set_params(model, NumpyFormat().read(path))
