"""The recipe's command-line options (train and compare), and the recipe they give:
from the flags, a ``--recipe`` preset, a recipe file (:mod:`polytrain.cli.config_file`) or
the checkpoint of ``--resume``."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from polytrain.cli import arguments as num
from polytrain.data.registry import DATASETS, TEXT_DATASETS
from polytrain.errors import ConfigError
from polytrain.neutral.models import MODELS
from polytrain.training.presets import PRESETS, preset_recipe
from polytrain.training.recipe import Recipe


def add_recipe_arguments(p: argparse.ArgumentParser) -> None:
    """The options of a recipe (shared by train and compare)."""
    d = Recipe()
    _add_what_options(p, d)
    _add_optimization_options(p, d)
    _add_execution_options(p, d)
    _add_data_options(p, d)


def _add_what_options(p: argparse.ArgumentParser, d: Recipe) -> None:
    """What trains on what: the recipe's source, model, data, loss and metric."""
    p.add_argument(
        "--config",
        default=None,
        metavar="TOML",
        help="a recipe file: one key per option (batch_size = 128); flags given override it "
        "(polytrain recipe RUN_DIR writes one from a run)",
    )
    p.add_argument(
        "--recipe",
        default=None,
        metavar="NAME",
        help=f"start from a built-in recipe ({', '.join(PRESETS)}); flags given override it",
    )
    p.add_argument(
        "--model",
        default=d.model,
        help=f"{', '.join(MODELS)}; or your own: "
        "pkg.module:factory (returns a ModelSpec, or a native model of --backend's "
        "framework) or a spec .json/.toml (docs/user-models.md)",
    )
    p.add_argument("--dataset", default=d.dataset, help=", ".join([*DATASETS, *TEXT_DATASETS]))
    p.add_argument(
        "--data",
        default=None,
        metavar="NPZ",
        help="your own data instead of --dataset: an .npz with x_train, y_train and optionally "
        "x_test, y_test",
    )
    p.add_argument(
        "--loss",
        default=d.loss,
        help="cross_entropy, mse, l1, bce_with_logits, or JSON with options: "
        '\'{"name": "cross_entropy", "label_smoothing": 0.1, "class_weights": [1, 2]}\'',
    )
    p.add_argument(
        "--metric",
        default=d.metric,
        help='accuracy, top_k (k=5), mse, or JSON: \'{"name": "top_k", "k": 3}\'; reported '
        "as the train/test metric (train_metric, test_metric in metrics.jsonl)",
    )


def _add_optimization_options(p: argparse.ArgumentParser, d: Recipe) -> None:
    """How it learns: epochs, batch, optimizer, lr and its schedule, dropout masks."""
    p.add_argument("--epochs", type=int, default=d.epochs)
    p.add_argument("--batch-size", type=int, default=d.batch_size, help="global batch size")
    p.add_argument("--optimizer", default=d.optimizer, help="sgd, momentum, adagrad, adam")
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--momentum", type=float, default=d.momentum, help="of --optimizer momentum")
    p.add_argument(
        "--warmup-steps",
        type=int,
        default=d.warmup_steps,
        metavar="N",
        help="raise the lr linearly over the first N steps (0: constant lr)",
    )
    p.add_argument(
        "--schedule",
        default=d.schedule,
        metavar="NAME[:K=V,...]",
        help="lr schedule: constant, step:step_size=N[,gamma=G], multistep:milestones=A/B, "
        "cosine[:warmup=N,min_lr=X,total=T], onecycle[:pct_start=P,...] (docs/semantics.md)",
    )
    p.add_argument(
        "--dropout-masks",
        default=d.dropout_masks,
        choices=("framework", "parity"),
        help="framework: each framework's own dropout RNG (fast); parity: masks drawn in "
        "numpy from the seed, the same on every backend (docs/semantics.md)",
    )
    _add_regularization_options(p, d)


def _add_regularization_options(p: argparse.ArgumentParser, d: Recipe) -> None:
    """What holds it back: gradient clipping, early stopping, weight decay."""
    p.add_argument(
        "--clip-grad-norm",
        type=float,
        default=None,
        metavar="MAX",
        help="rescale the summed gradients to a global L2 norm of at most MAX",
    )
    p.add_argument(
        "--clip-grad-value",
        type=float,
        default=None,
        metavar="V",
        help="clamp every summed gradient element to [-V, V]",
    )
    p.add_argument(
        "--early-stop",
        type=int,
        default=None,
        metavar="PATIENCE",
        help="stop after PATIENCE epochs without a better validation accuracy (--val-split)",
    )
    p.add_argument("--weight-decay", type=float, default=d.weight_decay, help="L2, all layers")
    p.add_argument(
        "--layer-weight-decay",
        default=None,
        metavar="LAYER=L2,...",
        help="L2 per layer (name prefix), e.g. fc1=0.01,conv1=0; overrides --weight-decay there",
    )


