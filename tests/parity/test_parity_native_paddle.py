"""polytrain on paddle vs a hand-written Paddle loop: same weights, same batches."""

from __future__ import annotations

import os
import pickle
import warnings

import numpy as np
import pytest

from polytrain import OptimizerConfig, get_backend, get_model_spec
from polytrain.errors import CheckpointError
from polytrain.testing import batch
from polytrain.training.step import StepRunner
from polytrain.utils import safe_pickle

with warnings.catch_warnings():  # paddle warns "No ccache found" on import
    warnings.simplefilter("ignore", UserWarning)
    paddle = pytest.importorskip("paddle")

STEPS = 5
NAMES = {"0": "conv1", "3": "conv2", "7": "fc1", "9": "fc2"}  # paddle's default names


def native_lenet(params: dict[str, np.ndarray]):
    """LeNet as a Paddle user writes it: default layer names, Linear weights [in, out]."""
    from paddle import nn

    net = nn.Sequential(
        nn.Conv2D(1, 20, 3), nn.ReLU(), nn.AvgPool2D(2, 2, exclusive=False),
        nn.Conv2D(20, 50, 5), nn.ReLU(), nn.AvgPool2D(2, 2, exclusive=False),
        nn.Flatten(), nn.Linear(800, 128), nn.ReLU(), nn.Linear(128, 10),
    )  # fmt: skip
    for key, p in net.named_parameters():
        idx, kind = key.split(".")
        value = params[f"{NAMES[idx]}.{kind}"]
        p.set_value(np.ascontiguousarray(value.T) if p.ndim == 2 else value)  # [in, out]
    return net


def native_params(net) -> dict[str, np.ndarray]:
    """A native net's parameters in canonical names and layout."""
    out = {}
    for key, p in net.named_parameters():
        idx, kind = key.split(".")
        out[f"{NAMES[idx]}.{kind}"] = p.numpy().T if p.ndim == 2 else p.numpy()
    return out


def test_lenet_steps_match_native_paddle_loop() -> None:
    spec = get_model_spec("lenet")
    params = spec.init_params(seed=0)
    batches = [batch(spec, 32, seed=i) for i in range(STEPS)]

    backend = get_backend("paddle")  # also sets paddle's threads, as for the native loop
    net = native_lenet(params)
    opt = paddle.optimizer.Momentum(learning_rate=0.05, momentum=0.9, parameters=net.parameters())
    native_losses = []
    for x, y in batches:
        logits = net(paddle.to_tensor(x))
        loss = paddle.nn.functional.cross_entropy(logits, paddle.to_tensor(y))
        loss.backward()
        opt.step()
        opt.clear_grad()
        native_losses.append(float(loss))

    model = backend.build_model(spec)
    backend.set_params(model, params)
    runner = StepRunner(
        backend, model, backend.make_optimizer(model, OptimizerConfig("momentum", lr=0.05))
    )
    losses = [runner.train_step(x, y).loss_sum / len(x) for x, y in batches]

    np.testing.assert_allclose(losses, native_losses, rtol=0, atol=1e-5)
    got = backend.get_params(model)
    for name, value in native_params(net).items():
        np.testing.assert_allclose(got[name], value, atol=1e-5, err_msg=name)


def test_users_own_paddle_layer_is_accepted() -> None:
    spec = get_model_spec("lenet")
    params = spec.init_params(seed=1)
    backend = get_backend("paddle")
    model = backend.build_model(native_lenet(params))

    got = backend.get_params(model)
    assert got["7.weight"].shape == (128, 800)  # torch layout, though paddle holds [in, out]
    for key, value in got.items():
        idx, kind = key.split(".")
        np.testing.assert_array_equal(value, params[f"{NAMES[idx]}.{kind}"], err_msg=key)
    assert backend.parameter_names(model)[:2] == ["0.weight", "0.bias"]

    # One step through polytrain equals the same step on the spec-built model.
    x, y = batch(spec, 16, seed=0)
    config = OptimizerConfig("momentum", lr=0.05)
    result = StepRunner(backend, model, backend.make_optimizer(model, config)).train_step(x, y)
    assert np.isfinite(result.loss_sum)
    reference = backend.build_model(spec)
    backend.set_params(reference, params)
    StepRunner(backend, reference, backend.make_optimizer(reference, config)).train_step(x, y)
    want = backend.get_params(reference)
    for key, value in backend.get_params(model).items():
        idx, kind = key.split(".")
        np.testing.assert_allclose(value, want[f"{NAMES[idx]}.{kind}"], atol=1e-6, err_msg=key)


def test_native_files_interoperate_with_plain_paddle(tmp_path) -> None:
    spec = get_model_spec("lenet")
    backend = get_backend("paddle")
    params = spec.init_params(seed=2)

    # A file written by plain paddle.save from a user's layer loads through polytrain.
    net = native_lenet(params)
    path = str(tmp_path / "plain.pdparams")
    paddle.save(net.state_dict(), path)
    model = backend.build_model(native_lenet(spec.init_params(seed=3)))
    backend.load_native(model, path)
    np.testing.assert_array_equal(backend.get_params(model)["7.weight"], params["fc1.weight"])

    # polytrain's .pdparams holds Paddle's names and layout: paddle.load reads it.
    built = backend.build_model(spec)
    backend.set_params(built, params)
    backend.save_native(built, str(tmp_path / "model.pdparams"))
    state = paddle.load(str(tmp_path / "model.pdparams"))
    np.testing.assert_array_equal(np.asarray(state["fc1.weight"]), params["fc1.weight"].T)


class _Exploit:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_load_native_refuses_code_in_pickles(tmp_path) -> None:
    marker = tmp_path / "ran"
    path = tmp_path / "evil.pdparams"
    path.write_bytes(pickle.dumps({"fc1.weight": _Exploit(str(marker))}, protocol=4))
    backend = get_backend("paddle")
    model = backend.build_model(get_model_spec("lenet"))
    with pytest.raises(CheckpointError, match=r"(posix|os)\.system.*not unpickle") as err:
        backend.load_native(model, str(path))
    assert str(path) in str(err.value)
    assert not marker.exists()
    path.write_bytes(b"cbuiltins\neval\n.")  # a bare lookup of builtins.eval
    with pytest.raises(CheckpointError, match=r"builtins\.eval"):
        safe_pickle.load(path)
