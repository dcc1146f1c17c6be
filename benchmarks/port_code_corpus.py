"""``polytrain port-code`` on real public code (issue 36):
``python -m benchmarks.port_code_corpus [--gather MIRRORS] [--json OUT] [--top 20]``.

The corpus is listed in ``tests/fixtures/port_code_corpus/manifest.toml``: files of public
Paddle 2.x/3.x, fluid 1.x, Gluon and d2l repositories, each with its repository, commit,
path and licence. ``--gather MIRRORS`` writes them beside the manifest from local bare git
mirrors (``MIRRORS/<owner>+<name>/repo``), notebook and d2l markdown cells extracted, each
checked against its sha256. Then every file is converted in memory and the script prints,
per file, per group and in total: the lines with framework calls, those converted, those
left marked, crashes (an exception out of the converter), whether the output compiles, and
the most frequent calls left unconverted (docs/porting.md quotes the totals).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
import sys
import tomllib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from polytrain.porting.code import convert_source

CORPUS = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "port_code_corpus"
GROUPS = ("paddle", "fluid", "gluon", "d2l")
_CELL = re.compile(r"^```\{\.python \.input[^}]*\}\n(.*?)^```", re.M | re.S)
_TAB = re.compile(r"^#@tab\s+(.*)$")


# ---- the corpus -----------------------------------------------------------------------------


def manifest(root: Path = CORPUS) -> list[dict[str, str]]:
    """The manifest's entries, in order."""
    data = tomllib.loads((root / "manifest.toml").read_text(encoding="utf-8"))
    return list(data["file"])


def licences(root: Path = CORPUS) -> dict[str, str]:
    """Repository -> its licence (SPDX)."""
    data = tomllib.loads((root / "manifest.toml").read_text(encoding="utf-8"))
    return dict(data["licences"])


def corpus_path(entry: dict[str, str], root: Path = CORPUS) -> Path:
    return root / entry["group"] / entry["name"]


def _shell_safe(line: str) -> str:
    """A cell's shell (``!pip``) or magic (``%matplotlib``) line, commented out (they start
    at the first column; ``%`` further in is Python's operator)."""
    return f"# {line}" if line.startswith(("!", "%")) else line


def notebook_code(text: str) -> str:
    """The code cells of a Jupyter notebook, one after another."""
    cells = json.loads(text)["cells"]
    out = []
    for cell in cells:
        if cell.get("cell_type") != "code":
            continue
        source = cell["source"]
        body = "".join(source) if isinstance(source, list) else source
        out.append("\n".join(_shell_safe(x) for x in body.splitlines()))
    return "\n\n".join(out) + "\n"


def markdown_code(text: str, tab: str | None) -> str:
    """The ``{.python .input}`` cells of a d2l chapter: all of them (``tab`` None, the
    book's single-framework v1), else those of ``tab`` and of ``#@tab all``."""
    out = []
    for match in _CELL.finditer(text):
        body = match.group(1)
        first = body.split("\n", 1)[0].strip()
        found = _TAB.match(first)
        tabs = {t.strip() for t in found.group(1).split(",")} if found else {"mxnet"}
        if tab is None or tab in tabs or "all" in tabs:
            out.append("\n".join(_shell_safe(x) for x in body.rstrip("\n").splitlines()))
    return "\n\n".join(out) + "\n"


def extract(kind: str, raw: str) -> str:
    if kind == "file":
        return raw
    if kind == "ipynb":
        return notebook_code(raw)
    if kind == "markdown":
        return markdown_code(raw, None)
    if kind.startswith("markdown:"):
        return markdown_code(raw, kind.split(":", 1)[1])
    raise ValueError(f"unknown extract kind {kind!r}")


def gather(mirrors: Path, root: Path = CORPUS) -> int:
    """Write every corpus file from the mirrors; the number of files whose hash differs."""
    bad = 0
    for entry in manifest(root):
        git_dir = mirrors / entry["repo"].replace("/", "+") / "repo"
        raw = subprocess.run(
            ["git", f"--git-dir={git_dir}", "show", f"{entry['commit']}:{entry['path']}"],
            check=True, capture_output=True,
        ).stdout.decode("utf-8")  # fmt: skip
        text = extract(entry["extract"], raw)
        digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
        if entry.get("sha256") not in (None, digest):
            print(f"{entry['name']}: sha256 {digest} differs from the manifest's")
            bad += 1
        path = corpus_path(entry, root)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(text.encode("utf-8"))  # as it is: some files have CRLF lines
    return bad


