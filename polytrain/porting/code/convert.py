"""One module's source converted: a first pass finds which import aliases stay in use (a
marked call still needs its import), the second converts with the others kept as aliases
of their target modules, then the imports are rewritten.

Where the tool itself fails on a statement (an exception in libcst or in a conversion),
that statement is left as it was under a marker and the conversion starts again without
entering it, so one statement the tool gets wrong never loses the rest of the file."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import libcst as cst
from libcst.metadata import MetadataWrapper

from polytrain.errors import ConfigError
from polytrain.porting.code.imports import (
    ImportRewriter,
    bindings,
    keepable_aliases,
    used_locals,
    with_helpers,
)
from polytrain.porting.code.port_pass import MARKER, STATEMENT
from polytrain.porting.code.report import FileReport, Use
from polytrain.porting.code.table import Framework, frameworks
from polytrain.porting.code.transformer import PortTransformer

MODULE_FAILED = "the tool failed outside any statement ({error}); the file is left as it was"
Skip = dict[tuple[int, int], str]


@dataclass
class Result:
    code: str
    report: FileReport


class _Failed(Exception):
    """The tool failed on the statement at ``at`` (None: outside any statement)."""

    def __init__(self, at: tuple[int, int] | None, error: str) -> None:
        super().__init__(error)
        self.at, self.error = at, error


def _error(exc: Exception) -> str:
    first = (str(exc).strip().splitlines() or [""])[0]
    return " ".join(f"{type(exc).__name__}: {first}"[:160].split())


def _pass(
    module: cst.Module,
    tables: Mapping[str, Framework],
    aliases: Mapping[str, str],
    skip: Skip,
) -> tuple[cst.Module, PortTransformer]:
    imported = {b.imported.split(".")[0] for b in bindings(module, tables)}
    transformer = PortTransformer(tables, imported, aliases, skip)
    try:
        converted = MetadataWrapper(module).visit(transformer)
    except Exception as exc:  # the tool's own failure: its statement is left whole
        at = transformer.inside[-1] if transformer.inside else None
        raise _Failed(at, _error(exc)) from exc
    return converted, transformer


def _convert(module: cst.Module, tables: Mapping[str, Framework], skip: Skip) -> Result:
    first, _ = _pass(module, tables, {}, skip)
    still_used = used_locals(first, tables)
    aliases = keepable_aliases(module, tables, still_used)
    converted, transformer = _pass(module, tables, aliases, skip)
    try:
        rewriter = ImportRewriter(tables, still_used, aliases, transformer.needs_root)
        final = with_helpers(converted.visit(rewriter), transformer.helpers)
        text = final.code
    except Exception as exc:
        raise _Failed(None, _error(exc)) from exc
    uses = sorted(transformer.uses, key=lambda u: u.line)
    return Result(text, FileReport("", uses))


def _left_whole(source: str, error: str) -> Result:
    """The file as it was, under one marker: the tool failed outside any statement."""
    why = MODULE_FAILED.format(error=error)
    marker = MARKER.format(api=STATEMENT, why=why)
    return Result(f"{marker}\n{source}", FileReport("", [Use(1, STATEMENT, why)]))


def convert_source(
    source: str, path: str = "<string>", tables: Mapping[str, Framework] | None = None
) -> Result:
    """``source`` converted, and what was converted and left."""
    tables = frameworks() if tables is None else tables
    try:
        module = cst.parse_module(source)
    except cst.ParserSyntaxError as exc:
        why = str(exc).strip().splitlines()[0]
        raise ConfigError(f"{path} is not Python that libcst can parse: {why}") from exc
    skip: Skip = {}
    while True:
        try:
            result = _convert(module, tables, skip)
        except _Failed as failed:
            if failed.at is None or failed.at in skip:
                result = _left_whole(source, failed.error)
            else:
                skip[failed.at] = failed.error
                continue
        result.report.path = path
        return result
