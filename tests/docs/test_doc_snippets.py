"""Every code block of README.md and docs/ works as shown (tests/doc_snippets.py says how
each kind is checked)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from doc_snippets import ROOT, Snippet, code_lines, commands, snippets
from test_examples_flags import help_flags

from polytrain.cli.parser import build_parser
from polytrain.cli.recipe_args import explicit_options, recipe_from_args

SNIPPETS = snippets()


def _ids(kind: str) -> list[Snippet]:
    chosen = []
    for s in SNIPPETS:
        if s.skip:
            kind_of = "skip"
        elif s.excerpt_of:
            kind_of = "excerpt"
        else:
            kind_of = s.language
        if kind_of == kind:
            chosen.append(s)
    return chosen


def test_the_docs_have_code_blocks() -> None:
    assert len(_ids("python")) >= 2 and len(_ids("bash")) >= 5 and _ids("excerpt")


@pytest.mark.slow
@pytest.mark.parametrize("snippet", _ids("python"), ids=lambda s: s.id)
def test_python_block_runs_as_shown(snippet: Snippet, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "backends")])}
    proc = subprocess.run(
        [sys.executable, "-c", snippet.code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, f"{snippet.id} failed:\n{proc.stderr[-2000:]}"


@pytest.mark.parametrize("snippet", _ids("excerpt"), ids=lambda s: s.id)
def test_excerpt_is_the_code_of_its_file(snippet: Snippet) -> None:
    assert snippet.excerpt_of is not None
    source = set(code_lines((ROOT / snippet.excerpt_of).read_text()))
    missing = [line for line in code_lines(snippet.code) if line not in source]
    assert not missing, f"{snippet.id}: not in {snippet.excerpt_of}: {missing}"


@pytest.mark.parametrize("snippet", _ids("bash"), ids=lambda s: s.id)
def test_command_lines_parse_and_their_recipes_are_valid(snippet: Snippet) -> None:
    parser = build_parser()
    for words in commands(snippet.code):
        if words[0] == "python":
            script = Path(words[1])
            assert (ROOT / script).is_file(), f"{snippet.id}: no {script}"
            used = {w.split("=")[0] for w in words[2:] if w.startswith("--")}
            assert used <= help_flags(script.stem), f"{snippet.id}: {' '.join(words)}"
            continue
        argv = words[1:]
        if "--" in argv:  # launch: the worker command is checked as its own line
            argv = argv[: argv.index("--")]
        try:
            args = parser.parse_args(argv)
        except SystemExit:
            pytest.fail(f"{snippet.id}: polytrain rejects: {' '.join(words)}")
        if args.command in ("train", "compare"):
            args.explicit = explicit_options(argv, args.subparser)
            recipe_from_args(args)  # raises ConfigError on a bad value


def test_skipped_blocks_say_why() -> None:
    for snippet in _ids("skip"):
        assert snippet.skip and len(snippet.skip) > 10, snippet.id
