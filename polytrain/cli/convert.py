"""``polytrain convert``: weights (and optimizer state) between native formats and
neutral checkpoints."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from polytrain.errors import ConfigError, PolytrainError

if TYPE_CHECKING:
    from polytrain.backend.native_format import NativeFormat


def cmd_convert(args: argparse.Namespace) -> int:
    """Convert weights between .pt, .pdparams, .params and neutral checkpoints."""
    from polytrain.io.convert import convert, plan_map
    from polytrain.io.zoo import with_zoo_notes

    zoo_notes = _take_zoo_map(args) if args.zoo is not None else []
    if args.print_map:
        found, notes = plan_map(args.input, args.to, model=args.model, name_map=args.map)
        print(map_json(found))
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
            scheduler_out=args.scheduler_out,
            model=args.model, name_map=args.map, dtype=args.dtype,
        )  # fmt: skip
        report.notes[:] = with_zoo_notes(zoo_notes, report.notes)
        print(report.format())
        return 0
    report = convert(
        args.input, args.output, args.to, model=args.model, name_map=args.map, dtype=args.dtype
    )
    report.notes[:] = with_zoo_notes(zoo_notes, report.notes)
    print(report.format())
    return 0


def _take_zoo_map(args: argparse.Namespace) -> list[str]:
    """``--zoo ZOO:MODEL``: the shipped map, checked against the input file, becomes
    ``args.map``; the notes saying so."""
    from polytrain.io.zoo import load_zoo, plan_zoo, zoo_notes

    for flag, value in (("--map", args.map), ("--model", args.model)):
        if value is not None:
            raise ConfigError(f"--zoo {args.zoo} gives the map: drop {flag}.")
    zmap, classes, args.map = plan_zoo(args.input, args.to, load_zoo(args.zoo))
    return zoo_notes(zmap, classes)


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


def map_json(found: dict[str, Any], indent: str = "") -> str:
    """A map as JSON, one entry a line (per-format maps nested)."""
    lines = []
    for key, value in found.items():
        nested = isinstance(value, dict) and all(isinstance(v, dict) for v in value.values())
        text = map_json(value, indent + "  ") if nested and value else json.dumps(value)
        lines.append(f"{indent}  {json.dumps(key)}: {text}")
    return "{\n" + ",\n".join(lines) + f"\n{indent}}}"


def convert_formats() -> dict[str, NativeFormat]:
    """The registered native formats, for the convert parser ({} when a plugin fails to
    declare them: convert then reports that itself)."""
    from polytrain.plugins.registry import registered_formats

    try:
        return registered_formats()
    except PolytrainError:
        return {}
