"""Python 3.11+ and numpy 1.23-2.x for the core; MXNet's pins only in its extra."""

from __future__ import annotations

import io
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from polytrain_mxnet._compat import MXNET_MAX_NUMPY, installed_numpy_version
from polytrain_mxnet._compat import mxnet_incompatibility as why_not
from rich.console import Console

from polytrain.cli.output import make_table
from polytrain.plugins.registry import registered_backends

PYPROJECT = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"]


def _requirement(name: str, requirements: list[str]) -> Requirement:
    return next(r for r in map(Requirement, requirements) if r.name == name)


def test_core_allows_newer_python_and_numpy_2() -> None:
    python = SpecifierSet(PYPROJECT["requires-python"])
    assert all(v in python for v in ("3.11.9", "3.12.1", "3.13.0")) and "3.10.12" not in python
    numpy = _requirement("numpy", PYPROJECT["dependencies"]).specifier
    assert all(v in numpy for v in ("1.23.5", "1.26.4", "2.0.2", "2.4.6"))


@pytest.mark.parametrize(("python", "installs"), [("3.11", True), ("3.12", False), ("3.13", False)])
def test_mxnet_extra_pins_only_where_mxnet_runs(python: str, installs: bool) -> None:
    """On Python >= 3.12 the extra is empty (so `.[all]` installs), not an unsolvable pin."""
    extra = [Requirement(r) for r in PYPROJECT["optional-dependencies"]["mxnet"]]
    assert {r.name for r in extra} == {"mxnet", "numpy"}
    for req in extra:
        assert req.marker is not None
        assert req.marker.evaluate({"python_version": python}) is installs


def test_mxnet_incompatibility_names_what_is_too_new() -> None:
    assert why_not("3.11.9", "1.23.5") is None
    numpy_only = why_not("3.11.9", "2.4.6")
    assert numpy_only is not None and "numpy 2.4.6" in numpy_only
    assert "Python 3.11.9" not in numpy_only
    both = why_not("3.12.1", "1.26.4")
    assert both is not None and "Python 3.12.1 and numpy 1.26.4" in both
    assert "needs Python < 3.12 and numpy < 1.24" in both
    assert why_not("3.13.0", "1.23.5") is not None and why_not("3.11.9", "1.24.0rc1") is not None


def test_mxnet_entry_follows_this_environment() -> None:
    """On numpy 1.23 (CI's first environment) MXNet is offered; on numpy 2 (the second, or
    Python 3.12) it is unavailable and its hint says why, even with an mxnet package present."""
    info = registered_backends()["mxnet"]
    numpy_version = installed_numpy_version()
    assert numpy_version is not None
    if tuple(int(p) for p in numpy_version.split(".")[:2]) >= MXNET_MAX_NUMPY:
        assert not info.available() and info.install_hint == why_not()
        assert f"numpy {numpy_version}" in info.install_hint
    else:
        assert info.install_hint == "pip install 'polytrain[mxnet]'"


def test_cli_table_keeps_square_brackets() -> None:
    """`polytrain backends` prints hints such as polytrain[mxnet] verbatim, not as markup."""
    out = io.StringIO()
    Console(file=out, width=200).print(
        make_table("t", ["hint"], [["pip install 'polytrain[mxnet]'"]])
    )
    assert "pip install 'polytrain[mxnet]'" in out.getvalue()
