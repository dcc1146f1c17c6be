"""Gluon's recurrent cells converted by port-code (gluon_cells.toml): each cell made by
MXNet and by the converted code, with the same weights, gives the same outputs and
states (float32: 1e-5) one step at a time and unrolled; the corpus's encoder (gluon-nlp's
language model) converts and runs as Gluon's."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from polytrain.porting.code import convert_source

mx = pytest.importorskip("mxnet")
torch = pytest.importorskip("torch")
from mxnet import autograd, nd  # noqa: E402

HEADER = "import mxnet as mx\nfrom mxnet import gluon, nd\nfrom mxnet.gluon import contrib, rnn\n"
TOL = 1e-5
CELLS = [
    "cell = rnn.RNNCell(4, input_size=3)",
    "cell = rnn.RNNCell(4, activation='relu')",
    "cell = rnn.LSTMCell(4, input_size=3)",
    "cell = rnn.LSTMCell(4, activation='softsign', recurrent_activation='tanh')",
    "cell = rnn.GRUCell(4)",
    "cell = contrib.rnn.LSTMPCell(5, 2)",
]


def _pair(code: str) -> tuple[Any, Any]:
    """The ``cell`` the code makes on MXNet and, converted (nothing left marked), on
    PyTorch."""
    result = convert_source(HEADER + code, "cells.py")
    assert [u for u in result.report.uses if not u.converted] == [], result.code
    src: dict[str, Any] = {}
    tgt: dict[str, Any] = {}
    exec(HEADER + code, src)
    exec(result.code, tgt)
    return src["cell"], tgt["cell"]


def _copy_weights(src: Any, tgt: Any, rng: np.random.Generator) -> None:
    """Random values for the Gluon cell's parameters (biases too), copied into the
    converted cell: Gluon's i2h_weight is i2h.weight; a sequence's cells in order."""
    if hasattr(tgt, "cells"):
        for s, t in zip(src._children.values(), tgt.cells, strict=True):
            _copy_weights(s, t, rng)
        return
    with torch.no_grad():
        for name, p in src.collect_params().items():
            value = rng.normal(0.0, 0.5, p.shape).astype(np.float32)
            p.set_data(nd.array(value))
            torch_name = ".".join(name.rsplit("_", 2)[-2:])
            tgt.get_parameter(torch_name).copy_(torch.tensor(value))


def _ready(code: str, rng: np.random.Generator, width: int = 3) -> tuple[Any, Any]:
    """Both cells made, run once (deferred input sizes) and given the same weights."""
    src, tgt = _pair(code)
    src.initialize()
    x = np.zeros((2, width), np.float32)
    src(nd.array(x), src.begin_state(batch_size=2))
    with torch.no_grad():
        tgt(torch.tensor(x), tgt.begin_state(batch_size=2))
    _copy_weights(src, tgt, rng)
    return src, tgt


def _np(value: Any) -> Any:
    if isinstance(value, list | tuple):
        return [_np(v) for v in value]
    if isinstance(value, nd.NDArray):
        return value.asnumpy()
    return value.detach().numpy() if isinstance(value, torch.Tensor) else value


def _close(a: Any, b: Any, what: str) -> None:
    a, b = _np(a), _np(b)
    if isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), what
        for u, v in zip(a, b, strict=True):
            _close(u, v, what)
        return
    assert a.shape == b.shape, (what, a.shape, b.shape)
    np.testing.assert_allclose(a, b, rtol=0, atol=TOL, err_msg=what)


@pytest.mark.filterwarnings("ignore:Lazy modules are a new feature:UserWarning")
@pytest.mark.parametrize("code", CELLS)
def test_a_converted_cell_computes_gluons_step_and_unroll(code: str) -> None:
    rng = np.random.default_rng(7)
    src, tgt = _ready(code, rng)
    x = rng.standard_normal((2, 3)).astype(np.float32)
    begin = [rng.standard_normal(s.shape).astype(np.float32) for s in src.begin_state(2)]
    assert [s.shape for s in begin] == [tuple(s.shape) for s in tgt.begin_state(2)]
    out_s, new_s = src(nd.array(x), [nd.array(b) for b in begin])
    out_t, new_t = tgt(torch.tensor(x), [torch.tensor(b) for b in begin])
    _close([out_s, *new_s], [out_t, *new_t], f"{code}: one step")
    seq = rng.standard_normal((2, 4, 3)).astype(np.float32)  # NTC
    _close(src.unroll(4, nd.array(seq), merge_outputs=True),
           tgt.unroll(4, torch.tensor(seq), merge_outputs=True), f"{code}: unroll NTC")  # fmt: skip
    tnc = seq.transpose(1, 0, 2).copy()
    outs_s, _ = src.unroll(4, nd.array(tnc), [nd.array(b) for b in begin], layout="TNC")
    outs_t, _ = tgt.unroll(4, torch.tensor(tnc), [torch.tensor(b) for b in begin], layout="TNC")
    assert isinstance(outs_s, list) and isinstance(outs_t, list)  # merge_outputs=None
    _close(outs_s, outs_t, f"{code}: unroll TNC, a list")


SEQUENCE = """
cell = rnn.HybridSequentialRNNCell()
cell.add(contrib.rnn.LSTMPCell(6, 3))
cell.add(rnn.DropoutCell(DROP))
cell.add(contrib.rnn.LSTMPCell(5, 2))
"""


@pytest.mark.filterwarnings("ignore:Lazy modules are a new feature:UserWarning")
@pytest.mark.parametrize("drop", ["0.0", "0.5"])
def test_a_sequence_of_projected_cells_unrolls_as_gluons(drop: str) -> None:
    """Two LSTMPCells with a DropoutCell between (rate 0 in training mode, or 0.5 in
    predict mode: both no dropout): a step, begin_state and unroll (TNC, merged) agree."""
    rng = np.random.default_rng(3)
    src, tgt = _ready(SEQUENCE.replace("DROP", drop), rng, width=4)
    training = drop == "0.0"
    tgt.train(training)
    assert len(tgt) == len(src) == 3 and len(list(tgt)) == 3
    begin_s, begin_t = src.begin_state(batch_size=2), tgt.begin_state(batch_size=2)
    shapes = [(2, 3), (2, 6), (2, 2), (2, 5)]  # [r, c] of each LSTMPCell
    assert [s.shape for s in begin_s] == [tuple(s.shape) for s in begin_t] == shapes
    assert tgt.state_info(2) == src.state_info(2)
    tgt.reset()
    seq = rng.standard_normal((5, 2, 4)).astype(np.float32)
    with autograd.record(train_mode=training):
        out_s = src.unroll(5, nd.array(seq), begin_s, layout="TNC", merge_outputs=True)
        step_s = src(nd.array(seq[0]), begin_s)
    out_t = tgt.unroll(5, torch.tensor(seq), begin_t, layout="TNC", merge_outputs=True)
    step_t = tgt(torch.tensor(seq[0]), begin_t)
    _close(out_s, out_t, "unroll")
    _close(step_s, step_t, "one step")
    assert isinstance(out_t[0], torch.Tensor) and tuple(out_t[0].shape) == (5, 2, 2)


def test_the_corpus_encoder_converts_and_runs() -> None:
    """gluon-nlp's BigRNN encoder (gluonnlp_language_model.py: _get_encoder and forward's
    unroll) converted runs to Gluon's numbers; the corpus files leave no cell marked."""
    from pathlib import Path

    corpus = Path(__file__).parents[1] / "fixtures/port_code_corpus/registry-gluon"
    for name in ("gluonnlp_language_model.py", "gluonnlp_train_language_model.py"):
        result = convert_source((corpus / name).read_text(encoding="utf-8"), name)
        left = {u.api for u in result.report.uses if not u.converted}
        assert not {a for a in left if "rnn." in a}, left
    code = """
def _get_encoder(num_layers, hidden_size, projection_size, encode_dropout):
    block = rnn.HybridSequentialRNNCell()
    with block.name_scope():
        for _ in range(num_layers):
            block.add(contrib.rnn.LSTMPCell(hidden_size, projection_size, input_size=3))
            if encode_dropout:
                block.add(rnn.DropoutCell(encode_dropout))
    return block

cell = _get_encoder(2, 4, 3, 0.1)
"""
    rng = np.random.default_rng(5)
    src, tgt = _ready(code, rng)
    tgt.eval()
    encoded = rng.standard_normal((4, 2, 3)).astype(np.float32)
    begin = src.begin_state(batch_size=2)
    out_s = src.unroll(4, nd.array(encoded), begin, layout="TNC", merge_outputs=True)
    begin_t = tgt.begin_state(batch_size=2, func=torch.zeros)
    out_t = tgt.unroll(4, torch.tensor(encoded), begin_t, layout="TNC", merge_outputs=True)
    _close(out_s, out_t, "the corpus's encoder")


