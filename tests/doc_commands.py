"""Run the bash blocks of README.md and docs/*.md as a user would, in a fresh folder.

Per doc, every bash block that is not marked (``<!-- snippet: skip: ... -->``, see
tests/doc_snippets.py) runs in document order in ONE temporary folder, so a later block
uses an earlier block's output (train -> convert -> port). Each command line (``\\``
continuations joined, comments dropped) runs through ``bash -c`` with the venv's ``bin``
first on ``PATH`` (``polytrain`` is its console script, ``python`` its interpreter), and
``examples`` is a link to the repository's examples/.

Budget caps, appended only where the doc's command would train for minutes (CI gives these
tests about 4 minutes):

- ``polytrain train`` and ``polytrain launch`` (its worker's ``train``): ``--max-steps 3
  --train-samples 512 --test-samples 128`` (epochs, backends, precision, devices and every
  other flag stay as written; the last value of a repeated flag wins);
- ``polytrain compare``: the same and ``--parity-steps 3`` (the lockstep replay).

Commands not run, each with its reason (the block's other lines run): ``NOT_RUN``.

Inputs a doc names but does not create are made by ``FIXTURES`` just before the first block
of that doc that names them (a word of the block equal to the trigger), by plain framework
code as a user's own script would:

- ``mnist.pdparams`` and ``model.params`` (the built-in models the conversion detects,
  docs/porting.md's "Converting weights"): written by ``polytrain convert`` from a capped
  numpy run of ``paddle-mnist`` and ``lenet``;
- Paddle ``own.pdparams`` and ``net.pdparams`` + ``net.pdopt`` (after one Adam step): a
  user's conv + linear net; README's ``mypkg`` package builds it on Paddle and PyTorch;
- Gluon ``net.params`` + ``net.states`` + ``order.txt`` (the
  Trainer's order, as docs/porting.md writes it): a conv + dense net after one step;
- ``resnet18.pt``: the torchvision-style ResNet-18 of tests/torch_twins.py;
  ``mymodels.py``: Paddle's ``resnet18()`` and that twin; ``r18.pdparams``: Paddle's weights;
- ``paddle-map.json``/``gluon-map.json``: the doc's json block just before the command;
- ``myplugins.py``: the imports and classes of the doc's python block after the command;
- ``train.py``/``project/``: the Paddle tutorial of tests/fixtures/port_code (and a text
  file);
- docs/porting.md's ``runs/paddle`` (a neutral checkpoint: a capped ``polytrain train``),
  removed after its block, since the doc's own walk-through later trains ``runs/paddle``.
"""

from __future__ import annotations

import ast
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from doc_snippets import ROOT, Snippet, snippets

BIN = Path(sys.executable).parent
TRAIN_CAP = ["--max-steps", "3", "--train-samples", "512", "--test-samples", "128"]
CAPS = {
    ("polytrain", "train"): TRAIN_CAP,
    ("polytrain", "launch"): TRAIN_CAP,  # appended at the end: the worker's train
    ("polytrain", "compare"): [*TRAIN_CAP, "--parity-steps", "3"],
}
NOT_RUN = {
    "./scripts/setup": "installs the venv from PyPI (network); CI runs it and ./scripts/test",
    "mlflow ui": "a web server that runs until stopped",
    "pip install polytrain": "installs from the index into the user's environment; "
    "scripts/test-wheel runs the README's line in a fresh venv against the built wheel",
}
OPERATORS = set("();<>|&")
TIMEOUT_S = 300


@dataclass(frozen=True)
class Command:
    """One command line of a doc, as run."""

    where: str  # doc:line
    shown: str  # the doc's text (continuations joined)
    run: str  # what bash runs (comments dropped, caps appended)
    capped: bool


