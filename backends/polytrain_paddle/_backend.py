"""The PaddlePaddle backend: the torch backend's twin, method for method.

Paddle differs from the canonical (PyTorch) conventions in a few places, each handled
where it occurs: Linear weights are [in, out] and BatchNorm buffers are ``_mean`` /
``_variance`` (renamed and transposed on get/set, :func:`canonical_layout`); BatchNorm
statistics and AvgPool windows follow Paddle's rules unless built by ``_layers``; one
CPU place per process means ``cpu:K`` devices are host replicas (``_devices.HostDevice``).
"""

from __future__ import annotations

import contextlib
import copy
import io
import os
import sys
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any, cast

import numpy as np

from polytrain.backend.autodiff import ShardStep
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
from polytrain.backend.buckets import bucket_bytes
from polytrain.backend.collectives import check_reduce_op
from polytrain.backend.devices import DeviceSeq
from polytrain.backend.functional import FunctionalOps
from polytrain.backend.identity import CompileProfile
from polytrain.backend.mismatch import check_params
from polytrain.backend.model import build_inputs
from polytrain.backend.precision import PRECISIONS, PrecisionSupport
from polytrain.distributed.cluster import ClusterInfo
from polytrain.distributed.watchdog import Deadline
from polytrain.errors import BackendError, CheckpointError, ClusterError
from polytrain.neutral.losses import LossSpec, class_positions
from polytrain.neutral.models import ModelSpec
from polytrain.neutral.optim import Optimizer, OptimizerConfig
from polytrain.utils.fileio import atomic_path

# On import paddle warns "No ccache found" and prints that OMP_NUM_THREADS > 1 is unwise;
# polytrain sets threads on purpose (polytrain.utils.threads), so both are dropped here.
with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()) as _stderr:
    warnings.simplefilter("ignore", UserWarning)
    import paddle
    import paddle.nn.functional as F
    from paddle import nn
from . import (  # these import paddle too: after the quiet import
    _devices,
    _inspect,
    _parallel,
    _precision,
    _static,
)
from ._format import PaddleFormat
from ._layers import build, canonical_layout, unwrap
from ._model import PaddleModel
from ._optim import PaddleOptimizer
from ._signals import release_signals

sys.stderr.writelines(s for s in _stderr.getvalue().splitlines(True) if "OMP_NUM" not in s)
release_signals(paddle)  # also when paddle was imported before this plugin armed its finder

_NUMPY = {paddle.float32: np.float32, paddle.float64: np.float64}  # parameter dtypes


