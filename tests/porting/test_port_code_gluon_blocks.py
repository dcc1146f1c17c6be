"""Gluon's blocks, cells and training-loop calls (issue 36, the registry corpus): each rule
converted and run on MXNet and on PyTorch with the same inputs, or left marked where the
tool cannot know (polytrain/porting/code/gluon_loops.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from port_code_helpers import assert_close, entry_arrays

from polytrain.porting.code import convert_source

pytest.importorskip("mxnet")
torch = pytest.importorskip("torch")
from mxnet import autograd, nd  # noqa: E402
from test_port_code_gluon import (  # noqa: E402
    ENTRY_OF,
    HEADER,
    TRAIN_LOOP,
    check_program,
    converted_example,
)

# ---- trainer.step(n) after a backward that is not a statement of its own ----------------

SCALED_LOOP = """
trainer = gluon.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.5, 'wd': 0.25})
for _ in range(2):
    with autograd.record():
        ls = [net(x) ** 2]
    [l.backward() for l in ls]
    trainer.step(4)
"""


def test_a_step_after_a_backward_in_a_comprehension_divides_the_gradients(
    tmp_path: Path,
) -> None:
    """d2l's ``[l.backward() for l in ls]; trainer.step(n)``: the gradients divided by n
    before the update (weight decay after), then cleared, as Gluon's Trainer.step."""
    entry = dataclasses.replace(ENTRY_OF["mxnet.gluon.Trainer"], example=SCALED_LOOP)
    code = converted_example(entry, SCALED_LOOP + TRAIN_LOOP)
    assert "gluon_step(trainer, 4)" in code and "gluon_backward(l)" in code
    check_program(entry, code, entry_arrays(entry), tmp_path)


def test_a_second_step_after_a_paired_one_stays_marked() -> None:
    """``loss.backward(); t1.step(n); t2.step(n)``: the loss took t1's division already;
    dividing t2's gradients again would be wrong, so t2's step is left marked."""
    source = HEADER + (
        "t1 = gluon.Trainer(a.collect_params(), 'sgd')\n"
        "t2 = gluon.Trainer(b.collect_params(), 'sgd')\n"
        "with autograd.record():\n    loss = b(a(x))\n"
        "loss.backward()\nt1.step(4)\nt2.step(4)\n"
    )
    result = convert_source(source, "gan.py")
    assert "gluon_step" not in result.code
    left = [u.api for u in result.report.uses if not u.converted]
    assert left == [".step"], result.code


# ---- with autograd.predict_mode(): the block's own blocks in eval mode --------------------

PREDICT_BLOCK = """
class Net(nn.Block):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.decoder = nn.Sequential()
        self.decoder.add(nn.Dropout(0.5), nn.BatchNorm(in_channels=3))

    def forward(self, x):
        with autograd.predict_mode():
            out = self.decoder(x)
        return out * 2
"""


def _run_predict_block(code: str, framework: str) -> tuple[np.ndarray, np.ndarray, bool]:
    """The block's output and input gradient in training mode (under autograd.record()
    on MXNet), and whether its decoder is in training mode after."""
    x = np.arange(12, dtype=np.float64).reshape(2, 3, 1, 2)
    space: dict[str, Any] = {}
    exec(code, space)
    net = space["Net"]()
    if framework == "mxnet":
        net.initialize()
        net.cast("float64")
        xs = nd.array(x, dtype="float64")
        xs.attach_grad()
        with autograd.record():
            out = net(xs)
        out.backward()
        return out.asnumpy(), xs.grad.asnumpy(), True
    net.double().train()
    xt = torch.tensor(x, requires_grad=True)
    out = net(xt)
    out.sum().backward()
    return out.detach().numpy(), xt.grad.numpy(), net.decoder.training


def test_predict_mode_around_the_blocks_own_blocks_puts_them_in_eval_mode() -> None:
    """``with autograd.predict_mode(): out = self.decoder(x)`` while training: dropout off,
    batch norm on its running statistics, gradients recorded; the mode restored after."""
    code = convert_source(HEADER + PREDICT_BLOCK, "lm.py").code
    assert "with gluon_predict_mode(self.decoder):" in code, code
    out_s, _, _ = _run_predict_block(HEADER + PREDICT_BLOCK, "mxnet")
    with pytest.warns(UserWarning, match="BatchNorm"):
        out_t, _, training = _run_predict_block(code, "torch")
    assert_close(out_s, out_t, 1e-6, "predict_mode out")
    assert training


def test_predict_mode_keeps_the_gradient_through_the_block() -> None:
    """Dropout off inside predict_mode, the gradient recorded through it (MXNet's own
    BatchNorm backward there is not the gradient of its output: the helper warns)."""
    source = HEADER + PREDICT_BLOCK.replace(", nn.BatchNorm(in_channels=3)", "")
    code = convert_source(source, "lm.py").code
    out_s, grad_s, _ = _run_predict_block(source, "mxnet")
    out_t, grad_t, _ = _run_predict_block(code, "torch")
    assert_close((out_s, grad_s), (out_t, grad_t), 1e-12, "predict_mode out and grad")


@pytest.mark.parametrize(
    "body",
    ["out = self.decoder(nd.relu(x))", "out = self.run(x)", "out = decoder(x)"],
    ids=["another-call", "a-method", "not-self"],
)
def test_predict_mode_around_other_calls_stays_marked(body: str) -> None:
    """Another call in the block may depend on MXNet's mode (a method, a function): the
    tool cannot put it in eval mode, so the line stays marked."""
    source = (
        HEADER
        + PREDICT_BLOCK.replace("out = self.decoder(x)", body)
        + ("\n    def run(self, x):\n        return x\n")
    )
    result = convert_source(source, "lm.py")
    assert "gluon_predict_mode" not in result.code
    left = {u.api for u in result.report.uses if not u.converted}
    assert "mxnet.autograd.predict_mode" in left
