"""examples/README.md promises each example's flags: each example takes exactly those."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
ROW = re.compile(r"^\| `(?P<name>\w+)\.py` \|(?P<cells>.*)\|\s*$")


def readme_rows() -> dict[str, list[str]]:
    """Example name -> its table cells (the last is the flags column)."""
    rows = {}
    for line in (EXAMPLES / "README.md").read_text().splitlines():
        match = ROW.match(line)
        if match:
            rows[match["name"]] = [cell.strip() for cell in match["cells"].split(" | ")]
    return rows


def help_flags(name: str) -> set[str]:
    """The long options of ``python examples/NAME.py --help`` (without --help)."""
    out = subprocess.run(
        [sys.executable, str(EXAMPLES / f"{name}.py"), "--help"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    return set(re.findall(r"^\s+(--[a-z][a-z-]*)", out, re.M)) - {"--help"}


def test_every_example_is_in_the_table() -> None:
    scripts = {p.stem for p in EXAMPLES.glob("*.py")}
    assert scripts == set(readme_rows())


@pytest.mark.parametrize("name", sorted(readme_rows()))
def test_example_takes_exactly_the_flags_the_readme_lists(name: str) -> None:
    *_, command, flags_cell = readme_rows()[name]
    promised = set(re.findall(r"`(--[a-z][a-z-]*)`", flags_cell))
    assert help_flags(name) == promised
    used = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", command.split(f"{name}.py", 1)[-1]))
    assert used <= promised, f"the command column uses {sorted(used - promised)}"
