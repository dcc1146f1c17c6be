"""Experiment trackers chosen with ``--log csv,mlflow,tensorboard``: plugins of the
training-event hooks that write on rank 0 only.

* ``csv``: ``steps.csv`` and ``epochs.csv`` in ``--out`` through the standard ``csv`` module.
* ``mlflow``: one MLflow run (params: the recipe; per-step and per-epoch metrics; the final
  checkpoint and the run's files as artifacts) through the ``mlflow`` package, in
  ``$MLFLOW_TRACKING_URI`` when set, else in a local SQLite store in ``--out``; a
  ``--resume`` in the same ``--out`` continues that MLflow run. Its waits on the store are
  bounded (:data:`MLFLOW_HTTP_BOUNDS`) and a stop signal ends them; a store that fails
  turns the tracker off with one line, and training goes on.
* ``tensorboard``: :class:`polytrain.training.curves.TensorBoardLogger`.
"""

from __future__ import annotations

import contextlib
import csv
import importlib.util
import io
import json
import logging
import os
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterable, Iterator
from dataclasses import fields
from pathlib import Path
from typing import IO, Any

from polytrain.errors import ConfigError
from polytrain.io.run_dir import CURVES_FILE, EPOCHS_CSV, METRICS_FILE, STEPS_CSV
from polytrain.plugins.hookspecs import hookimpl
from polytrain.plugins.records import LEGACY_EPOCH_KEYS, EpochRecord, RunInfo, StepRecord, Summary
from polytrain.training.curves import TensorBoardLogger
from polytrain.utils.fileio import atomic_write_text
from polytrain.utils.signals import StopSignalled, stop_signals_interrupt

TRACKERS = ("csv", "mlflow", "tensorboard")
MLFLOW_DB = "mlflow.db"  # the default store, in --out
MLFLOW_ARTIFACTS = "mlartifacts"  # its artifacts, beside it
MLFLOW_EXPERIMENT = "polytrain"  # unless $MLFLOW_EXPERIMENT_NAME names one
MLFLOW_RUN_FILE = "mlflow-run.json"  # in --out: the MLflow run that a --resume continues
TENSORBOARD_DIR = "tensorboard"  # --log tensorboard without --tensorboard DIR: in --out
# files of the run (and of polytrain compare) logged as MLflow artifacts when present
RUN_ARTIFACTS = (METRICS_FILE, CURVES_FILE, STEPS_CSV, EPOCHS_CSV)
COMPARISON_FILES = ("comparison.json", "comparison.png", "comparison.html")
METRICS_PER_BATCH = 1000  # MLflow's log_batch limit
# MLflow's HTTP client waits 120 s per request and retries 7 times with backoff (about 4
# minutes of backoff alone); polytrain's bounds, where the user's environment sets none:
MLFLOW_HTTP_BOUNDS = {
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",  # seconds per request (connect, then each read)
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
}


def tracker_names(log: str | Iterable[str] | None) -> list[str]:
    """``--log``'s comma list as known tracker names, in order, each once."""
    items = log.split(",") if isinstance(log, str) else list(log or ())
    names = list(dict.fromkeys(item.strip().lower() for item in items if item.strip()))
    for name in names:
        if name not in TRACKERS:
            raise ConfigError(
                f"--log {name}: unknown tracker; choose from {', '.join(TRACKERS)} "
                "(comma-separated)."
            )
    return names


def make_trackers(
    log: str | Iterable[str] | None,
    out_dir: str | Path | None,
    tensorboard: str | Path | None = None,
) -> dict[str, object]:
    """The plugins for ``--log``, by name; checks every package and folder they need now,
    before training starts. ``--tensorboard DIR`` alone gives the TensorBoard one."""
    names = tracker_names(log)
    if tensorboard is not None and "tensorboard" not in names:
        names.append("tensorboard")
    out = Path(out_dir) if out_dir else None
    plugins: dict[str, object] = {}
    for name in names:
        if name == "csv":
            plugins[name] = CsvLogger(_needs_out(out, "csv", "steps.csv and epochs.csv"))
        elif name == "mlflow":
            plugins[name] = MlflowTracker(out)
        else:
            folder = tensorboard or _needs_out(out, "tensorboard", "event files") / TENSORBOARD_DIR
            plugins[name] = TensorBoardLogger(folder)
    return plugins


def _needs_out(out: Path | None, name: str, what: str) -> Path:
    if out is None:
        extra = " or --tensorboard DIR" if name == "tensorboard" else ""
        raise ConfigError(f"--log {name} writes {what} into the run folder: add --out DIR{extra}.")
    return out


