"""The jax backend convolves channels-last on a CPU in float32 (XLA's CPU convolutions
work in NHWC) and nothing a user sees changes: outputs, gradients, BatchNorm statistics,
layer outputs and parameters stay NCHW/OIHW and equal the NCHW network's."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from polytrain import get_backend
from polytrain.neutral.models import (
    Add,
    AvgPool2d,
    BatchNorm2d,
    Conv2d,
    Dropout,
    Flatten,
    GlobalAvgPool2d,
    Linear,
    MaxPool2d,
    ModelSpec,
    ReLU,
    Residual,
    Sequential,
    get_model_spec,
)
from polytrain.plugins.registry import installed_backends

if "jax" not in installed_backends():  # (jax itself is imported by the backend, after XLA_FLAGS)
    pytest.skip("the jax backend is not installed", allow_module_level=True)

from polytrain_jax import _env

_env.before_import()  # XLA_FLAGS before jax starts, as the backend factory does

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from polytrain_jax import _layout, _net  # noqa: E402
from polytrain_jax._model import JaxModel, x64  # noqa: E402


def seq(*layers: Any) -> Sequential:
    return Sequential(tuple((str(i), layer) for i, layer in enumerate(layers)))


def every_nhwc_layer() -> ModelSpec:
    """Each layer with an NHWC form, a run broken by a layer without one (a Dropout of
    p=0) and a ceil-mode, padded average pool whose divisor is uneven."""
    block = Residual(
        seq(Conv2d(4, 4, 3, padding=1, bias=False), BatchNorm2d(4), ReLU(), Conv2d(4, 4, 1)),
        seq(Conv2d(4, 4, 1, bias=False), BatchNorm2d(4)),
    )
    net = seq(
        Conv2d(2, 4, 3, stride=2, padding=1), BatchNorm2d(4), ReLU(),
        MaxPool2d(3, 2, padding=1), block, Dropout(0.0),
        Add((seq(), seq(Conv2d(4, 4, 3, padding=1)))), AvgPool2d(3, 2, 1, True, False),
        Residual(seq(Conv2d(4, 4, 1))), GlobalAvgPool2d(), Flatten(), Linear(4, 3),
    )  # fmt: skip
    return ModelSpec("every-nhwc-layer", net, input_shape=(2, 13, 11), num_classes=3)


def conv_layouts(apply: Any, state: dict[str, Any], x: Any) -> set[tuple[int, ...]]:
    """The input layouts (``lhs_spec``) of the convolutions ``apply`` traces to."""
    jaxpr = jax.make_jaxpr(lambda s, v: apply(s, v, _net.Context(train=False)))(state, x)
    return {
        tuple(e.params["dimension_numbers"].lhs_spec)
        for e in jaxpr.jaxpr.eqns
        if e.primitive.name == "conv_general_dilated"
    }


NHWC, NCHW = (0, 3, 1, 2), (0, 1, 2, 3)


@pytest.mark.parametrize("dtype, layouts", [("float32", {NHWC}), ("float64", {NCHW})])
def test_a_cpu_model_convolves_channels_last_in_float32_only(dtype: str, layouts: set) -> None:
    backend = get_backend("jax")
    spec = get_model_spec("lenet")
    apply = JaxModel.of(backend.build_model(spec, dtype=dtype)).apply
    with x64():
        state = {n: jnp.zeros(s, dtype) for n, s in spec.parameter_shapes().items()}
        assert conv_layouts(apply, state, jnp.zeros((2, 1, 28, 28), dtype)) == layouts


def test_channels_last_equals_nchw_in_values_gradients_statistics_and_layer_outputs() -> None:
    spec = every_nhwc_layer()
    state = {n: jnp.asarray(v, jnp.float32) for n, v in spec.init_params(seed=3).items()}
    x = jnp.asarray(np.random.default_rng(0).standard_normal((5, 2, 13, 11)), jnp.float32)
    fast, plain = _layout.build_fast_layout(spec.net), _net.build(spec.net)
    assert conv_layouts(fast, state, x) == {NHWC}
    assert conv_layouts(plain, state, x) == {NCHW}

    def run(apply: Any) -> tuple[Any, ...]:
        seen: dict[str, Any] = {}
        ctx = _net.Context(train=True, hook=seen.__setitem__)
        out = apply(state, x, ctx)

        def loss(s: dict[str, Any]) -> Any:
            return (apply(s, x, _net.Context(train=True)) ** 2).sum()

        return out, jax.grad(loss)(state), dict(ctx.updates), seen

    got, want = run(fast), run(plain)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6)
    for g, w in zip(got[1:], want[1:], strict=True):
        assert list(g) == list(w)
        for name in w:
            assert g[name].shape == w[name].shape, name
            np.testing.assert_allclose(g[name], w[name], rtol=1e-4, atol=1e-5, err_msg=name)