def command_lines(snippet: Snippet) -> list[Command]:
    """The block's command lines, continuations joined, comments dropped, caps appended."""
    out: list[Command] = []
    lines = snippet.code.splitlines()
    i = 0
    while i < len(lines):
        start, text = i, lines[i]
        while text.endswith("\\") and i + 1 < len(lines):
            i += 1
            text = text[:-1] + " " + lines[i].strip()
        i += 1
        lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        words = list(lexer)
        if not words:
            continue
        where = f"{snippet.doc}:{snippet.line + 1 + start}"
        run, capped = _with_caps(words)
        out.append(Command(where, text.strip(), run, capped))
    return out


def _with_caps(words: list[str]) -> tuple[str, bool]:
    """The words as one bash line, each simple command's cap before its redirections."""
    parts: list[str] = []
    command: list[str] = []
    capped = False

    def flush() -> None:
        nonlocal capped
        cap = CAPS.get((command[0], command[1])) if len(command) > 1 else None
        if cap:
            capped = True
        parts.extend(shlex.quote(w) for w in command + (cap or []))
        command.clear()

    redirect = False
    for word in words:
        if set(word) <= OPERATORS:
            flush()
            parts.append(word)
            redirect = word.endswith(">") or word.endswith("<")
        elif redirect:
            parts.append(shlex.quote(word))
            redirect = False
        else:
            command.append(word)
    flush()
    return " ".join(parts), capped


def not_run(command: Command) -> str | None:
    """Why this command line is not run, or None."""
    return next((why for start, why in NOT_RUN.items() if command.shown.startswith(start)), None)


# -- inputs the docs name but do not create --------------------------------------------------

PADDLE_NET = """
import paddle
paddle.seed(0)
class Net(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.conv = paddle.nn.Conv2D(1, 4, 5)
        self.fc = paddle.nn.Linear(4 * 24 * 24, 10)
    def forward(self, x):
        return self.fc(paddle.flatten(paddle.nn.functional.relu(self.conv(x)), 1))
def build():
    return Net()
"""
TORCH_NET = """
import torch
class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 4, 5)
        self.fc = torch.nn.Linear(4 * 24 * 24, 10)
    def forward(self, x):
        return self.fc(torch.flatten(torch.relu(self.conv(x)), 1))
def build():
    return Net()
"""
PADDLE_STEP = """
net = build()
opt = paddle.optimizer.Adam(parameters=net.parameters(), learning_rate=0.001)
net(paddle.randn([2, 1, 28, 28])).mean().backward()
opt.step()
paddle.save(net.state_dict(), "{stem}.pdparams")
paddle.save(opt.state_dict(), "{stem}.pdopt")
"""
GLUON_STEP = """
import mxnet as mx
from mxnet import autograd, gluon
net = gluon.nn.HybridSequential()
net.add(gluon.nn.Conv2D(4, 5, in_channels=1), gluon.nn.Flatten(), gluon.nn.Dense(10))
net.initialize(mx.init.Xavier())
net(mx.nd.zeros((2, 1, 28, 28)))
trainer = gluon.Trainer(net.collect_params(), "sgd", {{"learning_rate": 0.1, "momentum": 0.9}})
with autograd.record():
    loss = net(mx.nd.random.normal(shape=(2, 1, 28, 28))).mean()
loss.backward()
trainer.step(2)
net.save_parameters("{stem}.params")
trainer.save_states("{stem}.states")
structured = {{p.name: k for k, p in net._collect_params_with_prefix().items()}}
with open("order.txt", "w") as f:
    f.writelines(structured[n] + "\\n" for n in sorted(net.collect_params().keys()))
mx.nd.waitall()
"""
TWINS = (
    f"import sys\nsys.path.insert(0, {str(ROOT / 'tests')!r})\nfrom torch_twins import ResNet18\n"
)


def _python(code: str) -> Callable[[Path, Snippet], None]:
    def make(cwd: Path, snippet: Snippet) -> None:
        _run_checked([sys.executable, "-c", code], cwd, f"fixture for {snippet.id}")

    return make


