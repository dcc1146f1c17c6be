"""``polytrain port-code``: the rewriting itself (comments and formatting kept, import
aliases resolved, unsupported calls marked and reported, never dropped), the command
(SRC untouched, OUT refused when it exists, folder mode, exit codes), the report's counts
on the seed tutorial, and the docs' API list generated from the table. No framework is
imported: the numbers of each mapping are tests/porting/test_port_code_mappings.py's."""

from __future__ import annotations

import io
import shutil
import tokenize
from pathlib import Path

import pytest

from polytrain.cli.main import main
from polytrain.porting.code import EXIT_UNCONVERTED, convert_source
from polytrain.porting.code.doc import page_with_list

FIXTURES = Path(__file__).parents[1] / "fixtures" / "port_code"
DOCS = Path(__file__).parents[2] / "docs" / "porting.md"

MODEL = '''"""A model."""
import numpy as np
import paddle
import paddle.nn as nn
import paddle.nn.functional as F  # the functional API


class Net(nn.Layer):
    def __init__(self):
        super().__init__()
        # two layers
        self.fc1 = nn.Linear(
            784,
            64,   # hidden
        )
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        h = F.relu(self.fc1(x))
        return F.softmax(self.fc2(h), axis=1)


def stats(x):
    a = np.ones((2, 3)).astype("float32").sum(axis=1)  # numpy: left alone
    return paddle.sum(x, axis=1, keepdim=True), a
'''


def test_comments_formatting_and_untouched_lines_are_kept() -> None:
    out = convert_source(MODEL).code
    assert out.splitlines()[0] == '"""A model."""'
    kept = [
        "        # two layers",
        "            64,   # hidden",
        "        super().__init__()",
        '    a = np.ones((2, 3)).astype("float32").sum(axis=1)  # numpy: left alone',
    ]
    for line in kept:
        assert line in out.splitlines(), line
    assert "import torch.nn.functional as F  # the functional API" in out
    assert "class Net(nn.Module):" in out
    assert (
        "        self.fc1 = nn.Linear(\n            784,\n            64,   # hidden\n        )"
        in out
    )
    assert "return F.softmax(self.fc2(h), dim=1)" in out
    assert "return torch.sum(x, dim=1, keepdim=True), a" in out
    assert "paddle" not in out


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import paddle\ny = paddle.nn.functional.relu(x)\n",
         "import torch\ny = torch.nn.functional.relu(x)\n"),
        ("import paddle.nn as nn\nm = nn.Conv2D(1, 2, 3)\n",
         "import torch.nn as nn\nm = nn.Conv2d(1, 2, 3)\n"),
        ("from paddle import nn\nm = nn.Conv2D(1, 2, 3)\n",
         "from torch import nn\nm = nn.Conv2d(1, 2, 3)\n"),
        ("import paddle.nn.functional as F\ny = F.softmax(x)\n",
         "import torch.nn.functional as F\ny = F.softmax(x, dim=-1)\n"),
        ("from paddle.nn import functional as fn\ny = fn.relu(x)\n",
         "from torch.nn import functional as fn\ny = fn.relu(x)\n"),
        ("from paddle.nn import Linear\nm = Linear(3, 4)\n",
         "import torch\nm = torch.nn.Linear(3, 4)\n"),
        ("import paddle as pd\nt = pd.concat([a, b], axis=1)\n",
         "import torch\nt = torch.cat([a, b], dim=1)\n"),
        ("import os\nimport paddle.optimizer as optim\nopt = optim.SGD(learning_rate=0.1, "
         "parameters=ps)\n",
         "import os\nimport torch.optim as optim\nopt = optim.SGD(ps, lr=0.1)\n"),
    ],
    ids=["root", "import-as", "from-import", "functional", "from-import-as", "name", "pd",
         "optim"],
)  # fmt: skip
def test_import_aliases_are_resolved(source: str, expected: str) -> None:
    result = convert_source(source)
    assert result.code == expected
    assert result.report.rate == 1.0


