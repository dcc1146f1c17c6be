"""The recipe loop: data, model, optimizer and events, using only Backend calls.

``train(recipe, backend="torch")`` trains, evaluates every epoch, calls the
training-event hooks (progress bar, JSON-lines metrics, user plugins) and returns a
:class:`~polytrain.records.Summary`. No framework code lives here.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .backend import Backend, BackendOptions
from .builtin_plugins import JsonlLogger, ProgressBar
from .cluster import ClusterInfo
from .cluster import resolve as resolve_cluster
from .data import ArrayDataset, BatchLoader, load_dataset
from .errors import NonFiniteLossError
from .models import ModelSpec, get_model_spec
from .plugins import get_backend, make_plugin_manager
from .recipe import Recipe
from .records import EpochRecord, RunInfo, StepRecord, Summary
from .sharding import share_bounds
from .step import StepRunner
from .threads import resolve_threads
from .watchdog import Watchdog

METRICS_FILE = "metrics.jsonl"


@dataclass
class Datasets:
    train: ArrayDataset
    test: ArrayDataset | None
    val: ArrayDataset | None = None


def load_datasets(recipe: Recipe) -> Datasets:
    """Train/test (and validation) datasets of a recipe, cut to its sample limits."""
    train = load_dataset(recipe.dataset, "train", data_dir=recipe.data_dir)
    test = load_dataset(recipe.dataset, "test", data_dir=recipe.data_dir)
    val = None
    if recipe.val_split:
        train, val = train.split(recipe.val_split, seed=recipe.seed)
    if recipe.train_samples:
        train = train.subset(min(recipe.train_samples, len(train)))
    if recipe.test_samples:
        test = test.subset(min(recipe.test_samples, len(test)))
    return Datasets(train, test, val)


class Trainer:
    """One training run of a recipe on one backend."""

    def __init__(
        self,
        recipe: Recipe,
        backend: Backend | str | None = None,
        *,
        out_dir: str | Path | None = None,
        plugins: Iterable[object] = (),
        progress: bool | None = None,
        datasets: Datasets | None = None,
        threads: int | None = None,
        cluster_info: ClusterInfo | None = None,
        timeout: float = 120.0,
    ) -> None:
        self.recipe = recipe
        self.cluster = cluster_info or resolve_cluster()
        if not isinstance(backend, Backend):
            threads = resolve_threads(threads, self.cluster.local_world_size)
            backend = get_backend(backend, options=BackendOptions(threads=threads))
        self.backend = backend
        self.out_dir = Path(out_dir) if out_dir else None
        self.spec: ModelSpec = get_model_spec(recipe.model)
        self.data = datasets or load_datasets(recipe)
        self.pm = make_plugin_manager()  # hooks run on every rank; plugins check run.is_main
        self.pm.register(ProgressBar(progress), name="polytrain.progress")
        if self.out_dir is not None:
            self.pm.register(JsonlLogger(self.out_dir / METRICS_FILE), name="polytrain.metrics")
        for plugin in plugins:
            self.pm.register(plugin)

        b = self.backend
        self.devices = b.devices(recipe.devices)
        self.timeout = timeout
        self.watchdog: Watchdog | None = None
        if self.cluster.is_distributed:
            b.init_distributed(self.cluster, self.devices, timeout)
        self.model = b.build_model(self.spec, self.devices)
        b.set_params(self.model, self.spec.init_params(recipe.seed))
        b.seed(recipe.seed)
        self.optimizer = b.make_optimizer(self.model, recipe.optimizer_config())
        self.runner = StepRunner(
            b, self.model, self.optimizer, accumulate=recipe.accumulate, precision=recipe.precision
        )
        self.loader = BatchLoader(
            self.data.train,
            recipe.batch_size,
            seed=recipe.seed,
            drop_last=recipe.drop_last,
            rank=b.rank,
            world_size=b.world_size,
            prefetch=2,
        )
        self.epoch = 0
        self.global_step = 0
        self.history: list[EpochRecord] = []

    # -- run --------------------------------------------------------------------------------

    def run_info(self) -> RunInfo:
        r, b = self.recipe, self.backend
        steps = len(self.loader) if r.max_steps is None else min(r.max_steps, len(self.loader))
        per_device = -(-r.batch_size // (b.world_size * len(self.devices) * r.accumulate))
        return RunInfo(
            backend=b.name,
            framework_version=b.version(),
            model=r.model,
            dataset=r.dataset,
            devices=[b.device_name(d) for d in self.devices],
            epochs=r.epochs,
            steps_per_epoch=steps,
            global_batch=r.batch_size,
            per_device_batch=per_device,
            rank=b.rank,
            world_size=b.world_size,
            threads=b.threads(),
            recipe=r.to_dict(),
            out_dir=str(self.out_dir) if self.out_dir else None,
            start_epoch=self.epoch,
        )

    def fit(self) -> Summary:
        """Train the remaining epochs of the recipe; evaluate after each."""
        if self.backend.world_size > 1:
            self.watchdog = Watchdog(self.timeout).start()
        try:
            return self._fit()
        finally:
            if self.watchdog is not None:
                self.watchdog.stop()
            self.backend.shutdown_distributed()

    def _progress(self, where: str) -> None:
        if self.watchdog is not None:
            self.watchdog.feed(where)

    def _fit(self) -> Summary:
        run = self.run_info()
        hook = self.pm.hook
        hook.polytrain_train_start(run=run)
        start = time.perf_counter()
        try:
            while self.epoch < self.recipe.epochs:
                record = self.train_epoch(run)
                self.history.append(record)
                hook.polytrain_epoch_end(run=run, epoch=record)
                self.epoch += 1
        finally:
            summary = Summary(
                epochs=list(self.history),
                seconds=time.perf_counter() - start,
                final_step=self.global_step,
                peak_rss_mb=peak_rss_mb(),
            )
            hook.polytrain_train_end(run=run, summary=summary)
        return summary

    def train_epoch(self, run: RunInfo) -> EpochRecord:
        b, r = self.backend, self.recipe
        sizes = self.loader.global_batch_sizes(self.epoch)
        loss_sum, correct, seen, steps = 0.0, 0, 0, 0
        hook = self.pm.hook
        b.synchronize()
        t0 = time.perf_counter()
        with self.loader.epoch(self.epoch) as batches:
            for step, (x, y) in enumerate(batches):
                if r.max_steps is not None and step >= r.max_steps:
                    break
                result = self.runner.train_step(x, y, global_count=sizes[step])
                loss = result.loss_sum / result.samples
                if not np.isfinite(loss):
                    raise NonFiniteLossError(
                        f"The loss became {loss} at epoch {self.epoch + 1}, step {step + 1} "
                        f"(global step {self.global_step + 1}). Lower --lr, or check the data."
                    )
                self._progress(f"epoch {self.epoch + 1} step {step + 1}")
                loss_sum += result.loss_sum
                correct += result.correct
                seen += result.samples
                steps += 1
                self.global_step += 1
                grad_norm = b.grad_norm(self.model) if r.grad_norm else None
                hook.polytrain_step_end(
                    run=run,
                    step=StepRecord(
                        epoch=self.epoch,
                        step=step,
                        global_step=self.global_step,
                        loss=loss,
                        lr=self.optimizer.lr,
                        samples=result.samples,
                        grad_norm=grad_norm,
                    ),
                )
        b.synchronize()
        seconds = time.perf_counter() - t0
        test_acc = self.evaluate(self.data.test) if self.data.test is not None else None
        val_acc = self.evaluate(self.data.val) if self.data.val is not None else None
        return EpochRecord(
            epoch=self.epoch,
            train_loss=loss_sum / max(seen, 1),
            train_accuracy=correct / max(seen, 1),
            test_accuracy=test_acc,
            val_accuracy=val_acc,
            seconds=seconds,
            samples_per_second=seen / seconds if seconds else 0.0,
            steps=steps,
        )

    def evaluate(self, dataset: ArrayDataset, batch_size: int = 1000) -> float:
        """Accuracy over every sample of ``dataset``: each process takes a contiguous
        share, correct counts and sample counts are summed (no padding, no duplicates)."""
        b = self.backend
        n = len(dataset)
        lo, hi = share_bounds(n, b.world_size, b.rank)
        x, y = dataset.x, dataset.y
        correct = total = 0
        for start in range(lo, hi, batch_size):
            stop = min(start + batch_size, hi)
            c, m = self.runner.eval_batch(x[start:stop], y[start:stop])
            self._progress(f"evaluation of epoch {self.epoch + 1}")
            correct += c
            total += m
        all_correct, all_total = b.allreduce_numbers([correct, total])
        return all_correct / all_total if all_total else float("nan")


def peak_rss_mb() -> float | None:
    """Peak resident memory of this process in MiB (Linux/macOS), else None."""
    try:
        import resource
    except ImportError:  # pragma: no cover - Windows
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 1024 if sys.platform != "darwin" else peak / 2**20


def train(
    recipe: Recipe | None = None, backend: Backend | str | None = None, **kwargs: Any
) -> Summary:
    """Train ``recipe`` (default: the documented LeNet/Fashion-MNIST recipe) on ``backend``."""
    return Trainer(recipe or Recipe(), backend, **kwargs).fit()
