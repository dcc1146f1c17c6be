"""GluonNLP's BERT into Hugging Face ``transformers.BertModel`` (issue 37, item 2).

GluonNLP 0.10 does not build on Python 3.11 (its generated C includes ``longintrepr.h``),
so ``BERTModel`` is rebuilt here from its source definitions (``src/gluonnlp/model/bert.py``
and ``transformer.py`` at v0.10.0): the same blocks, parameter names, registration order
and options. ``DotProductSelfAttentionCell`` holds the query, key and value projections as
its own parameters (saved as ``proj_query.weight`` ...) and runs them through MXNet's fused
``interleaved_matmul_selfatt_*`` operators, the output projection is the cell's ``proj``
``Dense``; the encoder works time-major ([T, N, C]) and adds a learned position embedding
kept as a bare parameter (``position_weight``). One change: ``token_types`` defaults to
zeros, so that the model runs on the token ids alone, as ``transformers.BertModel`` does."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

mx = pytest.importorskip("mxnet")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from mxnet.gluon import HybridBlock, nn  # noqa: E402
from port_helpers import check_port  # noqa: E402

from polytrain import port  # noqa: E402
from polytrain.cli.main import main  # noqa: E402
from polytrain.errors import ConfigError  # noqa: E402

UNITS, HIDDEN, LAYERS, HEADS, VOCAB, MAX_LENGTH, TYPES = 16, 32, 2, 2, 40, 24, 2
IDS = np.random.default_rng(3).integers(1, VOCAB, (3, 7))  # N != T: layouts cannot hide
HINTS = {  # GluonNLP registers the embeddings after the encoder, the attention's
    "word_embed.0": "embeddings.word_embeddings",  # LayerNorm after the feed-forward
    "token_type_embed.0": "embeddings.token_type_embeddings",
    "encoder.position_weight": "embeddings.position_embeddings",
    r"re:encoder\.transformer_cells\.(\d+)\.layer_norm":
        r"encoder.layer.\1.attention.output.LayerNorm",
}  # fmt: skip


class GELU(HybridBlock):  # type: ignore[misc]
    def hybrid_forward(self, F: Any, x: Any) -> Any:
        return F.LeakyReLU(x, act_type="gelu")


class DotProductSelfAttentionCell(HybridBlock):  # type: ignore[misc]
    def __init__(self, units: int, num_heads: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._num_heads, self.units = num_heads, units
        with self.name_scope():
            for role in ("query", "key", "value"):
                setattr(self, f"{role}_bias", self.params.get(f"{role}_bias", shape=(units,)))
            for role in ("query", "key", "value"):
                setattr(
                    self, f"{role}_weight", self.params.get(f"{role}_weight", shape=(units, units))
                )
            self.dropout_layer = nn.Dropout(0.1)

    def _collect_params_with_prefix(self, prefix: str = "") -> dict[str, Any]:
        prefix = prefix + "." if prefix else prefix  # saved as proj_query.weight, ...
        found = {prefix + "proj_" + k.replace("_", "."): v for k, v in self._reg_params.items()}
        for name, child in self._children.items():
            found.update(child._collect_params_with_prefix(prefix + name))
        return found

    def hybrid_forward(self, F: Any, qkv: Any, valid_len: Any, query_bias: Any, key_bias: Any,
                       value_bias: Any, query_weight: Any, key_weight: Any,
                       value_weight: Any) -> Any:  # fmt: skip
        heads = self._num_heads
        weights = [w.reshape(shape=(heads, -1, 0), reverse=True)
                   for w in (query_weight, key_weight, value_weight)]  # fmt: skip
        in_weight = F.concat(*weights, dim=-2).reshape(shape=(-1, 0), reverse=True)
        biases = [b.reshape(shape=(heads, -1), reverse=True)
                  for b in (query_bias, key_bias, value_bias)]  # fmt: skip
        in_bias = F.stack(*biases, axis=1).reshape(-1)
        qkv_proj = F.FullyConnected(
            data=qkv, weight=in_weight, bias=in_bias, num_hidden=self.units * 3, flatten=False
        )
        score = F.contrib.interleaved_matmul_selfatt_qk(qkv_proj, heads=heads)
        weights = self.dropout_layer(F.softmax(score, axis=-1))
        context = F.contrib.interleaved_matmul_selfatt_valatt(qkv_proj, weights, heads=heads)
        return context, weights.reshape(shape=(-1, heads, 0, 0), reverse=True)


class PositionwiseFFN(HybridBlock):  # type: ignore[misc]
    def __init__(self, units: int, hidden_size: int, eps: float, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        with self.name_scope():
            self.ffn_1 = nn.Dense(hidden_size, flatten=False, prefix="ffn_1_")
            self.activation = GELU()
            self.ffn_2 = nn.Dense(units, flatten=False, prefix="ffn_2_")
            self.dropout_layer = nn.Dropout(rate=0.1)
            self.layer_norm = nn.LayerNorm(in_channels=units, epsilon=eps)

    def hybrid_forward(self, F: Any, inputs: Any) -> Any:
        out = self.dropout_layer(self.ffn_2(self.activation(self.ffn_1(inputs))))
        return self.layer_norm(out + inputs)


class BERTEncoderCell(HybridBlock):  # type: ignore[misc]
    def __init__(self, units: int, hidden_size: int, heads: int, eps: float, **kw: Any) -> None:
        super().__init__(**kw)
        with self.name_scope():
            self.dropout_layer = nn.Dropout(rate=0.1)
            self.attention_cell = DotProductSelfAttentionCell(units, heads)
            self.proj = nn.Dense(units=units, flatten=False, prefix="proj_")
            self.ffn = PositionwiseFFN(units, hidden_size, eps)
            self.layer_norm = nn.LayerNorm(in_channels=units, epsilon=eps)

    def hybrid_forward(self, F: Any, inputs: Any, valid_len: Any = None) -> Any:
        outputs, weights = self.attention_cell(inputs, valid_len)
        outputs = self.dropout_layer(self.proj(outputs)) + inputs
        return self.ffn(self.layer_norm(outputs)), [weights]


class BERTEncoder(HybridBlock):  # type: ignore[misc]
    def __init__(self, eps: float = 1e-12, **kw: Any) -> None:
        super().__init__(**kw)
        self._units, self._max_length = UNITS, MAX_LENGTH
        with self.name_scope():
            self.dropout_layer = nn.Dropout(rate=0.1)
            self.layer_norm = nn.LayerNorm(in_channels=UNITS, epsilon=eps)
            self.position_weight = self.params.get("position_weight", shape=(MAX_LENGTH, UNITS))
            self.transformer_cells = nn.HybridSequential()
            for i in range(LAYERS):
                cell = BERTEncoderCell(UNITS, HIDDEN, HEADS, eps, prefix=f"transformer{i}_")
                self.transformer_cells.add(cell)

    def hybrid_forward(self, F: Any, inputs: Any, position_weight: Any) -> Any:
        steps = F.contrib.arange_like(inputs, axis=0)  # time-major: [T, N, C]
        positional = F.Embedding(steps, position_weight, self._max_length, self._units)
        inputs = F.broadcast_add(inputs, F.expand_dims(positional, axis=1))
        outputs = self.layer_norm(self.dropout_layer(inputs))
        for cell in self.transformer_cells:
            outputs, _ = cell(outputs, None)
        return outputs


class BERTModel(HybridBlock):  # type: ignore[misc]
    """``get_bert_model(..., use_decoder=False, use_classifier=False)``'s model."""

    def __init__(self, eps: float = 1e-12) -> None:
        super().__init__()
        self._units = UNITS
        self.encoder = BERTEncoder(eps)
        with self.name_scope():
            self.word_embed = nn.HybridSequential(prefix="word_embed_")
            with self.word_embed.name_scope():
                self.word_embed.add(nn.Embedding(VOCAB, UNITS))
            self.token_type_embed = nn.HybridSequential(prefix="token_type_embed_")
            with self.token_type_embed.name_scope():
                self.token_type_embed.add(nn.Embedding(TYPES, UNITS))
            self.pooler = nn.Dense(units=UNITS, flatten=False, activation="tanh", prefix="pooler_")

    def hybrid_forward(self, F: Any, inputs: Any, token_types: Any = None) -> Any:
        types = F.zeros_like(inputs) if token_types is None else token_types
        embedding = self.word_embed(inputs) + self.token_type_embed(types)
        sequence = self.encoder(embedding.transpose((1, 0, 2))).transpose((1, 0, 2))
        first = sequence.slice(begin=(0, 0, 0), end=(None, 1, None))
        return sequence, self.pooler(first.reshape(shape=(-1, self._units)))


