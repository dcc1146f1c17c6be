"""The built-in vit-fashion-mnist recipe: its model, its fp64 parity across frameworks (a
few samples, a few steps: seconds) and its per-layer outputs named alike on every backend."""

from __future__ import annotations

import numpy as np
import pytest

from polytrain import get_backend
from polytrain.neutral import reference
from polytrain.neutral.models import get_model_spec
from polytrain.testing import backends_under_test
from polytrain.testing.recorders import StepLosses
from polytrain.training.presets import preset_recipe
from polytrain.training.trainer import Datasets, Trainer, load_datasets

BACKENDS = backends_under_test()
# the preset on 48 images, 4 steps of 12 (the warm-up shortened so the lr moves): seconds
TINY = dict(precision="fp64", train_samples=48, test_samples=12, batch_size=12, epochs=1,
            warmup_steps=2)  # fmt: skip


@pytest.fixture(scope="module")
def data() -> Datasets:
    return load_datasets(preset_recipe("vit-fashion-mnist", TINY))


def test_vit_tiny_is_a_small_pre_norm_vit() -> None:
    spec = get_model_spec("vit-tiny")
    shapes = spec.parameter_shapes()
    assert shapes["patch.weight"] == (64, 1, 7, 7) and shapes["pos.weight"] == (16, 64)
    assert shapes["blocks.1.attn.branches.1.attn.in_proj_weight"] == (192, 64)
    assert shapes["head.weight"] == (10, 64)
    assert f"{spec.num_parameters():,} parameters" in spec.description
    x = np.random.default_rng(0).standard_normal((2, 1, 28, 28))
    assert reference.forward(spec, spec.init_params(0), x).shape == (2, 10)


@pytest.mark.slow
def test_vit_fp64_runs_agree_within_1e_10_per_step(data: Datasets) -> None:
    """The preset's first steps in float64 on every backend: the same loss to 1e-10."""
    runs = {}
    for backend in BACKENDS:
        losses = StepLosses()
        recipe = preset_recipe("vit-fashion-mnist", TINY)
        Trainer(recipe, backend, plugins=[losses], progress=False, datasets=data).fit()
        runs[backend] = losses.values
    reference_run = runs.get("torch", runs[BACKENDS[0]])
    assert len(reference_run) == 4 and reference_run[-1] < reference_run[0]  # it trained
    for backend, values in runs.items():
        np.testing.assert_allclose(values, reference_run, rtol=0, atol=1e-10, err_msg=backend)


@pytest.mark.slow
def test_vit_layer_outputs_are_the_same_layers_on_every_backend() -> None:
    """compare's per-layer diagnosis needs one name per spec layer on every backend: the
    attention itself (not its out_proj), each residual sum, no identity branch."""
    spec = get_model_spec("vit-tiny")
    params = spec.init_params(1)
    x = np.random.default_rng(1).random((2, 1, 28, 28)).astype(np.float32)
    want = None
    for backend in BACKENDS:
        b = get_backend(backend)
        model = b.build_model(spec)
        b.set_params(model, params)
        got = b.layer_outputs(model, b.to_tensor(x))
        names = [name for name, _ in got]
        assert "blocks.0.attn.branches.1.attn" in names and "blocks.0.attn" in names, backend
        assert "blocks.0.attn.branches.0" not in names, backend
        if want is None:
            want = got
            continue
        assert names == [name for name, _ in want], backend
        for (name, out), (_, ref) in zip(got, want, strict=True):
            np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5, err_msg=f"{backend} {name}")
