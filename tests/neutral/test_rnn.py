"""LSTM and GRU: the numpy backward against finite differences, the canonical (PyTorch)
names through every backend's native file and ``polytrain convert``, and the converted
files loaded by each framework's *own* recurrent layers give the reference's numbers.
(Forward and gradients on every backend, fp32 and fp64: the recurrent LayerCases of the
conformance suite.)"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from convert_helpers import assert_same, convert, random_params
from test_convert import assert_native_round_trip

from polytrain import get_backend
from polytrain.errors import ConfigError
from polytrain.io.checkpoint import find_checkpoint, load_checkpoint, save_checkpoint
from polytrain.io.convert import builtin_map
from polytrain.neutral import reference, reference_grad
from polytrain.neutral.models import GRU, LSTM, Flatten, Linear, ModelSpec, seq

SUFFIX = {"torch": ".pt", "paddle": ".pdparams", "mxnet": ".params"}


def rnn_spec() -> ModelSpec:
    """[N, 6, 3] -> 2-layer LSTM (4) -> GRU (5) -> 4 logits."""
    net = seq(
        ("lstm", LSTM(3, 4, num_layers=2)),
        ("gru", GRU(4, 5)),
        ("flatten", Flatten()),
        ("head", Linear(6 * 5, 4)),
    )
    return ModelSpec("tiny-rnn", net, input_shape=(6, 3), num_classes=4)


@pytest.mark.parametrize(
    "layer", [LSTM(3, 2, num_layers=2), GRU(3, 2, num_layers=2)], ids=["lstm", "gru"]
)
def test_reference_backward_matches_finite_differences(layer: LSTM | GRU) -> None:
    """Every coordinate of the input's and every parameter's gradient (backpropagation
    through time, two stacked layers) against central differences of the forward."""
    spec = ModelSpec("fd", seq(("rnn", layer), ("flat", Flatten()), ("head", Linear(8, 3))),
                     input_shape=(4, 3), num_classes=3)  # fmt: skip
    rng = np.random.default_rng(0)
    p = {k: rng.standard_normal(v.shape) for k, v in spec.init_params().items()}
    x, y = rng.standard_normal((2, 4, 3)), np.array([0, 2])
    _, gx, grads = reference_grad.loss_gradients(spec, p, x, y)
    assert sorted(grads) == sorted(spec.trainable_names())

    def loss(values: dict[str, np.ndarray]) -> float:
        logits = reference_grad.forward(spec, values, values["x"])
        return float(reference.cross_entropy(logits, y))

    for name, grad in ({"x": gx} | grads).items():
        values = {**p, "x": x}
        for i in np.ndindex(grad.shape):
            up, down = values[name].copy(), values[name].copy()
            up[i] += 1e-6
            down[i] -= 1e-6
            numeric = (loss({**values, name: up}) - loss({**values, name: down})) / 2e-6
            assert abs(numeric - grad[i]) < 1e-8, (name, i)


def test_canonical_names_layout_and_init_are_torchs() -> None:
    spec = rnn_spec()
    shapes = spec.parameter_shapes()
    assert list(shapes)[:4] == [
        "lstm.weight_ih_l0", "lstm.weight_hh_l0", "lstm.bias_ih_l0", "lstm.bias_hh_l0",
    ]  # fmt: skip
    assert shapes["lstm.weight_ih_l0"] == (16, 3) and shapes["lstm.weight_ih_l1"] == (16, 4)
    assert shapes["gru.weight_hh_l0"] == (15, 5) and shapes["gru.bias_ih_l0"] == (15,)
    params = spec.init_params(0)
    for name, bound in (("lstm.weight_hh_l1", 1 / 2), ("gru.bias_hh_l0", 1 / math.sqrt(5))):
        assert 0.5 * bound < np.abs(params[name]).max() <= bound, name
    assert ModelSpec.from_dict(spec.to_dict()) == spec
    with pytest.raises(ConfigError, match="integers >= 1"):
        GRU(3, 0)


def test_native_names_per_format() -> None:
    """PyTorch and Paddle name them alike (weight_ih_l0, no transpose); Gluon's layers
    call them _unfused.<layer>.i2h_weight, same layout."""
    spec = rnn_spec()
    for fmt in ("torch", "paddle"):
        entry = builtin_map(spec, fmt).entries["lstm.weight_ih_l1"]
        assert (entry.native, entry.transpose) == ("lstm.weight_ih_l1", False)
    mxnet = builtin_map(spec, "mxnet").entries
    assert mxnet["lstm.weight_ih_l1"].native == "lstm._unfused.1.i2h_weight"
    assert mxnet["gru.bias_hh_l0"].native == "gru._unfused.0.h2h_bias"
    assert not mxnet["lstm.weight_ih_l1"].transpose


def test_recurrent_weights_round_trip_native_formats(backend_name: str, tmp_path: Path) -> None:
    """What each backend writes reads back canonical, and what polytrain writes in that
    format loads into the backend and into the framework's own loader, strictly."""
    assert_native_round_trip(backend_name, rnn_spec(), tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_stacked_layers_first_in_the_net_get_exact_gradients(backend_name: str, dtype: str) -> None:
    """The conformance cases feed the layer an input that needs a gradient; here it is
    the net's first layer, fed data that needs none (MXNet 1.9's float64 fused kernel then
    skipped the gradient between stacked layers: layer 0 off by up to 8e-2)."""
    b = get_backend(backend_name)
    spec = ModelSpec("first", seq(("lstm", LSTM(3, 4, num_layers=2)), ("gru", GRU(4, 5, 2)),
                                  ("flat", Flatten()), ("head", Linear(30, 4))),
                     input_shape=(6, 3), num_classes=4, init="torch_default")  # fmt: skip
    params = spec.init_params(0)
    model = b.build_model(spec, dtype=dtype)
    b.set_params(model, params)
    rng = np.random.default_rng(2)
    x, y = rng.standard_normal((2, 6, 3)), np.array([1, 3])
    device = model.devices[0]
    with b.record():
        logits = b.forward(model, b.to_tensor(x.astype(dtype), device), train=True)
        loss = b.cross_entropy(logits, b.to_tensor(y, device), "mean")
    b.backward(loss)
    got = b.gradients(model)
    _, _, want = reference_grad.loss_gradients(spec, params, x, y)
    rtol, atol = (1e-9, 1e-10) if dtype == "float64" else (1e-4, 1e-5)
    for name, grad in want.items():
        np.testing.assert_allclose(got[name], grad, rtol=rtol, atol=atol, err_msg=name)


# -- polytrain convert into each framework's own LSTM/GRU ------------------------------------


def _torch_net(path: Path, x: np.ndarray) -> np.ndarray:
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lstm = nn.LSTM(3, 4, num_layers=2, batch_first=True)
            self.gru = nn.GRU(4, 5, batch_first=True)
            self.head = nn.Linear(30, 4)

        def forward(self, x: Any) -> Any:
            return self.head(self.gru(self.lstm(x)[0])[0].flatten(1))

    net = Net()
    net.load_state_dict(torch.load(path, weights_only=True), strict=True)
    with torch.no_grad():
        return np.asarray(net(torch.from_numpy(x)).numpy())


def _paddle_net(path: Path, x: np.ndarray) -> np.ndarray:
    import paddle
    from paddle import nn

    class Net(nn.Layer):
        def __init__(self) -> None:
            super().__init__()
            self.lstm = nn.LSTM(3, 4, num_layers=2)  # time_major=False: batch first
            self.gru = nn.GRU(4, 5)
            self.head = nn.Linear(30, 4)

        def forward(self, x: Any) -> Any:
            return self.head(self.gru(self.lstm(x)[0])[0].flatten(1))

    net = Net()
    missing, unexpected = net.set_state_dict(paddle.load(str(path)))
    assert not unexpected and all(".cell." in k for k in missing)  # aliases of set tensors
    net.eval()
    return np.asarray(net(paddle.to_tensor(x)).numpy())


def _gluon_net(path: Path, x: np.ndarray) -> np.ndarray:
    import mxnet as mx
    from mxnet.gluon import nn, rnn

    class Net(nn.HybridBlock):
        def __init__(self) -> None:
            super().__init__()
            with self.name_scope():
                self.lstm = rnn.LSTM(4, num_layers=2, layout="NTC", input_size=3)
                self.gru = rnn.GRU(5, layout="NTC", input_size=4)
                self.head = nn.Dense(4, in_units=30)

        def hybrid_forward(self, F: Any, x: Any) -> Any:
            return self.head(self.gru(self.lstm(x)))

    net = Net()
    net.load_parameters(str(path))  # strict: every name must match
    return np.asarray(net(mx.nd.array(x)).asnumpy())


FRAMEWORK_NETS = {"torch": _torch_net, "paddle": _paddle_net, "mxnet": _gluon_net}


@pytest.mark.filterwarnings("ignore:Skip loading for .*cell")  # Paddle's cell aliases
@pytest.mark.parametrize("fmt", list(FRAMEWORK_NETS))
def test_convert_feeds_the_frameworks_own_layers(fmt: str, tmp_path: Path) -> None:
    """A neutral checkpoint -> ``polytrain convert --to FMT`` -> the framework's plain
    LSTM/GRU/Linear loads it strictly and computes the numpy reference's logits; and
    ``polytrain convert`` back to neutral gives the same tensors, bit for bit."""
    pytest.importorskip(fmt)
    spec = rnn_spec()
    params = random_params(spec)
    save_checkpoint(tmp_path / "ck", params=params, spec=spec)
    native = tmp_path / f"net{SUFFIX[fmt]}"
    assert convert(tmp_path / "ck", native, "--to", fmt) == 0
    x = np.random.default_rng(3).standard_normal((2, 6, 3)).astype(np.float32)
    got = FRAMEWORK_NETS[fmt](native, x)
    np.testing.assert_allclose(got, reference.forward(spec, params, x), rtol=1e-5, atol=1e-5)
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(spec.to_json(), encoding="utf-8")
    back = tmp_path / "back"
    assert convert(native, back, "--to", "neutral", "--model", spec_file) == 0
    assert_same(load_checkpoint(find_checkpoint(back)).params, params)
