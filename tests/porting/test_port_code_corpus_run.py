"""Corpus files run (issue 36, item 4): each self-contained file of the port-code corpus
(a model and a training loop on data it makes, or data the harness substitutes with small
arrays or files) runs on its framework, then, converted by ``polytrain port-code``, on
PyTorch from the same weights and batches, and the losses of every step agree (float64
where both frameworks run it: 1e-10; float32: 1e-5 of the loss).

Each case's edits are the documented seams of tests/port_code_corpus_harness.py, applied
to the original before it is converted (both runs execute the same program): the harness
import, ``H.keep`` after a model is made, ``H.loss`` / ``H.watch`` on the losses, smaller
epoch and step counts, the harness's data where the file downloads. A model file without
a loop of its own gets a short ``driver`` (the framework's code, converted with it).

The corpus files are not in git: the tests skip until ``python -m
benchmarks.port_code_corpus --gather MIRRORS`` has written them."""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from port_code_corpus_harness import (
    assert_same_losses,
    converted_code,
    harness_pair,
    run,
    with_harness,
)

from benchmarks import port_code_corpus as corpus

torch = pytest.importorskip("torch")

FP64, FP32 = 1e-10, 1e-5


@dataclass(frozen=True)
class Case:
    """One corpus file (``group/name``) and how it runs: ``edits`` (old, new) in the
    original, each found and every occurrence replaced; ``driver``: code appended (a model
    file's steps); ``left``: the APIs the converter leaves marked; ``fixes`` (old, new) in
    the converted code: what those markers ask the user to write;
    ``book_data``: the d2l book's Fashion-MNIST, small files in each run's folder (the
    original's ``d2lzh`` loader is Gluon's FashionMNIST on them; the converted loader
    reads them from $MXNET_HOME)."""

    file: str
    edits: tuple[tuple[str, str], ...] = ()
    driver: str = ""
    dtype: str = "float32"
    left: tuple[str, ...] = ()
    fixes: tuple[tuple[str, str], ...] = ()
    book_data: bool = False

    @property
    def framework(self) -> str:
        group, name = self.file.split("/")
        return "paddle" if group == "paddle" or name.startswith("v2_") else "mxnet"

    @property
    def tolerance(self) -> float:
        return FP64 if self.dtype == "float64" else FP32


def _after(line: str, added: str) -> tuple[str, str]:
    """An edit that adds ``added`` after ``line`` (the same indentation)."""
    indent = line[: len(line) - len(line.lstrip())]
    return line + "\n", f"{line}\n{indent}{added}\n"


RAND_BRANCH = """paddle.rand(
                [
                    1,
                ]
            )
            > 0.5"""
CIFAR = """paddle.vision.datasets.Cifar10(
    mode="train", transform=transform
)"""
ALEXNET_STEPS = """
model = AlexNet(class_num=10)
H.keep(model)
model.eval()  # the dropout off (its masks are each framework's draws); gradients still flow
opt = paddle.optimizer.Momentum(learning_rate=0.01, momentum=0.9, parameters=model.parameters())
for _ in range(3):
    loss = F.cross_entropy(model(H.array(2, 3, 224, 224)), H.labels(2, 1, classes=10))
    H.loss(loss)
    loss.backward()
    opt.step()
    opt.clear_grad()
"""
CELOSS_STEPS = """
for epsilon, reduction in ((None, "mean"), (0.1, "sum"), (None, "none"), (0.2, "mean")):
    loss_fn = CELoss(reduction=reduction, epsilon=epsilon)
    for soft in (False, True):
        label = H.array(4, 5) if soft else H.labels(4, 1, classes=5)
        H.loss(loss_fn(H.array(4, 5), label)["CELoss"])
"""
URBAN_STEPS = """
net = get_net(num_labels=5)
H.keep(net, H.array(2, 40))
trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1, "momentum": 0.9})
loss = gluon.loss.SoftmaxCrossEntropyLoss()
for _ in range(4):
    x, y = H.array(8, 40), H.labels(8, classes=5, dtype="float32")
    with mx.autograd.record():
        L = loss(net(x), y)
    L.backward()
    trainer.step(8)
    H.loss(L)
"""
GENERATOR_STEPS = """
g_net = get_generator()
g_net.initialize(mx.init.Normal(0.02))
H.keep(g_net, H.array(2, 16, 1, 1))
trainer = gluon.Trainer(g_net.collect_params(), "sgd", {"learning_rate": 0.05, "momentum": 0.5})
loss = gluon.loss.L2Loss()
for _ in range(3):
    noise, target = H.array(2, 16, 1, 1), H.array(2, 3, 64, 64, scale=0.5)
    with autograd.record():
        L = loss(g_net(noise), target)
    L.backward()
    trainer.step(2)
    H.loss(L)
"""
MNIST_GLUON = "gluon.data.vision.MNIST('./data', train=True, transform=transformer)"