# ---- the measurement ------------------------------------------------------------------------


@dataclass
class Row:
    """One file's numbers."""

    group: str
    name: str
    lines: int = 0
    converted: int = 0
    crashed: str = ""
    compiles: bool = True
    left: Counter[str] = field(default_factory=Counter)

    @property
    def marked(self) -> int:
        return self.lines - self.converted


def measure(path: Path, group: str) -> Row:
    """``path`` converted in memory: its row."""
    row = Row(group, path.name)
    source = path.read_text(encoding="utf-8")
    try:
        result = convert_source(source, str(path))
    except Exception as exc:  # a crash is what is counted
        row.crashed = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        row.compiles = False
        return row
    report = result.report
    row.lines, row.converted = len(report.lines), len(report.converted_lines)
    row.left = report.unconverted
    try:
        compile(result.code, str(path), "exec")
    except SyntaxError:
        row.compiles = False
    return row


def _rate(done: int, total: int) -> str:
    return f"{100 * done / total:5.1f} %" if total else "    - "


def _line(label: str, rows: list[Row]) -> str:
    lines = sum(r.lines for r in rows)
    done = sum(r.converted for r in rows)
    crashes = sum(bool(r.crashed) for r in rows)
    compiles = sum(r.compiles for r in rows)
    return (
        f"{label:<44} {lines:5d} {done:5d} {lines - done:5d} {_rate(done, lines)} "
        f"{crashes:3d} {compiles:3d}/{len(rows)}"
    )


def table(rows: list[Row], top: int) -> str:
    head = f"{'file':<44} {'lines':>5} {'conv':>5} {'mark':>5} {'rate':>7} {'crash':>3} compiles"
    out = [head]
    for r in rows:
        out.append(
            _line(f"{r.group}/{r.name}", [r]) + (f"  CRASH {r.crashed}" if r.crashed else "")
        )
    out.append("")
    for group in GROUPS:
        out.append(_line(f"group {group}", [r for r in rows if r.group == group]))
    out.append(_line("total", rows))
    left: Counter[str] = Counter()
    for r in rows:
        left.update(r.left)
    out += ["", f"the {top} most frequent calls left unconverted:"]
    out += [f"  {n:4d}  {api}" for api, n in left.most_common(top)]
    return "\n".join(out)


def summary(rows: list[Row]) -> dict[str, Any]:
    def numbers(sel: list[Row]) -> dict[str, Any]:
        lines, done = sum(r.lines for r in sel), sum(r.converted for r in sel)
        return {
            "files": len(sel), "lines": lines, "converted": done, "marked": lines - done,
            "rate": round(done / lines, 4) if lines else None,
            "crashes": sum(bool(r.crashed) for r in sel),
            "compiles": sum(r.compiles for r in sel),
        }  # fmt: skip

    return {
        "files": [
            {"group": r.group, "name": r.name, **numbers([r]), "left": dict(r.left)} for r in rows
        ],
        "groups": {g: numbers([r for r in rows if r.group == g]) for g in GROUPS},
        "total": numbers(rows),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.port_code_corpus", description=__doc__
    )
    parser.add_argument("--gather", type=Path, metavar="MIRRORS", help="write the corpus first")
    parser.add_argument("--json", type=Path, metavar="OUT", help="write the numbers as JSON")
    parser.add_argument("--top", type=int, default=20)
    args = parser.parse_args(argv)
    if args.gather is not None and gather(args.gather):
        return 1
    entries = manifest()
    missing = [e["name"] for e in entries if not corpus_path(e).exists()]
    if missing:
        print(
            f"{len(missing)} corpus file(s) absent ({missing[0]}, ...): run with --gather MIRRORS"
        )
        return 2
    rows = [measure(corpus_path(e), e["group"]) for e in entries]
    print(table(rows, args.top))
    if args.json is not None:
        args.json.write_text(json.dumps(summary(rows), indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
