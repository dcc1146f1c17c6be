"""The version has one source, polytrain/_version.py: pyproject.toml reads it (dynamic), so
the installed metadata, ``polytrain.__version__`` and ``polytrain --version`` agree."""

from __future__ import annotations

import importlib.metadata
import tomllib
from pathlib import Path

import pytest

import polytrain
from polytrain.cli.main import main

PYPROJECT = Path(__file__).parents[2] / "pyproject.toml"


def test_pyproject_reads_the_version_from_the_package() -> None:
    config = tomllib.loads(PYPROJECT.read_text())
    assert "version" not in config["project"], "a second source: pyproject's [project] version"
    assert "version" in config["project"]["dynamic"]
    dynamic = config["tool"]["setuptools"]["dynamic"]["version"]
    assert dynamic == {"attr": "polytrain._version.__version__"}


def test_installed_metadata_and_cli_report_the_package_version(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert importlib.metadata.version("polytrain") == polytrain.__version__
    try:
        main(["--version"])
    except SystemExit as stop:
        assert stop.code in (0, None)
    assert capsys.readouterr().out.strip() == f"polytrain {polytrain.__version__}"