def require(module: str, tracker: str, extra: str) -> None:
    """A one-line :class:`ConfigError` naming the extra when ``module`` is not installed."""
    if importlib.util.find_spec(module) is None:
        raise ConfigError(
            f"--log {tracker} needs the {module} package: pip install 'polytrain[{extra}]'."
        )


# an older run's epochs.csv, which a resume appends to: its columns, by the names now
OLD_EPOCH_COLUMNS = {
    old: LEGACY_EPOCH_KEYS.get(old, old)
    for old in ("epoch", "train_loss", "train_accuracy", "test_accuracy", "seconds",
                "samples_per_second", "val_accuracy", "steps", "train_perplexity",
                "test_perplexity", "tokens_per_second")
}  # fmt: skip


class CsvLogger:
    """One row per step in ``steps.csv`` and per epoch in ``epochs.csv`` (header once;
    appended on --resume, without the rows of what the resume redoes), flushed at each
    epoch end and checkpoint. Rank 0 only."""

    STEP_COLUMNS = tuple(f.name for f in fields(StepRecord) if f.name != "extra")
    EPOCH_COLUMNS = tuple(f.name for f in fields(EpochRecord))

    def __init__(self, out_dir: str | Path) -> None:
        self.out_dir = Path(out_dir)
        self._files: dict[str, tuple[IO[str], csv.DictWriter[str]]] = {}

    def _writer(
        self, name: str, columns: tuple[str, ...], older: tuple[str, ...] = ()
    ) -> csv.DictWriter[str]:
        """The file's writer; a file with the ``older`` columns goes on with them."""
        if name not in self._files:
            path = self.out_dir / name
            header = ",".join(columns)
            if path.exists() and path.stat().st_size:
                with open(path, encoding="utf-8", newline="") as fh:
                    found = fh.readline().strip()
                if older and found == ",".join(older):
                    columns = older
                elif found != header:
                    raise ConfigError(
                        f"{path} has other columns ({found}); move it away or use --overwrite."
                    )
                fh = open(path, "a", encoding="utf-8", newline="")  # noqa: SIM115 - kept open
                writer = csv.DictWriter(fh, columns, extrasaction="ignore")
            else:
                self.out_dir.mkdir(parents=True, exist_ok=True)
                fh = open(path, "w", encoding="utf-8", newline="")  # noqa: SIM115 - kept open
                writer = csv.DictWriter(fh, columns, extrasaction="ignore")
                writer.writeheader()
            self._files[name] = (fh, writer)
        return self._files[name][1]

    @hookimpl
    def polytrain_train_start(self, run: RunInfo) -> None:
        if run.is_main and (run.start_global_step or run.start_epoch):
            drop_redone_rows(self.out_dir / STEPS_CSV, "global_step", run.start_global_step + 1)
            drop_redone_rows(self.out_dir / EPOCHS_CSV, "epoch", run.start_epoch)

    @hookimpl
    def polytrain_step_end(self, run: RunInfo, step: StepRecord) -> None:
        if run.is_main:
            self._writer(STEPS_CSV, self.STEP_COLUMNS).writerow(step.to_dict())

    @hookimpl
    def polytrain_checkpoint_saved(self) -> None:
        for fh, _ in self._files.values():  # every row a resume will not redo is on disk
            fh.flush()

    @hookimpl
    def polytrain_epoch_end(self, run: RunInfo, epoch: EpochRecord) -> None:
        if run.is_main:
            old = tuple(OLD_EPOCH_COLUMNS)
            writer = self._writer(EPOCHS_CSV, self.EPOCH_COLUMNS, old)
            row = epoch.to_dict()
            if writer.fieldnames == old:
                row = {o: row[new] for o, new in OLD_EPOCH_COLUMNS.items()}
            writer.writerow(row)
            for fh, _ in self._files.values():
                fh.flush()

    @hookimpl
    def polytrain_train_end(self, run: RunInfo, summary: Summary) -> None:
        for fh, _ in self._files.values():
            fh.close()
        self._files.clear()


