"""Registry corpus files of PaddleClas and PaddleNLP run (issue 36, item 4): each model
file runs on Paddle with a short driver (a few optimizer steps on the harness's small
batches), then, converted by ``polytrain port-code`` with its driver, on PyTorch from the
same weights and batches; the losses of every step agree (float32: 1e-5 of the loss).

The files import their package's siblings (``from ....utils.save_load import ...``);
the packages are not installed: each case's edits replace those imports with what the
file needs of them (a pretrained-weights loader these runs never call). The harness and
its seams are tests/port_code_corpus_harness.py's, as in test_port_code_corpus_run.py.

The gathered files are not in git: the tests skip until ``python -m
benchmarks.port_code_corpus --gather-registry`` wrote them, and fail instead where
``$POLYTRAIN_REQUIRE_REGISTRY_CORPUS`` is set (CI)."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import pytest
from port_code_corpus_harness import (
    assert_same_losses,
    converted_code,
    harness_pair,
    run,
    with_harness,
)

from benchmarks import port_code_corpus as corpus

paddle = pytest.importorskip("paddle")
torch = pytest.importorskip("torch")

FP32 = 1e-5
REQUIRE_REGISTRY = "POLYTRAIN_REQUIRE_REGISTRY_CORPUS"
NO_PRETRAINED = (
    "from ....utils.save_load import load_dygraph_pretrain",
    "load_dygraph_pretrain = None  # PaddleClas's loader: no pretrained weights here",
)


def _head_steps(head: str) -> str:
    """A margin head (``head(features, label)``: logits) on a Linear backbone, three
    Momentum steps of cross entropy in training mode (the margin applies to the label)."""
    return f"""
