"""``polytrain port`` (a model's weights into another framework's model, verified) and
``polytrain port-code`` (Paddle source into PyTorch source)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from polytrain.cli.convert import map_json
from polytrain.errors import ConfigError
from polytrain.utils.output_paths import refuse_overwriting_inputs, refuse_unwritable
from polytrain.utils.user_files import read_json


def _hints(items: Sequence[str] | None, path: str | None) -> dict[str, str | None]:
    """SOURCE=TARGET pairs (SOURCE= leaves a source layer out) and a JSON file of the same."""
    found: dict[str, str | None] = {}
    if path is not None:
        data = read_json(path, "the hints file")
        if not isinstance(data, dict):
            raise ConfigError(f"{path} must be a JSON object {{source layer: target layer}}.")
        found.update({str(k): (str(v) if v else None) for k, v in data.items()})
    for item in items or []:
        source, sep, target = item.partition("=")
        if not sep or not source:
            raise ConfigError(f"--hint {item!r} is not SOURCE_LAYER=TARGET_LAYER.")
        found[source] = target or None
    return found


def _input_shape(text: str | None) -> list[int] | None:
    """``--input-shape 1,3,224,224`` (or ``1x3x224x224``) as sizes >= 1."""
    if not text:
        return None
    try:
        shape = [int(n) for n in text.replace("x", ",").split(",") if n]
        if not shape or min(shape) < 1:
            raise ValueError
    except ValueError:
        raise ConfigError(f"--input-shape {text!r} is not like 1,3,224,224 (sizes >= 1).") from None
    return shape


def cmd_port(args: argparse.Namespace) -> int:
    """Port a model's weights into another framework's model object, verified."""
    from polytrain.porting.api import port

    shape = _input_shape(args.input_shape)
    if args.output is None and not args.print_map:
        args.subparser.error("the output file is required (or --print-map)")
    out = None if args.print_map else args.output
    outputs = {"the output": out, "--map-out": args.map_out, "--report": args.report}
    refuse_overwriting_inputs(
        outputs, {"--weights": args.weights, "--input": args.input, "--hints": args.hints}
    )
    refuse_unwritable(outputs)  # before the models are built, not after
    result = port(
        args.source, args.target, input_shape=shape, inputs=args.input,
        hints=_hints(args.hint, args.hints), tolerance=args.tolerance, weights=args.weights,
        out=out, map_out=args.map_out,
        report_out=args.report, seed=args.seed,
    )  # fmt: skip
    if args.print_map:
        print(map_json(result.map_json()))
    print(result.format(), file=sys.stderr if args.print_map else sys.stdout)
    if not result.passed:
        return 1
    if args.output is not None and not args.print_map:
        print(f"wrote {args.output}")
    return 0


def cmd_port_code(args: argparse.Namespace) -> int:
    """Convert Paddle source code into PyTorch source code; report what was converted."""
    from polytrain.porting.code import EXIT_UNCONVERTED, port_code

    def progress(line: str) -> None:
        print(f"polytrain port-code: {line}", file=sys.stderr, flush=True)

    shape = _input_shape(args.input_shape)
    if args.verify and shape is None:
        raise ConfigError("--verify needs --input-shape: the batch both models run on.")
    report = port_code(args.source, args.output, overwrite=args.overwrite, progress=progress)
    print(report.format(show_unsupported=args.show_unsupported))
    if args.verify:
        from polytrain.porting.code.files import default_output
        from polytrain.porting.code.verify import verify_converted

        src = Path(args.source)
        out = Path(args.output) if args.output else default_output(src)
        result = verify_converted(
            src, out, args.verify, input_shape=shape, tolerance=args.tolerance
        )
        print(result.format())
        if not result.passed:
            return 1
    return 0 if report.all_converted else EXIT_UNCONVERTED