@pytest.mark.filterwarnings("ignore:Lazy modules are a new feature:UserWarning")
def test_begin_state_takes_gluons_func_and_ctx() -> None:
    code = (
        "cell = rnn.LSTMCell(4, input_size=3)\n"
        "begin = cell.begin_state(2, func=nd.zeros, ctx=mx.cpu())\n"
    )
    result = convert_source(HEADER + code, "cells.py")
    assert [u for u in result.report.uses if not u.converted] == [], result.code
    ns: dict[str, Any] = {}
    exec(result.code, ns)
    assert [tuple(s.shape) for s in ns["begin"]] == [(2, 4), (2, 4)]


VALID = """
cell = rnn.SequentialRNNCell()
cell.add(rnn.LSTMCell(3, input_size=2))
cell.add(rnn.DropoutCell(0.0))
cell.add(rnn.GRUCell(2, input_size=3))
"""


@pytest.mark.parametrize(("layout", "merge"), [("NTC", None), ("TNC", True), ("NTC", False)])
def test_unroll_with_valid_length_masks_and_keeps_each_last_state(
    layout: str, merge: bool | None
) -> None:
    """Gluon's valid_length: the outputs past each length zero (stacked unless
    merge_outputs is False), each sequence's states from its last valid step."""
    rng = np.random.default_rng(11)
    src, tgt = _ready(VALID, rng, width=2)
    shape = (2, 4, 2) if layout == "NTC" else (4, 2, 2)
    x = rng.standard_normal(shape).astype(np.float32)
    lengths = np.array([2, 4], np.float32)
    out_s = src.unroll(4, nd.array(x), layout=layout, merge_outputs=merge,
                       valid_length=nd.array(lengths))  # fmt: skip
    out_t = tgt.unroll(4, torch.tensor(x), layout=layout, merge_outputs=merge,
                       valid_length=torch.tensor(lengths))  # fmt: skip
    assert isinstance(out_t[0], list) == (merge is False)
    _close(out_s, out_t, f"valid_length, {layout}, merge_outputs={merge}")