def _add_execution_options(p: argparse.ArgumentParser, d: Recipe) -> None:
    """Where and how it runs: seed, devices, micro-batches, precision."""
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--devices", default=d.devices, help="cpu, cpu:N (emulated), gpu, gpu:0,1")
    p.add_argument("--accumulate", type=int, default=d.accumulate, help="micro-batches per step")
    p.add_argument(
        "--precision",
        default=d.precision,
        help="fp32; bf16, fp16 (mixed); fp64 (parity mode: frameworks agree over whole runs)",
    )
    p.add_argument(
        "--pipeline-split",
        type=int,
        default=None,
        metavar="N",
        help="model parallel: top-level layers [0, N) on devices[0], the rest on devices[1]",
    )


def _add_data_options(p: argparse.ArgumentParser, d: Recipe) -> None:
    """How much of the data, from where, and what is recorded."""
    p.add_argument(
        "--train-samples", type=int, default=None, help="use the first N training samples"
    )
    p.add_argument("--test-samples", type=int, default=None, help="use the first N test samples")
    p.add_argument("--max-steps", type=int, default=None, help="stop each epoch after N steps")
    p.add_argument("--val-split", type=float, default=0.0, help="fraction held out for validation")
    p.add_argument("--drop-last", action="store_true", help="drop the last smaller batch")
    p.add_argument("--data-dir", default=None, help="directory with the dataset files")
    p.add_argument(
        "--threads",
        type=num.thread_count,
        default=None,
        help="intra-op threads per process (1 .. 4 per CPU)",
    )
    p.add_argument("--grad-norm", action="store_true", help="record the gradient norm per step")


def parse_layer_decay(text: str | None) -> dict[str, float]:
    """``fc1=0.01,conv1=0`` -> {"fc1": 0.01, "conv1": 0.0}."""
    if not text:
        return {}
    out = {}
    for item in text.split(","):
        name, sep, value = item.partition("=")
        try:
            if not sep or not name.strip():
                raise ValueError
            out[name.strip()] = float(value)
        except ValueError:
            raise ConfigError(
                f"--layer-weight-decay {text!r}: give LAYER=VALUE pairs, e.g. fc1=0.01,conv1=0."
            ) from None
    return out


def recipe_from_args(args: argparse.Namespace) -> Recipe:
    """The recipe of the command line: a built-in ``--recipe`` with the flags written on
    the command line on top, or the flags alone."""
    recipe = _flag_recipe(args)
    if getattr(args, "recipe", None) is None:
        return recipe
    given = recipe.to_dict()
    written = {_FIELD_OF_FLAG.get(d, d) for d in getattr(args, "explicit", set(given))}
    explicit = written & set(given)
    return preset_recipe(args.recipe, {key: given[key] for key in explicit})


_FIELD_OF_FLAG = {"layer_weight_decay": "per_layer_weight_decay"}


def _flag_recipe(args: argparse.Namespace) -> Recipe:
    return Recipe(
        model=args.model,
        dataset=args.dataset,
        data=args.data,
        loss=args.loss,
        metric=args.metric,
        epochs=args.epochs,
        batch_size=args.batch_size,
        optimizer=args.optimizer,
        lr=args.lr,
        momentum=args.momentum,
        warmup_steps=args.warmup_steps,
        schedule=args.schedule,
        clip_grad_norm=args.clip_grad_norm,
        clip_grad_value=args.clip_grad_value,
        early_stop=args.early_stop,
        weight_decay=args.weight_decay,
        per_layer_weight_decay=parse_layer_decay(args.layer_weight_decay),
        seed=args.seed,
        dropout_masks=args.dropout_masks,
        devices=args.devices,
        accumulate=args.accumulate,
        precision=args.precision,
        pipeline_split=args.pipeline_split,
        train_samples=args.train_samples,
        test_samples=args.test_samples,
        max_steps=args.max_steps,
        val_split=args.val_split,
        drop_last=args.drop_last,
        data_dir=args.data_dir,
        grad_norm=args.grad_norm,
    )


def explicit_options(argv: Sequence[str], parser: argparse.ArgumentParser) -> set[str]:
    """Destinations of the options actually written on the command line."""
    names = set()
    for action in parser._actions:
        if any(
            opt in argv or any(a.startswith(opt + "=") for a in argv)
            for opt in action.option_strings
        ):
            names.add(action.dest)
    return names


def resumed_recipe(args: argparse.Namespace) -> Recipe:
    """On --resume the checkpoint's recipe is the default; flags given explicitly override it."""
    from polytrain.io.checkpoint import find_checkpoint, read_manifest

    manifest = read_manifest(find_checkpoint(args.resume))
    saved = dict(manifest.get("recipe") or {})
    given = recipe_from_args(args).to_dict()
    for key in args.explicit & set(given):
        saved[key] = given[key]
    return Recipe.from_dict(saved)