class PaddleBackend(Backend, Collectives, Precision, NativeIO, Inspection, Compilation):
    name = "paddle"
    framework = "paddle"
    compiled_mode = _static.TOOL
    native_suffix = ".pdparams"

    def __init__(self, options: Any = None) -> None:
        super().__init__(options)
        # Paddle has a thread setter but no getter: remember what was set.
        self._threads = int(os.environ.get("OMP_NUM_THREADS", "1"))

    # -- identity, threads, seeds ---------------------------------------------------------

    def version(self) -> str:
        return str(paddle.__version__)

    def threads(self) -> dict[str, int]:
        return {"intra_op": self._threads}

    def set_threads(self, n: int) -> None:
        paddle.base.core.set_num_threads(n)
        self._threads = n

    def seed(self, seed: int) -> None:
        paddle.seed(seed)

    def compile_profile(self) -> CompileProfile | None:
        return _static.profile()

    def synchronize(self) -> None:
        # paddle.device.synchronize() raises on CPU, and waits only for the device named
        for i in range(self.gpu_count()):
            paddle.device.synchronize(paddle.CUDAPlace(i))

    # -- devices --------------------------------------------------------------------------

    def gpu_count(self) -> int:
        return paddle.device.cuda.device_count() if paddle.is_compiled_with_cuda() else 0

    def device(self, name: str) -> Device:
        return _devices.native_device(name)

    def device_name(self, device: Device) -> str:
        return _devices.neutral_name(device)

    # -- tensors --------------------------------------------------------------------------

    def to_tensor(self, array: np.ndarray, device: Device | None = None) -> Tensor:
        return paddle.to_tensor(np.ascontiguousarray(array), place=_devices.place(device))

    def to_numpy(self, tensor: Tensor) -> np.ndarray:
        return tensor.numpy()  # a host copy

    def allreduce(self, tensors: Sequence[Tensor], op: str) -> None:
        _parallel.allreduce(tensors, check_reduce_op(op), self.world_size)

    def broadcast(self, tensors: Sequence[Tensor], src: int = 0) -> None:
        _parallel.broadcast(tensors, src, self.world_size)

    # -- models ---------------------------------------------------------------------------

    def build_model(
        self, model: ModelSpec | Any, devices: DeviceSeq | None = None, *, dtype: str = "float32"
    ) -> Model:
        spec, devices = build_inputs(self, model, devices, dtype, nn.Layer, "paddle.nn.Layer")
        native = unwrap(cast(nn.Layer, model)) if spec is None else build(spec.net)
        native.to(dtype=getattr(paddle, dtype))  # parameters and float buffers, in place
        replicas = [native] + [copy.deepcopy(native) for _ in devices[1:]]
        for replica, device in zip(replicas, devices, strict=True):
            replica.to(device=_devices.place(device))  # a no-op where it already is
        if self.fast and spec is None:  # a native layer: dygraph-to-static, in place
            replicas = [paddle.jit.to_static(r, full_graph=True) for r in replicas]
        built = PaddleModel(
            native=native,
            devices=devices,
            replicas=replicas,
            spec=spec,
            dtype=dtype,
            names=[n for n, p in native.named_parameters() if not p.stop_gradient],
            layout=canonical_layout(native),
            training=[None] * len(devices),
        )
        if self.fast and spec is not None:  # --fast: the training step as a static program
            built.static = _static.build_step(self, built)
        return built

    def get_params(self, model: Model, replica: int = 0) -> dict[str, np.ndarray]:
        layout, out = PaddleModel.of(model).layout, {}
        for key, tensor in model.replicas[replica].state_dict().items():
            canonical, transposed = layout[key]
            value = self.to_numpy(tensor)
            out[canonical] = np.ascontiguousarray(value.T) if transposed else value
        return out

    def set_params(self, model: Model, params: dict[str, np.ndarray]) -> None:
        layout = PaddleModel.of(model).layout
        expected = {c: (k, t) for k, (c, t) in layout.items()}
        shapes = {k: tuple(v.shape) for k, v in model.replicas[0].state_dict().items()}
        check_params(expected, params, lambda kt: shapes[kt[0]][:: -1 if kt[1] else 1])
        with paddle.no_grad():
            for replica in model.replicas:
                for key, tensor in replica.state_dict().items():
                    canonical, transposed = layout[key]
                    value = np.asarray(params[canonical], _NUMPY[tensor.dtype])
                    tensor.set_value(np.ascontiguousarray(value.T if transposed else value))

    def parameter_names(self, model: Model) -> list[str]:
        own = PaddleModel.of(model)
        return [own.layout[n][0] for n in own.names]

    def forward(self, model: Model, x: Tensor, *, replica: int = 0, train: bool = False) -> Tensor:
        own = PaddleModel.of(model)
        layer = own.replicas[replica]
        if own.training[replica] is not train:
            if train:
                layer.train()
            else:
                layer.eval()
            own.training[replica] = train
        if train:
            return layer(x)
        with paddle.no_grad():
            return layer(x)

    def cross_entropy(
        self,
        logits: Tensor,
        labels: Tensor,
        reduction: str = "mean",
        ignore_index: int | None = None,
    ) -> Tensor:
        if labels.ndim == 2 and labels.shape[1] == 1:  # "none" would keep [N, 1]: give [N]
            labels = labels.reshape([-1])
        if ignore_index is None:
            return F.cross_entropy(logits, labels, reduction=cast(Any, reduction))
        losses = F.cross_entropy(logits, labels, reduction="none", ignore_index=ignore_index)
        losses = losses.reshape([-1])
        if reduction == "none":
            return losses
        if reduction == "sum":
            return losses.sum()
        # Paddle's own mean divides by every sample, ignored ones included: divide by the kept
        kept = (labels != ignore_index).astype(losses.dtype).sum()
        return losses.sum() / kept

    def count_correct(self, logits: Tensor, labels: Tensor) -> Tensor:
        return (logits.argmax(axis=1) == labels.reshape([-1])).sum()

    def sum_counts(self, counts: Sequence[Tensor]) -> Tensor:
        return counts[0] if len(counts) == 1 else paddle.add_n(list(counts))

    def loss(
        self, outputs: Tensor, targets: Tensor, loss: LossSpec, reduction: str = "sum"
    ) -> Tensor:
        if loss.plain and class_positions(tuple(outputs.shape), tuple(targets.shape)) == 1:
            return self.cross_entropy(outputs, targets, reduction)  # the verb, bit for bit
        from . import _losses

        return _losses.named_loss(outputs, targets, loss, reduction)

    def loss_and_gradients(
        self,
        model: Model,
        xs: Sequence[Tensor],
        ys: Sequence[Tensor],
        *,
        loss: LossSpec,
        denominator: int,
        loss_scale: float = 1.0,
        count_correct: bool = False,
        autocast: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext,
    ) -> list[ShardStep]:
        own = PaddleModel.of(model)
        if own.static is not None and len(xs) == 1:
            try:
                return [own.static.run(xs[0], ys[0], loss, loss_scale / denominator,
                                       count_correct)]  # fmt: skip
            except _static.StaticUnsupported as exc:  # the model trains eagerly from now on
                _static.warn_eager(str(exc))
                own.static = None
        return super().loss_and_gradients(
            model, xs, ys, loss=loss, denominator=denominator, loss_scale=loss_scale,
            count_correct=count_correct, autocast=autocast,
        )  # fmt: skip

    def backward(self, loss: Tensor) -> None:
        loss.backward()

    def gradients(self, model: Model, replica: int = 0) -> dict[str, np.ndarray]:
        own, out = PaddleModel.of(model), {}
        for name, p in model.replicas[replica].named_parameters():
            if name not in own.names:
                continue
            canonical, transposed = own.layout[name]
            g = np.zeros(p.shape, _NUMPY[p.dtype]) if p.grad is None else self.to_numpy(p.grad)
            out[canonical] = np.ascontiguousarray(g.T) if transposed else g
        return out

    def sync_in_buckets(self, model: Model) -> bool:
        """Fused buckets of ``bucket_mb`` (default 25 MB), one all_reduce each."""
        limit = bucket_bytes(self.options.bucket_mb)
        if limit == 0:
            return False
        per_param = self.replica_gradients(model)
        per_replica = [list(g) for g in zip(*per_param, strict=True)]
        _parallel.sync_buckets(per_replica, self.world_size, limit)
        return True

    def replica_gradients(self, model: Model) -> list[list[Tensor]]:
        trainable = [[p for p in r.parameters() if not p.stop_gradient] for r in model.replicas]
        return _parallel.gradients_to_sum(trainable, self.world_size)

    def grad_norm(self, model: Model) -> float:
        params = model.replicas[0].parameters()
        grads = [p.grad for p in params if not p.stop_gradient and p.grad is not None]
        if not grads:
            return 0.0
        return float(paddle.linalg.norm(paddle.stack([paddle.linalg.norm(g) for g in grads])))

    def layer_outputs(self, model: Model, x: Tensor) -> list[tuple[str, np.ndarray]]:
        return _inspect.layer_outputs(self, model, x)

    def make_optimizer(self, model: Model, config: OptimizerConfig) -> Optimizer:
        return PaddleOptimizer(model, config)

    # -- mixed precision and model parallelism (_precision.py) ----------------------------

    @contextlib.contextmanager
    def autocast(self, precision: str) -> Iterator[None]:
        with _precision.autocast(precision):
            yield

    def unscale_gradients(self, model: Model, inv_scale: float) -> bool:
        grads = [p.grad for r in model.replicas for p in r.parameters() if not p.stop_gradient]
        return _precision.unscale(grads, inv_scale)

    def _own_gradients(self, model: Model) -> list[Any]:
        """Every replica's gradient tensors (in-place ops on them change the gradients)."""
        params = [p for r in model.replicas for p in r.parameters() if not p.stop_gradient]
        return [p.grad for p in params if p.grad is not None]

    def scale_gradients(self, model: Model, factor: float) -> None:
        with paddle.no_grad():
            for g in self._own_gradients(model):
                g.scale_(factor)  # the scale is a double: float64 stays exact

    def clip_gradients(self, model: Model, limit: float) -> None:
        with paddle.no_grad():
            for g in self._own_gradients(model):
                g.clip_(-limit, limit)

    def precision_support(self, device: Device | None = None) -> dict[str, PrecisionSupport]:
        device = self.try_gpu() if device is None else device
        kind = "gpu" if isinstance(device, paddle.CUDAPlace) else "cpu"
        return {p: _precision.support(kind, p) for p in PRECISIONS}

    def copy_to(self, tensor: Tensor, device: Device) -> Tensor:
        return _precision.CopyTo.apply(tensor, _devices.place(device))

    # -- processes ------------------------------------------------------------------------

    def init_distributed(
        self, info: ClusterInfo, devices: Sequence[Device], timeout: float = 120.0
    ) -> None:
        import paddle.distributed as dist

        if info.world_size == 1:
            return
        if info.master_addr is None or info.master_port is None:
            raise BackendError("paddle.distributed needs a master address and port.")
        gpu = all(isinstance(d, paddle.CUDAPlace) for d in devices)
        # paddle.distributed reads its topology from these variables whichever launcher ran us
        os.environ["PADDLE_DISTRI_BACKEND"] = "nccl" if gpu else "gloo"
        os.environ["PADDLE_TRAINER_ID"] = str(info.rank)
        os.environ["PADDLE_TRAINERS_NUM"] = str(info.world_size)
        os.environ["MASTER_ADDR"] = info.master_addr
        os.environ["MASTER_PORT"] = str(info.master_port)
        if "PADDLE_TRAINER_ENDPOINTS" not in os.environ:  # not launched by paddle (srun, torchrun)
            master = f"{info.master_addr}:{info.master_port}"  # the store's address; the rest
            os.environ["PADDLE_TRAINER_ENDPOINTS"] = ",".join([master] * info.world_size)
            os.environ["PADDLE_CURRENT_ENDPOINT"] = master  # is only checked to exist on CPU
        self.use_process_device(devices)  # before the group: NCCL binds to this GPU
        os.environ["PADDLE_PG_TIMEOUT"] = str(int(timeout * 1000))
        os.environ["FLAGS_stop_check_timeout"] = str(int(timeout))  # noqa: SIM112 - paddle flag
        # Paddle's TCP store waits for every rank with no timeout of its own: bound it here
        deadline = Deadline(timeout, "paddle.distributed", holds_gil=True)
        where = f"{info.master_addr}:{info.master_port}"
        try:
            with deadline(f"joining as rank {info.rank} of {info.world_size} at {where}"):
                dist.init_parallel_env()
        except Exception as exc:
            raise ClusterError(
                f"paddle.distributed could not join rank {info.rank} of {info.world_size} at "
                f"{info.master_addr}:{info.master_port}: {exc}. Check that the master is "
                "reachable and every process was started with the same world size."
            ) from exc
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()

    def use_process_device(self, devices: Sequence[Device]) -> None:
        """Make this process's GPU Paddle's current device (``paddle.set_device`` and
        ``FLAGS_selected_gpus``, which ``init_parallel_env`` reads; nothing on the CPU).
        ``init_distributed`` calls it before creating the process group."""
        _devices.set_current_device(devices)

    def shutdown_distributed(self) -> None:
        import paddle.distributed as dist

        if self.world_size > 1 and dist.is_initialized():
            dist.destroy_process_group()
        self.rank, self.world_size = 0, 1

    # -- functional ops -------------------------------------------------------------------

    def functional(self) -> FunctionalOps:
        from ._ops import PaddleOps

        return PaddleOps(self)

    # -- native files ---------------------------------------------------------------------

    def save_native(self, model: Model, path: str) -> None:
        with atomic_path(path) as tmp:
            paddle.save(model.replicas[0].state_dict(), tmp)

    def load_native(self, model: Model, path: str) -> None:
        state = PaddleFormat().read(path)  # a .pdparams is a pickle: never paddle.load
        layout = PaddleModel.of(model).layout
        params = {}
        for key, value in state.items():
            canonical, transposed = layout.get(key, (key, False))
            params[canonical] = value.T if transposed else value
        try:
            self.set_params(model, params)
        except CheckpointError as exc:  # shapes are shown canonical: say how the file was read
            raise CheckpointError(
                f"{path} (read as Paddle layout, Linear [in, out]): {exc}"
            ) from None
