"""The recipe loop: data, model, optimizer and events, using only Backend calls.

``train(recipe, backend="torch")`` trains, evaluates every epoch, calls the
training-event hooks (progress bar, JSON-lines metrics, user plugins) and returns a
:class:`~polytrain.plugins.records.Summary`. No framework code lives here.
"""

from __future__ import annotations

import contextlib
import errno
import math
import signal
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import pluggy

from polytrain.backend.base import Backend, BackendOptions
from polytrain.backend.precision import param_dtype
from polytrain.data import ArrayDataset, BatchLoader, load_dataset
from polytrain.data.arrays import as_split, load_npz
from polytrain.distributed.cluster import ClusterInfo
from polytrain.distributed.cluster import resolve as resolve_cluster
from polytrain.distributed.watchdog import Watchdog
from polytrain.errors import (
    CheckpointError,
    ConfigError,
    DivergedError,
    NonFiniteLossError,
    OutputError,
    PolytrainError,
)
from polytrain.io.checkpoint import (
    Checkpoint,
    CheckpointManager,
    find_checkpoint,
    load_checkpoint,
    read_manifest,
)
from polytrain.io.run_dir import (
    CURVES_FILE,
    METRICS_FILE,
    RunDirLock,
    claim_run_dir,
    os_error_line,
    writable_dir,
)
from polytrain.neutral.losses import check_targets
from polytrain.neutral.models import ModelSpec
from polytrain.neutral.shape_check import sample_output_shape
from polytrain.neutral.spec_file import is_spec_reference, resolve_model_spec
from polytrain.plugins.control import TrainControl
from polytrain.plugins.guard import GuardedHooks
from polytrain.plugins.records import EpochRecord, RunInfo, StepRecord, Summary
from polytrain.plugins.registry import cluster_environments, get_backend, make_plugin_manager
from polytrain.training.builtin_plugins import JsonlLogger, ProgressBar
from polytrain.training.checkpointing import (
    RunCheckpoints,
    check_resumable,
    resumed_aside_warning,
    warn,
)
from polytrain.training.compile_decision import CompileChoice, RunPlan, choose_compile, model_work
from polytrain.training.curves import CurvesPlot
from polytrain.training.early_stopping import EarlyStopping
from polytrain.training.evaluation import Evaluation, eval_batch_size, evaluate_split
from polytrain.training.fit_checks import check_run_fits
from polytrain.training.health import (
    DEFAULT_MAX_LOSS_GROWTH,
    DEFAULT_MAX_SKIPPED,
    Problem,
    RunHealth,
    stop_line,
    tensor_problem,
)
from polytrain.training.inspection import first_nonfinite, inspect_record, parse_steps
from polytrain.training.pipeline import pipeline_backend
from polytrain.training.recipe import Recipe
from polytrain.training.step import DEFAULT_METRICS_EVERY, StepResult, StepRunner
from polytrain.training.trackers import make_trackers, tracker_names
from polytrain.utils.threads import resolve_threads

OUTPUT_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO}


@dataclass
class Datasets:
    train: ArrayDataset
    test: ArrayDataset | None
    val: ArrayDataset | None = None

    def origins(self) -> dict[str, dict[str, str]]:
        """Per split, the folder and files it was read from (for the run's records)."""
        parts = {"train": self.train, "test": self.test, "val": self.val}
        return {k: dict(d.origin) for k, d in parts.items() if d is not None and d.origin}


def load_datasets(recipe: Recipe, spec: ModelSpec | None = None) -> Datasets:
    """Train/test (and validation) datasets of a recipe, cut to its sample limits: the
    ``data`` .npz (checked against ``spec``, default the recipe's model), else the named
    dataset."""
    train: ArrayDataset
    test: ArrayDataset | None
    if recipe.data is not None:
        spec = spec or resolve_model_spec(recipe.model)
        splits = load_npz(recipe.data, spec, recipe.loss_spec(), recipe.metric_spec())
        train, test = splits["train"], splits.get("test")
    else:
        train = load_dataset(recipe.dataset, "train", data_dir=recipe.data_dir)
        test = load_dataset(recipe.dataset, "test", data_dir=recipe.data_dir)
    return cut_datasets(recipe, train, test)


