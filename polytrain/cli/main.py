"""The ``polytrain`` command line: backends, data, train, compare, convert, port, port-code,
launch, env, doctor.

Every sub-command is a small function; errors the user can fix print one clear line
and exit with status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from polytrain._version import __version__
from polytrain.cli import arguments as num
from polytrain.cli.config_file import apply_config, recipe_toml
from polytrain.data.registry import DATASETS, TEXT_DATASETS
from polytrain.errors import ConfigError, PolytrainError
from polytrain.neutral.models import MODELS
from polytrain.training.health import DEFAULT_MAX_LOSS_GROWTH, DEFAULT_MAX_SKIPPED
from polytrain.training.presets import PRESETS, preset_recipe
from polytrain.training.recipe import Recipe
from polytrain.training.step import DEFAULT_METRICS_EVERY
from polytrain.utils.fileio import atomic_write_text

if TYPE_CHECKING:
    from polytrain.backend.native_format import NativeFormat
    from polytrain.distributed.launcher import Launcher

Command = Callable[[argparse.Namespace], int]


def escape(text: str) -> str:
    """``text`` shown as it is by rich (``polytrain[paddle]`` is not a style tag)."""
    from rich.markup import escape as rich_escape

    return rich_escape(text)


def _console() -> Any:
    from rich.console import Console

    console = Console()
    if not console.is_terminal:  # logs and pipes: do not squeeze tables into 80 columns
        console = Console(width=160)
    return console


def _table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> Any:
    from rich.table import Table
    from rich.text import Text

    table = Table(title=title)
    for col in columns:
        table.add_column(col)
    for row in rows:  # Text: a cell such as "polytrain[mxnet]" is not read as rich markup
        table.add_row(*(Text("-" if v is None else str(v)) for v in row))
    return table


# -- backends -------------------------------------------------------------------------------


def cmd_backends(args: argparse.Namespace) -> int:
    """List registered backends; import only the ones named on the command line."""
    from polytrain.plugins.registry import default_plugin_manager, get_backend, registered_backends

    infos = registered_backends()
    rows = []
    report = []
    for name, info in infos.items():
        entry: dict[str, Any] = {
            "name": name,
            "framework": info.framework,
            "version": info.version(),
            "installed": info.available(),
            "devices": None,
        }
        if not entry["installed"]:
            entry["install"] = info.install_hint  # the plugin's own hint (or why not here)
        if name in args.names and info.available():
            try:
                backend = get_backend(name)
                entry["devices"] = [backend.device_name(d) for d in backend.try_all_gpus()]
                entry["importable"] = True
            except PolytrainError as exc:
                entry["importable"] = False
                entry["error"] = str(exc)
        report.append(entry)
        devices = ",".join(entry["devices"]) if entry["devices"] else None
        install = "yes" if entry["installed"] else f"no: {info.install_hint}"
        rows.append(
            [name, info.framework, entry["version"], install, devices or "(name it to probe)"]
        )
    for name, error in default_plugin_manager().broken.items():
        rows.append([name, "?", None, f"broken plugin: {error}", None])
        report.append({"name": name, "broken": error})
    unknown = [n for n in args.names if n not in infos]
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _console().print(
            _table(
                "polytrain backends",
                ["backend", "framework", "version", "installed", "devices"],
                rows,
            )
        )
    if unknown:
        get_backend(unknown[0])  # raises the standard "Unknown backend" error
    return 0


# -- data -----------------------------------------------------------------------------------


def cmd_data(args: argparse.Namespace) -> int:
    """Where each dataset was found, or how to get it; optionally download."""
    from polytrain.data import dataset_names, fetch_dataset, locate_dataset

    names = args.names or dataset_names()
    reports = []
    for name in names:
        if args.download:
            report = fetch_dataset(name, args.data_dir)
        else:
            report = locate_dataset(name, args.data_dir)
        reports.append(report)
    if args.json:
        print(json.dumps([r.as_dict() for r in reports], indent=2, default=str))
    else:
        for report in reports:
            print(report.format())
    return 0


# -- train ----------------------------------------------------------------------------------


def add_recipe_arguments(p: argparse.ArgumentParser) -> None:
    """The options of a recipe (shared by train and compare)."""
    d = Recipe()
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
        "pkg.module:factory (returns a ModelSpec) or a spec .json/.toml (docs/user-models.md)",
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
        "as the train/test accuracy columns",
    )
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


def _metric_text(value: float, counts: bool) -> str:
    """A share of samples as a percentage; another metric (mse) as it is."""
    return f"{100 * value:.2f}" if counts else f"{value:.5g}"


def cmd_train(args: argparse.Namespace) -> int:
    """Train one recipe on one backend and print the summary."""
    from polytrain.plugins.user_plugin import load_plugin
    from polytrain.training.keep_best import KeepBest
    from polytrain.training.trainer import Trainer

    recipe = resumed_recipe(args) if args.resume else recipe_from_args(args)
    plugins = [load_plugin(ref) for ref in args.plugin]
    if args.keep_best is not None:
        if not args.out:
            raise ConfigError(f"--keep-best {args.keep_best} keeps a checkpoint: add --out DIR.")
        plugins.append(KeepBest(args.keep_best))
    trainer = Trainer(
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
    rank = trainer.backend.rank  # fit() leaves the process group, which resets it
    summary = trainer.fit()
    if summary.interrupted:
        where = (
            f"; checkpoint {summary.checkpoint}"
            if summary.checkpoint
            else f" (rank {rank}: rank 0 saves)"
            if rank != 0 and args.out
            else " (no --out: nothing saved)"
        )
        print(f"polytrain train: {summary.stop_reason}{where}", file=sys.stderr)
        signum = trainer._stop_signal or 2
        return 128 + signum
    if rank != 0:  # rank 0 reports for the job
        return 0
    if summary.stop_reason != "completed":  # an early stop or a plugin's clean stop
        print(f"polytrain train: {summary.stop_reason}", file=sys.stderr)
    if args.json:
        print(json.dumps(summary.to_dict(), indent=2))
        return 0
    metric = recipe.metric_spec()
    counts = metric.counts
    rows = [
        [
            e.epoch + 1,
            f"{e.train_loss:.4f}",
            _metric_text(e.train_accuracy, counts),
            "-" if e.test_accuracy is None else _metric_text(e.test_accuracy, counts),
            f"{e.seconds:.1f}",
            f"{e.samples_per_second:.0f}",
        ]
        for e in summary.epochs
    ]
    title = (
        f"{trainer.backend.name} {trainer.backend.version()}: {recipe.model} on "
        f"{recipe.data or recipe.dataset}"
    )
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
    _console().print(_table(title, columns, rows))
    return 0


def cmd_recipe(args: argparse.Namespace) -> int:
    """Print the recipe of a run (its latest checkpoint's) as a recipe file."""
    from polytrain.io.checkpoint import find_checkpoint, read_manifest

    checkpoint = find_checkpoint(args.run)
    recipe = read_manifest(checkpoint).get("recipe")
    if not recipe:
        raise ConfigError(f"{checkpoint} records no recipe (written by an older polytrain?).")
    text = f"# the recipe of {checkpoint}\n" + recipe_toml(Recipe.from_dict(recipe).to_dict())
    if args.out:
        atomic_write_text(args.out, text)
    else:
        print(text, end="")
    return 0


# -- compare --------------------------------------------------------------------------------


def cmd_compare(args: argparse.Namespace) -> int:
    """Run one recipe on several backends and report the differences."""
    from polytrain.parity.compare import Tolerances, compare
    from polytrain.parity.report import lockstep_table, pairs_table, table
    from polytrain.plugins.registry import installed_backends, registered_backends

    if args.backends:
        backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    else:  # in the plugins' BackendInfo.order
        backends = installed_backends()
    tol = Tolerances(args.tol_loss, args.parity_steps, args.tol_acc, grad=args.tol_grad)
    reference = args.reference or first_in_order(backends, list(registered_backends()))
    result = compare(
        backends,
        recipe_from_args(args),
        args.out,
        tolerances=tol,
        threads=args.threads,
        reference=reference,
        quiet=args.quiet,
        lockstep_steps=args.parity_steps,
    )
    console = _console()
    console.print(table(result))
    if result.lockstep is not None:
        console.print(lockstep_table(result))
    console.print(pairs_table(result))
    out = escape(str(args.out))  # text, never markup: a path or message may hold [brackets]
    console.print(f"wrote {out}/comparison.json, {out}/comparison.png and {out}/comparison.html")
    if result.failures:
        for failure in result.failures:
            console.print(f"[red]FAIL[/red] {escape(failure)}")
        return 1
    acc = (
        f" and within {tol.test_accuracy_points} points of test accuracy"
        if tol.test_accuracy_points is not None
        else ""
    )
    ref = escape(reference or backends[0])
    free = min((p.steps_compared for p in result.pairs), default=0)
    locked = result.lockstep.steps if result.lockstep is not None else 0
    if result.recipe["precision"] == "fp64":
        console.print(
            f"[green]OK[/green] (fp64): free runs within {tol.step_loss:.0e} of {ref} on each "
            f"of the {free} steps compared, lockstep on each of {locked} steps, lockstep "
            f"gradients within {tol.grad_for('fp64'):.0e} (relative){acc}."
        )
        return 0
    grads = f"{tol.grad_for(result.recipe['precision']):.0e}"
    console.print(
        f"[green]OK[/green]: in lockstep every backend is within {tol.step_loss:.0e} of "
        f"{ref} (loss) and {grads} (relative, every parameter's gradient) on each of "
        f"{locked} steps{acc}. Free runs diverge once float32 "
        "rounding differences are amplified (--precision fp64 keeps them together); see "
        "docs/semantics.md."
    )
    return 0


def first_in_order(backends: Sequence[str], order: Sequence[str]) -> str | None:
    """The backend of ``backends`` that comes first in ``order`` (compare's reference);
    names not in ``order`` come after, as given."""
    rank = {name: i for i, name in enumerate(order)}
    ranked = sorted(enumerate(backends), key=lambda ib: (rank.get(ib[1], len(rank)), ib[0]))
    return ranked[0][1] if ranked else None


# -- launch and env -------------------------------------------------------------------------


def launcher_for(backend: str) -> Launcher:
    """The launcher the plugin of ``backend`` registers; one clear error if there is none."""
    from polytrain.plugins.registry import registered_launchers, resolve_backend_name

    resolve_backend_name(backend)  # unknown, broken or not installed: its own clear error
    launchers = registered_launchers()
    if backend not in launchers:
        raise ConfigError(
            f"Backend {backend!r} registers no launcher, so polytrain launch cannot start its "
            "processes; its plugin must implement polytrain_register_launchers."
        )
    return launchers[backend]


def cmd_launch(args: argparse.Namespace) -> int:
    """Run a command on several processes through the backend's own engine."""
    from polytrain.distributed.launch import launch
    from polytrain.distributed.launcher import LaunchSpec

    command = list(args.cmd)
    if command and command[0] == "--":
        command = command[1:]
    if args.log_dir is not None:
        from polytrain.io.run_dir import writable_dir

        writable_dir(args.log_dir, "--log-dir")
    spec = LaunchSpec(
        backend=args.backend,
        command=command,
        nproc_per_node=args.nproc_per_node,
        nnodes=args.nnodes,
        node_rank=args.node_rank,
        master=args.master,
        log_dir=args.log_dir,
        num_servers=args.num_servers,
        host=args.host,
        timeout=args.timeout,
    )
    return launch(spec, launcher_for(args.backend))


def cmd_env(args: argparse.Namespace) -> int:
    """Which process this is, as the launcher's environment says."""
    from polytrain.distributed.cluster import explain, resolve
    from polytrain.plugins.registry import cluster_environments

    info = resolve(environments=cluster_environments())
    if args.json:
        from dataclasses import asdict

        print(json.dumps(asdict(info), indent=2))
    elif args.explain:
        print(explain(info))
    else:
        print(
            f"rank {info.rank} of {info.world_size} (local {info.local_rank} of "
            f"{info.local_world_size}), source {info.source}"
        )
    return 0


# -- doctor -------------------------------------------------------------------------------


def cmd_doctor(args: argparse.Namespace) -> int:
    """What works here: imports, devices, threads, precisions, collectives."""
    from polytrain.cli.doctor import run_doctor, summary_rows, why_not
    from polytrain.plugins.registry import registered_backends

    names = args.names or list(registered_backends())
    reports = run_doctor(names, collectives=not args.no_collectives, progress=not args.json)
    if args.json:
        print(json.dumps(reports, indent=2))
        return 0
    console = _console()
    columns = ["backend", "version", "devices", "threads", "precisions (tiny step)",
               "2-process allreduce"]  # fmt: skip
    console.print(_table("polytrain doctor", columns, summary_rows(reports)))
    for line in why_not(reports):
        console.print(f"  why not: {line}", highlight=False, markup=False)
    return 0


# -- convert --------------------------------------------------------------------------------


def cmd_convert(args: argparse.Namespace) -> int:
    """Convert weights between .pt, .pdparams, .params and neutral checkpoints."""
    from polytrain.io.convert import convert, plan_map

    if args.print_map:
        found, notes = plan_map(args.input, args.to, model=args.model, name_map=args.map)
        print(_map_json(found))
        for note in notes:
            print(f"note: {note}", file=sys.stderr)
        return 0
    if args.output is None:
        args.subparser.error("the output file is required (or --print-map)")
    _announce_large_input(args.input, args.output)
    if args.optimizer is not None:
        from polytrain.io.optimizer_state import convert_with_optimizer

        report = convert_with_optimizer(
            args.input, args.output, args.to, optimizer=args.optimizer,
            settings=args.optimizer_setting, optimizer_out=args.optimizer_out,
            model=args.model, name_map=args.map, dtype=args.dtype,
        )  # fmt: skip
        print(report.format())
        return 0
    report = convert(
        args.input, args.output, args.to, model=args.model, name_map=args.map, dtype=args.dtype
    )
    print(report.format())
    return 0


LARGE_INPUT_BYTES = 64 << 20  # a conversion of this much says what it does before it starts


def _announce_large_input(source: str, target: str) -> None:
    """A line on stderr before converting a large file (or checkpoint folder): reading and
    writing hundreds of MB takes seconds to minutes, and silence looks like a hang."""
    path = Path(source)
    try:
        files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
        size = sum(p.stat().st_size for p in files)
    except OSError:
        return  # the conversion itself reports what is wrong with the path
    if size >= LARGE_INPUT_BYTES:
        print(f"polytrain convert: reading {source} ({size / 2**20:,.0f} MB), then writing "
              f"{target} ...", file=sys.stderr, flush=True)  # fmt: skip


def _map_json(found: dict[str, Any], indent: str = "") -> str:
    """A map as JSON, one entry a line (per-format maps nested)."""
    lines = []
    for key, value in found.items():
        nested = isinstance(value, dict) and all(isinstance(v, dict) for v in value.values())
        text = _map_json(value, indent + "  ") if nested and value else json.dumps(value)
        lines.append(f"{indent}  {json.dumps(key)}: {text}")
    return "{\n" + ",\n".join(lines) + f"\n{indent}}}"


def _convert_formats() -> dict[str, NativeFormat]:
    """The registered native formats, for the convert parser ({} when a plugin fails to
    declare them: convert then reports that itself)."""
    from polytrain.plugins.registry import registered_formats

    try:
        return registered_formats()
    except PolytrainError:
        return {}


# -- port -----------------------------------------------------------------------------------


def _hints(items: Sequence[str] | None, path: str | None) -> dict[str, str | None]:
    """SOURCE=TARGET pairs (SOURCE= leaves a source layer out) and a JSON file of the same."""
    found: dict[str, str | None] = {}
    if path is not None:
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ConfigError(f"Cannot read the hints file {path}: {exc}.") from exc
        if not isinstance(data, dict):
            raise ConfigError(f"{path} must be a JSON object {{source layer: target layer}}.")
        found.update({str(k): (str(v) if v else None) for k, v in data.items()})
    for item in items or []:
        source, sep, target = item.partition("=")
        if not sep or not source:
            raise ConfigError(f"--hint {item!r} is not SOURCE_LAYER=TARGET_LAYER.")
        found[source] = target or None
    return found


def cmd_port(args: argparse.Namespace) -> int:
    """Port a model's weights into another framework's model object, verified."""
    from polytrain.porting.api import port

    shape = None
    if args.input_shape:
        try:
            shape = [int(n) for n in args.input_shape.replace("x", ",").split(",") if n]
            if not shape or min(shape) < 1:
                raise ValueError
        except ValueError:
            raise ConfigError(
                f"--input-shape {args.input_shape!r} is not like 1,3,224,224 (sizes >= 1)."
            ) from None
    if args.output is None and not args.print_map:
        args.subparser.error("the output file is required (or --print-map)")
    result = port(
        args.source, args.target, input_shape=shape, inputs=args.input,
        hints=_hints(args.hint, args.hints), tolerance=args.tolerance, weights=args.weights,
        out=None if args.print_map else args.output, map_out=args.map_out,
        report_out=args.report, seed=args.seed,
    )  # fmt: skip
    if args.print_map:
        print(_map_json(result.map_json()))
    print(result.format(), file=sys.stderr if args.print_map else sys.stdout)
    if not result.passed:
        return 1
    if args.output is not None and not args.print_map:
        print(f"wrote {args.output}")
    return 0


# -- port-code ------------------------------------------------------------------------------


def cmd_port_code(args: argparse.Namespace) -> int:
    """Convert Paddle source code into PyTorch source code; report what was converted."""
    from polytrain.porting.code import EXIT_UNCONVERTED, port_code

    report = port_code(args.source, args.output, overwrite=args.overwrite)
    print(report.format(show_unsupported=args.show_unsupported))
    return 0 if report.all_converted else EXIT_UNCONVERTED


# -- parser ---------------------------------------------------------------------------------


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """``--help`` shows each option's default, unless it is None or False (no value)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (
            "%(default)" in text
            or not action.option_strings
            or default is None
            or default is False
            or default is argparse.SUPPRESS
            or isinstance(action, argparse._HelpAction | argparse._VersionAction)
        ):
            return action.help
        return f"{text} (default: %(default)s)".lstrip()


class CommandParser(argparse.ArgumentParser):
    """A subcommand's parser: its ``--help`` shows the defaults."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", DefaultsHelpFormatter)
        super().__init__(*args, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="polytrain",
        description="Write a training recipe once; run it on PyTorch, PaddlePaddle or MXNet.",
    )
    parser.add_argument("--version", action="version", version=f"polytrain {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=CommandParser)

    p = sub.add_parser("backends", help="list backends (import only the ones named)")
    p.add_argument("names", nargs="*", help="backends to import and probe for devices")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_backends, subparser=p)

    p = sub.add_parser("data", help="where each dataset is, or how to get it")
    p.add_argument("names", nargs="*", help="datasets (default: all)")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--download", action="store_true", help="download missing files")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_data, subparser=p)

    p = sub.add_parser("train", help="train a recipe on one backend")
    p.add_argument(
        "--backend",
        default=None,
        help="a registered backend, see polytrain backends (default: $POLYTRAIN_BACKEND or "
        "the only installed)",
    )
    add_recipe_arguments(p)
    p.add_argument("--out", default=None, help="directory for metrics.jsonl and checkpoints")
    p.add_argument(
        "--fast",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="compiled execution (MXNet hybridize, torch.compile, Paddle to_static); default: "
        "automatic, compiled when the planned steps repay the compile (the run header says "
        "which and why; docs/performance.md)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument(
        "--timeout",
        type=num.seconds,
        default=120.0,
        help="seconds for the rendezvous and for any step of a multi-process run",
    )
    p.add_argument("--resume", default=None, help="continue from a run or checkpoint directory")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the run already in --out (its metrics and checkpoints)",
    )
    p.add_argument(
        "--checkpoint-every", type=num.positive_int, default=None, help="also save every N steps"
    )
    p.add_argument(
        "--metrics-every",
        type=num.positive_int,
        default=DEFAULT_METRICS_EVERY,
        metavar="N",
        help="read the training accuracy count from the device every N steps (and at the "
        "epoch end and every checkpoint; same numbers, fewer host syncs); the loss is read "
        f"every step. Default {DEFAULT_METRICS_EVERY}; 1 reads it every step",
    )
    p.add_argument(
        "--keep-checkpoints", type=num.positive_int, default=2, help="checkpoints kept in --out"
    )
    p.add_argument("--tensorboard", default=None, help="write TensorBoard event files here")
    p.add_argument(
        "--log",
        default=None,
        metavar="csv,mlflow,tensorboard",
        help="experiment trackers, comma-separated (rank 0): csv (steps.csv, epochs.csv in "
        "--out), mlflow (params, metrics, artifacts; $MLFLOW_TRACKING_URI or a SQLite store "
        "in --out; pip install 'polytrain[mlflow]'), tensorboard (--tensorboard DIR or "
        "--out/tensorboard); docs/architecture.md, Experiment trackers",
    )
    p.add_argument(
        "--plugin",
        action="append",
        default=[],
        metavar="PKG.MODULE:CLASS",
        help="a training-event plugin (a class or factory called with no arguments); "
        "repeatable (docs/architecture.md, Callbacks that act)",
    )
    p.add_argument(
        "--keep-best",
        default=None,
        metavar="METRIC",
        help="also keep the checkpoint of the best epoch so far by METRIC (val_accuracy, "
        "test_accuracy, train_loss, ...) as checkpoints/best in --out",
    )
    p.add_argument(
        "--inspect",
        default=None,
        help="per-layer output/gradient statistics into the metrics file at these global "
        "steps: '1,50,200' or 'every:100'",
    )
    p.add_argument(
        "--max-skipped",
        type=float,
        default=DEFAULT_MAX_SKIPPED,
        help="stop when more than this share of steps was skipped (fp16 overflow)",
    )
    p.add_argument(
        "--max-loss-growth",
        type=float,
        default=DEFAULT_MAX_LOSS_GROWTH,
        help="stop when the loss exceeds its start this many times (inf: never)",
    )
    p.set_defaults(func=cmd_train, subparser=p)

    p = sub.add_parser("recipe", help="print a run's recipe as a recipe file (--config)")
    p.add_argument("run", metavar="RUN_DIR", help="a run folder or one of its checkpoints")
    p.add_argument("-o", "--out", default=None, metavar="TOML", help="write it there instead")
    p.set_defaults(func=cmd_recipe, subparser=p)

    p = sub.add_parser("compare", help="run one recipe on several backends and compare")
    p.add_argument("--backends", default=None, help="comma-separated (default: all installed)")
    add_recipe_arguments(p)
    p.add_argument("--out", default="runs/compare", help="directory for runs and the report")
    p.add_argument("--reference", default=None, help="backend the others are measured against")
    p.add_argument(
        "--tol-loss",
        type=num.positive_float,
        default=1e-4,
        help="max lockstep per-step loss difference",
    )
    p.add_argument(
        "--parity-steps",
        type=num.positive_int,
        default=200,
        help="the most lockstep steps (never more than the free runs took); also the most "
        "steps of the free runs compared",
    )
    p.add_argument(
        "--tol-grad",
        type=num.positive_float,
        default=None,
        help="max lockstep gradient difference of any parameter, relative to its norm "
        "(default: 5e-2 in fp32, 1e-8 in fp64)",
    )
    p.add_argument(
        "--tol-acc",
        type=num.non_negative_float,
        default=None,
        help="max final test-accuracy difference of the free runs, in points (default: report)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.set_defaults(func=cmd_compare, subparser=p)

    p = sub.add_parser(
        "launch",
        help="run a command on several processes/machines through the backend's own engine",
        description="Example: polytrain launch --backend torch --nproc-per-node 2 --log-dir logs "
        "-- polytrain train --backend torch --epochs 1",
    )
    p.add_argument("--backend", required=True, help="the backend whose engine starts the processes")
    p.add_argument("--nproc-per-node", type=num.positive_int, default=1)
    p.add_argument("--nnodes", type=num.positive_int, default=1)
    p.add_argument("--node-rank", type=num.non_negative_int, default=0, help="0 .. --nnodes - 1")
    p.add_argument("--master", default="127.0.0.1:29500", help="HOST:PORT of node 0")
    p.add_argument("--log-dir", default=None, help="worker output in LOG_DIR/workerlog.N")
    p.add_argument(
        "--num-servers",
        type=num.positive_int,
        default=1,
        help="parameter servers per node, where the engine has them",
    )
    p.add_argument(
        "--host", default=None, help="this node's address for the others (default: routed)"
    )
    p.add_argument(
        "--timeout",
        type=num.seconds,
        default=300.0,
        help="seconds for the nodes to meet and this node's workers to start",
    )
    # not "command": that name holds the sub-command, which error messages print
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="command", help="-- CMD [ARGS...]")
    p.set_defaults(func=cmd_launch, subparser=p)

    p = sub.add_parser("doctor", help="which backends, devices, precisions, collectives work here")
    p.add_argument("names", nargs="*", help="backends to check (default: all registered)")
    p.add_argument("--no-collectives", action="store_true", help="skip the 2-process check")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_doctor, subparser=p)

    formats = _convert_formats()
    p = sub.add_parser(
        "convert",
        help=f"convert weights: {', '.join(f.label for f in formats.values())}, neutral",
        description="Example: polytrain convert mnist.pdparams mnist.pt --to torch. The input "
        "format is detected from the content; see docs/porting.md.",
    )
    suffixes = "/".join(f.suffix for f in formats.values())
    p.add_argument("input", help=f"a {suffixes} file or a checkpoint (run) directory")
    p.add_argument("output", nargs="?", help="the file to write (a directory for --to neutral)")
    p.add_argument("--to", required=True, choices=[*formats, "neutral"] if formats else None)
    p.add_argument("--model", default=None, help="built-in model (default: detected)")
    p.add_argument(
        "--map",
        default=None,
        help="JSON name map for your own model; may be partial, with prefix and re: entries "
        "(docs/porting.md)",
    )
    p.add_argument(
        "--print-map",
        action="store_true",
        help="print the map this conversion would use (the --map JSON) and write nothing",
    )
    p.add_argument(
        "--dtype",
        default=None,
        choices=["float32", "float64"],
        help="of the weights written (default: float32 for .pt/.pdparams/.params, the "
        "source's for a neutral checkpoint)",
    )
    p.add_argument(
        "--optimizer",
        default=None,
        metavar="FILE",
        help="the optimizer state of the same run (.pdopt, Gluon Trainer.save_states): "
        "into the neutral checkpoint, or a torch.optim state dict (--optimizer-out)",
    )
    p.add_argument(
        "--optimizer-out",
        default=None,
        metavar="FILE",
        help="where the ported optimizer state goes (default: OUTPUT with .optimizer "
        "before its suffix, e.g. model.optimizer.pt)",
    )
    p.add_argument(
        "--optimizer-setting",
        action="append",
        default=None,
        metavar="KEY=VALUE",
        help="a hyperparameter the optimizer file does not record: optimizer=adam|adamw|"
        "momentum|adagrad|sgd, lr, momentum, betas=B1,B2, eps, weight_decay, nesterov; "
        "order=FILE (Gluon: the Trainer's parameter order)",
    )
    p.set_defaults(func=cmd_convert, subparser=p)

    p = sub.add_parser(
        "port",
        help="port a model's weights into a PyTorch model object, verified layer by layer",
        description="Example: polytrain port mymodels:paddle_resnet18 mymodels:torch_resnet18 "
        "r18.pt --weights r18.pdparams --input-shape 1,3,224,224. Layers are paired from the "
        "model objects (kind, order, shapes); see docs/porting.md.",
    )
    p.add_argument("source", help="pkg.module:factory building the source model")
    p.add_argument("target", help="pkg.module:factory building the target model")
    p.add_argument("output", nargs="?", help="the target's weights file to write (.pt)")
    p.add_argument("--weights", default=None, help="a weights file to load into the source")
    p.add_argument("--input-shape", default=None, help="random input of this shape: 1,3,224,224")
    p.add_argument("--input", default=None, metavar="NPY", help="a batch (.npy) to verify on")
    p.add_argument(
        "--hint",
        action="append",
        default=None,
        metavar="SRC=TGT",
        help="pair source layer SRC with target layer TGT (SRC= leaves SRC out); repeatable",
    )
    p.add_argument("--hints", default=None, metavar="JSON", help="hints as {source: target}")
    p.add_argument(
        "--tolerance", type=num.positive_float, default=1e-4, help="max |diff| / max |value|"
    )
    p.add_argument("--map-out", default=None, metavar="JSON", help="write the derived map")
    p.add_argument("--report", default=None, metavar="JSON", help="write the report as JSON")
    p.add_argument("--print-map", action="store_true", help="print the map; write no weights")
    p.add_argument("--seed", type=num.seed, default=0, help="of the random input")
    p.set_defaults(func=cmd_port, subparser=p)

    p = sub.add_parser(
        "port-code",
        help="rewrite Paddle code as PyTorch code (file or folder); unconverted calls are marked",
        description="Example: polytrain port-code train.py -o train_torch.py. SRC is never "
        "modified. Exit status 0: everything converted; 3: some calls left in place under a "
        "'# polytrain port-code:' comment; 2: an error. See docs/porting.md.",
    )
    p.add_argument("source", metavar="SRC", help="a .py file or a folder")
    p.add_argument(
        "-o", "--output", default=None, metavar="OUT",
        help="the new file or folder (default: SRC with _torch added); must not exist",
    )  # fmt: skip
    p.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")
    p.add_argument(
        "--show-unsupported", action="store_true", help="list each unconverted API and why"
    )
    p.set_defaults(func=cmd_port_code, subparser=p)

    p = sub.add_parser("env", help="rank, world size and master as this process sees them")
    p.add_argument("--explain", action="store_true", help="which source won and why")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_env, subparser=p)
    return parser


