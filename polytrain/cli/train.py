"""``polytrain train`` (one recipe on one backend) and ``polytrain recipe`` (a run's
recipe as a recipe file)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from polytrain.cli.config_file import recipe_toml
from polytrain.cli.output import make_console, make_table
from polytrain.cli.recipe_args import recipe_from_args, resumed_recipe
from polytrain.cli.run_options import carry_run_options, record_run_options
from polytrain.errors import ConfigError
from polytrain.plugins.records import Summary
from polytrain.training.recipe import Recipe
from polytrain.utils.fileio import atomic_write_text
from polytrain.utils.output_paths import folder_inputs, refuse_overwriting_inputs

if TYPE_CHECKING:
    from polytrain.training.trainer import Trainer


def _metric_text(value: float, counts: bool) -> str:
    """A share of samples as a percentage; another metric (mse) as it is."""
    return f"{100 * value:.2f}" if counts else f"{value:.5g}"


def cmd_train(args: argparse.Namespace) -> int:
    """Train one recipe on one backend and print the summary."""
    if args.resume:
        carry_run_options(args, args.subparser)
    recipe = resumed_recipe(args) if args.resume else recipe_from_args(args)
    if args.resume and args.out is None:
        args.out = _resumed_run_folder(args.resume)
    trainer = _trainer(args, recipe)
    rank = trainer.backend.rank  # fit() leaves the process group, which resets it
    if rank == 0 and trainer.folder.path is not None:
        record_run_options(args, trainer.folder.path, trainer.backend.name)
    summary = trainer.fit()
    if summary.interrupted:
        return _interrupted(args, summary, rank, trainer.stop.number)
    if rank != 0:  # rank 0 reports for the job
        return 0
    if summary.stop_reason != "completed":  # an early stop or a plugin's clean stop
        print(f"polytrain train: {summary.stop_reason}", file=sys.stderr)
    if args.json:
        print(json.dumps(summary.to_dict(), indent=2))
        return 0
    title = (
        f"{trainer.backend.name} {trainer.backend.version()}: {recipe.model_name} on "
        f"{recipe.data or recipe.dataset}"
    )
    make_console().print(_summary_table(title, summary, recipe))
    return 0


def _resumed_run_folder(resume: str) -> str | None:
    """``--resume RUN`` without ``--out`` goes on in RUN (its metrics appended, its
    checkpoints saved and pruned there), as a resumed run is expected to; a checkpoint
    directory alone names no folder, and its run then saves nothing unless ``--out``."""
    from polytrain.io.checkpoint import run_folder

    folder = run_folder(resume)
    return None if folder is None else str(folder)


def _trainer(args: argparse.Namespace, recipe: Recipe) -> Trainer:
    """The trainer of the command line's options, with its plugins loaded."""
    from polytrain.plugins.user_plugin import load_plugin
    from polytrain.training.keep_best import KeepBest
    from polytrain.training.trainer import Trainer

    plugins = [load_plugin(ref) for ref in args.plugin]
    if args.keep_best is not None:
        if not args.out:
            raise ConfigError(f"--keep-best {args.keep_best} keeps a checkpoint: add --out DIR.")
        plugins.append(KeepBest(args.keep_best))
    return Trainer(
        recipe,
        args.backend,
        out_dir=args.out,
        progress=False if args.quiet else None,
        plugins=plugins,
        threads=args.threads,
        timeout=args.timeout,
        resume=args.resume,
        checkpoint_every=args.checkpoint_every,
        metrics_every=args.metrics_every,
        keep_checkpoints=args.keep_checkpoints,
        tensorboard=args.tensorboard,
        log=args.log,
        inspect=args.inspect,
        fast=args.fast,
        overwrite=args.overwrite,
        max_skipped=args.max_skipped,
        max_loss_growth=args.max_loss_growth,
    )


def _interrupted(args: argparse.Namespace, summary: Summary, rank: int, signum: int) -> int:
    """The line of a run a signal stopped (where its checkpoint is) and its exit status."""
    where = (
        f"; checkpoint {summary.checkpoint}"
        if summary.checkpoint
        else f" (rank {rank}: rank 0 saves)"
        if rank != 0 and args.out
        else " (no --out: nothing saved)"
    )
    print(f"polytrain train: {summary.stop_reason}{where}", file=sys.stderr)
    return 128 + (signum or 2)


def _summary_table(title: str, summary: Summary, recipe: Recipe) -> Any:
    """One row per epoch: loss, the metric in its unit, time; perplexity for sequences."""
    metric = recipe.metric_spec()
    counts = metric.counts
    rows = [
        [
            e.epoch + 1,
            f"{e.train_loss:.4f}",
            _metric_text(e.train_metric, counts),
            "-" if e.test_metric is None else _metric_text(e.test_metric, counts),
            f"{e.seconds:.1f}",
            f"{e.samples_per_second:.0f}",
        ]
        for e in summary.epochs
    ]
    unit = " %" if counts else ""
    columns = [
        "epoch",
        "train loss",
        f"train {metric.label}{unit}",
        f"test {metric.label}{unit}",
        "seconds",
        "samples/s",
    ]
    if any(e.tokens_per_second is not None for e in summary.epochs):  # sequence targets
        columns += ["test perplexity", "tokens/s"]
        for row, e in zip(rows, summary.epochs, strict=True):
            ppl = e.test_perplexity
            row += ["-" if ppl is None else f"{ppl:.3f}", f"{e.tokens_per_second or 0:.0f}"]
    return make_table(title, columns, rows)


def cmd_recipe(args: argparse.Namespace) -> int:
    """Print the recipe of a run (its latest checkpoint's) as a recipe file."""
    from polytrain.io.checkpoint import find_checkpoint, read_manifest

    checkpoint = find_checkpoint(args.run)
    refuse_overwriting_inputs({"-o": args.out}, folder_inputs("RUN_DIR", checkpoint))
    recipe = read_manifest(checkpoint).get("recipe")
    if not recipe:
        raise ConfigError(f"{checkpoint} records no recipe (written by an older polytrain?).")
    text = f"# the recipe of {checkpoint}\n" + recipe_toml(Recipe.from_dict(recipe).to_dict())
    if args.out:
        atomic_write_text(args.out, text)
    else:
        print(text, end="")
    return 0
