"""comparison.html from a real (small) compare: self-contained, and drawn by headless Chromium.

Without a ``chromium`` binary the browser test skips, unless ``POLYTRAIN_REQUIRE_CHROMIUM=1``
(scripts/test sets it: CI fails instead). scripts/setup installs Debian's package.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import shutil
import subprocess
import tomllib
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

from polytrain.cli.main import main
from polytrain.testing import backends_under_test

SLICE = ["--train-samples", "128", "--test-samples", "64", "--batch-size", "64", "--epochs", "1",
         "--max-steps", "2", "--parity-steps", "2", "--optimizer", "momentum"]  # fmt: skip
WINDOW = (1200, 2400)  # tall enough for the whole page: the tables, the plot and the recipe
MATPLOTLIB_BLUE = (31, 119, 180)  # the plot's first colour (#1f77b4); the page's CSS has none


VOID = {"meta", "img", "br", "hr", "link", "input"}  # elements without an end tag


class Page(HTMLParser):
    """What the tests read from a page: title, tables, resource URLs, the recipe."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.title, self.recipe = "", ""
        self.tables: list[list[list[str]]] = []  # their rows' cells
        self.resources: list[str] = []  # every src/href value
        self.images: list[str] = []
        self._in: list[str] = []
        self.feed(text)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        self.resources += [v or "" for k, v in attrs if k in ("src", "href")]
        if tag == "img":
            self.images.append(values.get("src") or "")
        if tag == "table":
            self.tables.append([])
        if tag == "tr" and self.tables:
            self.tables[-1].append([])
        if tag == "pre" and values.get("id") == "recipe":
            tag = "recipe"
        if tag not in VOID:
            self._in.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if self._in:
            self._in.pop()

    def handle_data(self, data: str) -> None:
        where = self._in[-1] if self._in else ""
        if where == "title":
            self.title += data
        elif where == "recipe":
            self.recipe += data
        elif where in ("td", "th") and self.tables and self.tables[-1]:
            self.tables[-1][-1].append(data)


@pytest.fixture(scope="module")
def compared(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """Two steps of numpy and one more backend (one when only numpy is under test)."""
    out = tmp_path_factory.mktemp("compare-html")
    others = [n for n in backends_under_test() if n != "numpy"]
    chosen = ["numpy", *(["torch"] if "torch" in others else others[:1])]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(io.StringIO()):
        code = main(["compare", "--backends", ",".join(chosen), *SLICE, "--out", str(out),
                     "--quiet"])  # fmt: skip
    assert code == 0, printed.getvalue()
    return out, " ".join(printed.getvalue().split())


def expected_title(out: Path) -> str:
    recipe = json.loads((out / "comparison.json").read_text())["recipe"]
    return f"polytrain compare: {recipe['model']} on {recipe['dataset']}"


@pytest.mark.slow
def test_page_holds_the_report_and_needs_no_network(compared: tuple[Path, str]) -> None:
    out, printed = compared
    assert f"{out}/comparison.html" in printed  # the CLI's "wrote ..." line names it
    text = (out / "comparison.html").read_text(encoding="utf-8")
    data = json.loads((out / "comparison.json").read_text())
    page = Page(text)
    assert page.title == expected_title(out)
    rows = {row[0]: row for row in page.tables[0]}  # the backends' table, as printed
    for run in data["runs"]:  # the console's numbers, which are comparison.json's
        row = rows[run["backend"]]
        assert run["framework_version"] in row
        assert f"{run['epochs'][-1]['train_loss']:.6f}" in row
    if data["lockstep"] is not None:
        other = data["runs"][1]["backend"]
        assert f"{data['lockstep']['worst'][other]['loss']:.2e}" in rows[other]
        assert len(page.tables) == 3  # and the lockstep's and the pairs' tables
    recipe = {k: v for k, v in data["recipe"].items() if v is not None and v != {}}
    assert tomllib.loads(page.recipe) == recipe  # the recipe, as a recipe file
    (image,) = page.images
    prefix = "data:image/png;base64,"
    assert image.startswith(prefix)
    assert base64.b64decode(image[len(prefix) :]) == (out / "comparison.png").read_bytes()
    assert all(url.startswith("data:") for url in page.resources)
    for reference in ("http:", "https:", '"//', "'//", "url("):
        assert reference not in text, reference


def find_chromium() -> str:
    """The chromium binary; a skip (or, with POLYTRAIN_REQUIRE_CHROMIUM=1, a failure)."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    why = "no chromium binary on PATH (Debian: apt-get install chromium; scripts/setup does)"
    if os.environ.get("POLYTRAIN_REQUIRE_CHROMIUM") == "1":
        pytest.fail(f"POLYTRAIN_REQUIRE_CHROMIUM=1 but {why}")
    pytest.skip(why)


def chromium(binary: str, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
           "--hide-scrollbars", f"--user-data-dir={profile}", *args]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return done


@pytest.mark.slow
def test_headless_chromium_draws_the_page(compared: tuple[Path, str], tmp_path: Path) -> None:
    binary = find_chromium()
    out, _ = compared
    url = (out / "comparison.html").resolve().as_uri()
    dom = chromium(binary, tmp_path / "profile", "--dump-dom", url).stdout
    assert Page(dom).title == expected_title(out)
    shot = tmp_path / "page.png"
    chromium(binary, tmp_path / "profile", f"--screenshot={shot}",
             f"--window-size={WINDOW[0]},{WINDOW[1]}", url)  # fmt: skip
    import matplotlib.image

    pixels = np.round(matplotlib.image.imread(shot)[..., :3] * 255).astype(np.int16)
    assert pixels.shape[:2] == (WINDOW[1], WINDOW[0])
    not_white = np.any(pixels < 245, axis=-1).mean()
    colours = len(np.unique(pixels.reshape(-1, 3), axis=0))
    blue = np.all(np.abs(pixels - MATPLOTLIB_BLUE) <= 12, axis=-1).sum()
    assert not_white > 0.05 and colours > 200, (not_white, colours)  # not blank
    assert blue > 2000, blue  # the embedded plot was decoded and drawn (its bars and lines)