class Net(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.body = paddle.nn.Linear(6, 8)
        self.head = {head}

    def forward(self, x, label):
        return self.head(self.body(x), label)


model = Net()
H.keep(model)
opt = paddle.optimizer.Momentum(learning_rate=0.05, momentum=0.9, parameters=model.parameters())
for _ in range(3):
    label = H.labels(4, 1, classes=10)
    loss = paddle.nn.functional.cross_entropy(model(H.array(4, 6), label), label)
    H.loss(loss)
    loss.backward()
    opt.step()
    opt.clear_grad()
"""


SEQUENCE_MASK = """
def sequence_mask(seq_ids, valid_lengths):  # PaddleNLP's paddlenlp.layers.sequence
    return seq_ids < valid_lengths.unsqueeze(1)
"""
CRF_STEPS = """
class Tagger(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.emit = paddle.nn.Linear(6, 5)
        self.crf = LinearChainCrf(3, crf_lr=1.0)

    def forward(self, x, lengths, labels):  # the loss made here: the CRF registered once
        return LinearChainCrfLoss(self.crf)(self.emit(x), lengths, labels).mean()


model = Tagger()
H.keep(model)
opt = paddle.optimizer.Momentum(learning_rate=0.05, momentum=0.9, parameters=model.parameters())
for _ in range(3):
    lengths = H.labels(2, classes=3) + 3
    loss = model(H.array(2, 5, 6), lengths, H.labels(2, 5, classes=3))
    H.loss(loss)
    loss.backward()
    opt.step()
    opt.clear_grad()
# the CRF's caches, tensors Paddle registers as (non-persistable) buffers where PyTorch
# keeps plain attributes: cleared, so that the layers pair as polytrain port pairs them
for cache in ("_initial_alpha", "_start_tensor", "_stop_tensor", "_batch_index",
              "_seq_index", "_batch_seq_index"):
    setattr(model.crf, cache, None)
"""


# training mode (BatchNorm normalises by the batch: eval mode with fresh statistics lets
# activations grow to thousands, past Paddle's CPU softmax clip at -64) without dropout;
# batches whose last feature map has several values per channel (a BatchNorm over two
# values has gradients of rounding noise)
TRAIN_NO_DROPOUT = "model.train()\nmodel.dropout.p = 0.0"


@dataclass(frozen=True)
class Case:
    """A registry file (``name`` in registry-paddle), its ``edits`` (old, new) and
    ``driver`` as test_port_code_corpus_run.Case's; ``left``: the APIs the converter
    leaves marked, ``fixes`` (old, new) in the converted code: what those markers ask."""

    name: str
    edits: tuple[tuple[str, str], ...] = ()
    driver: str = ""
    left: tuple[str, ...] = ()
    fixes: tuple[tuple[str, str], ...] = ()


def _steps(
    make: str,
    batch: str = "H.array(2, 3, 32, 32)",
    classes: int = 10,
    lr: float = 0.05,
    mode: str = "model.eval()",
) -> str:
    """A model made by ``make``, kept, three Momentum steps of cross entropy on ``batch``
    (``mode``: eval by default: dropout off, its masks being each framework's draws;
    gradients flow)."""
    return f"""
model = {make}
H.keep(model)
{mode}
opt = paddle.optimizer.Momentum(learning_rate={lr}, momentum=0.9, parameters=model.parameters())
for _ in range(3):
    x = {batch}
    loss = paddle.nn.functional.cross_entropy(model(x), H.labels(x.shape[0], 1, classes={classes}))
    H.loss(loss)
    loss.backward()
    opt.step()
    opt.clear_grad()
"""


CASES = [
    Case("ppcls_mobilenet_v2.py", edits=(NO_PRETRAINED,), driver=_steps("MobileNet(10, 0.25)")),
    Case(
        "ppcls_se_resnext.py",
        edits=(NO_PRETRAINED,),
        driver=_steps("ResNeXt(layers=50, class_num=10, cardinality=32)", lr=0.001),
    ),
    Case(
        "ppcls_ghostnet.py",
        edits=(NO_PRETRAINED,),
        driver="paddle.seed(0)"
        + _steps("GhostNet(0.5, 10)", "H.array(16, 3, 32, 32)", lr=0.0001, mode=TRAIN_NO_DROPOUT),
    ),
    Case(
        "ppcls_vision_transformer.py",
        edits=(NO_PRETRAINED,),
        driver=_steps(
            "VisionTransformer(img_size=32, patch_size=8, class_num=10, embed_dim=32, depth=2,"
            " num_heads=2, qkv_bias=True)"
        ),
        # the layers are named by strings, `eval(norm_layer)`: the tool does not see them
        left=("paddle.nn.initializer.Normal",),  # `normal_ = Normal`, never used
        fixes=(
            ("eval(norm_layer)(embed_dim, epsilon=", "nn.LayerNorm(embed_dim, eps="),
            ("eval(norm_layer)(dim, epsilon=", "nn.LayerNorm(dim, eps="),
        ),
    ),
    Case("ppcls_arcmargin.py", driver=_head_steps("ArcMargin(8, 10, scale=8.0)")),
    Case(
        "paddlenlp_crf.py",
        edits=(
            ("from ..utils.log import logger", "import logging\nlogger = logging.getLogger('crf')"),
            ("from .sequence import sequence_mask", SEQUENCE_MASK),
        ),
        driver=CRF_STEPS,
        fixes=(
            # Paddle's `a += b` is `a = a + b` (a new tensor, broadcast), PyTorch's is in
            # place: the tool leaves augmented assignments as they are (docs/porting.md)
            ("offsets += unsqueeze_axes(", "offsets = offsets + unsqueeze_axes("),
        ),
    ),
]


def _entry(name: str) -> dict[str, str]:
    return next(e for e in corpus.registry_manifest() if e["name"] == name)


def registry_text(name: str) -> str:
    """The gathered file; absent, the test skips (fails where CI requires the corpus)."""
    entry = _entry(name)
    path = corpus.registry_path(entry)
    if not path.exists():
        why = f"{name} not gathered: python -m benchmarks.port_code_corpus --gather-registry"
        if os.environ.get(REQUIRE_REGISTRY):
            pytest.fail(f"{REQUIRE_REGISTRY} is set and {why}")
        pytest.skip(why)
    data = path.read_bytes()
    assert hashlib.sha256(data).hexdigest() == entry["sha256"], path
    return data.decode("utf-8")


def edited(case: Case) -> str:
    return with_harness(registry_text(case.name), case.edits, case.driver, case.name)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore")  # the files' own deprecated calls
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_converted_registry_file_trains_with_the_originals_losses(
    case: Case, tmp_path: Path
) -> None:
    text = edited(case)
    code = converted_code(text, case.name, case.left, case.fixes)
    original, converted = harness_pair("paddle", tmp_path)
    with paddle.utils.unique_name.guard():  # the files name their parameters: fresh names
        run(text, original, "original.py")
    run(code, converted, "converted.py")
    assert_same_losses(original, converted, FP32)