CASES = [
    Case(
        "paddle/hello_paddle.py",
        edits=(
            ("total_epoch = 5000", "total_epoch = 30"),
            _after("linear = paddle.nn.Linear(in_features=1, out_features=1)", "H.keep(linear)"),
            _after("    loss = mse_loss(y_predict, y_data)", "H.loss(loss)"),
        ),
        dtype="float64",
    ),
    Case(
        "paddle/dynamic_graph.py",
        edits=(
            (RAND_BRANCH, "H.coin()"),  # the model's random branch: the same in both runs
            _after("model = MyModel(input_size, hidden_size)", "H.keep(model)"),
            ("for t in range(200 * (total_data // batch_size)):", "for t in range(8):"),
            _after("    loss = loss_fn(y_pred, y)", "H.loss(loss)"),
            ("inputs = paddle.rand((256, 64))", "inputs = H.array(256, 64)"),
            _after("linear = paddle.nn.Linear(64, 8, bias_attr=False)", "H.keep(linear)"),
            _after("    loss = loss_fn(outputs, inputs)", "H.loss(loss)"),
        ),
    ),
    Case(
        "paddle/save_model.py",
        edits=(
            (
                'MNIST(mode="train", ',
                'MNIST(image_path=H.image_file("train", 200), '
                'label_path=H.label_file("train", 200), mode="train", ',
            ),
            (
                'MNIST(mode="test", ',
                'MNIST(image_path=H.image_file("test", 100), '
                'label_path=H.label_file("test", 100), mode="test", ',
            ),
            ("paddle.Model(MyModel(), ", "paddle.Model(H.keep(MyModel()), "),
            ("CrossEntropyLoss(), Accuracy())", "CrossEntropyLoss()), Accuracy())"),
            ("optim, paddle.nn.CrossEntropyLoss()", "optim, H.watch(paddle.nn.CrossEntropyLoss()"),
            (
                "optim, paddle.nn.loss.CrossEntropyLoss()",
                "optim, H.watch(paddle.nn.loss.CrossEntropyLoss()",
            ),
            ("batch_size=64,", "batch_size=64, shuffle=False,"),
            ("transform=ToTensor()", "transform=H.chw"),  # float64 images: Adam's steps
        ),
        dtype="float64",
    ),
    Case(
        "paddle/convnet_image_classification.py",
        edits=(
            (CIFAR, "H.images(64, 32, 32, 3, classes=10, transform=transform)"),
            (
                'paddle.vision.datasets.Cifar10(mode="test", transform=transform)',
                "H.images(32, 32, 32, 3, classes=10, transform=transform)",
            ),
            ("transform = ToTensor()", "transform = H.chw  # float64 images: Adam's steps"),
            ("epoch_num = 10", "epoch_num = 2"),
            ("shuffle=True", "shuffle=False"),
            (
                "            loss = F.cross_entropy(logits, y_data)\n",
                "            loss = F.cross_entropy(logits, y_data)\n            H.loss(loss)\n",
            ),
            _after("model = MyNet(num_classes=10)", "H.keep(model)"),
        ),
        dtype="float64",  # float32: Adam's first steps follow the sign of gradients near 0
    ),
    Case(
        "paddle/ppcls_alexnet.py",
        edits=(
            (
                "from ....utils.save_load import load_dygraph_pretrain",
                "load_dygraph_pretrain = None  # PaddleClas's loader: not used here",
            ),
        ),
        driver=ALEXNET_STEPS,
    ),
    Case(
        "paddle/ppcls_celoss.py",
        edits=(("from ppcls.utils import logger", "logger = None  # PaddleClas's logger"),),
        driver=CELOSS_STEPS,
    ),
    Case(
        "gluon/mnist.py",
        edits=(
            ("logging.basicConfig(level=logging.DEBUG)", "pass"),
            ("'--epochs', type=int, default=10,", "'--epochs', type=int, default=2,"),
            (MNIST_GLUON, MNIST_GLUON.replace("'./data'", "H.mnist_folder('data', 200, 100)")),
            ("shuffle=True", "shuffle=False"),
            _after(
                "    net.initialize(mx.init.Xavier(magnitude=2.24), ctx=ctx)",
                "H.keep(net, H.array(2, 784))",
            ),
            _after("                L = loss(output, label)", "H.loss(L)"),
        ),
    ),
    Case("gluon/urban_sounds_model.py", driver=URBAN_STEPS),
    Case("gluon/sn_gan_model.py", driver=GENERATOR_STEPS),
    Case(
        "d2l/v1_linear_regression_scratch.py",
        edits=(
            ("from IPython import display", "display = None  # a notebook's display"),
            ("set_figsize()\n", ""),
            ("plt.scatter(features[:, 1].asnumpy(), labels.asnumpy(), 1);", ""),
            (
                "features = nd.random.normal(scale=1, shape=(num_examples, num_inputs))",
                "features = H.array(num_examples, num_inputs)",
            ),
            (
                "labels += nd.random.normal(scale=0.01, shape=labels.shape)",
                "labels += H.array(num_examples, scale=0.01)",
            ),
            (
                "w = nd.random.normal(scale=0.01, shape=(num_inputs, 1))",
                "w = H.array(num_inputs, 1, scale=0.01)",
            ),
            ("num_epochs = 3", "num_epochs = 2"),
            _after("            l = loss(net(X, w, b), y)  # l是有关小批量X和y的损失", "H.loss(l)"),
        ),
    ),
    Case(
        "d2l/v1_linear_regression_gluon.py",
        edits=(
            (
                "features = nd.random.normal(scale=1, shape=(num_examples, num_inputs))",
                "features = H.array(num_examples, num_inputs)",
            ),
            (
                "labels += nd.random.normal(scale=0.01, shape=labels.shape)",
                "labels += H.array(num_examples, scale=0.01)",
            ),
            ("shuffle=True", "shuffle=False"),
            _after("net.initialize(init.Normal(sigma=0.01))", "H.keep(net, X)"),
            _after("            l = loss(net(X), y)", "H.loss(l)"),
            # the last cells read Gluon's Dense through net[0], which PyTorch nests one
            # level deeper (Sequential(Flatten(), Linear): the note of nn.Dense)
            ("dense = net[0]\ntrue_w, dense.weight.data()\n\ntrue_b, dense.bias.data()", ""),
        ),
    ),
    Case(
        "d2l/v1_lenet.py",
        edits=(
            # Gluon's block names (dense0): PyTorch's modules have none
            ("print(layer.name, 'output shape:", "print(type(layer).__name__, 'output shape:"),
            _after("net.initialize(force_reinit=True, ctx=ctx, init=init.Xavier())", "H.keep(net)"),
            _after("                l = loss(y_hat, y).sum()", "H.loss(l)"),
        ),
        book_data=True,
    ),
]


