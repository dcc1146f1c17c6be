"""The PyTorch backend. PyTorch's conventions are polytrain's canonical ones, so this
backend converts nothing; it is the reference the others mirror method for method."""

from __future__ import annotations

import contextlib
import copy
import sys
from collections.abc import Iterator, Sequence
from typing import Any, cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

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
from polytrain.errors import BackendError, CheckpointError, ClusterError
from polytrain.neutral.losses import LossSpec, class_positions
from polytrain.neutral.models import ModelSpec
from polytrain.neutral.optim import Optimizer, OptimizerConfig
from polytrain.utils.fileio import atomic_path

from . import _compile, _devices, _inspect, _layout, _losses, _malloc, _parallel, _precision
from ._layers import build, unwrap
from ._model import TorchModel
from ._optim import TorchOptimizer

_SKIP = ("num_batches_tracked",)
_NUMPY = {torch.float32: np.float32, torch.float64: np.float64}  # parameter dtypes


def _strip_prefix(state: dict[str, Any]) -> dict[str, Any]:
    if state and all(k.startswith("module.") for k in state):
        return {k[len("module.") :]: v for k, v in state.items()}
    return state


def collective_engine(
    devices: Sequence[Device], local_processes: int, gpus: int | None = None
) -> str:
    """NCCL when every device is a GPU and this node has a GPU per process; gloo otherwise
    (NCCL refuses two ranks on one GPU, e.g. ``--devices gpu:0`` in every process).
    ``gpus``: the node's GPU count (default: what torch sees)."""
    if gpus is None:
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    on_gpus = all(torch.device(d).type == "cuda" for d in devices)
    return "nccl" if on_gpus and local_processes <= gpus else "gloo"


