"""Helpers of the ``polytrain port`` tests: BatchNorm statistics with real values on both
source frameworks, and the check every ported architecture passes (with its PORT line)."""

from __future__ import annotations

from typing import Any

import numpy as np

RNG = np.random.default_rng(13)
TOLERANCE = 1e-4


def paddle_randomize_bn(model: Any) -> Any:
    """Paddle's BatchNorm starts at mean 0, variance 1: give every statistic a value."""
    import paddle

    state = model.state_dict()
    for name, value in state.items():
        shape = value.shape
        if name.endswith(("_mean", "bias")) and len(shape) == 1:
            state[name] = paddle.to_tensor(RNG.normal(0, 0.1, shape).astype("float32"))
        elif name.endswith(("_variance", "weight")) and len(shape) == 1:
            state[name] = paddle.to_tensor(RNG.uniform(0.5, 1.5, shape).astype("float32"))
    model.set_state_dict(state)
    return model


def gluon_randomize_bn(model: Any) -> Any:
    """The same for Gluon (``gamma``/``beta``, ``running_mean``/``running_var``)."""
    import mxnet as mx

    for name, param in model._collect_params_with_prefix().items():
        shape = param.shape
        if name.endswith(("running_mean", "beta")):
            param.set_data(mx.nd.array(RNG.normal(0, 0.1, shape).astype("float32")))
        elif name.endswith(("running_var", "gamma")):
            param.set_data(mx.nd.array(RNG.uniform(0.5, 1.5, shape).astype("float32")))
    return model


def check_port(result: Any, arch: str | None = None) -> None:
    """Verification passed, logits within 1e-4 of the largest, most layers traced; with
    ``arch``, the derived map covers every ported tensor and one PORT line is printed."""
    out = result.verification.rows[-1]
    assert result.passed, result.format()
    assert out.layer == "(output)" and out.relative <= TOLERANCE
    assert len(result.verification.rows) > len(result.pairs) // 2
    if arch is None:
        return
    ported = set()  # a tensor split into a Paddle attention's q/k/v: by its canonical name
    for pair in result.pairs:  # (or part for part where the source has the same parts)
        for role, t in pair.target.tensors.items():
            if t.parts and len(t.parts) == len(pair.source.tensors[role].parts):
                ported |= {part.native for part in t.parts}
            else:
                ported.add(f"{pair.target.name}.{role}" if t.parts else t.native)
    assert set(result.map_json()[result.source_framework]) == ported
    print(
        f"PORT {result.source_framework} {arch}: layers {len(result.pairs)}, "
        f"max rel logit diff {out.relative:.2g}"
    )