def gluon_bert(eps: float = 1e-12) -> Any:
    mx.random.seed(5)
    model = BERTModel(eps)
    model.initialize(mx.init.Normal(0.02))
    model(mx.nd.array(IDS))  # the Dense layers' input widths are inferred
    for name, param in model._collect_params_with_prefix().items():
        if name.endswith(("bias", "beta")):  # nonzero, so that a swapped bias shows
            param.set_data(mx.nd.random.normal(0, 0.02, param.shape))
    return model


def hf_bert() -> Any:
    config = transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=UNITS, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, intermediate_size=HIDDEN,
        max_position_embeddings=MAX_LENGTH, type_vocab_size=TYPES, layer_norm_eps=1e-12,
    )  # fmt: skip
    return transformers.BertModel(config).eval()


def test_gluonnlp_bert_ports_into_transformers(tmp_path: Path) -> None:
    source = gluon_bert()
    source.save_parameters(str(tmp_path / "bert.params"))
    result = port(
        source, hf_bert(), inputs=IDS, hints=HINTS, out=tmp_path / "bert.pt",
        map_out=tmp_path / "map.json",
    )  # fmt: skip
    check_port(result, "gluonnlp bert -> transformers")
    rows = {row.layer: row for row in result.verification.rows}
    attention = rows["encoder.layer.1.attention.self"]
    assert attention.source == "encoder.transformer_cells.1.attention_cell"
    assert attention.source_shape == [7, 3, UNITS] and attention.shape == [3, 7, UNITS]
    assert "embeddings.position_embeddings" not in rows  # a bare parameter: not traced
    sequence, pooled = (a.asnumpy() for a in source(mx.nd.array(IDS)))
    loaded = hf_bert()
    loaded.load_state_dict(torch.load(tmp_path / "bert.pt", weights_only=True), strict=True)
    with torch.no_grad():
        out = loaded(torch.from_numpy(IDS))
    seq_diff = np.abs(out.last_hidden_state.numpy() - sequence).max() / np.abs(sequence).max()
    pool_diff = np.abs(out.pooler_output.numpy() - pooled).max() / np.abs(pooled).max()
    worst = max(row.relative for row in result.verification.rows[:-1])
    print(f"gluonnlp bert -> transformers: layers {len(result.pairs)}, worst layer "
          f"{worst:.2g}, sequence {seq_diff:.2g}, pooled {pool_diff:.2g}")  # fmt: skip
    assert seq_diff <= 1e-5 and pool_diff <= 1e-5
    mapped = json.loads((tmp_path / "map.json").read_text())["mxnet"]
    assert mapped["encoder.layer.0.attention.self.key.weight"] == {
        "native": "encoder.transformer_cells.0.attention_cell.proj_key.weight",
        "transpose": False, "shape": [UNITS, UNITS],
    }  # fmt: skip
    argv = ["convert", str(tmp_path / "bert.params"), str(tmp_path / "conv.pt"), "--to",
            "torch", "--map", str(tmp_path / "map.json")]  # fmt: skip
    assert main(argv) == 0
    converted = torch.load(tmp_path / "conv.pt", weights_only=True)
    written = torch.load(tmp_path / "bert.pt", weights_only=True)
    assert set(converted) == set(written)
    assert all(torch.equal(converted[k], v) for k, v in written.items())


def test_without_the_layer_norm_hint_the_verification_stops_at_the_swapped_pair() -> None:
    """Order pairs the feed-forward's LayerNorm (registered first) with transformers'
    attention LayerNorm: same kind and shape, only the outputs tell."""
    hints = {k: v for k, v in HINTS.items() if not k.startswith("re:")}
    result = port(gluon_bert(), hf_bert(), inputs=IDS, hints=hints)
    assert not result.passed
    first = result.verification.first_failure
    assert first is not None and first.layer == "encoder.layer.0.attention.output.LayerNorm"
    assert first.source == "encoder.transformer_cells.0.ffn.layer_norm"


def test_a_pattern_hint_that_matches_no_layer_is_refused() -> None:
    with pytest.raises(ConfigError, match="matches no source layer with tensors"):
        port(gluon_bert(), hf_bert(), inputs=IDS, hints={r"re:cells\.(\d+)": r"x.\1"})
