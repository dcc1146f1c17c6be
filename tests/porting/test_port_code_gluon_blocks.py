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


def test_a_step_after_a_backward_in_a_lambda_stays_marked() -> None:
    """A backward inside a lambda may never run: the gradients the step finds are not
    known to be one backward's, so the step is left marked."""
    source = HEADER + (
        "trainer = gluon.Trainer(net.collect_params(), 'sgd')\n"
        "with autograd.record():\n    loss = net(x)\n"
        "closure = lambda: loss.backward()\ntrainer.step(4)\n"
    )
    result = convert_source(source, "loop.py")
    assert "gluon_step" not in result.code
    assert ".step" in {u.api for u in result.report.uses if not u.converted}


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


def _float64_net(code: str, framework: str) -> Any:
    """``Net()`` of ``code``, in float64: initialized and cast on MXNet, doubled on torch."""
    space: dict[str, Any] = {}
    exec(code, space)
    net = space["Net"]()
    if framework == "mxnet":
        net.initialize()
        net.cast("float64")
    else:
        net.double()
    return net


def _run_predict_block(code: str, framework: str) -> tuple[np.ndarray, np.ndarray, bool]:
    """The block's output and input gradient in training mode (under autograd.record()
    on MXNet), and whether its decoder is in training mode after."""
    x = np.arange(12, dtype=np.float64).reshape(2, 3, 1, 2)
    net = _float64_net(code, framework)
    if framework == "mxnet":
        xs = nd.array(x, dtype="float64")
        xs.attach_grad()
        with autograd.record():
            out = net(xs)
        out.backward()
        return out.asnumpy(), xs.grad.asnumpy(), True
    net.train()
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
    assert "with gluon_predict_mode(" not in result.code
    left = {u.api for u in result.report.uses if not u.converted}
    assert "mxnet.autograd.predict_mode" in left


# ---- nn.Dense(..., params=other.params): tied weights ---------------------------------------

TIED = """
class Net(nn.Block):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.embedding = nn.Sequential()
        self.embedding.add(nn.Embedding(5, 3))
        self.decoder = nn.Dense(5, flatten=False, params=self.embedding[0].params)

    def forward(self, x):
        return self.decoder(self.embedding(x))
"""


def _run_tied(code: str, framework: str) -> tuple[np.ndarray, ...]:
    """The tied model's output and its weight's and bias's gradients on set weights."""
    rng = np.random.default_rng(0)
    weight, bias = rng.standard_normal((5, 3)), rng.standard_normal(5)
    tokens = np.array([[0, 4, 2], [1, 1, 3]])
    net = _float64_net(code, framework)
    if framework == "mxnet":
        net(nd.array(tokens))  # the deferred shapes
        assert net.decoder.weight is net.embedding[0].weight
        net.embedding[0].weight.set_data(nd.array(weight, dtype="float64"))
        net.decoder.bias.set_data(nd.array(bias, dtype="float64"))
        with autograd.record():
            out = net(nd.array(tokens))
        out.backward()
        grads = net.decoder.weight.grad().asnumpy(), net.decoder.bias.grad().asnumpy()
        return out.asnumpy(), *grads
    assert net.decoder.weight is net.embedding[0].weight
    with torch.no_grad():
        net.embedding[0].weight.copy_(torch.tensor(weight))
        net.decoder.bias.copy_(torch.tensor(bias))
    out = net(torch.tensor(tokens))
    out.sum().backward()
    grads = net.decoder.weight.grad.numpy(), net.decoder.bias.grad.numpy()
    return out.detach().numpy(), *grads


def test_dense_with_another_blocks_params_ties_the_weight() -> None:
    """``nn.Dense(vocab, flatten=False, params=embedding.params)`` (a language model's
    tied decoder): the Linear's weight is the embedding's, its bias its own."""
    code = convert_source(HEADER + TIED, "lm.py").code
    assert "gluon_shared(nn.LazyLinear(out_features=5), self.embedding[0])" in code
    keys = ("out", "weight grad", "bias grad")
    gluon = dict(zip(keys, _run_tied(HEADER + TIED, "mxnet"), strict=True))
    torch_ = dict(zip(keys, _run_tied(code, "torch"), strict=True))
    assert_close(gluon, torch_, 1e-12, "tied")


def test_dense_with_a_parameter_dict_is_refused_when_it_runs() -> None:
    code = convert_source(HEADER + TIED.replace("self.embedding[0].params", "shared"), "lm.py")
    with pytest.raises(TypeError, match="tie the weights by hand"):
        exec(code.code + "\nshared = {}\nNet()\n", {})
