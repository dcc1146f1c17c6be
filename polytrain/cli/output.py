"""What the commands print: rich tables and a console that keeps them readable in logs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def escape(text: str) -> str:
    """``text`` shown as it is by rich (``polytrain[paddle]`` is not a style tag)."""
    from rich.markup import escape as rich_escape

    return rich_escape(text)


def make_console() -> Any:
    """A rich console; 160 columns wide when it is not a terminal."""
    from rich.console import Console

    console = Console()
    if not console.is_terminal:  # logs and pipes: do not squeeze tables into 80 columns
        console = Console(width=160)
    return console


def make_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> Any:
    """A rich table of ``rows``; None shows as "-", every cell as plain text."""
    from rich.table import Table
    from rich.text import Text

    table = Table(title=title)
    for col in columns:
        table.add_column(col)
    for row in rows:  # Text: a cell such as "polytrain[mxnet]" is not read as rich markup
        table.add_row(*(Text("-" if v is None else str(v)) for v in row))
    return table
