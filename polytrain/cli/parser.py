"""The ``polytrain`` argument parser: one sub-command per command module, each option
checked at parsing (:mod:`polytrain.cli.arguments`)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any, TypeAlias

from polytrain._version import __version__
from polytrain.cli import arguments as num
from polytrain.cli.compare import cmd_compare
from polytrain.cli.convert import cmd_convert, convert_formats
from polytrain.cli.info import cmd_backends, cmd_data, cmd_doctor
from polytrain.cli.launch import cmd_env, cmd_launch
from polytrain.cli.port import cmd_port, cmd_port_code
from polytrain.cli.recipe_args import add_recipe_arguments
from polytrain.cli.train import cmd_recipe, cmd_train
from polytrain.training.health import DEFAULT_MAX_LOSS_GROWTH, DEFAULT_MAX_SKIPPED
from polytrain.training.step import DEFAULT_METRICS_EVERY

Subparsers: TypeAlias = "argparse._SubParsersAction[CommandParser]"


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
    """The ``polytrain`` parser: one sub-parser per command, each with ``--debug``."""
    parser = argparse.ArgumentParser(
        prog="polytrain",
        description="Write a training recipe once; run it on PyTorch, PaddlePaddle or MXNet.",
    )
    parser.add_argument("--version", action="version", version=f"polytrain {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=CommandParser)
    for add_command in COMMANDS:
        add_command(sub)
    for command in sub.choices.values():
        command.add_argument(
            "--debug",
            action="store_true",
            help="on an error, print its traceback (a user's model, plugin or file included) "
            "after the one line; also POLYTRAIN_DEBUG=1",
        )
    return parser


def _add_backends(sub: Subparsers) -> None:
    """``polytrain backends``."""
    p = sub.add_parser("backends", help="list backends (import only the ones named)")
    p.add_argument("names", nargs="*", help="backends to import and probe for devices")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_backends, subparser=p)


def _add_data(sub: Subparsers) -> None:
    """``polytrain data``."""
    p = sub.add_parser("data", help="where each dataset is, or how to get it")
    p.add_argument("names", nargs="*", help="datasets (default: all)")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--download", action="store_true", help="download missing files")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_data, subparser=p)


def _add_train(sub: Subparsers) -> None:
    """``polytrain train``."""
    p = sub.add_parser("train", help="train a recipe on one backend")
    p.add_argument(
        "--backend",
        default=None,
        help="a registered backend, see polytrain backends (default: $POLYTRAIN_BACKEND or "
        "the only installed)",
    )
    add_recipe_arguments(p)
    _add_run_options(p)
    _add_checkpoint_options(p)
    _add_tracking_options(p)
    _add_health_options(p)
    p.set_defaults(func=cmd_train, subparser=p)


def _add_recipe(sub: Subparsers) -> None:
    """``polytrain recipe``."""
    p = sub.add_parser("recipe", help="print a run's recipe as a recipe file (--config)")
    p.add_argument("run", metavar="RUN_DIR", help="a run folder or one of its checkpoints")
    p.add_argument("-o", "--out", default=None, metavar="TOML", help="write it there instead")
    p.set_defaults(func=cmd_recipe, subparser=p)


def _add_compare(sub: Subparsers) -> None:
    """``polytrain compare``."""
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


def _add_launch(sub: Subparsers) -> None:
    """``polytrain launch``."""
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


def _add_doctor(sub: Subparsers) -> None:
    """``polytrain doctor``."""
    p = sub.add_parser("doctor", help="which backends, devices, precisions, collectives work here")
    p.add_argument("names", nargs="*", help="backends to check (default: all registered)")
    p.add_argument("--no-collectives", action="store_true", help="skip the 2-process check")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_doctor, subparser=p)


def _add_convert(sub: Subparsers) -> None:
    """``polytrain convert``."""
    formats = convert_formats()
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
        "--zoo",
        default=None,
        metavar="ZOO:MODEL",
        help="the map polytrain ships for a zoo model with a torchvision twin, e.g. "
        "paddle:densenet121, gluon:resnet18_v1, or for a named NLP model into transformers: "
        "paddlenlp:bert, paddlenlp:ernie, gluonnlp:bert (docs/porting.md, 'Zoo models "
        "without the objects'); the file is checked against it",
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
    _add_convert_optimizer_options(p)
    p.set_defaults(func=cmd_convert, subparser=p)


def _add_port(sub: Subparsers) -> None:
    """``polytrain port``."""
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


def _add_port_code(sub: Subparsers) -> None:
    """``polytrain port-code``."""
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
    p.add_argument(
        "--verify", default=None, metavar="FACTORY",
        help="after converting, build the model FACTORY (a function or class of the file; "
        "pkg.module:FACTORY in a folder) from the original and the converted code, and "
        "check them layer by layer as polytrain port does (imports both: their code runs)",
    )  # fmt: skip
    p.add_argument("--input-shape", default=None, help="--verify's random input: 2,1,28,28")
    p.add_argument(
        "--tolerance", type=num.positive_float, default=1e-4, help="--verify's max |diff| / max"
    )
    p.set_defaults(func=cmd_port_code, subparser=p)


def _add_env(sub: Subparsers) -> None:
    """``polytrain env``."""
    p = sub.add_parser("env", help="rank, world size and master as this process sees them")
    p.add_argument("--explain", action="store_true", help="which source won and why")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_env, subparser=p)


def _add_run_options(p: argparse.ArgumentParser) -> None:
    """Where a run writes, how it prints, resumes and waits."""
    p.add_argument("--out", default=None, help="directory for metrics.jsonl and checkpoints")
    p.add_argument(
        "--fast",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="compiled execution (MXNet hybridize, torch.compile, Paddle static graph); default: "
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
    p.add_argument(
        "--resume",
        default=None,
        help="continue from a run or checkpoint directory (a run goes on in its folder "
        "unless --out names another)",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the run already in --out (its metrics and checkpoints)",
    )


def _add_checkpoint_options(p: argparse.ArgumentParser) -> None:
    """How often a run saves and reads its metric."""
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


def _add_tracking_options(p: argparse.ArgumentParser) -> None:
    """Trackers, plugins and the records kept."""
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
        help="also keep the checkpoint of the best epoch so far by METRIC (val_metric, "
        "test_metric, train_loss, ...; or the older val_accuracy, test_accuracy) as "
        "checkpoints/best in --out",
    )
    p.add_argument(
        "--inspect",
        default=None,
        help="per-layer output/gradient statistics into the metrics file at these global "
        "steps: '1,50,200' or 'every:100'",
    )


def _add_health_options(p: argparse.ArgumentParser) -> None:
    """When an unhealthy run stops."""
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


def _add_convert_optimizer_options(p: argparse.ArgumentParser) -> None:
    """The optimizer and scheduler state ported beside the weights."""
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
        "--scheduler-out",
        default=None,
        metavar="FILE",
        help="where the ported lr scheduler state goes, when the run had a schedule "
        "(default: OUTPUT with .scheduler before its suffix)",
    )
    p.add_argument(
        "--optimizer-setting",
        action="append",
        default=None,
        metavar="KEY=VALUE",
        help="what the optimizer file does not record: optimizer=sgd|momentum|adam|adamw|"
        "adamax|adagrad|adadelta|rmsprop, lr, momentum, betas=B1,B2, eps, weight_decay, "
        "nesterov=true|false, rho, centered; scheduler='StepDecay(...)' (Paddle: the run's "
        "LR scheduler as its script built it) or scheduler=constant; order=FILE (Gluon: "
        "the Trainer's parameter order)",
    )


# the sub-commands in the order ``polytrain --help`` lists them
COMMANDS: tuple[Callable[[Subparsers], None], ...] = (
    _add_backends,
    _add_data,
    _add_train,
    _add_recipe,
    _add_compare,
    _add_launch,
    _add_doctor,
    _add_convert,
    _add_port,
    _add_port_code,
    _add_env,
)