def _files(files: dict[str, str], then: str = "") -> Callable[[Path, Snippet], None]:
    def make(cwd: Path, snippet: Snippet) -> None:
        for name, text in files.items():
            (cwd / name).parent.mkdir(parents=True, exist_ok=True)
            (cwd / name).write_text(text)
        if then:
            _python(then)(cwd, snippet)

    return make


def _json_block_before(name: str) -> Callable[[Path, Snippet], None]:
    def make(cwd: Path, snippet: Snippet) -> None:
        blocks = [s for s in _all_blocks(snippet.doc, "json") if s.line < snippet.line]
        (cwd / name).write_text(blocks[-1].code)

    return make


def _definitions_of_python_block_after(name: str) -> Callable[[Path, Snippet], None]:
    def make(cwd: Path, snippet: Snippet) -> None:
        block = next(s for s in _all_blocks(snippet.doc, "python") if s.line > snippet.line)
        kept = (ast.Import, ast.ImportFrom, ast.ClassDef, ast.FunctionDef)
        tree = ast.parse(block.code)
        tree.body = [node for node in tree.body if isinstance(node, kept)]
        (cwd / name).write_text(ast.unparse(tree) + "\n")

    return make


def _polytrain_native(name: str, model: str, to: str) -> Callable[[Path, Snippet], None]:
    """A built-in model's weights in a framework's format, written by polytrain itself."""

    def make(cwd: Path, snippet: Snippet) -> None:
        run = f".fixture-{model}"
        if not (cwd / run).exists():
            _neutral_run(run, "--model", model)(cwd, snippet)
        cmd = [str(BIN / "polytrain"), "convert", run, name, "--to", to]
        _run_checked(cmd, cwd, f"fixture for {snippet.id}")

    return make


def _paddle_tutorial(cwd: Path, snippet: Snippet) -> None:
    tutorial = (ROOT / "tests/fixtures/port_code/paddle_mnist_single.py").read_text()
    (cwd / "train.py").write_text(tutorial)
    (cwd / "project").mkdir()
    (cwd / "project/train.py").write_text(tutorial)
    (cwd / "project/README.txt").write_text("not python: copied as is\n")


def _neutral_run(out: str, *flags: str) -> Callable[[Path, Snippet], None]:
    def make(cwd: Path, snippet: Snippet) -> None:
        train = [str(BIN / "polytrain"), "train", "--backend", "numpy", "--epochs", "1"]
        cmd = [*train, *flags, "--out", out, *TRAIN_CAP]
        _run_checked(cmd, cwd, f"fixture for {snippet.id}")

    return make


@dataclass(frozen=True)
class Fixture:
    trigger: str  # a word of the block that needs it
    make: Callable[[Path, Snippet], None]
    paths: tuple[str, ...]  # what it creates (made when the first is missing)
    block_only: bool = False  # removed after the block


