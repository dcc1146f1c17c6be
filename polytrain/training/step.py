"""One optimizer step of the recipe, composed only of Backend verbs.

The global batch is cut into ``accumulate`` micro-batches, each micro-batch into one shard
per device; every shard's *summed* loss is scaled by 1/(samples of the global batch) before
backward, gradients are summed over replicas (and processes), then one update. So devices x
processes x micro-batches equals one device on the whole batch (the global-batch gradient
contract in docs/architecture.md). Under mixed precision
(:mod:`polytrain.backend.precision`) forward passes run in autocast, and with fp16 the loss
is scaled and a step with inf/nan gradients is skipped. Gradient clipping (by value, then
by global norm) acts on the summed, unscaled gradients, just before the update.

The loss is read on the host every step (the non-finite check refuses that very step's
update). An accuracy count stays on the device, summed by the ``sum_counts`` verb, and is
read every ``metrics_every`` steps and whenever the caller asks (:meth:`StepRunner.read_metrics`:
the epoch end, a checkpoint, a stop); metrics computed on the host are returned every step.
"""

from __future__ import annotations

import contextlib
import math
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from polytrain.backend.base import Backend, Model
from polytrain.backend.collectives import Collectives
from polytrain.backend.precision import param_dtype
from polytrain.errors import ConfigError, ShapeError
from polytrain.neutral.dropout_masks import ParityMasks
from polytrain.neutral.losses import LossSpec, MetricSpec, metric_sum
from polytrain.neutral.optim import Optimizer
from polytrain.neutral.shape_check import describe_misfit
from polytrain.neutral.sharding import shard_bounds
from polytrain.training.mixed_precision import MixedPrecision

CLIP_EPS = 1e-6  # PyTorch's clip_grad_norm_: max_norm / (total_norm + 1e-6)
DEFAULT_METRICS_EVERY = 50  # steps between host reads of the metric (docs/performance.md)
EXACT_COUNT_SAMPLES = 2**23  # read before a float32 count of held samples could round
HELD_COUNTS = 64  # counts held per replica before they are summed into one (on the device)


@dataclass
class StepResult:
    """Sums over the global batch of one step (all processes), on the host."""

    loss_sum: float
    # the metric summed over the samples (a count for accuracy and top_k) as read at this
    # step: this step's, or with metrics_every > 1 an accuracy count of every step since
    # the last read (0 in between: the counts wait on the device)
    metric_sum: float
    samples: int
    skipped: bool = False  # fp16: a gradient was inf/nan, so no update (the scale backed off)
    stop_signal: int = 0  # a stop signal some process received: every process stops here