class TorchBackend(Backend, Collectives, Precision, NativeIO, Inspection, Compilation):
    name = "torch"
    framework = "torch"
    compiled_mode = "torch.compile"
    native_suffix = ".pt"

    def __init__(self, options: Any = None) -> None:
        super().__init__(options)
        # glibc keeps the CPU memory torch frees for the next step: "reuse", or why not
        self.malloc = _malloc.keep_freed_memory()

    # -- identity, threads, seeds ---------------------------------------------------------

    def version(self) -> str:
        return str(torch.__version__)

    def threads(self) -> dict[str, int]:
        return {"intra_op": torch.get_num_threads(), "inter_op": torch.get_num_interop_threads()}

    def set_threads(self, n: int) -> None:
        torch.set_num_threads(n)
        with contextlib.suppress(RuntimeError):  # only settable before parallel work starts
            torch.set_num_interop_threads(n)

    def seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def synchronize(self) -> None:
        if torch.cuda.is_available():  # every GPU: synchronize() waits for the current one
            for i in range(torch.cuda.device_count()):
                torch.cuda.synchronize(i)

    def compile_profile(self) -> CompileProfile | None:
        return _compile.profile()

    def compile_cache_warm(self, fingerprint: str) -> bool:
        return _compile.is_warm(fingerprint)

    # -- devices --------------------------------------------------------------------------

    def gpu_count(self) -> int:
        return torch.cuda.device_count() if torch.cuda.is_available() else 0

    def device(self, name: str) -> Device:
        return _devices.native_device(name)

    def device_name(self, device: Device) -> str:
        return _devices.neutral_name(device)

    # -- tensors --------------------------------------------------------------------------

    def to_tensor(self, array: np.ndarray, device: Device | None = None) -> Tensor:
        tensor = torch.from_numpy(np.array(array, copy=True, order="C"))
        return tensor if device is None or device.type == "cpu" else tensor.to(device)

    def load_shard(self, shard: np.ndarray, device: Device) -> Tensor | None:
        """Shared, not copied (on the CPU; else moved without a host copy first): the copy
        cost 70-80 us per LeNet step (docs/performance.md, "Where polytrain's step time
        goes")."""
        tensor = torch.from_numpy(shard)
        return tensor if device.type == "cpu" else tensor.to(device)

    def to_numpy(self, tensor: Tensor) -> np.ndarray:
        if tensor.dtype == torch.bfloat16:  # numpy has no bfloat16
            tensor = tensor.float()
        return tensor.detach().cpu().numpy().copy()

    def allreduce(self, tensors: Sequence[Tensor], op: str) -> None:
        _parallel.allreduce(tensors, check_reduce_op(op), self.world_size)

    def broadcast(self, tensors: Sequence[Tensor], src: int = 0) -> None:
        _parallel.broadcast(tensors, src, self.world_size)

    # -- models ---------------------------------------------------------------------------

    def build_model(
        self, model: ModelSpec | Any, devices: DeviceSeq | None = None, *, dtype: str = "float32"
    ) -> Model:
        spec, devices = build_inputs(self, model, devices, dtype, nn.Module, "torch.nn.Module")
        if self.fast:
            _compile.use_cache_dir()  # before the first compile reads it
        native = unwrap(cast(nn.Module, model)) if spec is None else build(spec.net)
        native.to(getattr(torch, dtype))  # parameters and float buffers, in place
        if any(torch.device(d).type == "cuda" for d in devices):
            _devices.exact_float32()  # fp32 means fp32 (the precision flag picks bf16/fp16)
        channels_last = _layout.wants_channels_last(
            native, devices, dtype, from_spec=spec is not None
        )
        if channels_last:
            # conv weights, in place (torch's stubs omit to()'s memory_format keyword)
            native.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
        replicas = [native.to(devices[0])]
        replicas += [copy.deepcopy(native).to(d) for d in devices[1:]]
        return TorchModel(
            native=native,
            devices=devices,
            replicas=replicas,
            spec=spec,
            dtype=dtype,
            names=[n for n, _ in native.named_parameters()],
            training=[None] * len(devices),
            # fast: torch.compile (compiles at the first call, into the persistent cache);
            # chosen by --fast or by the automatic mode (polytrain.training.compile_decision)
            run=[torch.compile(r) for r in replicas] if self.fast else replicas,
            compiled_shape=[None] * len(replicas),
            warm_marker=self.options.compile_fingerprint if self.fast else None,
            channels_last=channels_last,
        )

    def _state(self, module: nn.Module) -> dict[str, torch.Tensor]:
        return {k: v for k, v in module.state_dict().items() if not k.endswith(_SKIP)}

    def get_params(self, model: Model, replica: int = 0) -> dict[str, np.ndarray]:
        state = self._state(TorchModel.of(model).replicas[replica])
        return {k: self.to_numpy(v) for k, v in state.items()}

    def set_params(self, model: Model, params: dict[str, np.ndarray]) -> None:
        expected = self._state(TorchModel.of(model).replicas[0])
        check_params(expected, params, lambda t: tuple(t.shape))
        with torch.no_grad():
            for replica in model.replicas:
                for name, tensor in self._state(replica).items():
                    tensor.copy_(torch.from_numpy(np.ascontiguousarray(params[name])))

    def parameter_names(self, model: Model) -> list[str]:
        return list(TorchModel.of(model).names)

    def forward(self, model: Model, x: Tensor, *, replica: int = 0, train: bool = False) -> Tensor:
        own = TorchModel.of(model)
        if own.channels_last:
            x = _layout.to_channels_last(x)
        if own.training[replica] is not train:
            own.replicas[replica].train(train)
            own.training[replica] = train
        if not train:
            with torch.no_grad():
                return own.replicas[replica](x)  # eager: one compiled graph only
        if own.run[replica] is own.replicas[replica]:
            return own.run[replica](x)
        shape = tuple(x.shape)
        if own.compiled_shape[replica] is None:
            own.compiled_shape[replica] = shape
        elif own.compiled_shape[replica] != shape:
            return own.replicas[replica](x)  # e.g. the smaller last batch: no recompile
        if own.warm_marker is not None:
            self._note_compiled(own)
        return own.run[replica](x)

    def _note_compiled(self, own: TorchModel) -> None:
        """Mark the cache warm for this model at its second compiled training call (the
        first call's forward and backward graphs have compiled by then)."""
        own.compiled_steps += 1
        if own.compiled_steps == 2 and own.warm_marker is not None:
            _compile.mark_warm(own.warm_marker)
            own.warm_marker = None

    def cross_entropy(
        self,
        logits: Tensor,
        labels: Tensor,
        reduction: str = "mean",
        ignore_index: int | None = None,
    ) -> Tensor:
        if labels.ndim == 2 and labels.shape[1] == 1:  # accept Paddle/MXNet-style [N, 1]
            labels = labels.reshape(-1)
        ignore = -100 if ignore_index is None else ignore_index  # -100: no valid label is
        return F.cross_entropy(logits, labels, reduction=reduction, ignore_index=ignore)

    def count_correct(self, logits: Tensor, labels: Tensor) -> Tensor:
        return (logits.argmax(dim=1) == labels.reshape(-1)).sum()

    def loss(
        self, outputs: Tensor, targets: Tensor, loss: LossSpec, reduction: str = "sum"
    ) -> Tensor:
        if loss.plain and class_positions(tuple(outputs.shape), tuple(targets.shape)) == 1:
            return self.cross_entropy(outputs, targets, reduction)  # the verb, bit for bit
        return _losses.named_loss(outputs, targets, loss, reduction)

    def backward(self, loss: Tensor) -> None:
        loss.backward()

    def gradients(self, model: Model, replica: int = 0) -> dict[str, np.ndarray]:
        out = {}
        for name, p in model.replicas[replica].named_parameters():
            g = p.grad
            out[name] = np.zeros(tuple(p.shape), _NUMPY[p.dtype]) if g is None else self.to_numpy(g)
        return out

    def sync_in_buckets(self, model: Model) -> bool:
        """Flat buckets of ``bucket_mb`` (default 25 MB), one all_reduce each."""
        limit = bucket_bytes(self.options.bucket_mb)
        if limit == 0:
            return False
        replicas = [[p for p in r.parameters() if p.requires_grad] for r in model.replicas]
        _parallel.sync_buckets(replicas, self.world_size, limit)
        return True

    def replica_gradients(self, model: Model) -> list[list[Tensor]]:
        replicas = [[p for p in r.parameters() if p.requires_grad] for r in model.replicas]
        return _parallel.gradients_to_sum(replicas, self.world_size)

    def grad_norm(self, model: Model) -> float:
        grads = [p.grad for p in model.replicas[0].parameters() if p.grad is not None]
        if not grads:
            return 0.0
        return float(
            torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
        )

    def layer_outputs(self, model: Model, x: Tensor) -> list[tuple[str, np.ndarray]]:
        return _inspect.layer_outputs(self, model, x)

    def make_optimizer(self, model: Model, config: OptimizerConfig) -> Optimizer:
        return TorchOptimizer(model, config)

    # -- mixed precision and model parallelism (_precision.py) ----------------------------

    @contextlib.contextmanager
    def autocast(self, precision: str) -> Iterator[None]:
        with _precision.autocast(precision):
            yield

    def unscale_gradients(self, model: Model, inv_scale: float) -> bool:
        grads = [p.grad for replica in model.replicas for p in replica.parameters()]
        return _precision.unscale(grads, inv_scale)

    def scale_gradients(self, model: Model, factor: float) -> None:
        with torch.no_grad():
            for replica in model.replicas:
                for p in replica.parameters():
                    if p.grad is not None:
                        p.grad.mul_(factor)

    def clip_gradients(self, model: Model, limit: float) -> None:
        with torch.no_grad():
            for replica in model.replicas:
                for p in replica.parameters():
                    if p.grad is not None:
                        p.grad.clamp_(-limit, limit)

    def precision_support(self, device: Device | None = None) -> dict[str, PrecisionSupport]:
        kind = torch.device(self.try_gpu() if device is None else device).type
        return {p: _precision.support(kind, p) for p in PRECISIONS}

    def copy_to(self, tensor: Tensor, device: Device) -> Tensor:
        return tensor.to(device)  # differentiable (ToCopyBackward)

    # -- processes ------------------------------------------------------------------------

    def init_distributed(
        self, info: ClusterInfo, devices: Sequence[Device], timeout: float = 120.0
    ) -> None:
        import datetime

        import torch.distributed as dist

        if info.world_size == 1:
            return
        if info.master_addr is None or info.master_port is None:
            raise BackendError(
                "torch.distributed needs a master address and port (MASTER_ADDR/PORT)."
            )
        engine = collective_engine(devices, info.local_world_size)
        self.use_process_device(devices)  # before the group: NCCL binds to the current GPU
        try:
            dist.init_process_group(
                engine,
                init_method=f"tcp://{info.master_addr}:{info.master_port}",
                rank=info.rank,
                world_size=info.world_size,
                timeout=datetime.timedelta(seconds=timeout),
            )
        except Exception as exc:  # rendezvous errors come as RuntimeError/DistNetworkError
            raise ClusterError(
                f"torch.distributed ({engine}) could not join rank {info.rank} of "
                f"{info.world_size} at {info.master_addr}:{info.master_port} within "
                f"{timeout:.0f} s: "
                f"{exc}. Check that the master is reachable, the port is free on the master, "
                "and every process was started with the same world size."
            ) from exc
        self.rank, self.world_size = info.rank, info.world_size

    def use_process_device(self, devices: Sequence[Device]) -> None:
        """Make this process's GPU the current device (``torch.cuda.set_device``; nothing
        on the CPU). ``init_distributed`` calls it before creating the process group."""
        _devices.set_current_device(devices)

    def shutdown_distributed(self) -> None:
        import torch.distributed as dist

        # gloo ranks may abort at exit unless the group is destroyed first (traps in
        # docs/architecture.md), and a rank that destroys it while a peer is still working
        # (rank 0 saving) can abort in gloo's teardown: on a clean exit, meet the others
        # first. A rank leaving on an exception skips the barrier (its peers may never
        # come); the group's timeout bounds it otherwise.
        if dist.is_available() and dist.is_initialized():
            if sys.exc_info()[0] is None:
                with contextlib.suppress(Exception):
                    dist.barrier()
            dist.destroy_process_group()
        self.rank, self.world_size = 0, 1

    # -- functional ops -------------------------------------------------------------------

    def functional(self) -> FunctionalOps:
        from ._ops import TorchOps

        return TorchOps(self)

    # -- native files ---------------------------------------------------------------------

    def save_native(self, model: Model, path: str) -> None:
        state = {
            k: v.detach().cpu().clone(memory_format=torch.contiguous_format)
            for k, v in model.replicas[0].state_dict().items()
        }
        with atomic_path(path) as tmp:
            torch.save(state, tmp)

    def load_native(self, model: Model, path: str) -> None:
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:
            raise CheckpointError(f"Cannot read {path} as a PyTorch state dict: {exc}") from exc
        if not isinstance(state, dict):
            raise CheckpointError(f"{path} holds a {type(state).__name__}, not a state dict.")
        state = _strip_prefix(state)
        params = {k: v.numpy() for k, v in state.items() if not k.endswith(_SKIP)}
        self.set_params(model, params)
