"""The bash blocks of README.md and docs/*.md run as a user would run them, one test per doc
(its blocks in order, in one fresh folder); tests/doc_commands.py says what is capped, what
is not run and which inputs are made first. tests/docs/test_doc_snippets.py still parses every
command line (cheap: it names a bad flag without running anything)."""

from __future__ import annotations

from pathlib import Path

import pytest
from doc_commands import NOT_RUN, command_lines, run_doc, runnable_blocks

DOCS = runnable_blocks()


@pytest.mark.slow
@pytest.mark.parametrize("doc", sorted(DOCS))
def test_doc_commands_run_as_shown(doc: str, tmp_path: Path) -> None:
    assert run_doc(doc, tmp_path)


def test_every_not_run_entry_is_still_in_a_doc() -> None:
    shown = [c.shown for blocks in DOCS.values() for s in blocks for c in command_lines(s)]
    for start in NOT_RUN:
        assert any(line.startswith(start) for line in shown), start
