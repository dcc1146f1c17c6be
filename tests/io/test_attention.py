"""Multi-head self-attention: canonical names/layouts through every native format.
(Forward and gradients on every backend: the attention LayerCases of the conformance suite.)"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_convert import assert_native_round_trip

from polytrain.errors import ConfigError
from polytrain.io.convert import builtin_map
from polytrain.neutral.models import Flatten, Linear, ModelSpec, MultiHeadSelfAttention, seq


def attention_spec(bias: bool = True) -> ModelSpec:
    layer = MultiHeadSelfAttention(8, 2, causal=True, bias=bias)
    net = seq(("attn", layer), ("flatten", Flatten()), ("head", Linear(3 * 8, 4)))
    return ModelSpec("tiny-attention", net, input_shape=(3, 8), num_classes=4)


@pytest.mark.parametrize("bias", [True, False])
def test_attention_weights_round_trip_native_formats(
    backend_name: str, bias: bool, tmp_path: Path
) -> None:
    """What each backend writes reads back canonical, and what polytrain writes in that
    format loads into the backend and into the framework's own loader, strictly."""
    assert_native_round_trip(backend_name, attention_spec(bias), tmp_path)


def test_paddle_native_layout_of_attention() -> None:
    """Paddle keeps torch's in_proj [3E, E]; out_proj is a Paddle Linear, [in, out]."""
    entries = builtin_map(attention_spec(), "paddle").entries
    assert entries["attn.out_proj.weight"].transpose
    assert entries["attn.out_proj.weight"].native == "attn.out_proj.weight"
    assert not entries["attn.in_proj_weight"].transpose
    assert not builtin_map(attention_spec(), "mxnet").entries["attn.out_proj.weight"].transpose


def test_attention_init_follows_torch() -> None:
    params = attention_spec().init_params(0)
    assert params["attn.in_proj_weight"].shape == (24, 8)
    assert not params["attn.in_proj_bias"].any() and not params["attn.out_proj.bias"].any()


def test_heads_must_divide_the_width() -> None:
    with pytest.raises(ConfigError, match="multiple of num_heads"):
        MultiHeadSelfAttention(6, 4)


def test_spec_with_attention_round_trips_json() -> None:
    spec = attention_spec()
    assert ModelSpec.from_dict(spec.to_dict()) == spec
    assert list(spec.parameter_shapes())[:4] == [
        "attn.in_proj_weight", "attn.in_proj_bias", "attn.out_proj.weight", "attn.out_proj.bias",
    ]  # fmt: skip
    assert np.prod(spec.parameter_shapes()["attn.in_proj_weight"]) == 3 * 8 * 8
