"""PaddleNLP's BERT and ERNIE into Hugging Face ``transformers.BertModel`` and
``ErnieModel`` (issue 37, item 2).

PaddleNLP does not install beside Paddle 3.3.1 here (its dependencies pull numpy 2 and
pandas 3 over the project's numpy 1.23), so the model is built from its source definitions
(paddlenlp/transformers/bert/modeling.py, ernie/modeling.py): embeddings (word, position,
token type, ERNIE 3.0's task type with ``use_task_id``, ``layer_norm``), a
``paddle.nn.TransformerEncoder`` of post-norm GELU layers, a tanh pooler, every LayerNorm's
epsilon set to 1e-12 by ``init_weights``, tokens equal to ``pad_token_id`` masked.
``transformers`` is a test dependency: skipped without it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

paddle = pytest.importorskip("paddle")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pnn = paddle.nn

from port_helpers import check_port  # noqa: E402

from polytrain import port  # noqa: E402
from polytrain.cli.main import main  # noqa: E402
from polytrain.errors import ConfigError  # noqa: E402

CONFIG = {
    "vocab_size": 40, "hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
    "intermediate_size": 32, "max_position_embeddings": 24, "type_vocab_size": 2,
}  # fmt: skip
IDS = np.random.default_rng(1).integers(1, CONFIG["vocab_size"], (3, 7))  # no pad token (0)


class PaddleNLPBertEmbeddings(pnn.Layer):  # type: ignore[misc]
    def __init__(self, vocab: int, hidden: int, positions: int, types: int, tasks: int) -> None:
        super().__init__()
        self.word_embeddings = pnn.Embedding(vocab, hidden)
        self.position_embeddings = pnn.Embedding(positions, hidden)
        self.token_type_embeddings = pnn.Embedding(types, hidden)
        if tasks:  # ERNIE 3.0 (use_task_id; task_id 0)
            self.task_type_embeddings = pnn.Embedding(tasks, hidden)
        self.layer_norm = pnn.LayerNorm(hidden)
        self.dropout = pnn.Dropout(0.1)

    def forward(self, ids: Any) -> Any:
        positions = paddle.cumsum(paddle.ones_like(ids), axis=-1) - 1
        x = self.word_embeddings(ids) + self.position_embeddings(positions)
        x = x + self.token_type_embeddings(paddle.zeros_like(ids))
        if hasattr(self, "task_type_embeddings"):
            x = x + self.task_type_embeddings(paddle.zeros_like(ids))
        return self.dropout(self.layer_norm(x))


class PaddleNLPBertPooler(pnn.Layer):  # type: ignore[misc]
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.dense = pnn.Linear(hidden, hidden)
        self.activation = pnn.Tanh()

    def forward(self, x: Any) -> Any:
        return self.activation(self.dense(x[:, 0]))


class PaddleNLPBertModel(pnn.Layer):  # type: ignore[misc]
    """PaddleNLP's ``BertModel`` (``fuse=False``), or with ``tasks`` its ``ErnieModel``
    (``use_task_id=True``), returning (sequence, pooled)."""

    def __init__(self, c: dict[str, int], pad_token_id: int = 0, tasks: int = 0) -> None:
        super().__init__()
        paddle.seed(11)
        self.pad_token_id = pad_token_id
        h = c["hidden_size"]
        self.embeddings = PaddleNLPBertEmbeddings(
            c["vocab_size"], h, c["max_position_embeddings"], c["type_vocab_size"], tasks
        )
        layer = pnn.TransformerEncoderLayer(
            h, c["num_attention_heads"], c["intermediate_size"], dropout=0.1,
            activation="gelu", attn_dropout=0.1, act_dropout=0,
        )  # fmt: skip
        self.encoder = pnn.TransformerEncoder(layer, c["num_hidden_layers"])
        self.pooler = PaddleNLPBertPooler(h)
        for sub in self.sublayers():  # init_weights: normal(0.02), LayerNorm epsilon 1e-12
            if isinstance(sub, pnn.LayerNorm):
                sub._epsilon = 1e-12
            elif isinstance(sub, pnn.Linear | pnn.Embedding):
                sub.weight.set_value(paddle.normal(0.0, 0.02, sub.weight.shape))

    def forward(self, ids: Any) -> Any:
        pad = (ids == self.pad_token_id).astype("float32") * -1e4
        mask = paddle.unsqueeze(pad, axis=[1, 2])
        sequence = self.encoder(self.embeddings(ids), src_mask=mask)
        return sequence, self.pooler(sequence)


def hf_bert(**overrides: Any) -> Any:
    config = transformers.BertConfig(**(CONFIG | {"layer_norm_eps": 1e-12} | overrides))
    return transformers.BertModel(config).eval()


def hf_ernie() -> Any:
    extra = {"layer_norm_eps": 1e-12, "use_task_id": True, "task_type_vocab_size": 3}
    return transformers.ErnieModel(transformers.ErnieConfig(**(CONFIG | extra))).eval()


MODELS = {"bert": (0, hf_bert), "ernie": (3, hf_ernie)}  # task types, the target


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MODELS))
def test_a_paddlenlp_model_ports_into_transformers(tmp_path: Path, name: str) -> None:
    tasks, make_target = MODELS[name]
    source = PaddleNLPBertModel(CONFIG, tasks=tasks)
    target = make_target()
    paddle.save(source.state_dict(), str(tmp_path / "bert.pdparams"))
    result = port(
        source, target, inputs=IDS, out=tmp_path / "bert.pt", map_out=tmp_path / "map.json"
    )
    check_port(result, f"paddlenlp {name} -> transformers")
    assert any("out of registration order" in note for note in result.notes)
    rows = {row.layer: row.source for row in result.verification.rows}
    assert rows["encoder.layer.1.attention.self"] == "encoder.layers.1.self_attn"
    assert rows["encoder.layer.0.attention.output.LayerNorm"] == "encoder.layers.0.norm1"
    source.eval()
    sequence, pooled = source(paddle.to_tensor(IDS))
    loaded = make_target()
    loaded.load_state_dict(torch.load(tmp_path / "bert.pt", weights_only=True), strict=True)
    with torch.no_grad():
        out = loaded(torch.from_numpy(IDS))
    seq_diff = np.abs(out.last_hidden_state.numpy() - sequence.numpy()).max()
    pool_diff = np.abs(out.pooler_output.numpy() - pooled.numpy()).max()
    assert seq_diff <= 1e-5 and pool_diff <= 1e-5
    print(f"{name} paddlenlp -> transformers: sequence {seq_diff:.2g}, pooled {pool_diff:.2g}")
    # the derived map converts the .pdparams alone (q/k/v part for part, no packing)
    mapped = json.loads((tmp_path / "map.json").read_text())["paddle"]
    assert mapped["encoder.layer.0.attention.self.key.weight"]["native"] == (
        "encoder.layers.0.self_attn.k_proj.weight"
    )
    argv = ["convert", str(tmp_path / "bert.pdparams"), str(tmp_path / "conv.pt"), "--to",
            "torch", "--map", str(tmp_path / "map.json")]  # fmt: skip
    assert main(argv) == 0
    converted = torch.load(tmp_path / "conv.pt", weights_only=True)
    written = torch.load(tmp_path / "bert.pt", weights_only=True)
    assert set(converted) == set(written) == set(mapped)
    assert all(torch.equal(converted[k], v) for k, v in written.items())
    make_target().load_state_dict(converted, strict=True)


def test_a_layer_norm_epsilon_that_differs_is_refused() -> None:
    """transformers' default 1e-12 against Paddle's LayerNorm default 1e-5 gives outputs
    within 1e-4 of each other: only the option check catches it."""
    source = PaddleNLPBertModel(CONFIG)
    for sub in source.sublayers():
        if isinstance(sub, pnn.LayerNorm):
            sub._epsilon = 1e-5
    with pytest.raises(ConfigError, match=r"has epsilon=1e-05, target .* has eps=1e-12"):
        port(source, hf_bert(), inputs=IDS)
