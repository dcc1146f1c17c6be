"""The MXNet (Gluon) backend, mirroring the torch backend method for method.

Devices are real contexts (``cpu:K`` is ``mx.cpu(K)``); a model is one Gluon block
whose parameters hold one copy per context, so every replica is the same block.
MXNet runs asynchronously: errors surface at sync points (to_numpy, synchronize),
where they are raised as :class:`~polytrain.errors.BackendError`.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
import tempfile
import warnings
from collections.abc import Iterator, Sequence
from typing import Any, cast

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

from polytrain.backend.base import (
    Backend,
    Collectives,
    Compilation,
    Device,
    Inspection,
    Model,
    NativeIO,
    Precision,
    Tensor,
)
from polytrain.backend.collectives import check_reduce_op
from polytrain.backend.devices import DeviceSeq
from polytrain.backend.functional import FunctionalOps
from polytrain.backend.mismatch import check_params
from polytrain.backend.model import build_inputs
from polytrain.backend.precision import PRECISIONS, PrecisionSupport
from polytrain.backend.reduction import check_reduction
from polytrain.distributed.cluster import ClusterInfo
from polytrain.errors import BackendError, CheckpointError, ClusterError
from polytrain.neutral.losses import LossSpec, class_positions
from polytrain.neutral.models import ModelSpec
from polytrain.neutral.optim import Optimizer, OptimizerConfig
from polytrain.utils.fileio import atomic_path
from polytrain.utils.threads import cpu_count

from . import _devices, _inspect, _losses, _parallel, _precision
from ._engine import ENGINE_VAR, NAIVE, engine
from ._layers import build, canonical, hybridize
from ._model import MXNetModel
from ._optim import MXNetOptimizer
from ._parallel import DistSync
from ._signals import release_signals
from ._step_graphs import StepGraphs, fits_graph

release_signals()  # MXNet's segfault logger, installed when libmxnet loaded


def _engine_omp_threads() -> int:
    """OpenMP threads per operator, as MXNet's engine fixed them when mxnet was imported
    (src/engine/openmp.cc: MXNET_OMP_MAX_THREADS, else OMP_NUM_THREADS, else half the
    CPUs on x86). MXSetNumOMPThreads reaches only the calling thread, not the engine's."""
    for var in ("MXNET_OMP_MAX_THREADS", "OMP_NUM_THREADS"):
        with contextlib.suppress(ValueError):
            return int(os.environ.get(var, ""))
    return max(1, cpu_count() // 2)


_ENGINE_OMP_THREADS = _engine_omp_threads()
_ENGINE = engine()  # as mxnet read it at its import, above


def _start_engine_quietly() -> None:
    """Create MXNet's engine now, without the line it logs to stderr when
    MXNET_ENGINE_TYPE is set (the run header shows the engine: ``engine_workers=0`` is
    NaiveEngine); anything else it writes passes through. MXNet logs that line only for a
    set engine; without one the engine starts at the first operator, as MXNet starts it."""
    if ENGINE_VAR not in os.environ:
        return
    sys.stderr.flush()
    with tempfile.TemporaryFile() as captured:
        saved = os.dup(2)
        os.dup2(captured.fileno(), 2)
        try:
            mx.nd.waitall()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        captured.seek(0)
        lines = captured.read().decode(errors="replace").splitlines(keepends=True)
    sys.stderr.write("".join(ln for ln in lines if "MXNet start using engine" not in ln))


_start_engine_quietly()


def _reason(exc: mx.base.MXNetError) -> str:
    """The message line of an MXNetError, without its C++ traceback."""
    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
    return next((ln for ln in reversed(lines) if "Error" in ln), lines[-1] if lines else "")


def _engine_error(exc: mx.base.MXNetError, what: str) -> BackendError:
    """A readable error for a failure the engine reports at a sync point (the threaded
    engine: of any operation queued before it)."""
    if _ENGINE == NAIVE:
        return BackendError(f"MXNet failed while {what}: {_reason(exc)}.")
    return BackendError(
        f"MXNet failed while {what}: {_reason(exc)}. MXNet runs asynchronously, so the failing "
        "operation may be any one queued before this point; run with "
        "MXNET_ENGINE_TYPE=NaiveEngine to raise it where it happens."
    )


_CPU0 = mx.cpu(0)
_SHARED_DTYPES = ("float32", "float64", "int32", "int64")


class MXNetBackend(Backend, Collectives, Precision, NativeIO, Inspection, Compilation):
    name = "mxnet"
    framework = "mxnet"
    compiled_mode = "hybridize"
    native_suffix = ".params"
    fast_default = True  # hybridize: measured 2-13% faster for LeNet (docs/performance.md)

    def __init__(self, options: Any = None) -> None:
        super().__init__(options)
        self._dist: DistSync | None = None  # the dist_sync kvstore, once init_distributed ran
        self._graphs = StepGraphs()  # the step's loss and count as cached graphs

    # -- identity, threads, seeds ---------------------------------------------------------

    def version(self) -> str:
        return str(mx.__version__)

    def threads(self) -> dict[str, int]:
        # NaiveEngine runs each operator in the calling thread: no worker threads
        workers = 0 if _ENGINE == NAIVE else int(os.environ.get("MXNET_CPU_WORKER_NTHREADS", "1"))
        return {"intra_op": _ENGINE_OMP_THREADS, "engine_workers": workers}

    def set_threads(self, n: int) -> None:
        mx.base.check_call(mx.base._LIB.MXSetNumOMPThreads(ctypes.c_int(n)))
        if n != _ENGINE_OMP_THREADS:  # the setter reaches only the calling thread's OpenMP
            warnings.warn(
                f"MXNet's engine kept {_ENGINE_OMP_THREADS} OpenMP threads (read when mxnet "
                f"was imported), not {n}: set POLYTRAIN_THREADS or OMP_NUM_THREADS before "
                "the first mxnet import.",
                RuntimeWarning,
                stacklevel=2,
            )

    def seed(self, seed: int) -> None:
        mx.random.seed(seed)

    def synchronize(self) -> None:
        try:
            mx.nd.waitall()
        except mx.base.MXNetError as exc:
            raise _engine_error(exc, "running queued operations") from exc

    # -- devices --------------------------------------------------------------------------

    def gpu_count(self) -> int:
        return int(mx.context.num_gpus())

    def device(self, name: str) -> Device:
        return _devices.native_device(name)

    def device_name(self, device: Device) -> str:
        return _devices.neutral_name(device)

    # -- tensors --------------------------------------------------------------------------

    def to_tensor(self, array: np.ndarray, device: Device | None = None) -> Tensor:
        array = np.asarray(array)
        return mx.nd.array(array, ctx=device or mx.cpu(), dtype=array.dtype)

    def load_shard(self, shard: np.ndarray, device: Device) -> Tensor | None:
        """Under NaiveEngine a shard for context cpu(0) is shared, not copied (~120 us per
        LeNet step: docs/performance.md, "MXNet's step graphs"): NaiveEngine has run every
        operator when the step returns; the threaded engine may read the batch later, so
        it gets a copy, as do other contexts and dtypes."""
        if not (_ENGINE == NAIVE and device == _CPU0 and shard.dtype.name in _SHARED_DTYPES):
            return None
        # from_numpy marks the array it gets read-only: a view, so the batch stays writeable
        return mx.nd.from_numpy(shard.view(), zero_copy=True)

    def to_numpy(self, tensor: Tensor) -> np.ndarray:
        if _precision.is_low_precision(tensor.dtype):  # bf16 asnumpy gives raw uint16 records
            tensor = tensor.astype("float32")
        try:
            return tensor.asnumpy()
        except mx.base.MXNetError as exc:
            raise _engine_error(exc, f"computing a {tensor.shape} tensor") from exc

    def allreduce(self, tensors: Sequence[Tensor], op: str) -> None:
        _parallel.allreduce(tensors, check_reduce_op(op), self._dist)

    def broadcast(self, tensors: Sequence[Tensor], src: int = 0) -> None:
        _parallel.broadcast(tensors, src, self._dist)

    # -- models ---------------------------------------------------------------------------

    def build_model(
        self, model: ModelSpec | Any, devices: DeviceSeq | None = None, *, dtype: str = "float32"
    ) -> Model:
        spec, devices = build_inputs(self, model, devices, dtype, gluon.Block, "gluon Block")
        if spec is not None:
            native = build(spec.net)
            native.initialize(ctx=devices)
            native.cast(dtype)
            if self.fast:
                hybridize(native)
        else:
            native = cast(gluon.Block, model)
            if all(p._data is None for p in native.collect_params().values()):
                native.initialize(ctx=devices)
            else:
                native.collect_params().reset_ctx(devices)
            native.cast(dtype)
        structural = native._collect_params_with_prefix()
        deferred = [n for n, p in structural.items() if p._data is None]  # no public test
        if deferred:
            raise BackendError(
                f"Parameters {deferred} of the block have unknown shapes (deferred init): "
                "give in_channels/in_units to its layers, or run one forward pass first."
            )
        # 'add': gradients accumulate over backward calls like torch; zero_grad resets them.
        native.collect_params().setattr("grad_req", "add")
        params = {canonical(n): p for n, p in structural.items()}
        own = MXNetModel(
            native=native,
            devices=devices,
            replicas=[native] * len(devices),
            spec=spec,
            dtype=dtype,
            params=params,
            structural=structural,
            trainable=[n for n, p in params.items() if p.grad_req != "null"],
        )
        shapes = [p.shape for p in own.trainable_params()]
        if self._dist is not None:  # keys before any backward (docs/architecture.md, traps)
            own.dist_keys = self._dist.new_keys(shapes, dtype)
        elif len(devices) > 1:
            own.kvstore = _parallel.local_kvstore(devices, shapes, dtype)
        return own

    def get_params(self, model: Model, replica: int = 0) -> dict[str, np.ndarray]:
        ctx = model.devices[replica]
        params = MXNetModel.of(model).params.items()
        return {k: self.to_numpy(p.data(ctx)).astype(model.dtype) for k, p in params}

    def set_params(self, model: Model, params: dict[str, np.ndarray]) -> None:
        expected = MXNetModel.of(model).params
        check_params(expected, params, lambda p: tuple(p.shape))
        for name, p in expected.items():
            p.set_data(mx.nd.array(np.asarray(params[name]), dtype=p.dtype))

    def parameter_names(self, model: Model) -> list[str]:
        return list(MXNetModel.of(model).trainable)

    def forward(self, model: Model, x: Tensor, *, replica: int = 0, train: bool = False) -> Tensor:
        block = model.replicas[replica]
        if train:  # batch statistics and running-stat updates, recorded or not
            with autograd.train_mode():
                return block(x)
        with autograd.pause(train_mode=False):
            return block(x)

    def record(self) -> contextlib.AbstractContextManager[None]:
        return autograd.record()

    def cross_entropy(
        self,
        logits: Tensor,
        labels: Tensor,
        reduction: str = "mean",
        ignore_index: int | None = None,
    ) -> Tensor:
        check_reduction(reduction)
        # float64: MXNet's float32 log_softmax is off by up to ~15 ulp, biased (torch: ~1 ulp)
        dtype = "float64" if logits.dtype == np.float64 else "float32"  # bf16 logits: fp32 loss
        plain = ignore_index is None and reduction != "none"
        if plain and fits_graph(logits, labels):
            return self._graphs.cross_entropy(logits, labels, reduction == "mean", dtype)
        logp = mx.nd.log_softmax(logits.astype("float64"), axis=1)
        labels = labels.reshape((-1,))
        if ignore_index is None:
            # pick clips out-of-range labels (checking them would need a sync)
            losses = -mx.nd.pick(logp, labels, axis=1)
            if reduction != "none":
                losses = losses.mean() if reduction == "mean" else losses.sum()
            return losses.astype(dtype)
        keep = (labels != ignore_index).astype("float64")
        losses = -mx.nd.pick(logp, labels * (labels != ignore_index), axis=1) * keep
        if reduction == "sum":
            losses = losses.sum()
        elif reduction == "mean":  # PyTorch's rule: divide by the samples kept
            losses = losses.sum() / keep.sum()
        return losses.astype(dtype)

    def count_correct(self, logits: Tensor, labels: Tensor) -> Tensor:
        if fits_graph(logits, labels):
            return self._graphs.count_correct(logits, labels)
        predicted = mx.nd.argmax(logits, axis=1)  # float32 indices
        return (predicted == labels.reshape((-1,)).astype(predicted.dtype)).sum()

    def sum_counts(self, counts: Sequence[Tensor]) -> Tensor:
        # one engine op for all (each op costs ~20 us to dispatch); float16 counts (amp)
        # would round past 2048, so they are summed in float32
        wide = [c.astype("float32") if c.dtype == np.float16 else c for c in counts]
        return wide[0] if len(wide) == 1 else mx.nd.add_n(*wide)

    def loss(
        self, outputs: Tensor, targets: Tensor, loss: LossSpec, reduction: str = "sum"
    ) -> Tensor:
        if loss.plain and class_positions(tuple(outputs.shape), tuple(targets.shape)) == 1:
            return self.cross_entropy(outputs, targets, reduction)  # the verb, bit for bit
        return _losses.named_loss(outputs, targets, loss, reduction)

    def backward(self, loss: Tensor) -> None:
        loss.backward()

    def scale_loss(self, loss: Tensor, denominator: int, scale: float = 1.0) -> Tensor:
        with autograd.record():  # MXNet differentiates only recorded ops; callers scale after
            return loss * (scale / denominator)

    def gradients(self, model: Model, replica: int = 0) -> dict[str, np.ndarray]:
        ctx, own = model.devices[replica], MXNetModel.of(model)
        return {n: self.to_numpy(own.params[n].grad(ctx)) for n in own.trainable}

    def replica_gradients(self, model: Model) -> list[list[Tensor]]:
        params = MXNetModel.of(model).trainable_params()
        return [[p.grad(c) for c in model.devices] for p in params]

    def sync_gradients(self, model: Model) -> None:
        own = MXNetModel.of(model)
        if self._dist is not None and self.world_size > 1:
            if own.dist_keys is None:  # built before init_distributed
                shapes = [p.shape for p in own.trainable_params()]
                own.dist_keys = self._dist.new_keys(shapes, model.dtype)
            self._dist.sum_gradients(own.dist_keys, self.replica_gradients(model))
            return
        if model.num_devices == 1:
            return
        if own.kvstore is None:
            raise BackendError(
                "This model's devices share no kvstore (it was built in a process group): "
                "build it again after shutdown_distributed to sum gradients over its devices."
            )
        for i, grads in enumerate(self.replica_gradients(model)):  # the framework's reduction
            own.kvstore.pushpull(i, grads, out=grads, priority=-i)

    def layer_outputs(self, model: Model, x: Tensor) -> list[tuple[str, np.ndarray]]:
        return _inspect.layer_outputs(self, model, x)

    def make_optimizer(self, model: Model, config: OptimizerConfig) -> Optimizer:
        return MXNetOptimizer(model, config, lambda: self.world_size)

    # -- mixed precision and model parallelism (_precision.py) ----------------------------

    @contextlib.contextmanager
    def autocast(self, precision: str) -> Iterator[None]:
        with _precision.autocast(precision):
            yield

    def unscale_gradients(self, model: Model, inv_scale: float) -> bool:
        grads = [g for per_param in self.replica_gradients(model) for g in per_param]
        return _precision.unscale(grads, inv_scale)

    def scale_gradients(self, model: Model, factor: float) -> None:
        for per_param in self.replica_gradients(model):
            for g in per_param:
                g *= factor  # a double scalar: float64 stays exact

    def clip_gradients(self, model: Model, limit: float) -> None:
        # nd.clip takes float32 bounds (float64 would be off by ~1e-9); the scalar
        # maximum/minimum keep the bound in double
        for per_param in self.replica_gradients(model):
            for g in per_param:
                g[:] = mx.nd.minimum(mx.nd.maximum(g, -limit), limit)

    def precision_support(self, device: Device | None = None) -> dict[str, PrecisionSupport]:
        device = self.try_gpu() if device is None else device
        return {p: _precision.support(device.device_type, p) for p in PRECISIONS}

    def copy_to(self, tensor: Tensor, device: Device) -> Tensor:
        return tensor.as_in_context(device)  # recorded: the gradient flows back

    # -- processes ------------------------------------------------------------------------

    def init_distributed(
        self, info: ClusterInfo, devices: Sequence[Device], timeout: float = 120.0
    ) -> None:
        if not info.is_distributed:
            return
        if info.source != "dmlc" or info.role != "worker":
            raise ClusterError(
                f"MXNet runs several processes through its parameter server (kvstore "
                f"dist_sync), which needs DMLC_ROLE=worker; this process came from a "
                f"{info.source} launch (role {info.role}). Start the job with: polytrain "
                "launch --backend mxnet --nproc-per-node N -- CMD"
            )
        if info.master_addr in ("127.0.0.1", "localhost"):  # ps-lite guesses an interface
            os.environ.setdefault("DMLC_NODE_HOST", "127.0.0.1")
        self._dist = DistSync(timeout)
        self.rank, self.world_size = self._dist.rank, self._dist.world_size

    def shutdown_distributed(self) -> None:
        if self._dist is not None:
            # a worker leaving on an exception skips the exit barrier: its peers never come
            self._dist.close(barrier=sys.exc_info()[0] is None)
            self._dist = None
        self.rank, self.world_size = 0, 1

    def allreduce_numbers(self, values: Sequence[float]) -> list[float]:
        if self._dist is None or self.world_size == 1:
            return [float(v) for v in values]
        return [float(v) for v in self._dist.sum_numbers(np.asarray(values, np.float64))]

    # -- functional ops -------------------------------------------------------------------

    def functional(self) -> FunctionalOps:
        from ._ops import MXNetOps

        return MXNetOps(self)

    # -- native files ---------------------------------------------------------------------

    def save_native(self, model: Model, path: str) -> None:
        # save_parameters' format, written from context 0: save_parameters itself averages
        # the contexts' copies (replicas' BatchNorm stats differ; (3a)/3 may not be a).
        ctx, structural = model.devices[0], MXNetModel.of(model).structural
        arrays = {k: p.data(ctx).copyto(mx.cpu()) for k, p in structural.items()}
        with atomic_path(path) as tmp:
            mx.nd.save(tmp, arrays)

    def load_native(self, model: Model, path: str) -> None:
        try:
            loaded: dict[str, Any] | list[Any] = mx.nd.load(path)
        except mx.base.MXNetError as exc:
            raise CheckpointError(f"Cannot read {path} as MXNet .params: {_reason(exc)}") from exc
        if not isinstance(loaded, dict):
            raise CheckpointError(f"{path} holds unnamed arrays, not Gluon parameters.")
        aliases: dict[str, str] = {}
        for name, p in MXNetModel.of(model).structural.items():
            to = canonical(name)
            legacy = p.name.removeprefix(model.native.prefix)  # save_params strips it
            # structural names (save_parameters), full names (Module's "arg:"/"aux:")
            for key in (name, legacy, p.name, f"arg:{p.name}", f"aux:{p.name}"):
                aliases[key] = to
        params = {aliases.get(k, k): v.asnumpy() for k, v in loaded.items()}
        self.set_params(model, params)
