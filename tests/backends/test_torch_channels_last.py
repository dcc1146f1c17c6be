"""polytrain's own conv models run channels-last on a CPU in float32 eager (the layout
oneDNN computes in), and nothing a user sees changes: values, saved files, their modules."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from polytrain import OptimizerConfig, get_backend, get_model_spec
from polytrain.testing import batch
from polytrain.training.step import StepRunner

torch = pytest.importorskip("torch")
CHANNELS_LAST = torch.channels_last


def conv_weights(model) -> list:
    return [p for p in model.replicas[0].parameters() if p.dim() == 4]


def test_builtin_conv_model_is_channels_last_and_steps_like_nchw() -> None:
    spec = get_model_spec("lenet")
    params = spec.init_params(seed=0)
    batches = [batch(spec, 16, seed=i) for i in range(3)]
    backend = get_backend("torch")
    model = backend.build_model(spec)
    backend.set_params(model, params)
    assert all(w.is_contiguous(memory_format=CHANNELS_LAST) for w in conv_weights(model))
    assert not all(w.is_contiguous() for w in conv_weights(model))
    runner = StepRunner(backend, model, backend.make_optimizer(model, OptimizerConfig("sgd")))
    losses = [runner.train_step(x, y).loss_sum / len(x) for x, y in batches]

    reference = get_backend("torch")
    nchw = reference.build_model(spec)
    for w in conv_weights(nchw):  # the same model, back in torch's default order
        w.data = w.data.contiguous()
    reference.set_params(nchw, params)
    assert all(w.is_contiguous() for w in conv_weights(nchw))
    ref_runner = StepRunner(reference, nchw, reference.make_optimizer(nchw, OptimizerConfig("sgd")))
    ref_losses = [ref_runner.train_step(x, y).loss_sum / len(x) for x, y in batches]
    np.testing.assert_allclose(losses, ref_losses, rtol=0, atol=1e-5)
    got, want = backend.get_params(model), reference.get_params(nchw)
    for name in want:
        assert got[name].flags.c_contiguous
        np.testing.assert_allclose(got[name], want[name], rtol=0, atol=1e-5)


def test_saved_native_file_is_in_default_order(tmp_path: Path) -> None:
    backend = get_backend("torch")
    model = backend.build_model(get_model_spec("lenet"))
    backend.save_native(model, str(tmp_path / "m.pt"))
    state = torch.load(tmp_path / "m.pt", weights_only=True)
    assert all(t.is_contiguous() for t in state.values())


def test_fp64_and_user_modules_keep_their_layout() -> None:
    backend = get_backend("torch")
    fp64 = backend.build_model(get_model_spec("lenet"), dtype="float64")
    assert all(w.is_contiguous() for w in conv_weights(fp64))
    user = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3), torch.nn.Flatten())
    model = backend.build_model(user)
    assert all(w.is_contiguous() for w in conv_weights(model))
