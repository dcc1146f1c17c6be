"""Two execution details of the torch backend's built models, each the same floats as
torch's plain modules: a ReLU runs in place where it follows a layer whose output is fresh
and unread by its backward (Conv2d, Linear, BatchNorm2d, a residual sum), and nowhere else;
Flatten hands a channels-last input its gradient back channels-last."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.torch_layers import plain_modules
from polytrain import OptimizerConfig, get_backend, get_model_spec
from polytrain.neutral.models import (
    BatchNorm2d,
    Conv2d,
    Flatten,
    Linear,
    MaxPool2d,
    ModelSpec,
    ReLU,
    Sigmoid,
    seq,
)
from polytrain.testing import batch
from polytrain.training.step import StepRunner

torch = pytest.importorskip("torch")
nn = torch.nn


def mixed_spec() -> ModelSpec:
    net = seq(
        ("relu0", ReLU()),  # the caller's input: never in place
        ("conv", Conv2d(1, 4, 3)),
        ("relu1", ReLU()),
        ("bn", BatchNorm2d(4)),
        ("relu2", ReLU()),
        ("pool", MaxPool2d(2, 2)),
        ("relu3", ReLU()),  # after a pooling: not on the list
        ("flatten", Flatten()),
        ("fc1", Linear(36, 8)),
        ("sig", Sigmoid()),
        ("relu4", ReLU()),  # sigmoid's backward reads its output: not in place
        ("fc2", Linear(8, 8)),
        ("relu5", ReLU()),
        ("fc3", Linear(8, 3)),
    )
    return ModelSpec("inplace-probe", net, input_shape=(1, 8, 8), num_classes=3)


def relus(model) -> dict[str, bool]:
    return {
        name: m.inplace for name, m in model.replicas[0].named_modules() if isinstance(m, nn.ReLU)
    }


def test_only_relus_after_fresh_outputs_run_in_place() -> None:
    model = get_backend("torch").build_model(mixed_spec())
    assert relus(model) == {
        "relu0": False,
        "relu1": True,
        "relu2": True,
        "relu3": False,
        "relu4": False,
        "relu5": True,
    }


@pytest.mark.slow
@pytest.mark.parametrize("name", ["inplace-probe", "lenet", "resnet18"])
def test_steps_equal_plain_modules_bit_for_bit(name: str) -> None:
    """float32, the default path (channels-last for the built-in conv models): three SGD
    steps with momentum, then every loss and parameter is equal."""
    spec = mixed_spec() if name == "inplace-probe" else get_model_spec(name)
    size = 4 if name == "resnet18" else 8
    params = spec.init_params(seed=0)
    batches = [batch(spec, size, seed=i) for i in range(3)]
    results = []
    for reference in (False, True):
        backend = get_backend("torch")
        model = backend.build_model(spec)
        if reference:
            plain_modules(model.replicas[0])
        backend.set_params(model, params)
        opt = backend.make_optimizer(model, OptimizerConfig("momentum", lr=0.05))
        runner = StepRunner(backend, model, opt)
        inputs = [x.copy() for x, _ in batches]
        labels = [y for _, y in batches]
        losses = [runner.train_step(x, y).loss_sum for x, y in zip(inputs, labels, strict=True)]
        for x, (given, _) in zip(inputs, batches, strict=True):
            np.testing.assert_array_equal(x, given)  # the caller's batch is unchanged
        results.append((losses, backend.get_params(model)))
    (losses, got), (ref_losses, want) = results
    assert losses == ref_losses
    for key in want:
        np.testing.assert_array_equal(got[key], want[key])


def test_flatten_returns_a_channels_last_gradient() -> None:
    from polytrain_torch._layout import Flatten

    leaf = torch.randn(4, 3, 5, 5).contiguous(memory_format=torch.channels_last)
    leaf.requires_grad_(True)
    x = leaf * 2.0  # not a leaf: its gradient keeps the layout autograd gives it
    seen = []
    x.register_hook(seen.append)
    y = Flatten()(x)
    assert y.shape == (4, 75)
    np.testing.assert_array_equal(y.detach().numpy(), x.detach().flatten(1).numpy())
    y.backward(torch.arange(300.0).reshape(4, 75))
    (grad,) = seen
    assert grad.is_contiguous(memory_format=torch.channels_last)
    np.testing.assert_array_equal(grad.numpy(), np.arange(300.0).reshape(4, 3, 5, 5))


@pytest.mark.slow
def test_built_model_traces_and_exports() -> None:
    """An exported graph has no backward: no hook, no extra view in it."""
    model = get_backend("torch").build_model(get_model_spec("lenet"))
    net = model.replicas[0]
    x = torch.randn(4, 1, 28, 28).contiguous(memory_format=torch.channels_last)
    want = net(x)
    traced = torch.jit.trace(net, x)
    assert "view_as" not in str(traced.graph)
    torch.testing.assert_close(traced(x), want, rtol=0, atol=0)
    exported = torch.export.export(net, (x,))
    torch.testing.assert_close(exported.module()(x), want, rtol=0, atol=0)