def test_a_local_name_shadowing_an_import_is_not_converted() -> None:
    source = "import paddle.nn as nn\n\ndef f(nn):\n    return nn.Linear(3, 4)\n"
    result = convert_source(source)
    assert "return nn.Linear(3, 4)" in result.code
    assert result.report.uses == []


UNSUPPORTED = """import paddle
import paddle.nn as nn

attr = paddle.ParamAttr(name="w", need_clip=False)
fc = nn.Linear(3, 4, weight_attr=False)
pool = nn.MaxPool2D(2, return_mask=True)
norm = paddle.vision.transforms.Resize(32)
ok = nn.ReLU()
"""


def test_unsupported_calls_stay_as_they_were_marked_and_reported() -> None:
    result = convert_source(UNSUPPORTED, "u.py")
    lines = result.code.splitlines()
    originals = [
        'attr = paddle.ParamAttr(name="w", need_clip=False)',
        "fc = nn.Linear(3, 4, weight_attr=False)",
        "pool = nn.MaxPool2D(2, return_mask=True)",
        "norm = paddle.vision.transforms.Resize(32)",
    ]
    for original in originals:
        at = lines.index(original)  # unchanged, character for character
        assert lines[at - 1].startswith("# polytrain port-code: "), lines[at - 1]
    assert (
        "# polytrain port-code: paddle.nn.MaxPool2D not converted: `return_mask=True`: the "
        "indices' layout is not checked yet; the table takes only False"
    ) in lines
    assert (
        "# polytrain port-code: paddle.ParamAttr not converted: `need_clip=False`: a parameter "
        "left out of gradient clipping: clip the others by hand; the table takes only True"
    ) in lines
    assert "ok = torch.nn.ReLU()" in lines
    assert (
        "import paddle" in lines and "import paddle.nn as nn" in lines and "import torch" in lines
    )
    report = result.report
    assert dict(report.unconverted) == {
        "paddle.ParamAttr": 1, "paddle.nn.Linear": 1, "paddle.nn.MaxPool2D": 1,
        "paddle.vision.transforms.Resize": 1,
    }  # fmt: skip
    assert (len(report.lines), len(report.converted_lines)) == (5, 1)
    assert report.to_dict()["rate"] == 0.2
    again = convert_source(result.code)  # a second run adds no second marker
    assert again.code.count("# polytrain port-code:") == result.code.count("# polytrain port-code:")


def test_star_arguments_and_uncalled_names_are_marked() -> None:
    source = "import paddle.nn as nn\nm = nn.Linear(*sizes)\nmake = nn.Linear\n"
    result = convert_source(source)
    assert "m = nn.Linear(*sizes)" in result.code and "make = nn.Linear" in result.code
    reasons = result.report.reasons()
    assert reasons == {"paddle.nn.Linear": "`*` arguments hide their names from the table"}
    assert sum(result.report.unconverted.values()) == 2


def test_an_argument_that_edits_another_is_converted_only_for_its_literals() -> None:
    source = (
        "import paddle\n"
        "a = paddle.matmul(x + 1, y, transpose_x=True, transpose_y=False)\n"
        "b = paddle.matmul(x, y, transpose_y=flag)\n"
    )
    result = convert_source(source)
    lines = result.code.splitlines()
    assert "a = torch.matmul((x + 1).mT, y)" in lines
    assert lines[-1] == "b = paddle.matmul(x, y, transpose_y=flag)"
    assert result.report.reasons() == {
        "paddle.matmul": "`transpose_y=flag`: give True or False: the operand is transposed "
        "(y.mT) by the value; the table takes only False, True"
    }


