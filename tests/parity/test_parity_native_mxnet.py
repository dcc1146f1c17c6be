"""polytrain on MXNet vs a hand-written Gluon loop: same weights, same batches."""

from __future__ import annotations

import numpy as np
import pytest

from polytrain import OptimizerConfig, get_backend, get_model_spec
from polytrain.errors import BackendError
from polytrain.testing import batch
from polytrain.training.step import StepRunner

mx = pytest.importorskip("mxnet")
STEPS = 5
NAMES = {"0": "conv1", "3": "conv2", "7": "fc1", "9": "fc2"}


def gluon_lenet():
    from mxnet.gluon import nn

    net = nn.HybridSequential()
    net.add(
        nn.Conv2D(20, 3, in_channels=1), nn.Activation("relu"), nn.AvgPool2D(2, 2),
        nn.Conv2D(50, 5, in_channels=20), nn.Activation("relu"), nn.AvgPool2D(2, 2),
        nn.Flatten(), nn.Dense(128, in_units=800), nn.Activation("relu"),
        nn.Dense(10, in_units=128),
    )  # fmt: skip
    net.initialize()
    return net


def native_lenet(params: dict[str, np.ndarray]):
    net = gluon_lenet()
    for key, p in net._collect_params_with_prefix().items():
        idx, kind = key.split(".")
        p.set_data(mx.nd.array(params[f"{NAMES[idx]}.{kind}"]))
    return net


def runner(backend, spec, params, devices: str = "cpu") -> StepRunner:
    model = backend.build_model(spec, backend.devices(devices))
    backend.set_params(model, params)
    opt = backend.make_optimizer(model, OptimizerConfig("momentum", lr=0.05))
    return StepRunner(backend, model, opt)


def test_lenet_steps_match_native_gluon_loop() -> None:
    from mxnet import autograd, gluon

    spec = get_model_spec("lenet")
    params = spec.init_params(seed=0)
    batches = [batch(spec, 32, seed=i) for i in range(STEPS)]

    net = native_lenet(params)
    # MXNet's SGD keeps lr inside the momentum buffer: equal to torch's at a constant lr
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.05, "momentum": 0.9})
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    native_losses = []
    for x, y in batches:
        with autograd.record():
            loss = loss_fn(net(mx.nd.array(x)), mx.nd.array(y))
        loss.backward()
        trainer.step(len(x))
        native_losses.append(float(loss.mean().asscalar()))

    backend = get_backend("mxnet")
    run = runner(backend, spec, params)
    losses = [run.train_step(x, y).loss_sum / len(x) for x, y in batches]

    np.testing.assert_allclose(losses, native_losses, rtol=0, atol=1e-5)
    got = backend.get_params(run.model)
    for key, p in net._collect_params_with_prefix().items():
        idx, kind = key.split(".")
        np.testing.assert_allclose(got[f"{NAMES[idx]}.{kind}"], p.data().asnumpy(), atol=1e-5)


def test_users_own_gluon_block_is_accepted(tmp_path) -> None:
    from mxnet.gluon import nn

    spec = get_model_spec("lenet")
    backend = get_backend("mxnet")
    net = gluon_lenet()  # default Gluon names (hybridsequential0_conv0_weight, ...)
    model = backend.build_model(net)
    got = backend.get_params(model)
    want = {f"{i}.{kind}": spec.parameter_shapes()[f"{n}.{kind}"] for i, n in NAMES.items()
            for kind in ("weight", "bias")}  # fmt: skip
    assert {k: v.shape for k, v in got.items()} == want
    assert backend.parameter_names(model) == list(want)

    x, y = batch(spec, 16)
    opt = backend.make_optimizer(model, OptimizerConfig("momentum", lr=0.05))
    result = StepRunner(backend, model, opt).train_step(x, y)
    assert np.isfinite(result.loss_sum)
    assert not np.array_equal(backend.get_params(model)["0.weight"], got["0.weight"])

    # a plain save_parameters file loads back; BatchNorm gamma/beta are weight/bias
    path = str(tmp_path / "net.params")
    net.save_parameters(path)
    other = backend.build_model(gluon_lenet())
    backend.load_native(other, path)
    for k, v in backend.get_params(other).items():
        np.testing.assert_array_equal(v, backend.get_params(model)[k], err_msg=k)

    def conv_bn():
        block = nn.HybridSequential()
        with block.name_scope():
            block.add(nn.Conv2D(4, 3, in_channels=1), nn.BatchNorm(in_channels=4))
        return block

    a, b = backend.build_model(conv_bn()), backend.build_model(conv_bn())
    assert list(backend.get_params(a)) == [
        "0.weight", "0.bias", "1.weight", "1.bias", "1.running_mean", "1.running_var"
    ]  # fmt: skip
    backend.set_params(a, {k: v + 0.5 for k, v in backend.get_params(a).items()})
    with pytest.warns(UserWarning):  # the deprecated format: names without the block prefix
        a.native.save_params(str(tmp_path / "legacy.params"))
    backend.load_native(b, str(tmp_path / "legacy.params"))
    for k, v in backend.get_params(b).items():
        np.testing.assert_array_equal(v, backend.get_params(a)[k], err_msg=k)


def test_two_contexts_equal_one_on_the_full_batch() -> None:
    spec = get_model_spec("lenet")
    params = spec.init_params(seed=1)
    backend = get_backend("mxnet")
    one, two = runner(backend, spec, params), runner(backend, spec, params, "cpu:2")
    assert [backend.device_name(d) for d in two.model.devices] == ["cpu:0", "cpu:1"]
    for i in range(3):
        x, y = batch(spec, 24, seed=i)
        a, b = one.train_step(x, y), two.train_step(x, y)
        assert abs(a.loss_sum - b.loss_sum) < 1e-4 and a.metric_sum == b.metric_sum
    from polytrain_mxnet._model import MXNetModel

    want = backend.get_params(one.model)
    for replica in range(2):  # every context's copy took the same update
        ctx = two.model.devices[replica]
        for name, p in MXNetModel.of(two.model).params.items():
            np.testing.assert_allclose(p.data(ctx).asnumpy(), want[name], atol=1e-6, err_msg=name)


def test_engine_errors_are_readable_at_sync_points() -> None:
    backend = get_backend("mxnet")
    bad = mx.nd.take(mx.nd.ones((3, 4)), mx.nd.array([0, 7]), mode="raise")  # returns at once
    with pytest.raises(BackendError, match=r"out of bound.*NaiveEngine"):
        backend.to_numpy(bad)