R18_WEIGHTS = (
    "import paddle\npaddle.save(paddle.vision.models.resnet18().state_dict(), 'r18.pdparams')"
)
MYPKG = {
    "mypkg/__init__.py": "",
    "mypkg/paddle_net.py": PADDLE_NET,
    "mypkg/torch_net.py": TORCH_NET,
}
FIXTURES: dict[str, list[Fixture]] = {
    "README.md": [
        Fixture(
            "net.pdparams",
            _files(MYPKG, "from mypkg.paddle_net import *\n" + PADDLE_STEP.format(stem="net")),
            ("net.pdparams", "net.pdopt", "mypkg"),
        ),
    ],
    "docs/architecture.md": [
        Fixture(
            "myplugins:HalveOnPlateau",
            _definitions_of_python_block_after("myplugins.py"),
            ("myplugins.py",),
        ),
    ],
    "docs/porting.md": [
        Fixture(
            "mnist.pdparams",
            _polytrain_native("mnist.pdparams", "paddle-mnist", "paddle"),
            ("mnist.pdparams",),
        ),
        Fixture(
            "model.params", _polytrain_native("model.params", "lenet", "mxnet"), ("model.params",)
        ),
        Fixture("runs/paddle", _neutral_run("runs/paddle"), ("runs/paddle",), block_only=True),
        Fixture(
            "own.pdparams", _python(PADDLE_NET + PADDLE_STEP.format(stem="own")), ("own.pdparams",)
        ),
        Fixture(
            "resnet18.pt",
            _python(TWINS + "import torch\ntorch.save(ResNet18().state_dict(), 'resnet18.pt')"),
            ("resnet18.pt",),
        ),
        Fixture("paddle-map.json", _json_block_before("paddle-map.json"), ("paddle-map.json",)),
        Fixture("gluon-map.json", _json_block_before("gluon-map.json"), ("gluon-map.json",)),
        Fixture(
            "net.pdparams", _python(PADDLE_NET + PADDLE_STEP.format(stem="net")), ("net.pdparams",)
        ),
        Fixture("net.params", _python(GLUON_STEP.format(stem="net")), ("net.params",)),
        Fixture(
            "mymodels:paddle_resnet18",
            _files(
                {
                    "mymodels.py": TWINS
                    + "import paddle\n"
                    + "def paddle_resnet18():\n    return paddle.vision.models.resnet18()\n"
                    + "def torch_resnet18():\n    return ResNet18()\n"
                },
                R18_WEIGHTS,
            ),
            ("mymodels.py", "r18.pdparams"),
        ),
        Fixture("train.py", _paddle_tutorial, ("train.py", "project")),
    ],
}


# -- running ----------------------------------------------------------------------------------


def _all_blocks(doc: str, language: str) -> list[Snippet]:
    """The doc's fenced blocks in that language (json included), in order."""
    lines = (ROOT / doc).read_text().splitlines()
    out, start = [], None
    for i, line in enumerate(lines):
        if start is None and line.strip() == f"```{language}":
            start = i
        elif start is not None and line.startswith("```"):
            out.append(Snippet(doc, start + 1, language, "\n".join(lines[start + 1 : i]) + "\n"))
            start = None
    return out


def runnable_blocks() -> dict[str, list[Snippet]]:
    """Per doc, its bash blocks to run (not skipped, not excerpts), in document order."""
    out: dict[str, list[Snippet]] = {}
    for s in snippets():
        if s.language == "bash" and not s.skip and not s.excerpt_of:
            out.setdefault(s.doc, []).append(s)
    return out


def environment() -> dict[str, str]:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("PYTHONPATH", None)
    env["COLUMNS"] = "120"
    return env


def _run_checked(cmd: list[str], cwd: Path, what: str, shown: str | None = None) -> None:
    proc = subprocess.run(
        cmd, cwd=cwd, env=environment(), capture_output=True, text=True, timeout=TIMEOUT_S
    )
    output = proc.stdout + proc.stderr
    if proc.returncode != 0 or "Traceback (most recent call last)" in output:
        raise AssertionError(
            f"{what}: exit {proc.returncode}\n$ {shown or shlex.join(cmd)}\n{output[-3000:]}"
        )


def run_doc(doc: str, cwd: Path) -> list[Command]:
    """Run the doc's bash blocks in order in cwd; the commands run (AssertionError on the
    first that fails, naming doc:line, the command and the tail of its output)."""
    (cwd / "examples").symlink_to(ROOT / "examples")
    ran: list[Command] = []
    made: set[str] = set()
    for snippet in runnable_blocks()[doc]:
        words = set(re.split(r"\s+", snippet.code))
        temporary: list[str] = []
        for fixture in FIXTURES.get(doc, []):
            needed = fixture.trigger in words and fixture.trigger not in made
            if needed and not (cwd / fixture.paths[0]).exists():
                made.add(fixture.trigger)
                fixture.make(cwd, snippet)
                if fixture.block_only:
                    temporary.extend(fixture.paths)
        for command in command_lines(snippet):
            if not_run(command):
                continue
            _run_checked(["bash", "-c", command.run], cwd, command.where, command.run)
            ran.append(command)
        for path in temporary:
            shutil.rmtree(cwd / path)
    return ran