def cut_datasets(recipe: Recipe, train: ArrayDataset, test: ArrayDataset | None) -> Datasets:
    """The recipe's validation split and sample limits applied."""
    val = None
    if recipe.val_split:
        train, val = train.split(recipe.val_split, seed=recipe.seed)
    if recipe.train_samples:
        train = train.subset(min(recipe.train_samples, len(train)))
    if recipe.test_samples and test is not None:
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
        datasets: Datasets | Mapping[str, Any] | Any = None,  # see as_datasets
        threads: int | None = None,
        cluster_info: ClusterInfo | None = None,
        timeout: float = 120.0,
        resume: str | Path | None = None,
        checkpoint_every: int | None = None,
        keep_checkpoints: int = 2,
        tensorboard: str | Path | None = None,
        log: str | Iterable[str] | None = None,
        fast: bool | None = None,
        inspect: str | None = None,
        overwrite: bool = False,
        max_skipped: float = DEFAULT_MAX_SKIPPED,
        max_loss_growth: float = DEFAULT_MAX_LOSS_GROWTH,
        metrics_every: int = DEFAULT_METRICS_EVERY,
    ) -> None:
        self.recipe = recipe
        self.metrics_every = metrics_every  # steps between host reads of the accuracy count
        self.health = RunHealth(max_skipped, max_loss_growth)  # checks its limits first
        self.cluster = cluster_info or resolve_cluster(environments=cluster_environments())
        self._run_dir_lock: RunDirLock | None = None
        tracker_names(log)  # an unknown --log name fails before any work
        if self.cluster.rank == 0:  # before any work: rank 0 writes the run's files
            if tensorboard is not None:
                writable_dir(tensorboard, "--tensorboard")
            if out_dir:
                self._run_dir_lock = claim_run_dir(
                    out_dir,
                    resume=resume,
                    overwrite=overwrite,
                    inputs={"--data": recipe.data, "--data-dir": recipe.data_dir},
                )
        try:
            self._build(
                backend,
                out_dir=out_dir,
                plugins=plugins,
                progress=progress,
                datasets=datasets,
                threads=threads,
                timeout=timeout,
                resume=resume,
                checkpoint_every=checkpoint_every,
                keep_checkpoints=keep_checkpoints,
                tensorboard=tensorboard,
                log=log,
                fast=fast,
                inspect=inspect,
            )
        except BaseException:
            self._release_run_dir()
            raise

    def _release_run_dir(self) -> None:
        if self._run_dir_lock is not None:
            self._run_dir_lock.release()
            self._run_dir_lock = None

    def _build(
        self,
        backend: Backend | str | None,
        *,
        out_dir: str | Path | None,
        plugins: Iterable[object],
        progress: bool | None,
        datasets: Datasets | Mapping[str, Any] | Any,
        threads: int | None,
        timeout: float,
        resume: str | Path | None,
        checkpoint_every: int | None,
        keep_checkpoints: int,
        tensorboard: str | Path | None,
        log: str | Iterable[str] | None,
        fast: bool | None,
        inspect: str | None,
    ) -> None:
        recipe = self.recipe
        own_backend = not isinstance(backend, Backend)  # built here: fast=None is automatic
        if not isinstance(backend, Backend):
            if threads is not None or self.cluster.local_world_size > 1:
                threads = resolve_threads(threads, self.cluster.local_world_size)
            # else None: the backend's own default (polytrain.utils.threads, docs/performance.md)
            options = BackendOptions(threads=threads, fast=fast, precision=recipe.precision)
            backend = get_backend(backend, options=options)
        if recipe.pipeline_split:  # models become two stages on devices[0] and devices[1]
            backend = pipeline_backend(backend, recipe.pipeline_split)
        self.backend = backend
        self.out_dir = Path(out_dir) if out_dir else None
        self.spec: ModelSpec = model_spec_for(recipe, resume)
        self.data = as_datasets(datasets, recipe, self.spec)
        check_run_fits(recipe, self.spec, self.data.train)
        self.pm = make_plugin_manager()  # hooks run on every rank; plugins check run.is_main
        self.pm.register(ProgressBar(progress), name="polytrain.progress")
        if self.out_dir is not None:
            self.pm.register(JsonlLogger(self.out_dir / METRICS_FILE), name="polytrain.metrics")
            self.pm.register(
                CurvesPlot(self.out_dir / CURVES_FILE), name="polytrain.training.curves"
            )
        for name, tracker in make_trackers(log, out_dir, tensorboard).items():  # --log
            self.pm.register(tracker, name=f"polytrain.{name}")
        if recipe.early_stop:
            metric = recipe.metric_spec()
            early = EarlyStopping(
                recipe.early_stop,
                lower_is_better=metric.name == "mse",  # the one error metric; the rest are rates
                label=metric.label,
            )
            self.pm.register(early, name="polytrain.early_stop")
        for plugin in plugins:
            register_plugin(self.pm, plugin)
        self.control = TrainControl(
            lambda: self.backend.get_params(self.model), lambda: self.history
        )
        self.hooks = GuardedHooks(
            self.pm, lambda: f"at global step {self.global_step}", lambda: self.checkpoints.intact()
        )

        b = self.backend
        self.devices = b.devices(recipe.devices, cluster=self.cluster)  # gpu: this rank's
        self.timeout = timeout
        self.watchdog: Watchdog | None = None
        if self.cluster.is_distributed:
            b.init_distributed(self.cluster, self.devices, timeout)
        try:  # a rank that fails after joining must leave, or its peers wait for it
            self.loader = BatchLoader(
                self.data.train,
                recipe.batch_size,
                seed=recipe.seed,
                drop_last=recipe.drop_last,
                rank=b.rank,
                world_size=b.world_size,
                prefetch=2,
            )
            self.compile_choice = self._choose_compile(fast, auto=own_backend, inspect=inspect)
            self.model = b.build_model(self.spec, self.devices, dtype=param_dtype(recipe.precision))
            b.set_params(self.model, self.spec.init_params(recipe.seed))
            b.seed(recipe.seed)
            self.optimizer = b.make_optimizer(self.model, recipe.optimizer_config())
            self.runner = StepRunner(
                b,
                self.model,
                self.optimizer,
                accumulate=recipe.accumulate,
                precision=recipe.precision,
                loss=recipe.loss_spec(),
                metric=recipe.metric_spec(),
                clip_grad_norm=recipe.clip_grad_norm,
                clip_grad_value=recipe.clip_grad_value,
                dropout_masks=recipe.parity_masks(b.rank),
                metrics_every=self.metrics_every,
            )
            self.schedule = recipe.lr_schedule().resolve(recipe.total_steps(len(self.loader)))
            self.epoch = 0
            self.global_step = 0
            self.history: list[EpochRecord] = []
            self.partial = EpochProgress()
            self.checkpoint_every = checkpoint_every
            self.inspect_step = parse_steps(inspect)
            manager = None
            if self.out_dir is not None and b.rank == 0:
                manager = CheckpointManager(self.out_dir, keep=keep_checkpoints)
            self.checkpoints = RunCheckpoints(manager, self.health, self.out_dir)
            self._stop_signal: int | None = None
            self._stop_note = ""  # where a stop signal was honoured, when not between steps
            if resume is not None:
                self.restore(load_checkpoint(find_checkpoint(resume), spec=self.spec))
        except BaseException:
            b.shutdown_distributed()
            raise

    def _choose_compile(
        self, fast: bool | None, *, auto: bool, inspect: str | None
    ) -> CompileChoice:
        """--fast/--no-fast, or the automatic choice for a backend built here; a backend
        object passed in keeps its own ``fast``."""
        r, b = self.recipe, self.backend
        if not auto:
            return CompileChoice(b.fast, "set on the backend object")
        per_process = -(-r.batch_size // b.world_size)
        plan = RunPlan(
            planned_steps=r.total_steps(len(self.loader)),
            batch_per_process=per_process,
            precision=r.precision,
            processes=b.world_size,
            inspect=inspect is not None,
            pipeline=bool(r.pipeline_split),
            **model_work(self.spec),
        )
        shape = (per_process, *self.spec.input_shape)
        dtype = param_dtype(r.precision)
        choice = choose_compile(b, fast, plan, self.spec.to_dict(), dtype, shape)
        b.options.fast = choice.fast
        b.options.compile_fingerprint = choice.fingerprint
        return choice

    # -- run --------------------------------------------------------------------------------

    def run_info(self) -> RunInfo:
        r, b = self.recipe, self.backend
        steps = len(self.loader) if r.max_steps is None else min(r.max_steps, len(self.loader))
        per_device = -(-r.batch_size // (b.world_size * self.model.num_devices * r.accumulate))
        return RunInfo(
            backend=b.name,
            framework_version=b.version(),
            model=r.model_name,
            dataset=r.data or r.dataset,
            devices=[b.device_name(d) for d in self.devices],
            epochs=r.epochs,
            steps_per_epoch=steps,
            global_batch=r.batch_size,
            per_device_batch=per_device,
            rank=b.rank,
            world_size=b.world_size,
            threads=b.threads(),
            fast=b.fast,
            fast_reason=self.compile_choice.reason,
            recipe=r.to_dict(),
            out_dir=str(self.out_dir) if self.out_dir else None,
            start_epoch=self.epoch,
            data=self.data.origins(),
        )

    def fit(self) -> Summary:
        """Train the remaining epochs of the recipe; evaluate after each.

        SIGINT/SIGTERM stop the run at the next step boundary with a checkpoint saved
        (when there is an output directory); the summary then says ``interrupted``."""
        if self.backend.world_size > 1:
            self.watchdog = Watchdog(self.timeout, rank=self.backend.rank).start()
        try:
            with self._stop_on_signals():
                return self._fit()
        except OSError as exc:
            if exc.filename is None and exc.errno not in OUTPUT_ERRNOS:
                raise
            raise OutputError(
                os_error_line(exc, self.checkpoints.resume_hint(), self.out_dir)
            ) from exc
        finally:
            if self.watchdog is not None:
                self.watchdog.stop()
            self.backend.shutdown_distributed()
            self._release_run_dir()

    @contextlib.contextmanager
    def _stop_on_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def request_stop(signum: int, _frame: object) -> None:
            self._stop_signal = signum
            for sig in STOP_SIGNALS:  # a second signal acts at once
                signal.signal(sig, previous[sig])

        previous = {sig: signal.signal(sig, request_stop) for sig in STOP_SIGNALS}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _progress(self, where: str) -> None:
        if self.watchdog is not None:
            self.watchdog.feed(where)

    def _fit(self) -> Summary:
        run = self.run_info()
        hook = self.hooks
        control = self.control
        hook.polytrain_train_start(run=run, control=control)
        start = time.perf_counter()
        stop_reason = "completed"
        try:
            while self.epoch < self.recipe.epochs and not control.stop_requested:
                record = self.train_epoch(run)
                if record is None:
                    name = signal.Signals(self._stop_signal or 2).name
                    stop_reason = f"interrupted by {name}{self._stop_note}"
                    break
                self.history.append(record)
                self.epoch += 1
                self.partial = EpochProgress()
                self.save_checkpoint()
                hook.polytrain_epoch_end(run=run, epoch=record, control=control)
                self._keep_marked()
            if control.stop_reason is not None and stop_reason == "completed":
                stop_reason = control.stop_reason  # a plugin's clean stop
            ended = not stop_reason.startswith("interrupted")  # completed or early stop
            if ended and self.out_dir is None:  # no checkpoint judged the last update
                self._judge_state(None)
            if ended and (problem := self.health.skipped_problem()):
                raise DivergedError(
                    f"The run ended, but {problem.reason}. Use --precision bf16 or fp32, or lower "
                    f"--lr. Skipped steps change no weights: the checkpoints are kept."
                )
        except BaseException as exc:
            stop_reason = f"failed: {type(exc).__name__}"
            raise
        finally:
            summary = Summary(
                epochs=list(self.history),
                seconds=time.perf_counter() - start,
                interrupted=stop_reason.startswith("interrupted"),
                checkpoint=str(self.checkpoints.last) if self.checkpoints.last else None,
                final_step=self.global_step,
                stop_reason=stop_reason,
                peak_rss_mb=peak_rss_mb(),
            )
            hook.polytrain_train_end(run=run, summary=summary, control=control)
        return summary

    def train_epoch(self, run: RunInfo) -> EpochRecord | None:
        """Train (the rest of) the current epoch and evaluate; None if a signal stopped it."""
        b, r, p = self.backend, self.recipe, self.partial
        sizes = self.loader.global_batch_sizes(self.epoch)
        hook = self.hooks
        b.synchronize()
        t0 = time.perf_counter()
        with self.loader.epoch(self.epoch, start_step=p.step) as batches:
            for step, (x, y) in enumerate(batches, start=p.step):
                if r.max_steps is not None and step >= r.max_steps:
                    break
                inspecting = self.inspect_step is not None and self.inspect_step(
                    self.global_step + 1
                )
                outputs = self._layer_outputs(x) if inspecting else []
                # backends apply changes only; a plugin's lr replaces the schedule's
                lr = self.control.lr
                self.optimizer.set_lr(
                    self.schedule.lr_at(self.global_step, r.lr) if lr is None else lr
                )
                result = self.runner.train_step(
                    x, y, global_count=sizes[step], stop_signal=self._stop_signal or 0,
                    step=self.global_step,
                )  # fmt: skip
                loss = result.loss_sum / result.samples
                scaled = self.runner.mixed_precision.scaler is not None
                problem = self.health.observe(self.global_step + 1, loss, result.skipped, scaled)
                if problem is not None:
                    self._unhealthy(problem, loss, step, x, applied=not result.skipped)
                self._progress(f"epoch {self.epoch + 1} step {step + 1}")
                p.add(result)
                self.global_step += 1
                grad_norm = b.grad_norm(self.model) if r.grad_norm else None
                extra = self.runner.mixed_precision.step_extra(result.skipped)
                if inspecting:  # gradients of this step are still in place
                    extra["inspect"] = inspect_record(outputs, b.gradients(self.model))
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
                        extra=extra,
                    ),
                    control=self.control,
                )
                # several processes stop at the step they agreed on (a peer would hang)
                stop = result.stop_signal if b.world_size > 1 else self._stop_signal
                if stop:
                    self._stop_signal = stop
                    p.seconds += time.perf_counter() - t0
                    self.save_checkpoint()
                    return None
                if self.checkpoint_every and self.global_step % self.checkpoint_every == 0:
                    self.save_checkpoint()
                if self.control.stop_requested:  # a clean stop: this epoch ends here
                    break
        b.synchronize()
        p.seconds += time.perf_counter() - t0
        self._read_metrics()
        test = self._evaluate(self.data.test, "test")
        val = None if test and test.stop_signal else self._evaluate(self.data.val, "validation")
        if self._evaluation_stopped(test, val):
            return None
        train_loss = p.loss_sum / max(p.seen, 1)
        tokens = self._sequence_targets()
        return EpochRecord(
            epoch=self.epoch,
            train_loss=train_loss,
            train_accuracy=p.correct / max(p.seen, 1),
            test_accuracy=test.metric if test else None,
            val_accuracy=val.metric if val else None,
            seconds=p.seconds,
            samples_per_second=p.seen / p.seconds if p.seconds else 0.0,
            steps=p.step,
            train_perplexity=perplexity(train_loss) if tokens and r.loss_spec().plain else None,
            test_perplexity=perplexity(test.mean_loss) if tokens and test else None,
            tokens_per_second=tokens * p.seen / p.seconds if tokens and p.seconds else None,
        )

    def _sequence_targets(self) -> int:
        """Positions per sample of sequence targets ([N, T] class labels: T), else 0."""
        y = self.data.train.y
        return int(y.shape[1]) if self.recipe.loss_spec().class_targets and y.ndim == 2 else 0

    def _evaluate(self, dataset: ArrayDataset | None, split: str) -> Evaluation | None:
        """``dataset`` evaluated until a stop signal; a non-finite result stops the run."""
        if dataset is None:
            return None
        found = evaluate_split(
            self.runner, self.backend, dataset, split, tokens=bool(self._sequence_targets()),
            stop=lambda: self._stop_signal or 0,
            progress=lambda: self._progress(f"evaluation of epoch {self.epoch + 1}"),
            batch_size=eval_batch_size(self.recipe.batch_size, self.backend.world_size),
        )  # fmt: skip
        if problem := found.problem(self.recipe.metric_spec().label):
            self._diverged(problem, self._state())
        return found

    def _evaluation_stopped(self, *evaluations: Evaluation | None) -> bool:
        """Whether a stop signal cut an evaluation short: then the checkpoint is saved and
        the stop's line will say how much was evaluated."""
        cut = next((e for e in evaluations if e is not None and e.stop_signal), None)
        if cut is None:
            return False
        metric = self.recipe.metric_spec()
        self._stop_signal = cut.stop_signal  # every process: the evaluation agreed on it
        note = cut.partial_note(metric.label, metric.counts)
        self._stop_note = f" during the evaluation of epoch {self.epoch + 1}: {note}"
        self.save_checkpoint()
        return True

    def _unhealthy(
        self, problem: Problem, loss: float, step: int, x: np.ndarray, *, applied: bool
    ) -> NoReturn:
        """Stop with the step, the reason and the last good checkpoint (see
        :mod:`polytrain.training.health`); checkpoints after it are set aside."""
        at = f"at epoch {self.epoch + 1}, step {step + 1} (global step {self.global_step + 1})"
        kept = self.checkpoints.set_aside(None)
        layer = None
        if problem.non_finite:
            with contextlib.suppress(PolytrainError):  # a backend without per-layer outputs
                layer = first_nonfinite(self._layer_outputs(x))
        line = stop_line(problem, at, kept, loss=loss, applied=applied, layer=layer)
        raise (NonFiniteLossError if problem.non_finite else DivergedError)(line)

    def _diverged(self, problem: Problem, state: dict[str, Any] | None) -> NoReturn:
        """Stop on a state no run may resume from (its tensors or its evaluation are not
        finite): ``state`` goes to ``checkpoints/diverged/``, ``latest`` to the last good."""
        epoch = self.epoch + (1 if self.partial.step else 0)
        kept = self.checkpoints.set_aside(state)
        raise NonFiniteLossError(
            f"Training stopped after global step {self.global_step} (epoch {epoch}): "
            f"{problem.reason}. Lower --lr, add --weight-decay, or check the data. {kept}"
        )

    def _judge_state(self, state: dict[str, Any] | None) -> dict[str, Any] | None:
        """Stop (:meth:`_diverged`) when the tensors of ``state`` are not finite; without
        ``--out`` the parameters are judged. Every process calls it: they stop together."""
        problem = None
        if state is not None:
            slots = (state["optimizer_state"] or {}).get("slots")
            problem = tensor_problem(state["params"], slots)
        elif self.out_dir is None:
            problem = tensor_problem(self.backend.get_params(self.model))
        if self.backend.world_size > 1:
            (bad,) = self.backend.allreduce_numbers([float(problem is not None)])
            if bad and problem is None:
                problem = Problem("NaN/Inf in the state rank 0 checked", non_finite=True)
        if problem is not None:
            self._diverged(problem, state)
        return state

    def _layer_outputs(self, x: np.ndarray) -> list[tuple[str, np.ndarray]]:
        """Per-layer outputs of replica 0 for this process's batch (eval mode, the weights
        before the step)."""
        b = self.backend
        return b.layer_outputs(self.model, b.to_tensor(x, self.devices[0]))

    # -- checkpoints ------------------------------------------------------------------------

    def _read_metrics(self) -> None:
        """Add the metric sums still held on the device to the epoch's (every process)."""
        self.partial.correct += self.runner.read_metrics()

    def save_checkpoint(self) -> Path | None:
        """Save the whole training state (rank 0, when there is an output directory) once
        its tensors are found finite (:meth:`_judge_state`)."""
        self._read_metrics()  # every process: the partial-epoch sums must be whole
        if self.out_dir is None:
            return None
        state = self._judge_state(self._state())
        path = self.checkpoints.save(state, self.global_step) if state else None
        self._keep_marked()
        return path

    def _state(self) -> dict[str, Any] | None:
        """What a checkpoint holds, read to the host (rank 0 with --out), else None."""
        if self.checkpoints.manager is None:
            return None
        b = self.backend
        return dict(
            params=b.get_params(self.model),
            optimizer_state=self.optimizer.state_dict(),
            spec=self.spec,
            model_name=self.spec.name,
            backend=b.name,
            framework_version=b.version(),
            position={
                "epoch": self.epoch,
                "step": self.partial.step,
                "global_step": self.global_step,
            },
            seed=self.recipe.seed,
            recipe=self.recipe.to_dict(),
            scaler=self.runner.mixed_precision.state_dict(),
            history=[e.to_dict() for e in self.history],
            extra={
                "partial_epoch": asdict(self.partial),
                "health": self.health.state_dict(),
                "world_size": b.world_size,
                "devices": [b.device_name(d) for d in self.devices],
                "data": self.data.origins(),  # e.g. a text set's vocabulary
                "control": self.control.state_dict(),  # a plugin's lr
            },
            param_dtype=self.model.dtype,
        )

    def _keep_marked(self) -> None:
        """Keep the last checkpoint under the names plugins asked for (rank 0, with --out)."""
        manager, last = self.checkpoints.manager, self.checkpoints.last
        if manager is None or last is None:
            return
        while self.control.marks:
            manager.keep_as(last, self.control.marks.pop(0))

    def restore(self, checkpoint: Checkpoint) -> None:
        """Continue from a checkpoint written by any backend, on any device count."""
        check_resumable(checkpoint, self.recipe)
        b = self.backend
        b.set_params(self.model, checkpoint.params)
        if checkpoint.optimizer_state is not None:
            self.optimizer.load_state_dict(checkpoint.optimizer_state)
        elif b.rank == 0:
            print(
                f"polytrain: the checkpoint has no optimizer state: {self.optimizer.config.name} "
                "starts fresh",
                file=sys.stderr,
            )
        self.runner.mixed_precision.load_state_dict(checkpoint.scaler)
        pos = checkpoint.position
        self.epoch, self.global_step = int(pos["epoch"]), int(pos["global_step"])
        extra = checkpoint.manifest.get("extra") or {}
        try:
            self.partial = EpochProgress(**extra.get("partial_epoch", {"step": int(pos["step"])}))
            self.history = [EpochRecord(**h) for h in checkpoint.history or []]
        except (TypeError, ValueError) as exc:
            raise CheckpointError(
                f"{checkpoint.path}: the training position or history in its manifest is "
                f"malformed ({exc}); use an earlier checkpoint."
            ) from exc
        self.health.load_state_dict(extra.get("health"))
        self.control.load_state_dict(extra.get("control"))
        self.checkpoints.last = checkpoint.path
        manager = self.checkpoints.manager
        if manager is not None and checkpoint.path.resolve().parent == manager.directory.resolve():
            self.health.good_checkpoint = checkpoint.path.resolve()  # the one resumed is good
        elif b.rank == 0:
            warn(resumed_aside_warning(checkpoint.path))

    def evaluate(self, dataset: ArrayDataset, batch_size: int = 1000) -> float:
        """Accuracy over every sample of ``dataset``: each process takes a contiguous
        share, correct counts and sample counts are summed (no padding, no duplicates)."""
        return evaluate_split(
            self.runner, self.backend, dataset, "test", batch_size=batch_size
        ).metric


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@dataclass
class EpochProgress:
    """Sums of the epoch so far: what a mid-epoch checkpoint must carry."""

    step: int = 0
    loss_sum: float = 0.0
    correct: float = 0  # the metric's sum (a count for accuracy)
    seen: int = 0
    seconds: float = 0.0

    def add(self, result: StepResult) -> None:
        self.step += 1
        if not np.isfinite(result.loss_sum):  # an fp16 step the scaler skipped
            return
        self.loss_sum += result.loss_sum
        self.correct += result.correct
        self.seen += result.samples


