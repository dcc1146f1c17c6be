"""The code blocks of README.md and docs/*.md, and what a test does with each.

A fenced block is code when its language is ``python`` or ``bash``; an HTML comment on the
line before it says how it is checked when it cannot run as shown:

- ``<!-- snippet: excerpt of PATH -->``: every code line of the block (its text before a
  trailing ``#`` comment) is a line of PATH, a file the suite runs;
- ``<!-- snippet: skip: REASON -->``: not run, for the reason given (several machines, a
  GPU, a scheduler).

Other python blocks run as shown, in a fresh interpreter; bash blocks' ``polytrain`` and
``python examples/...`` command lines are parsed by the real parsers (``train`` and
``compare`` also build their recipe, which validates every value).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FENCE = re.compile(r"^```(\w*)\s*$")
SHELL_OPERATORS = ("|", "||", "&&", ";", "&", "<", "2>&1")
PROGRAMS = ("polytrain", ".venv/bin/polytrain", "python")
MARK = re.compile(r"^<!-- snippet: (excerpt of (?P<path>\S+)|skip: (?P<reason>.+?)) -->\s*$")


@dataclass(frozen=True)
class Snippet:
    """One fenced code block."""

    doc: str  # path relative to the repository
    line: int  # 1-based line of the opening fence
    language: str
    code: str
    excerpt_of: str | None = None
    skip: str | None = None

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}"


def snippets(docs: list[Path] | None = None) -> list[Snippet]:
    """Every python and bash block of README.md and docs/*.md."""
    found = []
    for path in docs or [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        lines = path.read_text().splitlines()
        i = 0
        while i < len(lines):
            fence = FENCE.match(lines[i])
            if not fence:
                i += 1
                continue
            start, language = i, fence.group(1)
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            mark = MARK.match(lines[start - 1]) if start else None
            if language in ("python", "bash"):
                found.append(
                    Snippet(
                        str(path.relative_to(ROOT)),
                        start + 1,
                        language,
                        "\n".join(lines[start + 1 : end]) + "\n",
                        excerpt_of=mark["path"] if mark else None,
                        skip=mark["reason"] if mark else None,
                    )
                )
            i = end + 1
    return found


def code_lines(code: str) -> list[str]:
    """The block's code lines without trailing comments and indentation (blank and
    comment-only lines dropped)."""
    out = []
    for line in code.splitlines():
        text = re.sub(r"\s{2,}#.*$", "", line).strip()  # an inline comment: 2+ spaces, #
        if text and not text.startswith("#"):
            out.append(text)
    return out


def commands(code: str) -> list[list[str]]:
    """The ``polytrain``/``python`` commands of a bash block (continuations joined, comments,
    redirections and pipes dropped; each side of ``&&`` on its own), split into words."""
    import shlex

    joined = re.sub(r"\\\n\s*", " ", code)
    out = []
    for line in joined.splitlines():
        segment: list[str] = []
        for word in [*shlex.split(line, comments=True), ";"]:
            if word in SHELL_OPERATORS or word.startswith(">"):
                if segment and segment[0] in PROGRAMS:
                    out.append(segment)
                segment = [] if word != ">" else ["(redirect)"]
            else:
                segment.append(word)
    return out
