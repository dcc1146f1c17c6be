"""What every benchmark shares: the workload, its data and batch order, the clock, FLOP
counting, a matmul peak probe and the statistics.

The native loops and the polytrain run train the same LeNet from the same numpy weights
(``spec.init_params(seed)``) on the same batches in the same order (the data-order contract in
docs/architecture.md: ``default_rng([seed, epoch]).permutation(N)``), so their losses agree
as well as their work: each measurement reports its last loss and the harness checks them.
"""

from __future__ import annotations

import contextlib
import math
import os
import platform
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

try:  # Unix only: CPU time of child processes
    import resource
except ImportError:  # pragma: no cover - Windows
    resource = None  # type: ignore[assignment]

from polytrain.neutral.models import (
    GELU,
    Add,
    AvgPool2d,
    BatchNorm2d,
    Conv2d,
    Flatten,
    GlobalAvgPool2d,
    Layer,
    LayerNorm,
    Linear,
    MaxPool2d,
    Mean,
    ModelSpec,
    MultiHeadSelfAttention,
    PositionalEmbedding,
    ReLU,
    Reshape,
    Residual,
    Sequential,
    Transpose,
    get_model_spec,
)

from .stats import cpu_model, usable_cpus

MODEL = "lenet"
DATASET = "fashion-mnist"


@dataclass(frozen=True)
class Workload:
    """One timed training run: ``warmup`` untimed steps, then ``steps`` timed ones."""

    steps: int = 60
    warmup: int = 10
    batch_size: int = 256
    # the native loops are SGD with momentum: pinned here, not the Recipe's default
    optimizer: str = "momentum"
    lr: float = 0.05
    momentum: float = 0.9
    seed: int = 0
    threads: int | None = None  # per process; None: each backend's default
    fast: bool | None = None  # None: the backend's default (polytrain: the automatic mode)
    precision: str = "fp32"
    model: str = MODEL  # lenet; resnet18 where a framework's native loops have it (Paddle)

    @property
    def total_steps(self) -> int:
        return self.warmup + self.steps

    @property
    def train_samples(self) -> int:
        """Exactly one epoch of ``total_steps`` full batches."""
        return self.total_steps * self.batch_size

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Measurement:
    """One timed run of one loop."""

    loop: str  # "polytrain" or "native"
    seconds: float
    samples: int
    last_loss: float
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def samples_per_second(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "samples_per_second": self.samples_per_second}


# -- data -----------------------------------------------------------------------------------


def load_train(n: int) -> tuple[np.ndarray, np.ndarray]:
    """The first ``n`` Fashion-MNIST training samples: float32 [n, 1, 28, 28], int64 [n]."""
    from polytrain.data import load_dataset

    data = load_dataset(DATASET, "train")
    data = data.subset(min(n, len(data)))
    return data.x, data.y


def batch_indices(n: int, batch_size: int, seed: int, epoch: int = 0) -> list[np.ndarray]:
    """Contract 9's batches of one epoch: the same order polytrain's loader uses."""
    order = np.random.default_rng([seed, epoch]).permutation(n)
    return [order[i : i + batch_size] for i in range(0, n, batch_size)]


