"""Built-in plugins for the training-event hooks: a progress bar and a JSON-lines log.

They are registered on the run's plugin manager exactly like third-party plugins.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path
from typing import IO, Any

from polytrain.neutral.losses import parse_metric
from polytrain.plugins.hookspecs import hookimpl
from polytrain.plugins.records import EpochRecord, RunInfo, StepRecord, Summary
from polytrain.utils.fileio import atomic_write_text


def compile_label(run: RunInfo) -> str:
    """``fast (compiled)`` or ``eager``, and why when the run says (the automatic mode)."""
    label = "fast (compiled)" if run.fast else "eager"
    return f"{label} ({run.fast_reason})" if run.fast_reason else label


class ProgressBar:
    """Run header and one line per epoch on stderr; a tqdm bar per epoch when stderr is a
    terminal (or ``bar=True``). Rank 0 only; ``enabled=False`` silences it."""

    def __init__(self, enabled: bool | None = None, bar: bool | None = None) -> None:
        self.enabled = True if enabled is None else enabled
        self.bar = sys.stderr.isatty() if bar is None else bar
        self._bar: Any = None
        self._loss = 0.0
        self._n = 0

    @hookimpl
    def polytrain_train_start(self, run: RunInfo) -> None:
        if self.enabled and run.is_main:
            threads = ", ".join(f"{k}={v}" for k, v in run.threads.items())
            print(
                f"polytrain: {run.backend} {run.framework_version} | "
                f"{run.model} on {run.dataset} | "
                f"devices {','.join(run.devices)} x {run.world_size} process(es) | "
                f"global batch {run.global_batch} ({run.per_device_batch}/device) | "
                f"{lr_policy(run.recipe)} | threads {threads} | "
                f"{compile_label(run)} {run.recipe.get('precision', '')}",
                file=sys.stderr,
            )

    @hookimpl
    def polytrain_step_end(self, run: RunInfo, step: StepRecord) -> None:
        if not (self.enabled and self.bar and run.is_main):
            return
        if self._bar is None:
            from tqdm import tqdm

            self._bar = tqdm(
                total=run.steps_per_epoch,
                initial=step.step,
                desc=f"epoch {step.epoch + 1}/{run.epochs}",
                unit="step",
                leave=False,
                file=sys.stderr,
                mininterval=0.5,
            )
            self._loss, self._n = 0.0, 0
        self._loss += step.loss
        self._n += 1
        self._bar.update(1)
        if self._n % 10 == 0:
            self._bar.set_postfix(loss=f"{self._loss / self._n:.4f}", refresh=False)

    @hookimpl
    def polytrain_epoch_end(self, run: RunInfo, epoch: EpochRecord) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if self.enabled and run.is_main:
            metric = parse_metric(run.recipe.get("metric", "accuracy"))
            test = "-" if epoch.test_metric is None else metric.shown(epoch.test_metric)
            ppl = (
                ""
                if epoch.test_perplexity is None
                else f"test perplexity {epoch.test_perplexity:.3f}, "
            )
            print(
                f"epoch {epoch.epoch + 1}/{run.epochs}: loss {epoch.train_loss:.4f}, "
                f"train {metric.label} {metric.shown(epoch.train_metric)}, "
                f"test {metric.label} {test}, {ppl}"
                f"{epoch.seconds:.1f} s, {epoch.samples_per_second:.0f} samples/s",
                file=sys.stderr,
            )

    @hookimpl
    def polytrain_train_end(self, run: RunInfo, summary: Summary) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def lr_policy(recipe: dict[str, Any]) -> str:
    """The learning-rate policy in words, for the run header."""
    name = recipe.get("optimizer", "?")
    warmup = recipe.get("warmup_steps") or 0
    schedule = recipe.get("schedule") or "constant"
    policy = [] if schedule == "constant" and warmup else [schedule]
    policy += [f"(linear warm-up over {warmup} steps)"] if warmup else []
    text = f"{name} lr {recipe.get('lr')} " + " ".join(policy)
    for key in ("clip_grad_norm", "clip_grad_value"):
        if recipe.get(key):
            text += f", {key.replace('_', ' ')} {recipe[key]}"
    if name == "momentum":
        text += f", momentum {recipe.get('momentum')}"
    if recipe.get("weight_decay"):
        text += f", weight decay {recipe['weight_decay']}"
    return text


class JsonlLogger:
    """Appends one JSON object per event to ``path`` (rank 0 only). Start, epoch and end
    lines are flushed at once; step lines at least every ``flush_seconds`` and whenever a
    checkpoint is saved (``tail -f`` shows a run as it goes; a killed run keeps every
    step up to its last checkpoint). A resume drops the lines of the steps and epochs it
    redoes, so each step is in the file once."""

    def __init__(self, path: str | os.PathLike[str], flush_seconds: float = 1.0) -> None:
        self.path = Path(path)
        self.flush_seconds = flush_seconds
        self._fh: IO[str] | None = None
        self._step_flushed_at = -math.inf  # the first step line is flushed at once

    def _write(self, record: dict[str, Any], flush: bool = False) -> None:
        if self._fh is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - kept open
        self._fh.write(json.dumps(record) + "\n")
        if flush:
            self._fh.flush()
        elif record["event"] == "step":
            now = time.monotonic()
            if now - self._step_flushed_at >= self.flush_seconds:
                self._fh.flush()
                self._step_flushed_at = now

    @hookimpl
    def polytrain_train_start(self, run: RunInfo) -> None:
        if run.is_main:
            if run.start_global_step or run.start_epoch:
                drop_redone_records(self.path, run.start_global_step, run.start_epoch)
            self._write({"event": "start", **run.to_dict()}, flush=True)

    @hookimpl
    def polytrain_checkpoint_saved(self) -> None:
        if self._fh is not None:  # every step a resume will not redo is on disk
            self._fh.flush()

    @hookimpl
    def polytrain_step_end(self, run: RunInfo, step: StepRecord) -> None:
        if run.is_main:
            self._write({"event": "step", **step.to_dict()})

    @hookimpl
    def polytrain_epoch_end(self, run: RunInfo, epoch: EpochRecord) -> None:
        if run.is_main:
            self._write({"event": "epoch", **epoch.to_dict()}, flush=True)

    @hookimpl
    def polytrain_train_end(self, run: RunInfo, summary: Summary) -> None:
        if run.is_main:
            self._write({"event": "end", **summary.to_dict()}, flush=True)
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def drop_redone_records(path: Path, global_step: int, epoch: int) -> None:
    """Rewrite the metrics file ``path`` (atomically) without the step records past
    ``global_step`` and the epoch records from ``epoch`` (0-based) on: what a resume from
    the checkpoint of ``global_step`` redoes, written after it by the run a kill ended.
    A line that is not whole JSON (the kill cut it) goes too."""
    if not path.is_file():
        return
    kept = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if not _redone(record, global_step, epoch):
            kept.append(line)
    atomic_write_text(path, "".join(f"{line}\n" for line in kept))


def _redone(record: object, global_step: int, epoch: int) -> bool:
    if not isinstance(record, dict):
        return True
    event, step, done = record.get("event"), record.get("global_step"), record.get("epoch")
    if event == "step" and isinstance(step, int):
        return step > global_step
    return event == "epoch" and isinstance(done, int) and done >= epoch


def read_metrics(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The records of a metrics file, in order."""
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]
