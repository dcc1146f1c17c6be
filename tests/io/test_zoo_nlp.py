"""``polytrain convert FILE OUT --to torch --zoo paddlenlp:bert`` (issue 37): the named-model
shortcut for PaddleNLP's BERT and ERNIE and GluonNLP's BERT, from the weights file alone.
The models are those of tests/porting/test_port_bert.py and
tests/porting/test_port_gluon_bert.py (rebuilt from their sources: neither package
installs here), saved with their framework's own save, converted with the shipped template
and loaded strictly into ``transformers``' twin, the outputs compared. ``transformers`` is
a test dependency: skipped without it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_zoo_maps import convert, refused

LAYERS = 3  # not the port tests' 2: the template expands for the file's layer count


def relative(found: np.ndarray, expected: np.ndarray) -> float:
    return float(np.abs(found - expected).max() / np.abs(expected).max())


def paddlenlp_model(name: str) -> tuple[Any, dict[str, int], Any]:
    """(the PaddleNLP model of ``name`` with LAYERS layers, its config, its twin)."""
    from test_port_bert import CONFIG, PaddleNLPBertModel, transformers

    config = CONFIG | {"num_hidden_layers": LAYERS}
    if name == "bert":
        twin = transformers.BertModel(transformers.BertConfig(**config, layer_norm_eps=1e-12))
        return PaddleNLPBertModel(config), config, twin.eval()
    ernie = transformers.ErnieConfig(
        **config, layer_norm_eps=1e-12, use_task_id=True, task_type_vocab_size=3
    )
    return PaddleNLPBertModel(config, tasks=3), config, transformers.ErnieModel(ernie).eval()


def check_outputs(twin: Any, pt: Path, ids: np.ndarray, sequence: Any, pooled: Any) -> None:
    import torch

    twin.load_state_dict(torch.load(pt, weights_only=True), strict=True)
    with torch.no_grad():
        out = twin(torch.from_numpy(ids))
    seq = relative(out.last_hidden_state.numpy(), sequence)
    pool = relative(out.pooler_output.numpy(), pooled)
    print(f"{pt.stem}: sequence {seq:.2g}, pooled {pool:.2g} (relative)")
    assert seq <= 1e-5 and pool <= 1e-5


@pytest.mark.parametrize("name", ["bert", "ernie"])
def test_a_paddlenlp_file_converts_into_transformers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    from test_port_bert import IDS, paddle

    source, config, twin = paddlenlp_model(name)
    state = source.state_dict()
    if name == "ernie":  # a task model's file: the base model under its prefix
        state = {f"ernie.{key}": value for key, value in state.items()}
    paddle.save(state, str(tmp_path / "model_state.pdparams"))
    out = convert(capsys, tmp_path / "model_state.pdparams", tmp_path / f"{name}.pt",
                  "--to", "torch", "--zoo", f"paddlenlp:{name}")  # fmt: skip
    keys = ("vocab_size", "hidden_size", "num_hidden_layers", "intermediate_size",
            "max_position_embeddings", "type_vocab_size")  # fmt: skip
    assert ", ".join(f"{k}={config[k]}" for k in keys) in out
    assert f"({LAYERS} layers" in out and "cannot give num_attention_heads" in out
    assert ("use_task_id=True, task_type_vocab_size=3" in out) == (name == "ernie")
    source.eval()
    sequence, pooled = (t.numpy() for t in source(paddle.to_tensor(IDS)))
    check_outputs(twin, tmp_path / f"{name}.pt", IDS, sequence, pooled)


def test_a_gluonnlp_file_converts_into_transformers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from test_port_gluon_bert import IDS, gluon_bert, hf_bert, mx

    source = gluon_bert()
    source.save_parameters(str(tmp_path / "bert.params"))
    out = convert(capsys, tmp_path / "bert.params", tmp_path / "gluon.pt", "--to", "torch",
                  "--zoo", "gluonnlp:bert")  # fmt: skip
    assert "hidden_size=16, num_hidden_layers=2, intermediate_size=32" in out
    sequence, pooled = (a.asnumpy() for a in source(mx.nd.array(IDS)))
    check_outputs(hf_bert(), tmp_path / "gluon.pt", IDS, sequence, pooled)


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ("drop layer 1", r"missing encoder\.layers\.1\.self_attn\.q_proj\.weight"),
        ("add a head", r"unexpected cls\.predictions\.bias"),
        ("no embeddings", r"it has no embeddings\.word_embeddings\.weight"),
    ],
)
def test_a_file_that_is_not_the_model_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], change: str, expected: str
) -> None:
    from test_port_bert import paddle

    state = paddlenlp_model("bert")[0].state_dict()
    if change == "drop layer 1":
        state = {k: v for k, v in state.items() if not k.startswith("encoder.layers.1.")}
    elif change == "add a head":
        state["cls.predictions.bias"] = paddle.zeros([40])
    else:
        state = {k: v for k, v in state.items() if not k.startswith("embeddings.")}
    paddle.save(state, str(tmp_path / "model_state.pdparams"))
    err = refused(capsys, tmp_path / "bert.pt", tmp_path / "model_state.pdparams",
                  tmp_path / "bert.pt", "--to", "torch", "--zoo", "paddlenlp:bert")  # fmt: skip
    assert re.search(expected, err), err


def test_an_unknown_nlp_name_lists_the_named_models(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    err = refused(capsys, tmp_path / "x.pt", tmp_path / "x.pdparams", tmp_path / "x.pt",
                  "--to", "torch", "--zoo", "paddlenlp:bret")  # fmt: skip
    assert "did you mean paddlenlp:bert" in err
    assert "paddlenlp: bert, ernie; gluonnlp: bert" in err