def test_the_scheduler_moves_after_its_optimizer() -> None:
    source = (
        "import paddle\n"
        "sched = paddle.optimizer.lr.StepDecay(learning_rate=0.1, step_size=10)  # decay\n"
        "opt = paddle.optimizer.Adam(learning_rate=sched, parameters=net.parameters())\n"
        "lonely = paddle.optimizer.lr.ExponentialDecay(0.1, 0.9)\n"
    )
    result = convert_source(source)
    assert result.code.splitlines() == [
        "import torch",
        "import paddle",  # still used by the scheduler left in place
        "opt = torch.optim.Adam(net.parameters(), lr=0.1)",
        "sched = torch.optim.lr_scheduler.StepLR(opt, step_size=10)  # decay",
        "# polytrain port-code: paddle.optimizer.lr.ExponentialDecay not converted: a scheduler "
        "is converted when an optimizer is made from it in the same block, after it (`opt = "
        "paddle.optimizer.X(learning_rate=sched, ...)`): PyTorch builds it on the optimizer",
        "lonely = paddle.optimizer.lr.ExponentialDecay(0.1, 0.9)",
    ]


@pytest.mark.slow
def test_seed_tutorial_conversion_rates() -> None:
    single = convert_source((FIXTURES / "paddle_mnist_single.py").read_text(encoding="utf-8"))
    assert (len(single.report.lines), len(single.report.converted_lines)) == (18, 18)
    code = [line for line in single.code.splitlines() if not line.lstrip().startswith("#")]
    assert not [line for line in code if "fluid" in line or "paddle" in line]
    assert "    model = MNIST()" not in single.code  # the guard's body is unindented
    assert "model = MNIST()" in single.code.splitlines()
    multi = convert_source((FIXTURES / "paddle_mnist_multi.py").read_text(encoding="utf-8"))
    assert (len(multi.report.lines), len(multi.report.converted_lines)) == (18, 18)
    # the data-parallel calls convert (tests/porting/test_port_code_fluid_multi.py runs them), and
    # the MNIST reader (issue 36)
    assert not multi.report.unconverted


def _snapshot(root: Path) -> dict[str, tuple[bytes, int]]:
    files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
    return {str(p): (p.read_bytes(), p.stat().st_mtime_ns) for p in files}


