"""The recipe loop: data, model, optimizer and events, using only Backend calls.

``train(recipe, backend="torch")`` trains, evaluates every epoch, calls the
training-event hooks (progress bar, JSON-lines metrics, user plugins) and returns a
:class:`~polytrain.plugins.records.Summary`. No framework code lives here; the Trainer
composes its collaborators: :mod:`~polytrain.training.options` (how it runs),
:mod:`~polytrain.training.data` (the splits), :mod:`~polytrain.training.run_folder` (the
output folder's lock, the stop signals), :mod:`~polytrain.training.checkpointing` (save,
restore, keep), :mod:`~polytrain.training.evaluation`, :mod:`~polytrain.training.health`.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from pathlib import Path
from typing import Any

import numpy as np

from polytrain.backend.base import Backend
from polytrain.backend.collectives import Collectives, leave_processes
from polytrain.data import ArrayDataset
from polytrain.distributed.cluster import resolve as resolve_cluster
from polytrain.distributed.watchdog import Watchdog
from polytrain.io.checkpoint import Checkpoint, find_checkpoint, load_checkpoint
from polytrain.neutral.models import ModelSpec
from polytrain.plugins.control import TrainControl
from polytrain.plugins.guard import GuardedHooks
from polytrain.plugins.records import EpochRecord, RunInfo, Summary
from polytrain.plugins.registry import cluster_environments
from polytrain.training.build import describe_run, make_backend, make_loader, make_step_runner
from polytrain.training.checkpointing import RunCheckpoints, model_spec_for
from polytrain.training.data import Datasets, as_datasets, cut_datasets, load_datasets
from polytrain.training.evaluation import evaluate_epoch, evaluate_split, first_problem
from polytrain.training.events import event_plugins, register_plugin
from polytrain.training.health import RunHealth
from polytrain.training.inspection import StepInspector
from polytrain.training.native_model import RunModel
from polytrain.training.options import TrainerOptions
from polytrain.training.position import EpochProgress, RunPosition, perplexity
from polytrain.training.recipe import Recipe
from polytrain.training.run_folder import RunFolder, StopRequest
from polytrain.training.step import StepResult
from polytrain.training.trackers import tracker_names

__all__ = [  # the names other modules import from here (some moved to their own rooms)
    "Datasets",
    "EpochProgress",
    "Trainer",
    "TrainerOptions",
    "as_datasets",
    "cut_datasets",
    "load_datasets",
    "model_spec_for",
    "perplexity",
    "register_plugin",
    "train",
]


class Trainer:
    """One training run of a recipe on one backend.

    The keywords are the fields of :class:`~polytrain.training.options.TrainerOptions`
    (``out_dir``, ``plugins``, ``datasets``, ``resume``, ``log``, ...); ``options=`` takes
    them as one object, and keywords given beside it replace its fields."""

    def __init__(
        self,
        recipe: Recipe,
        backend: Backend | str | None = None,
        options: TrainerOptions | None = None,
        **settings: Any,
    ) -> None:
        self.recipe = recipe
        self.options = dataclasses.replace(options or TrainerOptions(), **settings)
        self.health = RunHealth(self.options.max_skipped, self.options.max_loss_growth)
        self.cluster = self.options.cluster_info or resolve_cluster(
            environments=cluster_environments()
        )
        tracker_names(self.options.log)  # an unknown --log name fails before any work
        self.folder = RunFolder(recipe, self.options, self.cluster.rank)  # before any work
        self.out_dir = self.folder.path
        self.stop = StopRequest()
        try:
            self._build(backend)
        except BaseException:
            self.folder.release()
            raise

    def _build(self, backend: Backend | str | None) -> None:
        recipe = self.recipe
        self.backend = make_backend(backend, recipe, self.options, self.cluster.local_world_size)
        self.source = RunModel.resolve(recipe, self.backend, self.options, self.cluster)
        self.spec: ModelSpec | None = self.source.spec  # None: the user's native model
        self.data = self.source.datasets(self.options.datasets, recipe)
        self.pm = event_plugins(recipe, self.options, self.out_dir)
        self.position = RunPosition()
        self.control = TrainControl(
            lambda: self.backend.get_params(self.model), lambda: self.position.history
        )
        self.hooks = GuardedHooks(
            self.pm,
            lambda: f"at global step {self.position.global_step}",
            lambda: self.checkpoints.intact(),
        )
        self.devices = self.backend.devices(recipe.devices, cluster=self.cluster)  # gpu: rank's
        self.watchdog: Watchdog | None = None
        self.header: RunInfo | None = None  # the run_info() of fit(), once it started
        if self.cluster.is_distributed:
            job = f"a distributed job ({self.cluster.world_size} processes)"
            collectives = Collectives.required(self.backend, job)
            collectives.init_distributed(self.cluster, self.devices, self.options.timeout)
        try:  # a rank that fails after joining must leave, or its peers wait for it
            self._build_training(auto_compile=not isinstance(backend, Backend))
        except BaseException:
            leave_processes(self.backend)
            raise

    def _build_training(self, *, auto_compile: bool) -> None:
        """The loader, the compile choice (automatic for a backend built here; a backend
        object passed in keeps its own ``fast``), model, optimizer, step runner, schedule
        and checkpoints; then the resumed state."""
        recipe, backend, options = self.recipe, self.backend, self.options
        self.loader = make_loader(self.data.train, recipe, backend)
        self.compile_choice = self.source.compile_choice(
            backend, recipe, len(self.loader), options, auto=auto_compile
        )
        self.model = self.source.build(backend, self.devices, recipe)
        self.optimizer = backend.make_optimizer(self.model, recipe.optimizer_config())
        self.runner = make_step_runner(backend, self.model, self.optimizer, recipe, options)
        self.source.check_fits(recipe, backend, self.model, self.runner, self.data)
        self.schedule = recipe.lr_schedule().resolve(recipe.total_steps(len(self.loader)))
        self.inspector = StepInspector(options.inspect, backend, self.model, self.devices[0])
        self.checkpoints = RunCheckpoints(self, self.out_dir, options.keep_checkpoints)
        if options.resume is not None:
            self.restore(load_checkpoint(find_checkpoint(options.resume), spec=self.spec))

    @property
    def epoch(self) -> int:
        """The epoch in progress (0-based): the number of epochs finished."""
        return self.position.epoch

    @property
    def history(self) -> list[EpochRecord]:
        return self.position.history

    # -- run --------------------------------------------------------------------------------

    def run_info(self) -> RunInfo:
        """What the run is: its header and the first record of the metrics file."""
        return describe_run(self.recipe, self.backend, self.model, self.devices,
                            steps_per_epoch=len(self.loader), choice=self.compile_choice,
                            out_dir=self.out_dir, start_epoch=self.position.epoch,
                            start_step=self.position.partial.step,
                            start_global_step=self.position.global_step,
                            data=self.data)  # fmt: skip

    def fit(self) -> Summary:
        """Train the remaining epochs of the recipe; evaluate after each.

        SIGINT/SIGTERM stop the run at the next step boundary with a checkpoint saved
        (when there is an output directory); the summary then says ``interrupted``."""
        if self.backend.world_size > 1:
            self.watchdog = Watchdog(self.options.timeout, rank=self.backend.rank).start()
        try:
            with self.folder.output_errors(self.checkpoints.resume_hint), self.stop.caught():
                return self._fit()
        finally:
            leave_job(self.backend, self.watchdog)
            self.folder.release()

    def _fit(self) -> Summary:
        run = self.header = self.run_info()
        self.hooks.polytrain_train_start(run=run, control=self.control)
        start = time.perf_counter()
        stop_reason = "completed"
        try:
            stop_reason = self._train_epochs(run)
            if not stop_reason.startswith("interrupted"):
                self.checkpoints.check_ending()
        except BaseException as exc:
            stop_reason = f"failed: {type(exc).__name__}"
            raise
        finally:
            seconds = time.perf_counter() - start
            summary = self.position.summary(seconds, stop_reason, self.checkpoints.last)
            self.hooks.polytrain_train_end(run=run, summary=summary, control=self.control)
        return summary

    def _train_epochs(self, run: RunInfo) -> str:
        """Train the epochs left; the stop reason (completed, a plugin's, a signal's)."""
        control = self.control
        while self.position.epoch < self.recipe.epochs and not control.stop_requested:
            record = self.train_epoch(run)
            if record is None:
                return self.stop.reason()
            self.position.finish_epoch(record)
            # the hooks first: the epoch's record is written and a plugin's lr is in the
            # checkpoint, so a resume from it neither loses the one nor the other
            self.hooks.polytrain_epoch_end(run=run, epoch=record, control=control)
            self.save_checkpoint()
            self.checkpoints.keep_marked()
        return "completed" if control.stop_reason is None else control.stop_reason

    def train_epoch(self, run: RunInfo) -> EpochRecord | None:
        """Train (the rest of) the current epoch and evaluate; None if a signal stopped it."""
        position, progress, max_steps = self.position, self.position.partial, self.recipe.max_steps
        sizes = self.loader.global_batch_sizes(position.epoch)
        self.backend.synchronize()
        started = time.perf_counter()
        with self.loader.epoch(position.epoch, start_step=progress.step) as batches:
            for step, (x, y) in enumerate(batches, start=progress.step):
                if max_steps is not None and step >= max_steps:
                    break
                result = self._train_step(run, step, x, y, sizes[step])
                # several processes stop at the step they agreed on (a peer would hang)
                stop = result.stop_signal if self.backend.world_size > 1 else self.stop.signal
                if stop:
                    self.stop.signal = stop
                    progress.seconds += time.perf_counter() - started
                    self.save_checkpoint()
                    return None
                every = self.options.checkpoint_every
                if every and position.global_step % every == 0:
                    self.save_checkpoint()
                if self.control.stop_requested:  # a clean stop: this epoch ends here
                    break
        self.backend.synchronize()
        progress.seconds += time.perf_counter() - started
        return self._end_epoch()

    def _train_step(
        self, run: RunInfo, step: int, x: np.ndarray, y: np.ndarray, global_count: int
    ) -> StepResult:
        """One optimizer step, judged by the run's health, then the step-end hook."""
        position, mixed = self.position, self.runner.mixed_precision
        outputs = self.inspector.before_step(position.global_step + 1, x)
        lr = self.control.lr  # backends apply changes only; a plugin's lr replaces the schedule's
        self.optimizer.set_lr(
            self.schedule.lr_at(position.global_step, self.recipe.lr) if lr is None else lr
        )
        result = self.runner.train_step(
            x, y, global_count=global_count, stop_signal=self.stop.number,
            step=position.global_step,
        )  # fmt: skip
        loss = result.loss_sum / result.samples
        scaled = mixed.scaler is not None
        if problem := self.health.observe(position.global_step + 1, loss, result.skipped, scaled):
            layers = functools.partial(self.inspector.layer_outputs, x)
            self.checkpoints.stop_unhealthy(problem, step, loss, result.skipped, layers)
        self._progress(f"epoch {position.epoch + 1} step {step + 1}")
        position.partial.add(result)
        position.global_step += 1
        extra = mixed.step_extra(result.skipped)
        if outputs is not None:
            extra["inspect"] = self.inspector.record(outputs)
        grad_norm = self.backend.grad_norm(self.model) if self.recipe.grad_norm else None
        record = position.step_record(step, loss, self.optimizer.lr, result.samples, grad_norm)
        record.extra = extra
        self.hooks.polytrain_step_end(run=run, step=record, control=self.control)
        return result

    def _end_epoch(self) -> EpochRecord | None:
        """Evaluate the epoch and make its record; None when a stop signal cut the
        evaluation short (the checkpoint is saved, the stop's line says how much was
        evaluated); a non-finite evaluation stops the run."""
        self._read_metrics()
        recipe, epoch = self.recipe, self.position.epoch
        found = evaluate_epoch(
            self.runner, self.backend, self.data, recipe, stop=lambda: self.stop.number,
            progress=lambda: self._progress(f"evaluation of epoch {epoch + 1}"),
        )  # fmt: skip
        metric = recipe.metric_spec()
        if problem := first_problem(found, metric.label):
            self.checkpoints.stop_diverged(problem, self.checkpoints.state())
        if cut := next((e for e in found if e.stop_signal), None):
            self.stop.signal = cut.stop_signal  # every process: the evaluation agreed on it
            note = cut.partial_note(metric.label, metric.counts)
            self.stop.note = f" during the evaluation of epoch {epoch + 1}: {note}"
            self.save_checkpoint()
            return None
        tokens, plain = self.data.sequence_length(recipe), recipe.loss_spec().plain
        return self.position.partial.record(epoch, found, tokens, plain, metric.label)

    def _progress(self, where: str) -> None:
        if self.watchdog is not None:
            self.watchdog.feed(where)

    def _read_metrics(self) -> None:
        """Add the metric sums still held on the device to the epoch's (every process)."""
        self.position.partial.metric_sum += self.runner.read_metrics()

    # -- checkpoints (polytrain.training.checkpointing) ---------------------------------------

    def save_checkpoint(self) -> Path | None:
        """Save the whole training state (rank 0, when there is an output directory) once
        its tensors are found finite; every process calls it."""
        self._read_metrics()  # every process: the partial-epoch sums must be whole
        path = self.checkpoints.save_run()
        if path is not None and self.header is not None:
            self.hooks.polytrain_checkpoint_saved(
                run=self.header, path=str(path), global_step=self.position.global_step,
                control=self.control,
            )  # fmt: skip
        return path

    def restore(self, checkpoint: Checkpoint) -> None:
        """Continue from a checkpoint written by any backend, on any device count."""
        self.checkpoints.restore(checkpoint)

    def evaluate(self, dataset: ArrayDataset, batch_size: int = 1000) -> float:
        """Accuracy over every sample of ``dataset``: each process takes a contiguous
        share, correct counts and sample counts are summed (no padding, no duplicates)."""
        return evaluate_split(
            self.runner, self.backend, dataset, "test", batch_size=batch_size
        ).metric


def leave_job(backend: Backend, watchdog: Watchdog | None) -> None:
    """Leave the job under the watchdog: the engines' exit barriers (jax's shutdown,
    ps-lite's) wait for every peer, and one that died at the end would hold this process
    there (jax: 100 s, until its heartbeats time out; ps-lite: for ever)."""
    try:
        if watchdog is not None:
            watchdog.feed(f"{watchdog.where}, while leaving the job")
        leave_processes(backend)
    finally:
        if watchdog is not None:
            watchdog.stop()


def train(
    recipe: Recipe | None = None, backend: Backend | str | None = None, **kwargs: Any
) -> Summary:
    """Train ``recipe`` (default: the documented LeNet/Fashion-MNIST recipe) on ``backend``."""
    return Trainer(recipe or Recipe(), backend, **kwargs).fit()