def drop_redone_rows(path: Path, column: str, first_redone: int) -> None:
    """Rewrite the CSV file ``path`` (atomically) without the rows whose ``column`` is
    ``first_redone`` or more, and a last row a kill cut short; a missing file stays so."""
    if not path.is_file():
        return
    with open(path, encoding="utf-8", newline="") as fh:
        rows = list(csv.reader(fh))
    if not rows or column not in rows[0]:
        return
    at = rows[0].index(column)
    kept = [rows[0]] + [
        row for row in rows[1:]
        if len(row) == len(rows[0]) and row[at].isdigit() and int(row[at]) < first_redone
    ]  # fmt: skip
    if len(kept) < len(rows):
        text = io.StringIO()
        csv.writer(text).writerows(kept)
        atomic_write_text(path, text.getvalue())


def param_text(value: Any) -> str:
    """A recipe value as an MLflow param (params are text): strings as they are, the rest
    as JSON (``0.1``, ``true``, ``null``, ``{"fc1": 0.01}``)."""
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


class MlflowTracker:
    """One MLflow run per training run, through :class:`mlflow.tracking.MlflowClient`.

    Params: the recipe (:func:`param_text`); tags: backend, framework version, model,
    dataset, devices. Metrics: ``loss``, ``lr`` (and ``grad_norm``) at each global step,
    sent in batches at epoch ends; the epoch record's numbers (``train_loss``,
    ``test_accuracy`` or ``test_mse``: :meth:`EpochRecord.named_numbers`) at step = epoch
    number. Artifacts at the end: the run's files,
    any comparison files in --out, and the final checkpoint under ``checkpoint/``.
    Store: ``$MLFLOW_TRACKING_URI`` when set, else ``sqlite:///<out>/mlflow.db`` with
    artifacts in ``<out>/mlartifacts``. Rank 0 only.

    A resumed run (``--resume``, the same --out, store and experiment) continues the MLflow
    run that ``<out>/mlflow-run.json`` names, so its metrics stay one series: the run is
    set RUNNING again and tagged ``polytrain.resumed_at_step``; recipe values changed on
    resume (MLflow params cannot change) are listed in ``polytrain.resume_changes``.

    Every exchange with the store is bounded (:func:`bounded_http`) and a SIGTERM or
    SIGINT ends it at once (the Trainer then stops as usual); a store that fails or does
    not answer turns the tracker off with one line on stderr, and training goes on. An
    MLflow file store (``file:`` or a bare path), which MLflow 3 refuses, is one
    :class:`ConfigError` line before any work."""

    def __init__(self, out_dir: str | Path | None) -> None:
        require("mlflow", "mlflow", "mlflow")
        self.out_dir = Path(out_dir).resolve() if out_dir else None
        self.user_uri = os.environ.get("MLFLOW_TRACKING_URI") or None
        if self.user_uri is not None:
            refuse_file_store(self.user_uri)
        else:
            if self.out_dir is None:
                raise ConfigError(
                    "--log mlflow keeps its store in the run folder: add --out DIR, or set "
                    "MLFLOW_TRACKING_URI to your tracking server or store."
                )
            for module in ("sqlalchemy", "alembic"):  # the local SQLite store's
                require(module, "mlflow", "mlflow")
        self.tracking_uri = self.user_uri or f"sqlite:///{self.out_dir}/{MLFLOW_DB}"
        self.experiment = os.environ.get("MLFLOW_EXPERIMENT_NAME") or MLFLOW_EXPERIMENT
        self.client: Any = None
        self.run_id: str | None = None
        self._pending: list[Any] = []  # step metrics not yet sent

    @hookimpl
    def polytrain_train_start(self, run: RunInfo) -> None:
        if run.is_main:
            with self._store("starting the MLflow run"):
                self._start(run)

    @contextlib.contextmanager
    def _store(self, what: str) -> Iterator[None]:
        """One exchange with the store: bounded, ended by a stop signal; a failure turns
        the tracker off with one line, and training goes on."""
        from mlflow.exceptions import MlflowException
        from requests import RequestException  # MLflow's HTTP client

        try:
            with stop_signals_interrupt(), bounded_http():
                yield
        except StopSignalled as stop:
            self._off(f"{what} was stopped by {stop}", "MLflow is off")
        except (MlflowException, RequestException) as exc:
            self._off(f"{what} failed: {_failure(exc)}", "training goes on without MLflow")

    def _off(self, reason: str, outcome: str) -> None:
        where = f"store {self.tracking_uri}"
        print(
            f"polytrain: --log mlflow: {reason} ({where}); {outcome}", file=sys.stderr, flush=True
        )
        self.client, self.run_id, self._pending = None, None, []

    def _start(self, run: RunInfo) -> None:
        from mlflow.entities import Param, RunTag
        from mlflow.tracking import MlflowClient

        with _quiet_loggers("mlflow.store.db.utils", "alembic"):  # creating the local tables
            self.client = MlflowClient(tracking_uri=self.tracking_uri)
            found = self.client.get_experiment_by_name(self.experiment)
        if found is not None:
            experiment_id = found.experiment_id
        else:
            location = None  # a server's own default
            if self.user_uri is None and self.out_dir is not None:
                location = (self.out_dir / MLFLOW_ARTIFACTS).as_uri()
            experiment_id = self.client.create_experiment(
                self.experiment, artifact_location=location
            )
        resumed = run.start_epoch > 0 or run.start_step > 0
        previous = self._previous_run(experiment_id) if resumed else None
        if previous is not None:
            self._continue(previous, run)
            return
        name = self.out_dir.name if self.out_dir else f"{run.model}-{run.backend}"
        mlrun = self.client.create_run(experiment_id, run_name=name)
        self.run_id = mlrun.info.run_id
        if self.out_dir is not None:
            record = {
                "tracking_uri": self.tracking_uri,
                "experiment_id": experiment_id,
                "run_id": self.run_id,
            }
            atomic_write_text(self.out_dir / MLFLOW_RUN_FILE, json.dumps(record))
        tags = {
            "polytrain.backend": run.backend,
            "polytrain.framework_version": run.framework_version,
            "polytrain.model": run.model,
            "polytrain.dataset": run.dataset,
            "polytrain.devices": ",".join(run.devices),
            "polytrain.world_size": str(run.world_size),
            "polytrain.start_step": str(run.start_step),
        }
        if run.out_dir:
            tags["polytrain.out_dir"] = str(Path(run.out_dir).resolve())
        self.client.log_batch(
            self.run_id,
            params=[Param(k, param_text(v)) for k, v in sorted(run.recipe.items())],
            tags=[RunTag(k, v) for k, v in tags.items()],
        )

    def _previous_run(self, experiment_id: str) -> Any:
        """The MLflow run this --out's last run wrote to, if it is in this store and
        experiment and not deleted; else None (a new run is created)."""
        path = self.out_dir / MLFLOW_RUN_FILE if self.out_dir else None
        if path is None or not path.is_file():
            return None
        try:
            saved = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if (saved.get("tracking_uri"), saved.get("experiment_id")) != (
            self.tracking_uri,
            experiment_id,
        ):
            return None
        from mlflow.exceptions import MlflowException

        try:
            found = self.client.get_run(str(saved.get("run_id")))
        except MlflowException:
            return None
        return found if found.info.lifecycle_stage == "active" else None

    def _continue(self, previous: Any, run: RunInfo) -> None:
        """Log into ``previous`` again: RUNNING, new params added, changed ones tagged."""
        from mlflow.entities import Param, RunTag

        self.run_id = previous.info.run_id
        self.client.update_run(self.run_id, status="RUNNING")
        logged = previous.data.params
        recipe = {k: param_text(v) for k, v in sorted(run.recipe.items())}
        changes = [f"{k}: {logged[k]} -> {v}" for k, v in recipe.items() if logged.get(k, v) != v]
        at_step = run.start_epoch * run.steps_per_epoch + run.start_step
        tags = {"polytrain.resumed_at_step": str(at_step)}
        if changes:
            tags["polytrain.resume_changes"] = "; ".join(changes)
        self.client.log_batch(
            self.run_id,
            params=[Param(k, v) for k, v in recipe.items() if k not in logged],
            tags=[RunTag(k, v) for k, v in tags.items()],
        )

    @hookimpl
    def polytrain_step_end(self, run: RunInfo, step: StepRecord) -> None:
        if not run.is_main or self.run_id is None:
            return
        from mlflow.entities import Metric

        now = _millis()
        values = {"loss": step.loss, "lr": step.lr, "grad_norm": step.grad_norm}
        for key, value in values.items():
            if value is not None:
                self._pending.append(Metric(key, float(value), now, step.global_step))

    @hookimpl
    def polytrain_epoch_end(self, run: RunInfo, epoch: EpochRecord) -> None:
        if not run.is_main or self.run_id is None:
            return
        from mlflow.entities import Metric

        now = _millis()
        for key, value in epoch.named_numbers().items():  # at step = the epoch's number
            if value is not None:
                self._pending.append(Metric(key, float(value), now, epoch.epoch + 1))
        with self._store("sending the epoch's metrics"):
            self._send()

    def _send(self) -> None:
        while self._pending:
            batch, self._pending = (
                self._pending[:METRICS_PER_BATCH],
                self._pending[METRICS_PER_BATCH:],
            )
            self.client.log_batch(self.run_id, metrics=batch)

    @hookimpl(trylast=True)  # after the metrics file's last line
    def polytrain_train_end(self, run: RunInfo, summary: Summary) -> None:
        if run.is_main and self.run_id is not None:
            with self._store("ending the MLflow run"):
                self._finish(run, summary)

    def _finish(self, run: RunInfo, summary: Summary) -> None:
        """The last metrics, the run's files and checkpoint as artifacts, the status."""
        assert self.run_id is not None
        self._send()
        out = Path(run.out_dir) if run.out_dir else None
        if out is not None:
            for name in (*RUN_ARTIFACTS, *COMPARISON_FILES):
                if (out / name).is_file():
                    self.client.log_artifact(self.run_id, str(out / name))
        if summary.checkpoint and Path(summary.checkpoint).is_dir():
            checkpoint = Path(summary.checkpoint)
            self.client.log_artifacts(
                self.run_id, str(checkpoint), artifact_path=f"checkpoint/{checkpoint.name}"
            )
        status = (
            "FAILED"
            if summary.stop_reason.startswith("failed")
            else "KILLED"
            if summary.interrupted
            else "FINISHED"
        )
        self.client.set_terminated(self.run_id, status=status)
        self.run_id = None