class Stopped(BaseException):
    """SIGTERM as an exception, so that cleanups run (a half-written temporary file is
    removed, a child run is told to stop) before the command exits 128 + SIGTERM."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def _sigterm_raises(command: str) -> Iterator[None]:
    """For commands without a stop of their own (train and launch save, then exit)."""
    if command not in ("compare", "convert"):
        yield
        return

    def stop(signum: int, _frame: object) -> None:
        raise Stopped(signum)

    try:
        previous = signal.signal(signal.SIGTERM, stop)
    except ValueError:  # not the main thread: signals stay as they are
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _drop_stdout() -> None:
    """Point stdout at /dev/null so that Python's final flush does not fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    args.explicit = explicit_options(argv, args.subparser)
    try:
        if getattr(args, "config", None):
            args.explicit |= apply_config(args, args.subparser, args.config)
        with _sigterm_raises(args.command):
            code = int(args.func(args))
            sys.stdout.flush()  # a closed pipe surfaces here, not at interpreter exit
            return code
    except BrokenPipeError:  # `polytrain ... --json | head`: the reader left; not an error
        _drop_stdout()
        return 128 + signal.SIGPIPE
    except Stopped as stop:
        name = signal.Signals(stop.signum).name
        print(f"polytrain {args.command}: interrupted by {name}", file=sys.stderr)
        return 128 + stop.signum
    except PolytrainError as exc:
        print(f"polytrain {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # one a user can cause (a path, a full disk) is one line too
        if exc.filename is None and exc.errno is None:
            raise
        where = f"{exc.filename}: " if exc.filename is not None else ""
        print(f"polytrain {args.command}: error: {where}{exc.strerror or exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"polytrain {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