def register_plugin(pm: pluggy.PluginManager, plugin: object) -> None:
    """Register a user plugin; one line saying what is wrong when pluggy rejects it (a
    misspelt hook name or argument)."""
    try:
        pm.register(plugin)
    except (pluggy.PluginValidationError, ValueError) as exc:
        raise ConfigError(f"plugin {type(plugin).__name__}: {exc}".replace("\n", " ")) from exc


def model_spec_for(recipe: Recipe, resume: str | Path | None) -> ModelSpec:
    """The recipe's model; on resume, a user model (factory or file) is the spec the
    checkpoint stores, so a run resumes without the factory or the file."""
    if resume is not None and is_spec_reference(recipe.model):
        saved = (read_manifest(find_checkpoint(resume)).get("model") or {}).get("spec")
        if saved:
            return ModelSpec.from_dict(saved)
    return resolve_model_spec(recipe.model)


def as_datasets(data: Any, recipe: Recipe, spec: ModelSpec) -> Datasets:
    """``Trainer(datasets=...)``: a :class:`Datasets`, or ``{"train": ..., "test": ...,
    "val": ...}`` (``test``/``val`` optional) of ``(x, y)`` array pairs, ArrayDatasets or
    indexable objects of ``(x, y)`` samples (:mod:`polytrain.data.arrays`), or one such
    value (the training set); None: the recipe's own data. Targets must suit the loss."""
    loss, metric = recipe.loss_spec(), recipe.metric_spec()
    if data is None:
        found = load_datasets(recipe, spec)
    elif isinstance(data, Datasets):
        found = data
    else:
        parts = dict(data) if isinstance(data, dict) else {"train": data}
        unknown = sorted(set(parts) - {"train", "test", "val"})
        if unknown or "train" not in parts:
            raise ConfigError(
                f"datasets= takes the keys train (required), test and val; got {sorted(parts)}."
            )
        split = {
            k: as_split(v, spec, loss, metric, f"datasets[{k!r}]")
            for k, v in parts.items()
            if v is not None
        }
        found = cut_datasets(recipe, split["train"], split.get("test"))
        if "val" in split:
            if found.val is not None:
                raise ConfigError("datasets= has a 'val' split and the recipe a --val-split: one.")
            found.val = split["val"]
    for name, part in (("train", found.train), ("test", found.test), ("val", found.val)):
        if part is not None:
            where = part.source or f"the {name} set"
            check_targets(loss, metric, part.y, spec.num_classes, where, sample_output_shape(spec))
    return found


def perplexity(mean_cross_entropy: float) -> float:
    """``exp`` of a mean token cross-entropy (inf past float range, as the loss diverged)."""
    try:
        return math.exp(mean_cross_entropy)
    except OverflowError:
        return math.inf


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