def refuse_file_store(uri: str) -> None:
    """MLflow 3 refuses its file store (a ``file:`` URI or a bare path) unless
    ``MLFLOW_ALLOW_FILE_STORE`` is set, with a traceback at the first call: one
    :class:`ConfigError` line before any work instead, naming the SQLite URI to use."""
    parsed = urllib.parse.urlparse(uri)
    if parsed.scheme not in ("", "file"):
        return
    try:
        from mlflow.environment_variables import MLFLOW_ALLOW_FILE_STORE
    except ImportError:  # an MLflow that still opens file stores
        return
    if MLFLOW_ALLOW_FILE_STORE.get():
        return
    folder = Path(urllib.request.url2pathname(parsed.path) if parsed.scheme else uri)
    raise ConfigError(
        f"MLFLOW_TRACKING_URI={uri} is an MLflow file store, which this MLflow no longer "
        f"opens: use a database file, MLFLOW_TRACKING_URI=sqlite:///{folder.resolve() / MLFLOW_DB}"
        ", or unset it to keep the store in --out."
    )


@contextlib.contextmanager
def bounded_http() -> Iterator[None]:
    """Inside, MLflow's HTTP waits have :data:`MLFLOW_HTTP_BOUNDS` where the environment
    sets none (MLflow reads them at each request); the environment is restored after."""
    added = [name for name in MLFLOW_HTTP_BOUNDS if name not in os.environ]
    os.environ.update({name: MLFLOW_HTTP_BOUNDS[name] for name in added})
    try:
        yield
    finally:
        for name in added:
            os.environ.pop(name, None)


