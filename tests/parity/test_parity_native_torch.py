"""polytrain on torch vs a hand-written PyTorch loop: same weights, same batches."""

from __future__ import annotations

import numpy as np
import pytest

from polytrain import OptimizerConfig, get_backend, get_model_spec
from polytrain.testing import batch
from polytrain.training.step import StepRunner

torch = pytest.importorskip("torch")
STEPS = 5


def native_lenet(params: dict[str, np.ndarray]):
    from torch import nn

    net = nn.Sequential(
        nn.Conv2d(1, 20, 3), nn.ReLU(), nn.AvgPool2d(2, 2),
        nn.Conv2d(20, 50, 5), nn.ReLU(), nn.AvgPool2d(2, 2),
        nn.Flatten(), nn.Linear(800, 128), nn.ReLU(), nn.Linear(128, 10),
    )  # fmt: skip
    names = {"0": "conv1", "3": "conv2", "7": "fc1", "9": "fc2"}
    with torch.no_grad():
        for key, p in net.named_parameters():
            idx, kind = key.split(".")
            p.copy_(torch.from_numpy(params[f"{names[idx]}.{kind}"]))
    return net


def test_lenet_steps_match_native_torch_loop() -> None:
    spec = get_model_spec("lenet")
    params = spec.init_params(seed=0)
    batches = [batch(spec, 32, seed=i) for i in range(STEPS)]

    net = native_lenet(params)
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    native_losses = []
    for x, y in batches:
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(torch.from_numpy(x)), torch.from_numpy(y))
        loss.backward()
        opt.step()
        native_losses.append(loss.item())

    backend = get_backend("torch")
    model = backend.build_model(spec)
    backend.set_params(model, params)
    runner = StepRunner(
        backend, model, backend.make_optimizer(model, OptimizerConfig("momentum", lr=0.05))
    )
    losses = [runner.train_step(x, y).loss_sum / len(x) for x, y in batches]

    np.testing.assert_allclose(losses, native_losses, rtol=0, atol=1e-5)
    got = backend.get_params(model)
    names = {"0": "conv1", "3": "conv2", "7": "fc1", "9": "fc2"}
    for key, p in net.named_parameters():
        idx, kind = key.split(".")
        np.testing.assert_allclose(got[f"{names[idx]}.{kind}"], p.detach().numpy(), atol=1e-5)
