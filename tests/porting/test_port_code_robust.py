"""``polytrain port-code`` never crashes on a file (issue 36): a marked argument written
over several lines gives a one-line marker; a statement the tool itself fails on stays as
it was under a marker while the rest of the file is converted; the command then exits 3
(some use left marked), not with a traceback. No framework is imported."""

from __future__ import annotations

from pathlib import Path

from polytrain.cli.main import main
from polytrain.porting.code import EXIT_UNCONVERTED, convert_source
from polytrain.porting.code.port_pass import STATEMENT
from polytrain.porting.code.table import frameworks, load_framework

MULTI_LINE = """import os
import paddle.nn as nn


class Net(nn.Layer):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2D(
            3, 8, 3,
            padding_mode=os.environ.get(
                "MODE",
                "zeros",
            ),
        )
        self.fc = nn.Linear(8, 2)
"""


def test_a_multi_line_marked_argument_gives_a_one_line_marker() -> None:
    result = convert_source(MULTI_LINE)
    compile(result.code, "<converted>", "exec")
    marker = next(x for x in result.code.splitlines() if "paddle.nn.Conv2D not converted" in x)
    assert '`padding_mode=os.environ.get( "MODE", "zeros", )`' in marker
    assert "torch.nn.Linear(8, 2)" in result.code
    assert convert_source(result.code).code.count("paddle.nn.Conv2D not converted") == 1


BROKEN = """
[framework]
name = "Paddle"
root = "paddle"
target_root = "torch"

[[api]]
source = "paddle.nn.ReLU"
target = "torch.nn.ReLU"
example = "out = paddle.nn.ReLU()"

[[api]]
source = "paddle.broken"
target = "torch.("
args = ["x"]
example = "out = paddle.broken(x)"
"""

SOURCE = """import paddle


def f(x):
    y = paddle.broken(x)  # the table's target does not parse
    return paddle.nn.ReLU()(y)
"""


def test_a_statement_the_tool_fails_on_stays_whole_and_the_rest_converts(tmp_path: Path) -> None:
    (tmp_path / "broken.toml").write_text(BROKEN, encoding="utf-8")
    table = {"paddle": load_framework(tmp_path / "broken.toml")}
    result = convert_source(SOURCE, "src.py", tables=table)
    lines = result.code.splitlines()
    at = lines.index("    y = paddle.broken(x)  # the table's target does not parse")
    assert lines[at - 1].startswith(f"    # polytrain port-code: {STATEMENT} not converted: ")
    assert "ParserSyntaxError" in lines[at - 1]
    assert "    return torch.nn.ReLU()(y)" in lines
    compile(result.code, "<converted>", "exec")
    left = [u for u in result.report.uses if not u.converted]
    assert [(u.line, u.api) for u in left] == [(5, STATEMENT)]
    assert result.report.path == "src.py"
    assert frameworks()["paddle"].entries["paddle.nn.ReLU"].target == "torch.nn.ReLU"


def test_the_command_exits_3_on_what_crashed_it_before(tmp_path: Path) -> None:
    src, out = tmp_path / "net.py", tmp_path / "net_torch.py"
    src.write_text(MULTI_LINE, encoding="utf-8")
    assert main(["port-code", str(src), "-o", str(out)]) == EXIT_UNCONVERTED
    compile(out.read_text(encoding="utf-8"), str(out), "exec")