class StepRunner:
    """Runs training steps and evaluation batches of one model on one backend."""

    def __init__(
        self,
        backend: Backend,
        model: Model,
        optimizer: Optimizer,
        *,
        accumulate: int = 1,
        precision: str = "fp32",
        loss: LossSpec | None = None,
        metric: MetricSpec | None = None,
        clip_grad_norm: float | None = None,
        clip_grad_value: float | None = None,
        dropout_masks: ParityMasks | None = None,
        metrics_every: int = 1,
    ) -> None:
        if isinstance(metrics_every, bool) or not isinstance(metrics_every, int):
            raise ConfigError(f"metrics_every must be an integer >= 1, got {metrics_every!r}.")
        if metrics_every < 1:
            raise ConfigError(f"metrics_every must be an integer >= 1, got {metrics_every}.")
        self.metrics_every = metrics_every
        self._held: dict[int, list[Any]] = {}  # replica -> its counts, on the device
        self._held_steps = 0
        self._held_samples = 0  # of every process
        self.dropout_masks = dropout_masks
        self.steps_taken = 0  # the step of parity dropout masks when train_step gets none
        self.clip_grad_norm = clip_grad_norm
        self.clip_grad_value = clip_grad_value
        self.loss = loss or LossSpec()
        self.metric = metric or MetricSpec()
        self.backend = backend
        self.model = model
        self.optimizer = optimizer
        self.accumulate = accumulate
        self.precision = precision
        if model.dtype != param_dtype(precision):
            raise ConfigError(
                f"Precision {precision} needs a model built with dtype="
                f"{param_dtype(precision)!r}; this one was built in {model.dtype}."
            )
        self.mixed_precision = MixedPrecision(backend, precision, model.devices)
        self._collectives = self._find_collectives()
        self._input_dtype = np.dtype(model.dtype)  # batches are cast to the model's dtype

    def _find_collectives(self) -> Collectives | None:
        """The backend's collectives (found once, here); a model on several devices, or
        several processes, needs them."""
        b, devices = self.backend, self.model.devices
        if len(devices) > 1:
            names = ", ".join(b.device_name(d) for d in devices)
            return Collectives.required(b, f"training on {len(devices)} devices ({names})")
        if b.world_size > 1:
            return Collectives.required(b, f"training in {b.world_size} processes")
        return Collectives.of(b)

    def _sum_numbers(self, values: list[float]) -> list[float]:
        """Host numbers summed over the processes (several only with collectives)."""
        if self._collectives is None:
            return [float(v) for v in values]
        return self._collectives.allreduce_numbers(values)

    @contextlib.contextmanager
    def _shapes_explained(self, x: np.ndarray) -> Iterator[None]:
        """A framework's error on a batch that does not fit the spec becomes a ShapeError
        naming the layer and the shapes (found by the numpy reference, only on failure)."""
        try:
            yield
        except ShapeError:
            raise
        except Exception as exc:  # a framework's, or a backend's own shape complaint
            spec = self.model.spec
            why = describe_misfit(spec, tuple(np.shape(x))) if spec is not None else None
            if why is None:
                raise
            raise ShapeError(why) from exc

    def _cast(self, x: np.ndarray) -> np.ndarray:
        """A float batch in the model's dtype (a no-op for float32 data and models)."""
        return x.astype(self._input_dtype, copy=False) if x.dtype.kind == "f" else x

    def train_step(
        self, x: np.ndarray, y: np.ndarray, global_count: int | None = None, stop_signal: int = 0,
        *, step: int | None = None,
    ) -> StepResult:  # fmt: skip
        """One update from this process's part of a global batch of ``global_count``
        samples (default: ``len(x)``, a single process). ``stop_signal`` (a signal this
        process received, or 0) rides on the step's sum of numbers, so that every process
        learns it at the same step (SIGTERM wins over SIGINT) and all stop there together.
        ``step``: the global step, which keys parity dropout masks (default: one more than
        the last)."""
        b, model, mp = self.backend, self.model, self.mixed_precision
        x = self._cast(x)
        denominator = global_count or len(x)
        one_backward = self.accumulate == 1  # one forward and backward per replica
        if one_backward:
            self.optimizer.zero_grad_for_one_backward()
        else:
            self.optimizer.zero_grad()
        step = self.steps_taken if step is None else step
        self.steps_taken = step + 1
        masks = self.dropout_masks.step(step) if self.dropout_masks else contextlib.nullcontext()
        with masks, self._shapes_explained(x):
            losses, metric_sums, replicas = self._forward_backward(x, y, denominator)
        if one_backward:
            self.optimizer.gradients_done()
        if self._collectives is not None:  # else one device in one process: nothing to sum
            self._collectives.sync_gradients(model)
        loss_sum = sum(float(b.to_numpy(v)) for v in losses)
        held = self.metrics_every > 1 and not any(isinstance(v, float) for v in metric_sums)
        summed = 0 if held else self._metric_total(metric_sums, self._counts(y))
        total = len(x)
        if b.world_size > 1:  # report the global batch, as one process would
            asks = [float(stop_signal == signal.SIGTERM), float(stop_signal == signal.SIGINT)]
            loss_sum, all_summed, all_total, terms, ints = self._sum_numbers(
                [loss_sum, summed, len(x), *asks]
            )
            summed = round(all_summed) if self._counts(y) else all_summed
            total = round(all_total)
            stop_signal = signal.SIGTERM if terms else signal.SIGINT if ints else 0
        finite = bool(np.isfinite(loss_sum))
        if held and finite:  # a step without a finite loss counts nothing (EpochProgress)
            self._hold(metric_sums, replicas, total)
            if self._held_steps >= self.metrics_every or self._held_samples >= EXACT_COUNT_SAMPLES:
                summed = self.read_metrics()
        if not finite and mp.scaler is None:
            # no update from a non-finite loss: the weights stay the last good ones, so the
            # trainer can find the first layer that goes non-finite on this very batch
            return StepResult(loss_sum, summed, total, skipped=True, stop_signal=stop_signal)
        skipped = not mp.unscale(model)
        if not skipped:
            self.clip_gradients()
            self.optimizer.step()
        return StepResult(loss_sum, summed, total, skipped, stop_signal)

    def _hold(self, counts: list[Any], replicas: list[int], samples: int) -> None:
        """Add a step's per-shard counts to the device sums, one per replica."""
        for i, count in zip(replicas, counts, strict=True):
            held = self._held.setdefault(i, [])
            held.append(count)
            if len(held) >= HELD_COUNTS:
                held[:] = [self.backend.sum_counts(held)]
        self._held_steps += 1
        self._held_samples += samples

    def read_metrics(self) -> int:
        """The accuracy count held on the device since the last read, summed over every
        process (one host read per replica; 0 and no read when nothing is held). Every
        process must call it at the same step: the sum is a collective."""
        if not self._held_steps:
            return 0
        sums = [self.backend.sum_counts(held) for held in self._held.values()]
        count = self._metric_total(sums, counts=True)
        self._held, self._held_steps, self._held_samples = {}, 0, 0
        if self.backend.world_size > 1:
            (count,) = self._sum_numbers([count])
        return round(count)

    def _forward_backward(
        self, x: np.ndarray, y: np.ndarray, denominator: int
    ) -> tuple[list[Any], list[Any], list[int]]:
        """Forward and backward of every micro-batch on every replica, in that order; the
        per-shard summed losses, metric sums and replica indices."""
        b, model, mp = self.backend, self.model, self.mixed_precision
        losses: list[Any] = []
        metric_sums: list[Any] = []
        replicas: list[int] = []
        count = self.metric.name == "accuracy" and y.ndim == 1  # by the count_correct verb
        for lo, hi in shard_bounds(len(x), self.accumulate, what="micro-batches"):
            xs = b.split_and_load(x[lo:hi], model.devices)
            ys = b.split_and_load(y[lo:hi], model.devices)
            shards = b.loss_and_gradients(
                model, xs, ys, loss=self.loss, denominator=denominator,
                loss_scale=mp.loss_scale, count_correct=count, autocast=mp.autocast,
            )  # fmt: skip
            for i, (shard, yi) in enumerate(zip(shards, ys, strict=True)):
                losses.append(shard.loss)
                metric_sums.append(shard.correct if count else self._metric(shard.outputs, yi))
                replicas.append(i)
        return losses, metric_sums, replicas

    def _metric(self, outputs: Any, targets: Any) -> Any:
        """The metric's sum over a shard: accuracy of class rows by the backend's verb (no
        copy of the outputs), the others (and sequence targets, where a sample counts the
        share of its positions hit) by the numpy definition of :mod:`polytrain.neutral.losses`."""
        b = self.backend
        if self.metric.name == "accuracy" and len(targets.shape) == 1:
            return b.count_correct(outputs, targets)
        return metric_sum(self.metric, b.to_numpy(outputs), b.to_numpy(targets))

    def _counts(self, y: np.ndarray) -> bool:
        """Whether the metric's sum over ``y``'s samples is a whole count (class labels
        [N]; sequence targets [N, T] sum shares of positions)."""
        return self.metric.counts and y.ndim == 1

    def _metric_total(self, sums: list[Any], counts: bool) -> float:
        values = [v if isinstance(v, float) else float(self.backend.to_numpy(v)) for v in sums]
        return round(sum(values)) if counts else sum(values)

    def clip_gradients(self) -> None:
        """Clip the summed gradients, as PyTorch's clip_grad_value_ then clip_grad_norm_:
        each element to [-v, v]; then every gradient times ``clip_grad_norm / (norm + 1e-6)``
        of the global L2 norm, where that is below 1. A non-finite norm leaves the gradients
        as they are (the health check reports the step)."""
        b, model = self.backend, self.model
        if self.clip_grad_value is not None:
            b.clip_gradients(model, self.clip_grad_value)
        if self.clip_grad_norm is not None:
            norm = b.grad_norm(model)
            coef = self.clip_grad_norm / (norm + CLIP_EPS)
            if math.isfinite(norm) and coef < 1:
                b.scale_gradients(model, coef)

    def eval_batch(self, x: np.ndarray, y: np.ndarray) -> tuple[float, int]:
        """(the metric's sum, samples) of one evaluation batch, split over the devices."""
        total, _, n = self._evaluate(x, y, cross_entropy=False)
        return total, n

    def eval_batch_tokens(self, x: np.ndarray, y: np.ndarray) -> tuple[float, float, int]:
        """(the metric's sum, the sum of the samples' plain cross-entropy, samples) of one
        evaluation batch of class targets: with sequence targets [N, T] the loss sum over
        the samples is that of their mean token cross-entropy (the perplexity's exponent)."""
        return self._evaluate(x, y, cross_entropy=True)

    def _evaluate(
        self, x: np.ndarray, y: np.ndarray, *, cross_entropy: bool
    ) -> tuple[float, float, int]:
        b, model = self.backend, self.model
        x = self._cast(x)
        n = min(len(x), model.num_devices)
        devices = model.devices[:n]
        xs, ys = b.split_and_load(x, devices), b.split_and_load(y, devices)
        counts, losses = [], []
        with self.mixed_precision.autocast(), self._shapes_explained(x):
            for i, (xi, yi) in enumerate(zip(xs, ys, strict=True)):
                outputs = b.forward(model, xi, replica=i, train=False)
                counts.append(self._metric(outputs, yi))
                if cross_entropy:
                    losses.append(float(b.to_numpy(b.loss(outputs, yi, LossSpec(), "sum"))))
        return self._metric_total(counts, self._counts(y)), sum(losses), len(x)

    def predict(self, x: np.ndarray) -> np.ndarray:
        """Eval-mode logits of replica 0 as numpy."""
        b = self.backend
        x = self._cast(x)
        with self._shapes_explained(x):
            return b.to_numpy(b.forward(self.model, b.to_tensor(x, self.model.devices[0])))
