"""A batch that does not fit the model is polytrain's ShapeError naming the layer and the
shapes, on every backend, not the framework's own exception."""

from __future__ import annotations

import numpy as np
import pytest

from polytrain import OptimizerConfig, StepRunner, get_backend, get_model_spec
from polytrain.errors import ShapeError
from polytrain.neutral.shape_check import describe_misfit
from polytrain.testing import backends_under_test


@pytest.mark.slow
@pytest.mark.parametrize("name", backends_under_test())
@pytest.mark.parametrize(
    ("shape", "message"),
    [
        ((2, 3, 28, 28), r"layer 'conv1' \(Conv2d\) gets \[1, 3, 28, 28\].*takes \[N, 1, H, W\]"),
        ((2, 1, 32, 32), r"layer 'fc1' \(Linear\) gets \[1, 1250\].*takes \[\.\.\., 800\]"),
    ],
)
def test_a_misfit_batch_names_the_layer(name: str, shape: tuple[int, ...], message: str) -> None:
    b = get_backend(name)
    spec = get_model_spec("lenet")
    model = b.build_model(spec, b.devices("cpu"))
    runner = StepRunner(b, model, b.make_optimizer(model, OptimizerConfig("sgd", lr=0.1)))
    x = np.zeros(shape, dtype=np.float32)
    y = np.zeros(len(x), dtype=np.int64)
    for call in (lambda: runner.train_step(x, y), lambda: runner.eval_batch(x, y)):
        with pytest.raises(ShapeError, match=message) as err:
            call()
        assert "\n" not in str(err.value)
        assert "takes samples of [1, 28, 28]" in str(err.value)


def test_a_fitting_batch_has_no_misfit() -> None:
    assert describe_misfit(get_model_spec("lenet"), (4, 1, 28, 28)) is None
    assert describe_misfit(get_model_spec("vit-tiny"), (4, 1, 28, 28)) is None
    assert describe_misfit(get_model_spec("char-transformer"), (4, 64)) is None


def test_a_sequence_model_names_its_layer() -> None:
    why = describe_misfit(get_model_spec("char-transformer"), (4, 80))
    assert why is not None
    assert "layer 'pos' (PositionalEmbedding) gets [1, 80, 64]" in why
    assert "takes samples of [64]" in why
