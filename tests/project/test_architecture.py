"""The plugin boundary: the core knows frameworks only through what plugins declare.

Docstrings, comments and prose (help texts, error hints) may name a framework; code may
not: no identifier names one, and no string is a framework's name or one of its module
paths (which is what dispatching on a backend name or importing a framework needs).
The layers themselves are checked by ``lint-imports`` (pyproject.toml)."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

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


def test_the_core_names_no_framework_in_code() -> None:
    offenders = {
        str(path.relative_to(CORE)): hits
        for path in sorted(CORE.rglob("*.py"))
        if (hits := framework_mentions(path.read_text(encoding="utf-8")))
    }
    assert offenders == {}


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
