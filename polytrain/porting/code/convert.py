"""One module's source converted: a first pass finds which import aliases stay in use (a
marked call still needs its import), the second converts with the others kept as aliases
of their target modules, then the imports are rewritten."""

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
from polytrain.porting.code.report import FileReport
from polytrain.porting.code.table import Framework, frameworks
from polytrain.porting.code.transformer import PortTransformer


@dataclass
class Result:
    code: str
    report: FileReport


def _pass(
    module: cst.Module, tables: Mapping[str, Framework], aliases: Mapping[str, str]
) -> tuple[cst.Module, PortTransformer]:
    imported = {b.imported.split(".")[0] for b in bindings(module, tables)}
    transformer = PortTransformer(tables, imported, aliases)
    converted = MetadataWrapper(module).visit(transformer)
    return converted, transformer


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
    first, _ = _pass(module, tables, {})
    still_used = used_locals(first, tables)
    aliases = keepable_aliases(module, tables, still_used)
    converted, transformer = _pass(module, tables, aliases)
    rewriter = ImportRewriter(tables, still_used, aliases, transformer.needs_root)
    final = with_helpers(converted.visit(rewriter), transformer.helpers)
    uses = sorted(transformer.uses, key=lambda u: u.line)
    return Result(final.code, FileReport(path, uses))
