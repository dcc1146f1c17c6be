"""The PyTorch backend. PyTorch's conventions are polytrain's canonical ones, so this
backend converts nothing; it is the reference the others mirror method for method."""

from __future__ import annotations

import contextlib
import copy
import io
import sys
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from polytrain.backend.base import Backend, Device, Model, Tensor, check_params
from polytrain.backend.functional import FunctionalOps
from polytrain.backend.precision import PRECISIONS, PrecisionSupport, check_dtype
from polytrain.errors import BackendError, CheckpointError, ClusterError
from polytrain.neutral.models import (
    AvgPool2d,
    BatchNorm2d,
    Conv2d,
    Dropout,
    Flatten,
    GlobalAvgPool2d,
    Layer,
    Linear,
    MaxPool2d,
    ModelSpec,
    ReLU,
    Residual,
    Sequential,
)
from polytrain.neutral.optim import Optimizer, OptimizerConfig
from polytrain.utils.fileio import atomic_path

from . import _inspect, _precision
from ._optim import TorchOptimizer

_SKIP = ("num_batches_tracked",)
_NUMPY = {torch.float32: np.float32, torch.float64: np.float64}  # parameter dtypes


class _Residual(nn.Module):
    def __init__(self, body: nn.Module, shortcut: nn.Module | None) -> None:
        super().__init__()
        self.body = body
        self.shortcut = shortcut

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = x if self.shortcut is None else self.shortcut(x)
        return F.relu(self.body(x) + s)


def _build(layer: Layer) -> nn.Module:
    if isinstance(layer, Sequential):
        return nn.Sequential(OrderedDict((n, _build(c)) for n, c in layer.layers))
    if isinstance(layer, Residual):
        short = None if layer.shortcut is None else _build(layer.shortcut)
        return _Residual(_build(layer.body), short)
    if isinstance(layer, Conv2d):
        return nn.Conv2d(
            layer.in_channels,
            layer.out_channels,
            layer.kernel_size,
            stride=layer.stride,
            padding=layer.padding,
            bias=layer.bias,
        )
    if isinstance(layer, Linear):
        return nn.Linear(layer.in_features, layer.out_features, bias=layer.bias)
    if isinstance(layer, BatchNorm2d):
        return nn.BatchNorm2d(layer.num_features, eps=layer.eps, momentum=layer.momentum)
    if isinstance(layer, ReLU):
        return nn.ReLU()
    if isinstance(layer, MaxPool2d):
        return nn.MaxPool2d(layer.kernel_size, layer.stride, layer.padding)
    if isinstance(layer, AvgPool2d):
        return nn.AvgPool2d(
            layer.kernel_size,
            layer.stride,
            layer.padding,
            ceil_mode=layer.ceil_mode,
            count_include_pad=layer.count_include_pad,
        )
    if isinstance(layer, GlobalAvgPool2d):
        return nn.AdaptiveAvgPool2d(1)
    if isinstance(layer, Flatten):
        return nn.Flatten()
    if isinstance(layer, Dropout):
        return nn.Dropout(layer.p)
    raise BackendError(f"torch backend cannot build layer {layer!r}")


def _unwrap(module: nn.Module) -> nn.Module:
    """The user's module inside DataParallel/DDP wrappers (no ``module.`` prefixes)."""
    while isinstance(module, nn.DataParallel | nn.parallel.DistributedDataParallel):
        module = module.module
    return module


def _strip_prefix(state: dict[str, Any]) -> dict[str, Any]:
    if state and all(k.startswith("module.") for k in state):
        return {k[len("module.") :]: v for k, v in state.items()}
    return state


def _on_distinct_gpus(tensors: Sequence[torch.Tensor]) -> bool:
    """One tensor per GPU: torch.cuda.comm's reduce/broadcast apply (NCCL when present)."""
    devices = [t.device for t in tensors]
    return all(d.type == "cuda" for d in devices) and len(set(devices)) == len(devices)