def _entry(case: Case) -> dict[str, str]:
    return next(e for e in corpus.manifest() if f"{e['group']}/{e['name']}" == case.file)


GATHERED = all(corpus.corpus_path(e).exists() for e in corpus.manifest())


def edited(case: Case) -> str:
    """The corpus file with the case's edits, the harness imported first."""
    text = corpus.corpus_path(_entry(case)).read_text(encoding="utf-8")
    return with_harness(text, case.edits, case.driver, case.file)


@contextlib.contextmanager
def _default_dtype(framework: str, dtype: str) -> Iterator[None]:
    """The framework's default float dtype for the run (MXNet has none: its arrays are
    float32 unless made otherwise)."""
    if framework == "mxnet":
        yield
        return
    module = pytest.importorskip(framework)
    old = module.get_default_dtype()
    module.set_default_dtype(getattr(torch, dtype) if framework == "torch" else dtype)
    try:
        yield
    finally:
        module.set_default_dtype(old)


def _book(folder: Path) -> types.ModuleType:
    """The d2l book's package as the original imports it: its Fashion-MNIST loader, Gluon's
    FashionMNIST files of the run's folder through Gluon's ToTensor, the training batches
    shuffled (the one function of ``d2lzh`` these files call)."""
    import mxnet as mx

    vision = mx.gluon.data.vision
    module = types.ModuleType("d2lzh")

    def load_data_fashion_mnist(batch_size: int) -> tuple[Any, Any]:
        root = str(folder / "datasets" / "fashion-mnist")
        train, test = (
            vision.FashionMNIST(root, train=part).transform_first(vision.transforms.ToTensor())
            for part in (True, False)
        )
        data = mx.gluon.data
        return data.DataLoader(train, batch_size, shuffle=True), data.DataLoader(test, batch_size)

    module.__dict__["load_data_fashion_mnist"] = load_data_fashion_mnist
    return module


def _mxnet_files(monkeypatch: pytest.MonkeyPatch) -> None:
    """Gluon's datasets read the harness's files: its sha1 check of MXNet's own files
    passed over (it would download them)."""
    import mxnet.gluon.data.vision.datasets as sets
    import mxnet.gluon.utils as utils

    monkeypatch.setattr(utils, "check_sha1", lambda *args: True)
    monkeypatch.setattr(sets, "check_sha1", lambda *args: True)


@pytest.mark.slow  # 75 s together
@pytest.mark.skipif(not GATHERED, reason="corpus not gathered (python -m "
                    "benchmarks.port_code_corpus --gather MIRRORS)")  # fmt: skip
@pytest.mark.filterwarnings("ignore")  # the corpus's own deprecated calls
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.file)
def test_converted_corpus_file_trains_with_the_originals_losses(
    case: Case, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip(case.framework)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    text = edited(case)
    code = converted_code(text, case.file, case.left, case.fixes)
    original, converted = harness_pair(case.framework, tmp_path, case.dtype)
    folders = original.folder, converted.folder
    modules = {}
    if case.framework == "mxnet":
        _mxnet_files(monkeypatch)
    if case.book_data:
        for harness in (original, converted):
            harness.mnist_folder("datasets/fashion-mnist", 64, 32)
        modules["d2lzh"] = _book(folders[0])
    with _default_dtype(case.framework, case.dtype):
        run(text, original, "original.py", modules)
    monkeypatch.setenv("MXNET_HOME", str(folders[1]))
    with _default_dtype("torch", case.dtype):
        run(code, converted, "converted.py")
    assert_same_losses(original, converted, case.tolerance)
