"""comparison.html: the comparison as one self-contained page (no network needed to open it).

The page holds what ``polytrain compare`` prints (the same rich tables, turned into HTML
tables, so the numbers are the console's and ``comparison.json``'s), the verdict and its
failures, the plot (``comparison.png`` embedded as a base64 ``data:`` URI) and the recipe as
a recipe file. Its CSS is inline; a Content-Security-Policy forbids loading anything else,
so a browser opening it reaches no network. Every text value is escaped (``html.escape``).
Written with the standard library only: a page this small needs no template engine.
"""

from __future__ import annotations

import base64
import html
from pathlib import Path
from typing import TYPE_CHECKING, Any

from polytrain._version import __version__
from polytrain.utils.fileio import atomic_write_text

if TYPE_CHECKING:
    from polytrain.parity.results import Comparison

#: Nothing but the page itself, its inline CSS and ``data:`` images.
CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"

STYLE = """
body { font-family: sans-serif; margin: 1.5em auto; max-width: 1400px; color: #222; }
h1 { font-size: 1.5em; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 0.9em; }
caption { text-align: left; font-weight: bold; padding: 0.3em 0; }
th, td { border: 1px solid #bbb; padding: 0.25em 0.6em; }
th { background: #e8eef6; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr:nth-child(even) td { background: #f6f6f6; }
.ok { color: #176b1f; font-weight: bold; }
.fail { color: #b00020; font-weight: bold; }
img { max-width: 100%; border: 1px solid #ddd; }
pre { background: #f4f4f4; padding: 0.8em; border: 1px solid #ddd; }
footer { color: #777; font-size: 0.8em; margin-top: 2em; }
"""


def page_title(result: Comparison) -> str:
    """``polytrain compare: <model> on <dataset>``: the page's <title> and heading."""
    return f"polytrain compare: {result.recipe['model']} on {result.recipe['dataset']}"


def write_html(result: Comparison, path: Path, plot: Path) -> None:
    """Write the page for ``result`` to ``path`` (atomically), embedding the PNG ``plot``."""
    atomic_write_text(path, render_html(result, plot.read_bytes()))


def render_html(result: Comparison, png: bytes) -> str:
    """The page's text: verdict, tables, plot (``png``, embedded) and recipe."""
    from polytrain.parity.report import lockstep_table, pairs_table, table

    e = html.escape
    title = page_title(result)
    tables = [t for t in (table(result), lockstep_table(result), pairs_table(result)) if t]
    tol = result.tolerances
    grad = tol.grad_for(result.recipe.get("precision", "fp32"))
    acc = "report only" if tol.test_accuracy_points is None else f"{tol.test_accuracy_points}"
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{e(CSP)}">',
        f"<title>{e(title)}</title><style>{STYLE}</style></head><body>",
        f"<h1>{e(title)}</h1>",
        _verdict(result),
        f"<p>Reference backend: <b>{e(result.reference)}</b>. Tolerances: lockstep step loss "
        f"{tol.step_loss:.0e} over {tol.parity_steps} steps, relative gradient {grad:.0e}, "
        f"test accuracy (points) {e(acc)}; free runs diverge at |Δloss| &gt; "
        f"{tol.diverged_at:.0e}.</p>",
        "<h2>Results</h2>",
        *(_table_html(t) for t in tables),
        "<h2>Plots</h2>",
        f'<img alt="{e(title)}: loss curves, deviation per step, test accuracy, throughput" '
        f'src="data:image/png;base64,{base64.b64encode(png).decode("ascii")}">',
        "<h2>Recipe</h2>",
        "<p>As a recipe file (<code>polytrain compare --config FILE</code>):</p>",
        f'<pre id="recipe">{e(recipe_text(result.recipe))}</pre>',
        f"<footer>Written by polytrain {e(__version__)}.</footer>",
        "</body></html>",
    ]
    return "\n".join(parts) + "\n"


def recipe_text(recipe: dict[str, Any]) -> str:
    """The recipe as TOML: every field that has a value (``polytrain recipe``'s format)."""
    import tomli_w

    return tomli_w.dumps({k: v for k, v in recipe.items() if v is not None and v != {}})


def _verdict(result: Comparison) -> str:
    if result.ok:
        return '<p class="ok">OK: within tolerances</p>'
    items = "".join(f"<li>{html.escape(f)}</li>" for f in result.failures)
    return f'<p class="fail">TOLERANCE BROKEN</p><ul class="fail">{items}</ul>'


def _table_html(table: Any) -> str:
    """A rich ``Table`` (the console report's) as an HTML table: same caption, same cells."""
    e = html.escape
    head = "".join(f"<th>{e(str(c.header))}</th>" for c in table.columns)
    columns = [[str(cell) for cell in c.cells] for c in table.columns]
    numeric = [c.justify == "right" for c in table.columns]
    rows = []
    for row in zip(*columns, strict=True):
        cells = "".join(
            f'<td class="num">{e(v)}</td>' if num else f"<td>{e(v)}</td>"
            for v, num in zip(row, numeric, strict=True)
        )
        rows.append(f"<tr>{cells}</tr>")
    return (
        f"<table><caption>{e(str(table.title or ''))}</caption>"
        f"<thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"
    )