class TorchBackend(Backend):
    name = "torch"
    framework = "torch"
    native_suffix = ".pt"

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

    # -- devices --------------------------------------------------------------------------

    def gpu_count(self) -> int:
        return torch.cuda.device_count() if torch.cuda.is_available() else 0

    def device(self, name: str) -> Device:
        kind, _, index = name.partition(":")
        if kind == "cpu":  # cpu:K is an emulated device: a replica in host memory
            return torch.device("cpu", int(index)) if index else torch.device("cpu")
        if kind == "gpu":
            return torch.device("cuda", int(index or 0))
        raise BackendError(f"Unknown device name {name!r}; use cpu, cpu:K or gpu:K.")

    def device_name(self, device: Device) -> str:
        dev = torch.device(device)
        kind = "gpu" if dev.type == "cuda" else dev.type
        return kind if dev.index is None else f"{kind}:{dev.index}"

    # -- tensors --------------------------------------------------------------------------

    def to_tensor(self, array: np.ndarray, device: Device | None = None) -> Tensor:
        tensor = torch.from_numpy(np.array(array, copy=True, order="C"))
        return tensor if device is None or device.type == "cpu" else tensor.to(device)

    def to_numpy(self, tensor: Tensor) -> np.ndarray:
        if tensor.dtype == torch.bfloat16:  # numpy has no bfloat16
            tensor = tensor.float()
        return tensor.detach().cpu().numpy().copy()

    def allreduce(self, tensors: Sequence[Tensor], op: str) -> None:
        if op not in ("sum", "mean"):
            raise BackendError(f"allreduce op must be 'sum' or 'mean', got {op!r}.")
        with torch.no_grad():
            gpus = _on_distinct_gpus(tensors)
            if gpus:  # untested here (no GPU): torch.cuda.comm, NCCL when available
                from torch.cuda import comm

                total = comm.reduce_add(list(tensors), tensors[0].device.index)
            else:  # emulated cpu:K devices: an ordinary reduction in host memory
                total = tensors[0].clone()
                for t in tensors[1:]:
                    total.add_(t.to(total.device))
            count = len(tensors)
            if self.world_size > 1:
                import torch.distributed as dist

                dist.all_reduce(total, op=dist.ReduceOp.SUM)
                count *= self.world_size
            if op == "mean":
                total.div_(count)
            if gpus and len(tensors) > 1:
                tensors[0].copy_(total)
                comm.broadcast(tensors[0], out=list(tensors[1:]))
                return
            for t in tensors:
                t.copy_(total)

    def broadcast(self, tensors: Sequence[Tensor], src: int = 0) -> None:
        with torch.no_grad():
            source = tensors[src]
            if self.world_size > 1:
                import torch.distributed as dist

                dist.broadcast(source, src=0)
            for i, t in enumerate(tensors):
                if i != src:
                    t.copy_(source)

    # -- models ---------------------------------------------------------------------------

    def build_model(
        self,
        model: ModelSpec | Any,
        devices: Sequence[Device] | None = None,
        *,
        dtype: str = "float32",
    ) -> Model:
        devices = list(devices) if devices else [self.device("cpu")]
        check_dtype(dtype)
        spec = model if isinstance(model, ModelSpec) else None
        if spec is not None:
            native = _build(spec.net)
        elif isinstance(model, nn.Module):
            native = _unwrap(model)
        else:
            raise BackendError(
                f"torch backend builds a polytrain ModelSpec or wraps a torch.nn.Module, "
                f"not {type(model).__name__}."
            )
        native.to(getattr(torch, dtype))  # parameters and float buffers, in place
        replicas = [native.to(devices[0])]
        replicas += [copy.deepcopy(native).to(d) for d in devices[1:]]
        names = [n for n, _ in native.named_parameters()]
        return Model(
            native=native,
            devices=devices,
            replicas=replicas,
            spec=spec,
            private={
                "names": names,
                "training": [None] * len(devices),
                # --fast: torch.compile (compiles at the first call; off by default, it did
                # not pay for LeNet on a 2-core CPU: docs/performance.md)
                "run": [torch.compile(r) for r in replicas] if self.fast else replicas,
            },
            dtype=dtype,
        )

    def _state(self, module: nn.Module) -> dict[str, torch.Tensor]:
        return {k: v for k, v in module.state_dict().items() if not k.endswith(_SKIP)}

    def get_params(self, model: Model, replica: int = 0) -> dict[str, np.ndarray]:
        return {k: self.to_numpy(v) for k, v in self._state(model.replicas[replica]).items()}

    def set_params(self, model: Model, params: dict[str, np.ndarray]) -> None:
        expected = self._state(model.replicas[0])
        check_params(expected, params, lambda t: tuple(t.shape))
        with torch.no_grad():
            for replica in model.replicas:
                for name, tensor in self._state(replica).items():
                    tensor.copy_(torch.from_numpy(np.ascontiguousarray(params[name])))

    def parameter_names(self, model: Model) -> list[str]:
        return list(model.private["names"])

    def _set_mode(self, model: Model, replica: int, train: bool) -> nn.Module:
        module = model.replicas[replica]
        if model.private["training"][replica] is not train:
            module.train(train)
            model.private["training"][replica] = train
        return module

    def forward(self, model: Model, x: Tensor, *, replica: int = 0, train: bool = False) -> Tensor:
        self._set_mode(model, replica, train)
        module = model.private["run"][replica]
        if train:
            return module(x)
        with torch.no_grad():
            return module(x)

    def record(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

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

    def backward(self, loss: Tensor) -> None:
        loss.backward()

    def gradients(self, model: Model, replica: int = 0) -> dict[str, np.ndarray]:
        out = {}
        for name, p in model.replicas[replica].named_parameters():
            g = p.grad
            out[name] = np.zeros(tuple(p.shape), _NUMPY[p.dtype]) if g is None else self.to_numpy(g)
        return out

    def replica_gradients(self, model: Model) -> list[list[Tensor]]:
        per_replica = [[p.grad for p in r.parameters()] for r in model.replicas]
        return [list(g) for g in zip(*per_replica, strict=True)]

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

    def precision_support(self, device: Device | None = None) -> dict[str, PrecisionSupport]:
        kind = torch.device(self.try_gpu() if device is None else device).type
        return {p: _precision.support(kind, p) for p in PRECISIONS}

    def copy_to(self, tensor: Tensor, device: Device) -> Tensor:
        return tensor.to(device)  # differentiable (ToCopyBackward)

    # -- processes ------------------------------------------------------------------------

    def init_distributed(
        self, info: Any, devices: Sequence[Device], timeout: float = 120.0
    ) -> None:
        import datetime

        import torch.distributed as dist

        if info.world_size == 1:
            return
        if info.master_addr is None or info.master_port is None:
            raise BackendError(
                "torch.distributed needs a master address and port (MASTER_ADDR/PORT)."
            )
        engine = "nccl" if all(torch.device(d).type == "cuda" for d in devices) else "gloo"
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

    def shutdown_distributed(self) -> None:
        import torch.distributed as dist

        # gloo ranks may abort at exit unless the group is destroyed first (DESIGN.md traps),
        # and a rank that destroys it while a peer is still working (rank 0 saving) can abort
        # in gloo's teardown: on a clean exit, meet the others first. A rank leaving on an
        # exception skips the barrier (its peers may never come); the group's timeout bounds
        # it otherwise.
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
        state = {k: v.detach().cpu().clone() for k, v in model.replicas[0].state_dict().items()}
        with atomic_path(path) as tmp:
            torch.save(state, tmp)

    def encode_weights(self, tensors: dict[str, np.ndarray]) -> bytes:
        state = {k: torch.from_numpy(np.array(v, order="C")) for k, v in tensors.items()}
        buffer = io.BytesIO()  # archive name "archive", whatever the file will be called
        torch.save(state, buffer)
        return buffer.getvalue()

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