def _failure(exc: BaseException, limit: int = 300) -> str:
    """What went wrong, short: no answer in time, a refused connection, else the first
    line of MLflow's message."""
    chain: list[BaseException] = []
    cause: BaseException | None = exc
    while cause is not None and cause not in chain:
        chain.append(cause)
        cause = cause.__cause__ or cause.__context__
    if any(isinstance(e, TimeoutError) for e in chain):
        timeout, retries = (
            os.environ.get(name, MLFLOW_HTTP_BOUNDS[name])
            for name in ("MLFLOW_HTTP_REQUEST_TIMEOUT", "MLFLOW_HTTP_REQUEST_MAX_RETRIES")
        )
        return (
            f"no answer within MLFLOW_HTTP_REQUEST_TIMEOUT={timeout} s, "
            f"MLFLOW_HTTP_REQUEST_MAX_RETRIES={retries}"
        )
    if any(isinstance(e, ConnectionRefusedError) for e in chain):
        return "the connection was refused"
    text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return text if len(text) <= limit else text[: limit - 3] + "..."


@contextlib.contextmanager
def _quiet_loggers(*names: str) -> Iterator[None]:
    """Only warnings and errors from these loggers inside the block."""
    loggers = [logging.getLogger(name) for name in names]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(max(logger.getEffectiveLevel(), logging.WARNING))
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def _millis() -> int:
    return int(time.time() * 1000)