def batches(
    x: np.ndarray, y: np.ndarray, work: Workload
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The numpy batches of one epoch, gathered in the loop's own thread (no prefetch)."""
    for index in batch_indices(len(x), work.batch_size, work.seed):
        yield np.take(x, index, axis=0), np.take(y, index)


def lenet() -> ModelSpec:
    return get_model_spec(MODEL)


def cpu_seconds() -> tuple[float, float]:
    """(CPU time of this process, all its threads; CPU time of its finished children, e.g.
    torch.compile's workers), user + system, in seconds."""
    children = 0.0
    if resource is not None:
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        children = usage.ru_utime + usage.ru_stime
    return time.process_time(), children


class Clock:
    """Times the steps after the warm-up: ``tick(step, sync)`` after every step, where
    ``sync`` waits for queued work (MXNet is asynchronous); only the two boundary ticks
    synchronise, so the loop itself runs as it would untimed. Wall time and CPU time (the
    process's threads and its children) over the same window."""

    def __init__(self, work: Workload) -> None:
        self.work = work
        self.start: float | None = None
        self.stop: float | None = None
        self.cpu_start = self.cpu_stop = (0.0, 0.0)

    def tick(self, step: int, sync: Callable[[], None]) -> None:
        """Call after step ``step`` (0-based) finished its Python part."""
        if step == self.work.warmup - 1:
            sync()
            self.start, self.cpu_start = time.perf_counter(), cpu_seconds()
        elif step == self.work.total_steps - 1:
            sync()
            self.stop, self.cpu_stop = time.perf_counter(), cpu_seconds()

    @property
    def seconds(self) -> float:
        if self.start is None or self.stop is None:
            raise RuntimeError("the clock did not see both the warm-up end and the last step")
        return self.stop - self.start

    @property
    def children_cpu_seconds(self) -> float:
        """CPU time of child processes that finished (and were waited for) in the window."""
        return self.cpu_stop[1] - self.cpu_start[1]

    @property
    def cpu_seconds(self) -> float:
        """CPU time of the whole process (all its threads) and its children over the timed
        steps: the work done, less sensitive than wall time to other processes on a shared
        machine."""
        return self.cpu_stop[0] - self.cpu_start[0] + self.children_cpu_seconds

    def measurement(self, loop: str, last_loss: float, **extra: Any) -> Measurement:
        return Measurement(
            loop,
            self.seconds,
            self.work.steps * self.work.batch_size,
            last_loss,
            {
                "cpu_seconds": self.cpu_seconds,
                "children_cpu_seconds": self.children_cpu_seconds,
                **extra,
            },
        )


# -- FLOPs ----------------------------------------------------------------------------------


def forward_flops(spec: ModelSpec) -> tuple[int, int]:
    """(FLOPs of one sample's forward pass, FLOPs of the first layer with weights):
    2 per multiply-add of convolutions and dense layers, 1 per output of pooling (per
    window element), ReLU, GELU, bias, positional embedding, mean and residual sum, 4 per
    BatchNorm output, 5 per LayerNorm output, 3 per attention score (softmax). Sequential
    specs with residual blocks and Add branches (a ViT's) are counted."""
    total, first, _ = _net_flops(spec.net, spec.input_shape)
    return total, first or 0


def _net_flops(net: Layer, shape: tuple[int, ...]) -> tuple[int, int | None, tuple[int, ...]]:
    """(FLOPs, FLOPs of the first weighted layer or None, output shape) of ``net``."""
    total, first = 0, None
    for _, layer in _flat(net):
        if isinstance(layer, Residual):
            flops, head, out = _net_flops(layer.body, shape)
            if layer.shortcut is not None:
                flops += _net_flops(layer.shortcut, shape)[0]
            flops += 2 * math.prod(out)  # the sum and its ReLU
        elif isinstance(layer, Add):
            branches = [_net_flops(b, shape) for b in layer.branches]
            out, head = branches[0][2], None
            flops = sum(b[0] for b in branches) + (len(branches) - 1) * math.prod(out)
        else:
            flops, out = _layer_flops(layer, shape)
            head = flops if isinstance(layer, Conv2d | Linear) else None
        if first is None:
            first = head
        total, shape = total + flops, out
    return total, first, shape


def train_flops_per_sample(spec: ModelSpec) -> int:
    """Forward + backward FLOPs of one training sample: backward costs twice the forward
    (gradients of inputs and of weights), except that no framework computes the gradient
    of the input images (the first weighted layer's input gradient)."""
    fwd, first = forward_flops(spec)
    return 3 * fwd - first


def _flat(layer: Layer) -> Iterator[tuple[str, Layer]]:
    if isinstance(layer, Sequential):
        for name, child in layer.layers:
            for sub, leaf in _flat(child):
                yield (f"{name}.{sub}" if sub else name), leaf
    else:
        yield "", layer


def _layer_flops(layer: Layer, shape: tuple[int, ...]) -> tuple[int, tuple[int, ...]]:
    if isinstance(layer, Conv2d):
        c, h, w = shape
        k, s, p = layer.kernel_size, layer.stride, layer.padding
        ho, wo = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
        out = layer.out_channels * ho * wo
        flops = 2 * out * c * k * k + (out if layer.bias else 0)
        return flops, (layer.out_channels, ho, wo)
    if isinstance(layer, Linear):  # on [..., in]: every leading position
        flops = 2 * layer.in_features * layer.out_features + layer.out_features * layer.bias
        return math.prod(shape[:-1]) * flops, (*shape[:-1], layer.out_features)
    if isinstance(layer, AvgPool2d | MaxPool2d):
        c, h, w = shape
        k = layer.kernel_size
        s = layer.stride or k
        ho, wo = (h + 2 * layer.padding - k) // s + 1, (w + 2 * layer.padding - k) // s + 1
        return c * ho * wo * k * k, (c, ho, wo)
    if isinstance(layer, ReLU | GELU | PositionalEmbedding):
        return math.prod(shape), shape
    if isinstance(layer, BatchNorm2d):
        return 4 * math.prod(shape), shape
    if isinstance(layer, GlobalAvgPool2d):
        return math.prod(shape), shape[:1]
    if isinstance(layer, Flatten):
        return 0, (math.prod(shape),)
    return _sequence_layer_flops(layer, shape)


def _sequence_layer_flops(layer: Layer, shape: tuple[int, ...]) -> tuple[int, tuple[int, ...]]:
    """A transformer's layers on one sample's ``shape`` (no batch axis)."""
    if isinstance(layer, LayerNorm):
        return 5 * math.prod(shape), shape
    if isinstance(layer, MultiHeadSelfAttention):
        t, e = shape
        projections = 2 * t * e * 4 * e + 4 * t * e * layer.bias  # q, k, v and out
        scores = 2 * 2 * t * t * e + 3 * layer.num_heads * t * t  # q k^T, softmax, p v
        return projections + scores, shape
    if isinstance(layer, Reshape):
        return 0, layer.shape
    if isinstance(layer, Transpose):
        dims = list(shape)
        a, b = (d - 1 if d > 0 else len(dims) + d for d in (layer.dim0, layer.dim1))
        dims[a], dims[b] = dims[b], dims[a]
        return 0, tuple(dims)
    if isinstance(layer, Mean):
        axis = layer.dim - 1 if layer.dim > 0 else len(shape) + layer.dim
        return math.prod(shape), shape[:axis] + shape[axis + 1 :]
    raise ValueError(f"FLOP counting does not know {type(layer).__name__}")


def matmul_peak_gflops(threads: int, n: int = 1024, repeats: int = 7) -> dict[str, float]:
    """Best-of-``repeats`` float32 matmul throughput (GFLOP/s) of numpy's BLAS (its own
    thread count) and, if installed, torch's at ``threads`` threads: with every core,
    the machine's practical peak."""
    out = {}
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    out["numpy"] = _best_gflops(lambda: a @ b, n, repeats)
    try:
        import torch
    except ImportError:
        return out
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    out["torch"] = _best_gflops(lambda: ta @ tb, n, repeats)
    torch.set_num_threads(previous)
    return out


def _best_gflops(fn: Callable[[], Any], n: int, repeats: int) -> float:
    fn()
    best = math.inf
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best / 1e9


# -- statistics -----------------------------------------------------------------------------


@dataclass
class Summary:
    """Median and spread of repeated measurements of one quantity."""

    values: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    @property
    def spread(self) -> float:
        """(max - min) / median: the whole range, relative."""
        return (max(self.values) - min(self.values)) / self.median if self.median else 0.0

    @property
    def iqr(self) -> float:
        """Interquartile range relative to the median (robust to one outlier)."""
        if len(self.values) < 4:
            return self.spread
        q = statistics.quantiles(self.values, n=4)
        return (q[2] - q[0]) / self.median if self.median else 0.0

    def __str__(self) -> str:
        return f"{self.median:,.0f} (±{100 * self.spread / 2:.1f}%)"


def per_round_ratios(
    a: Sequence[Measurement], b: Sequence[Measurement]
) -> tuple[list[float], list[float]]:
    """Per round, ``a``'s samples/s over ``b``'s, and ``b``'s CPU time per sample (process
    and children) over ``a``'s: the work each loop does, much less disturbed than wall
    time by other processes on a shared machine. Above 1: ``a`` is faster."""
    pairs = list(zip(a, b, strict=True))
    speed = [p.samples_per_second / q.samples_per_second for p, q in pairs]
    cpu = [q.extra["cpu_seconds"] / p.extra["cpu_seconds"] for p, q in pairs]
    return speed, cpu


def peak_fractions(
    measured: Sequence[Measurement], peaks: Sequence[float], flops_per_sample: float
) -> list[float]:
    """Per round, the loop's achieved GFLOP/s over the matmul peak probed in that round
    (the same process, minutes apart at most): the VM's speed drifts by the hour, so a
    peak probed elsewhere or at another time is not the ceiling this round ran under."""
    pairs = zip(measured, peaks, strict=True)
    return [m.samples_per_second * flops_per_sample / 1e9 / peak for m, peak in pairs]


def interleaved(order_seed: int, repeats: int, loops: Sequence[str]) -> list[str]:
    """The run order: every repetition runs each loop once, in an order that alternates
    (ABBA...), so a drift of the machine's speed hits every loop alike."""
    sequence = []
    for r in range(repeats):
        pair = list(loops) if (r + order_seed) % 2 == 0 else list(reversed(loops))
        sequence += pair
    return sequence


def machine() -> dict[str, Any]:
    """What the machine is (for the report): CPU model, cores, load, Python and numpy."""
    info: dict[str, Any] = {
        "cpu": cpu_model(),
        "cpus": os.cpu_count(),
        "usable_cpus": usable_cpus(),
        "python": platform.python_version(),
        "numpy": np.__version__,
    }
    with contextlib.suppress(OSError, AttributeError):
        info["load_average"] = list(os.getloadavg())
    return info


def initial_weights(seed: int, model: str = MODEL) -> list[np.ndarray]:
    """The model's initial weights in model order (LeNet: conv1 w, b, conv2 w, b, fc1 w, b,
    fc2 w, b; BatchNorm: weight, bias, running mean, running variance), canonical (PyTorch)
    layout: what each native loop loads into its own layers."""
    return list(get_model_spec(model).init_params(seed).values())