def test_a_dropout_cell_shares_its_mask_along_axes() -> None:
    _, tgt = _pair("cell = rnn.DropoutCell(0.5, axes=(0,))")
    out, states = tgt(torch.ones(6, 40), [])
    assert states == [] and bool((out == out[0]).all())
    assert set(out.unique().tolist()) <= {0.0, 2.0} and 0 < out[0].sum() < 80
    assert torch.equal(tgt.eval()(torch.ones(6, 40), [])[0], torch.ones(6, 40))


@pytest.mark.filterwarnings("ignore:Lazy modules are a new feature:UserWarning")
def test_the_corpus_big_rnn_runs_converted_to_gluons_numbers() -> None:
    """gluon-nlp's BigRNN (the class as the corpus file has it: an Embedding, a
    HybridSequentialRNNCell of LSTMPCells with DropoutCells, a Dense decoder) and its
    conversion from the same weights: forward's output and states agree."""
    import ast
    from pathlib import Path

    path = Path(__file__).parents[1] / "fixtures/port_code_corpus/registry-gluon"
    text = (path / "gluonnlp_language_model.py").read_text(encoding="utf-8")
    node = next(n for n in ast.parse(text).body if getattr(n, "name", "") == "BigRNN")
    imports = "from mxnet.gluon import Block, nn, rnn, contrib\nfrom mxnet import nd, cpu\n"
    code = imports + str(ast.get_source_segment(text, node)) + "\n"
    code += "net = BigRNN(11, 6, 5, 2, 3, embed_dropout=0.1, encode_dropout=0.1)\n"
    result = convert_source(code, "big_rnn.py")
    assert [u for u in result.report.uses if not u.converted] == [], result.code
    src: dict[str, Any] = {}
    tgt: dict[str, Any] = {}
    exec(code, src)
    exec(result.code, tgt)
    net_s, net_t = src["net"], tgt["net"].eval()
    net_s.initialize()
    tokens = np.random.default_rng(2).integers(0, 11, (4, 2))
    net_s(nd.array(tokens), net_s.begin_state(batch_size=2))
    with torch.no_grad():
        net_t(torch.tensor(tokens), net_t.begin_state(batch_size=2))
    rng = np.random.default_rng(4)
    _copy_weights(net_s.encoder, net_t.encoder, rng)
    with torch.no_grad():
        for block, layer in ((net_s.embedding[0], net_t.embedding[0]),
                             (net_s.decoder, net_t.decoder[-1])):  # fmt: skip
            for name, p in block.collect_params().items():
                value = rng.normal(0.0, 0.5, p.shape).astype(np.float32)
                p.set_data(nd.array(value))
                getattr(layer, name.rsplit("_", 1)[-1]).copy_(torch.tensor(value))
    out_s = net_s(nd.array(tokens), net_s.begin_state(batch_size=2))
    out_t = net_t(torch.tensor(tokens), net_t.begin_state(batch_size=2))
    assert tuple(out_t[0].shape) == (4, 2, 11) and len(out_t[1]) == 4
    _close(out_s, out_t, "BigRNN forward")