def test_command_on_a_file_leaves_src_untouched_and_refuses_an_existing_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "train.py"
    src.write_text(UNSUPPORTED, encoding="utf-8")
    before = _snapshot(src)
    out = tmp_path / "train_torch.py"
    assert main(["port-code", str(src), "-o", str(out)]) == EXIT_UNCONVERTED
    assert _snapshot(src) == before
    assert out.read_text(encoding="utf-8") == convert_source(UNSUPPORTED, str(src)).code
    printed = capsys.readouterr().out
    assert "1/5 lines with framework calls converted (20%), 4 use(s) left marked" in printed
    out.write_text("mine", encoding="utf-8")
    assert main(["port-code", str(src), "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "exists" in err and "--overwrite" in err
    assert out.read_text(encoding="utf-8") == "mine"
    assert main(["port-code", str(src), "-o", str(out), "--overwrite", "--show-unsupported"]) == 3
    assert "1 x paddle.nn.MaxPool2D: `return_mask=True`" in capsys.readouterr().out
    clean = tmp_path / "clean.py"
    clean.write_text("import paddle\ny = paddle.exp(x)\n", encoding="utf-8")
    assert main(["port-code", str(clean)]) == 0  # default OUT: clean_torch.py
    assert (tmp_path / "clean_torch.py").read_text() == "import torch\ny = torch.exp(x)\n"


@pytest.mark.slow
def test_command_on_a_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "proj"
    src.mkdir()
    for seed in ("paddle_mnist_single.py", "paddle_mnist_multi.py"):
        shutil.copy(FIXTURES / seed, src / seed)
    (src / "data").mkdir()
    (src / "data" / "notes.txt").write_text("not python", encoding="utf-8")
    (src / "pkg").mkdir()
    (src / "pkg" / "ops.py").write_text("import paddle\nz = paddle.abs(x)\n", encoding="utf-8")
    (src / "pkg" / "left.py").write_text("import paddle\npaddle.summary(net)\n", encoding="utf-8")
    before = _snapshot(src)
    out = tmp_path / "proj_torch"
    assert main(["port-code", str(src), "-o", str(out)]) == EXIT_UNCONVERTED
    assert _snapshot(src) == before
    assert (out / "data" / "notes.txt").read_text() == "not python"
    assert (out / "pkg" / "ops.py").read_text() == "import torch\nz = torch.abs(x)\n"
    assert (out / "paddle_mnist_single.py").exists() and (out / "paddle_mnist_multi.py").exists()
    printed = capsys.readouterr().out
    assert "total: 37/38 lines converted (97%) in 4 file(s)" in printed
    assert main(["port-code", str(src), "-o", str(src / "inside")]) == 2
    assert not (src / "inside").exists()


def test_a_file_that_does_not_parse_is_one_line_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "bad"
    src.mkdir()
    (src / "good.py").write_text("import paddle\n", encoding="utf-8")
    (src / "bad.py").write_text("def f(:\n", encoding="utf-8")
    assert main(["port-code", str(src), "-o", str(tmp_path / "out")]) == 2
    assert "bad.py is not Python that libcst can parse" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_the_docs_list_is_the_table() -> None:
    text = DOCS.read_text(encoding="utf-8")
    assert page_with_list(text) == text, "run: python -m polytrain.porting.code.doc"


GLUON_LOOP = """import mxnet as mx
from mxnet import autograd, gluon
from mxnet.gluon import nn

net = nn.Sequential()
net.add(nn.Dense(4, flatten=False), nn.Dense(2))
seen = set()
seen.add(3)
trainer = gluon.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.1})
for x, y in batches:
    with autograd.record():
        loss = loss_fn(net(x), y)
    loss.backward()
    trainer.step(x.shape[0])
other.step(8)
x.attach_grad()
z.backward()
"""


def test_gluon_step_divides_the_loss_zeroes_the_gradients_and_marks_what_it_cannot_see() -> None:
    result = convert_source(GLUON_LOOP)
    lines = result.code.splitlines()
    assert (
        "net.extend([nn.LazyLinear(out_features=4), torch.nn.Sequential(torch.nn.Flatten(), "
        "nn.LazyLinear(out_features=2))])"
    ) in lines
    assert "seen.add(3)" in lines  # a set's add: not a Sequential made in this file
    assert "trainer = torch.optim.SGD(net.parameters(), lr=0.1)" in lines
    at = lines.index("    loss = loss_fn(net(x), y)")  # the record block's body, unindented
    assert lines[at + 1 : at + 4] == [
        "    (loss / x.shape[0]).sum().backward()",
        "    trainer.step()",
        "    trainer.zero_grad()",
    ]
    assert result.report.reasons() == {
        ".step": "a `.step(...)` whose receiver is not seen made by gluon.Trainer in this file",
    }
    assert "x.requires_grad_()" in lines and "other.step(8)" in lines
    # no step after it: Gluon's overwriting backward, a helper defined once after the imports
    assert (
        "gluon_backward(z)" in lines
        and lines.count("def gluon_backward(loss, retain_graph=False):") == 1
    )


@pytest.mark.slow
def test_d2l_mxnet_seed_conversion_rate() -> None:
    seed = convert_source((FIXTURES / "d2l_multi_gpu_mxnet.py").read_text(encoding="utf-8"))
    # `for l in ls: l.backward()` -> gluon_backward(l); d2l.sgd -> d2lzh_sgd; the book's data
    # loader -> d2lzh_load_data_fashion_mnist (tests/porting/test_port_code_d2l_seed.py runs it)
    assert (len(seed.report.lines), len(seed.report.converted_lines)) == (40, 40)
    assert not seed.report.unconverted
    tokens = tokenize.generate_tokens(io.StringIO(seed.code).readline)
    names = {t.string for t in tokens if t.type == tokenize.NAME}  # not a helper's path
    assert not names & {"mxnet", "nd", "autograd"}
