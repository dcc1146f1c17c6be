"""The plugin boundary: the core knows frameworks only through what plugins declare.

Docstrings, comments and prose (help texts, error hints) may name a framework; code may
not: no identifier names one, and no string is a framework's name or one of its module
paths (which is what dispatching on a backend name or importing a framework needs).
The package's data (the port-code tables, the zoo maps) holds no program text that
imports a framework: test-only code belongs in tests/.
The layers themselves are checked by ``lint-imports`` (pyproject.toml)."""

from __future__ import annotations

import ast
import io
import json
import re
import tokenize
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import polytrain

FRAMEWORKS = ("torch", "paddle", "mxnet", "jax")
CORE = Path(polytrain.__file__).parent
# the neutral model zoo names two models after the seed programs they reproduce
SEED_MODEL_NAMES = {"paddle_mnist", "torch_dp_cnn"}
MODULE = re.compile(rf"({'|'.join(FRAMEWORKS)})(\.\w+)*")  # "torch", "torch.distributed.run"


def _docstring_lines(source: str) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                first = body[0]
                lines.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    return lines


def framework_mentions(source: str) -> list[str]:
    """Identifiers naming a framework, and strings that are a framework or its module."""
    docstrings = _docstring_lines(source)
    found = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        where = f"line {tok.start[0]}: {tok.string[:60]}"
        if tok.type == tokenize.NAME:
            lowered = tok.string.lower()
            if tok.string not in SEED_MODEL_NAMES and any(f in lowered for f in FRAMEWORKS):
                found.append(where)
        elif tok.type == tokenize.STRING and tok.start[0] not in docstrings:
            try:
                value = ast.literal_eval(tok.string)
            except (ValueError, SyntaxError):  # f-strings: check their text
                value = tok.string
            if isinstance(value, str) and MODULE.fullmatch(value.strip()):
                found.append(where)
    return found


@pytest.mark.slow
def test_the_core_names_no_framework_in_code() -> None:
    offenders = {
        str(path.relative_to(CORE)): hits
        for path in sorted(CORE.rglob("*.py"))
        if (hits := framework_mentions(path.read_text(encoding="utf-8")))
    }
    assert offenders == {}


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def _imported_roots(program: str) -> list[str]:
    """The top-level modules a program text imports (line by line where it does not parse)."""
    try:
        tree = ast.parse(program)
    except SyntaxError:
        return [m.group(1) for m in re.finditer(r"(?m)^\s*(?:from|import)\s+(\w+)", program)]
    roots = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots += [alias.name.split(".")[0] for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            roots.append(node.module.split(".")[0])
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else ""
            name = node.func.id if isinstance(node.func, ast.Name) else name
            if name in ("__import__", "import_module") and isinstance(node.args[0].value, str):
                roots.append(node.args[0].value.split(".")[0])
    return roots


def framework_imports_in_data(path: Path) -> list[str]:
    """Program texts in a package data file (toml, json) that import a framework."""
    text = path.read_text(encoding="utf-8")
    data = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    return [
        program.strip().splitlines()[0][:60]
        for program in _strings(data)
        if set(_imported_roots(program)) & set(FRAMEWORKS)
    ]


@pytest.mark.slow
def test_the_core_data_holds_no_framework_importing_program() -> None:
    data = [p for p in sorted(CORE.rglob("*")) if p.suffix in (".toml", ".json")]
    assert data, "the scan must see the package's data files"
    found = {str(path.relative_to(CORE)): framework_imports_in_data(path) for path in data}
    offenders = {name: hits for name, hits in found.items() if hits}
    assert offenders == {}


def test_the_data_check_finds_a_framework_import(tmp_path: Path) -> None:
    table = tmp_path / "t.toml"
    table.write_text(
        '[[api]]\nexample = "import numpy as np\\nout = np.ones(2)"\n'
        'stand_in = """\ntry:\n    import mxnet.gluon.utils as u, os\nfinally:\n    pass\n"""\n'
        "[[api]]\nexample = \"m = __import__('paddle.nn')\"\n"
        '[[api]]\nexample = "from torch import nn\\nif x:\\n  broken("\n'
    )
    assert len(framework_imports_in_data(table)) == 3
    (tmp_path / "m.json").write_text(json.dumps({"a": ["import jax.numpy as jnp", "jax.numpy"]}))
    assert len(framework_imports_in_data(tmp_path / "m.json")) == 1


def test_the_check_finds_dispatch_on_a_framework_name() -> None:
    code = (
        "def launch(spec):\n"
        '    if spec.backend == "torch":\n'
        '        return ["torch.distributed.run"]\n'
    )
    assert len(framework_mentions(code)) == 2
    assert framework_mentions("import paddle\n")
    prose = '"""Docs may say torch."""\nhint = "pip install polytrain[torch]"\n'
    assert framework_mentions(prose) == []


def test_the_public_api_reexports_the_training_classes() -> None:
    from polytrain import Recipe, StepRunner, Trainer
    from polytrain.training.recipe import Recipe as R
    from polytrain.training.step import StepRunner as S
    from polytrain.training.trainer import Trainer as T

    assert (Recipe, StepRunner, Trainer) == (R, S, T)
    assert {"Recipe", "StepRunner", "Trainer"} <= set(polytrain.__all__)
    try:
        polytrain.no_such_name  # noqa: B018
    except AttributeError as exc:
        assert "no_such_name" in str(exc)
    else:
        raise AssertionError("an unknown attribute must raise AttributeError")
