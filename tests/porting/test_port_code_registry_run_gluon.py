"""Registry corpus files of the registry-gluon group run (issue 36, item 4): gluon-cv's
and gluon-nlp's model files run on MXNet, then, converted by ``polytrain port-code``, on
PyTorch from the same weights and batches, and the losses of every step agree (float64:
1e-10).

The files are library modules without a loop: each case appends a short ``driver`` (the
framework's code, converted with it) that makes a model, keeps its weights (``H.keep``),
and takes a few SGD steps on the harness's batches (tests/port_code_corpus_harness.py).
A file that imports a sibling of its package (``from ..nn import ReLU6``) gets that
sibling's few lines in its place (an ``edit``): the packages are not installed.

The files are not in git: the tests skip until ``python -m benchmarks.port_code_corpus
--gather-registry`` has written them, and fail where $POLYTRAIN_REQUIRE_REGISTRY_CORPUS
is set (CI)."""

from __future__ import annotations

from pathlib import Path

import pytest
from port_code_corpus_harness import (
    assert_same_losses,
    converted_code,
    harness_pair,
    run,
    with_harness,
)
from test_port_code_corpus import registry_file
from test_port_code_corpus_run import Case, _default_dtype

from benchmarks import port_code_corpus as corpus

torch = pytest.importorskip("torch")

DRIVER = """
import mxnet as mx
from mxnet import autograd, gluon

net = {make}
net.initialize(mx.init.Xavier())
net.cast("float64")
H.keep(net, H.array({shape}))
trainer = gluon.Trainer(net.collect_params(), "sgd", {{"learning_rate": {lr}, "momentum": 0.5}})
loss = gluon.loss.SoftmaxCrossEntropyLoss()
for _ in range(3):
    x, y = H.array({shape}), H.labels({batch}, classes={classes}, dtype="float64")
    with autograd.record():
        L = loss(net(x), y)
    L.backward()
    trainer.step({batch})
    H.loss(L)
"""


def classifier(make: str, shape: tuple[int, ...], classes: int, lr: float = 2**-4) -> str:
    """The steps of a classifier ``make`` on batches of ``shape``: SGD with momentum on
    Gluon's softmax cross-entropy, in float64 (the learning rate and momentum powers of 2:
    MXNet's optimizer holds them as float32)."""
    shape_text = ", ".join(map(str, shape))
    return DRIVER.format(make=make, shape=shape_text, batch=shape[0], classes=classes, lr=lr)


RELU6 = (
    "from ..nn import ReLU6",
    """class ReLU6(HybridBlock):  # gluoncv/nn/block.py's, the sibling it imports
    def __init__(self, **kwargs):
        super(ReLU6, self).__init__(**kwargs)

    def hybrid_forward(self, F, x):
        return F.clip(x, 0, 6, name="relu6")""",
)
CASES = [
    Case(
        "registry-gluon/gluoncv_cifarresnet.py",
        driver=classifier("cifar_resnet20_v1(classes=10)", (2, 3, 8, 8), 10),
        dtype="float64",
    ),
    Case(
        "registry-gluon/gluoncv_se_resnet.py",
        driver=classifier(
            "SE_ResNetV2(SE_BottleneckV2, [1, 1], [16, 32, 64], classes=5, thumbnail=True)",
            (2, 3, 8, 8),
            5,
        ),
        dtype="float64",
    ),
    Case(
        "registry-gluon/gluoncv_mobilenet.py",
        edits=(RELU6,),
        driver=classifier("MobileNetV2(multiplier=0.25, classes=5)", (4, 3, 64, 64), 5, 2**-5),
        dtype="float64",
    ),
    Case(
        "registry-gluon/gluoncv_resnext.py",
        driver=classifier(
            "ResNext([1, 1], 2, 4, classes=5, use_se=True, deep_stem=True, avg_down=True, "
            "stem_width=8)",
            (2, 3, 16, 16),
            5,
        ),
        dtype="float64",
    ),
    Case(
        "registry-gluon/gluoncv_senet.py",
        # the dropout off: its masks are each framework's draws
        edits=(("self.features.add(nn.Dropout(0.2))", "self.features.add(nn.Dropout(0.0))"),),
        driver=classifier("SENet([1, 1], 2, 4, avg_down=True, classes=5)", (2, 3, 16, 16), 5),
        dtype="float64",
    ),
    Case(
        "registry-gluon/gluoncv_densenet.py",
        driver=classifier("DenseNet(8, 4, [1, 1], classes=5)", (2, 3, 56, 56), 5),
        dtype="float64",
    ),
]


def _entry(case: Case) -> dict[str, str]:
    group, name = case.file.split("/")
    return next(e for e in corpus.registry_manifest() if (e["group"], e["name"]) == (group, name))


def edited(case: Case) -> str:
    """The registry file with the case's edits, the harness imported first."""
    text = registry_file(_entry(case)).read_text(encoding="utf-8")
    return with_harness(text, case.edits, case.driver, case.file)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore")  # the files' own deprecated calls
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.file)
def test_converted_registry_file_trains_with_the_originals_losses(
    case: Case, tmp_path: Path
) -> None:
    pytest.importorskip("mxnet")
    text = edited(case)
    code = converted_code(text, case.file, case.left, case.fixes)
    original, converted = harness_pair("mxnet", tmp_path, case.dtype)
    run(text, original, "original.py")
    with _default_dtype("torch", case.dtype):
        run(code, converted, "converted.py")
    assert_same_losses(original, converted, case.tolerance)
