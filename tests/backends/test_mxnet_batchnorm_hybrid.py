"""polytrain's PyTorch-rule BatchNorm on MXNet, hybridized: the whole model runs as one
cached graph whose extra outputs are the new running statistics, with the imperative
version's numbers to the bit and torch's BatchNorm2d's to float64 rounding."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from test_fp64 import batchnorm_run

from polytrain import get_backend
from polytrain.errors import BackendError
from polytrain.neutral.models import BatchNorm1d, Flatten, Linear, ModelSpec, seq
from polytrain.testing import batch, tiny_resnet

mx = pytest.importorskip("mxnet")
from mxnet import autograd  # noqa: E402


def _dense_bn() -> ModelSpec:
    """BatchNorm1d over [N, C]: one value per channel per sample."""
    net = seq(("flatten", Flatten()), ("fc1", Linear(144, 6)), ("bn", BatchNorm1d(6)),
              ("fc2", Linear(6, 10)))  # fmt: skip
    return ModelSpec("dense-bn", net, input_shape=(1, 12, 12), init="kaiming_normal")


def _gluon_steps(spec: ModelSpec, fast: bool, dtype: str, n: int = 4) -> tuple[list, Any]:
    """Three recorded forward/backward passes, then an eval pass: outputs, gradients and
    every parameter (running statistics included) as numpy arrays, and the root block."""
    b = get_backend("mxnet", fast=fast)
    model = b.build_model(spec, dtype=dtype)
    b.set_params(model, spec.init_params(seed=4))
    net, params = model.native, sorted(model.native._collect_params_with_prefix().items())
    seen = []
    for step in range(3):
        x = mx.nd.array(batch(spec, n, seed=step)[0], dtype=dtype)
        for _, p in params:
            if p.grad_req != "null":
                p.zero_grad()
        with autograd.record():
            out = net(x)
            (out * out).sum().backward()
        seen += [out.asnumpy(), *(p.grad().asnumpy() for _, p in params if p.grad_req != "null")]
    with autograd.predict_mode():
        seen.append(net(x).asnumpy())
    return seen + [p.data().asnumpy() for _, p in params], net


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("make_spec", [tiny_resnet, _dense_bn])
def test_hybridized_batchnorm_equals_imperative_to_the_bit(make_spec: Any, dtype: str) -> None:
    spec = make_spec()
    imperative, _ = _gluon_steps(spec, fast=False, dtype=dtype)
    hybrid, net = _gluon_steps(spec, fast=True, dtype=dtype)
    assert net._active and net._cached_op is not None  # one cached graph for the whole model
    assert len(net._stat_params) == sum("running_mean" in k for k in net.collect_params())
    assert len(hybrid) == len(imperative)
    for i, (a, h) in enumerate(zip(imperative, hybrid, strict=True)):
        np.testing.assert_array_equal(h, a, err_msg=f"array {i}")
    means = [p.data().asnumpy() for k, p in net.collect_params().items() if "running_mean" in k]
    assert all(np.abs(m).min() > 0 for m in means)  # updated from their zero init


def _torch_rule_run(backend: str, **options: Any) -> tuple[list[float], dict[str, Any], Any]:
    return batchnorm_run(backend, steps=3, batch_size=8, **options)


def test_hybridized_batchnorm_matches_torch_in_float64() -> None:
    pytest.importorskip("torch")
    losses, params, logits = _torch_rule_run("mxnet", fast=True)
    ref_losses, ref_params, ref_logits = _torch_rule_run("torch")
    np.testing.assert_allclose(losses, ref_losses, rtol=0, atol=1e-13)
    assert any("running_var" in k for k in ref_params)
    for k, v in ref_params.items():
        np.testing.assert_allclose(params[k], v, rtol=1e-13, atol=1e-14, err_msg=k)
    np.testing.assert_allclose(logits, ref_logits, rtol=0, atol=1e-12)


def test_one_value_per_channel_stops_hybridized_training() -> None:
    b = get_backend("mxnet", fast=True)
    spec = _dense_bn()
    model = b.build_model(spec, dtype="float64")
    x = mx.nd.array(batch(spec, 1)[0], dtype="float64")
    with pytest.raises(BackendError, match="more than 1 value per channel"), autograd.record():
        model.native(x)
    with autograd.predict_mode():  # evaluation of one sample is fine
        assert model.native(x).shape == (1, 10)
