"""Losses and metrics by name: each backend's value and gradient w.r.t. the outputs against
the numpy references of polytrain.neutral.losses, and the metrics through the StepRunner."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from polytrain.errors import ConfigError, DataError
from polytrain.neutral.losses import (
    LossSpec,
    MetricSpec,
    check_targets,
    loss_grad_reference,
    loss_reference,
    metric_sum,
    parse_loss,
    parse_metric,
)
from polytrain.neutral.models import Linear, ModelSpec, seq
from polytrain.plugins.records import EpochRecord, RunInfo
from polytrain.training.builtin_plugins import ProgressBar
from polytrain.training.step import StepRunner

LOSSES = {
    "ce": LossSpec(),
    "ce-smooth": LossSpec(label_smoothing=0.1),
    "ce-weights": LossSpec(class_weights=(1.0, 2.0, 0.5, 3.0)),
    "ce-smooth-weights": LossSpec(label_smoothing=0.2, class_weights=(1.0, 2.0, 0.5, 3.0)),
    "mse": LossSpec("mse"),
    "l1": LossSpec("l1"),
    "bce": LossSpec("bce_with_logits"),
}
TOL = {"float32": (2e-5, 2e-6), "float64": (1e-10, 1e-12)}  # rtol, atol


def _case(spec: LossSpec, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    outputs = rng.standard_normal((6, 4)).astype(dtype)
    if spec.class_targets:
        return outputs, rng.integers(0, 4, 6).astype(np.int64)
    if spec.name == "bce_with_logits":
        return outputs, rng.random((6, 4)).astype(np.float32)
    return outputs, rng.standard_normal((6, 4)).astype(np.float32)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name", list(LOSSES))
def test_loss_value_and_gradient_match_numpy(backend: Any, name: str, dtype: str) -> None:
    spec = LOSSES[name]
    _check_value_and_gradient(backend, name, spec, *_case(spec, dtype), dtype)


def _check_value_and_gradient(
    backend: Any, name: str, spec: Any, outputs: np.ndarray, targets: np.ndarray, dtype: str
) -> None:
    """The backend's loss in every reduction, and its gradient w.r.t. the outputs (shape
    and dtype included), against the numpy references."""
    rtol, atol = TOL[dtype]
    yt = backend.to_tensor(targets)
    for reduction in ("none", "sum", "mean"):
        got = backend.to_numpy(backend.loss(backend.to_tensor(outputs), yt, spec, reduction))
        want = loss_reference(spec, outputs, targets, reduction)
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=f"{name} {reduction}")
    ops = backend.functional()
    z = ops.parameter(outputs)
    with backend.record():
        loss = backend.loss(z, yt, spec, "sum")
    backend.backward(loss)
    grad = backend.to_numpy(ops.grad(z))
    assert grad.shape == outputs.shape and grad.dtype == np.dtype(dtype)
    want_grad = loss_grad_reference(spec, outputs, targets)
    np.testing.assert_allclose(grad, want_grad, rtol=rtol, atol=atol)


def _linear_spec() -> ModelSpec:
    return ModelSpec("probe", seq(("fc", Linear(3, 4))), input_shape=(3,), num_classes=4)


@pytest.mark.parametrize("metric", ["accuracy", '{"name": "top_k", "k": 2}', "mse"])
def test_metrics_through_the_step_runner_match_numpy(backend: Any, metric: str) -> None:
    spec, m = _linear_spec(), parse_metric(metric)
    model = backend.build_model(spec)
    params = spec.init_params(seed=1)
    backend.set_params(model, params)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((9, 3)).astype(np.float32)
    y = (
        rng.integers(0, 4, 9).astype(np.int64)
        if m.class_targets
        else rng.standard_normal((9, 4)).astype(np.float32)
    )
    loss = LossSpec() if m.class_targets else LossSpec("mse")
    optimizer = backend.make_optimizer(model, _sgd())
    runner = StepRunner(backend, model, optimizer, loss=loss, metric=m)
    got, n = runner.eval_batch(x, y)
    logits = x.astype(np.float64) @ params["fc.weight"].T + params["fc.bias"]
    assert n == 9
    assert got == pytest.approx(metric_sum(m, logits, y), rel=1e-5)


def _sgd() -> Any:
    from polytrain.neutral.optim import OptimizerConfig

    return OptimizerConfig(name="sgd", lr=0.1)


def test_metric_references_by_hand() -> None:
    z = np.array([[3.0, 1.0, 2.0], [0.0, 5.0, 5.0], [1.0, 1.0, 0.0]])
    y = np.array([2, 2, 2])
    assert metric_sum(MetricSpec(), z, y) == 0.0
    # top-2: sample 0 has one logit above its label's, sample 1 a tie (a hit), sample 2 two
    assert metric_sum(MetricSpec("top_k", k=2), z, y) == 2.0
    t = np.zeros((3, 3))
    assert metric_sum(MetricSpec("mse"), z, t) == pytest.approx((14 / 3) + (50 / 3) + (2 / 3))


def test_parsing_names_and_json() -> None:
    assert parse_loss("mse") == LossSpec("mse")
    spec = parse_loss('{"name": "cross_entropy", "label_smoothing": 0.1, "class_weights": [1, 2]}')
    assert spec == LossSpec(label_smoothing=0.1, class_weights=(1.0, 2.0))
    assert parse_metric('{"name": "top_k", "k": 3}') == MetricSpec("top_k", k=3)
    with pytest.raises(ConfigError, match="Unknown loss 'huber'"):
        parse_loss("huber")
    with pytest.raises(ConfigError, match="takes no label_smoothing"):
        parse_loss('{"name": "mse", "label_smoothing": 0.1}')
    with pytest.raises(ConfigError, match="label_smoothing must be"):
        LossSpec(label_smoothing=1.5)
    with pytest.raises(ConfigError, match="options are label_smoothing"):
        parse_loss('{"name": "cross_entropy", "smoothing": 0.1}')


@pytest.mark.parametrize(
    ("metric", "train", "test"),
    [
        ("accuracy", "train accuracy 81.25%", "test accuracy 50.00%"),
        ('{"name": "top_k", "k": 5}', "train top-5 81.25%", "test top-5 50.00%"),
        ("mse", "train mse 0.8125", "test mse 0.5"),
    ],
)
def test_the_epoch_line_prints_each_metric_with_its_own_unit(
    metric: str, train: str, test: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """An mse is no share of samples: the epoch line names the metric and shows a count's
    share in percent, an mse as it is (it printed 'acc 81.25%' for every metric)."""
    run = RunInfo("numpy", "1", "mlp", "data", ["cpu"], 1, 2, 32, 32, recipe={"metric": metric})
    epoch = EpochRecord(
        0, 0.5, train_metric=0.8125, test_metric=0.5, seconds=1, samples_per_second=64
    )
    ProgressBar(enabled=True, bar=False).polytrain_epoch_end(run, epoch)
    line = capsys.readouterr().err
    assert f"{train}, {test}," in line, line


def test_targets_are_checked_against_the_loss_in_one_line() -> None:
    labels, values = np.array([0, 3]), np.zeros((2, 4), np.float32)
    check_targets(LossSpec(), MetricSpec(), labels, 4, "d")
    check_targets(LossSpec("mse"), MetricSpec("mse"), values, 4, "d")
    with pytest.raises(DataError, match=r"labels range over 0\.\.3, but the model has 3 outputs"):
        check_targets(LossSpec(), MetricSpec(), labels, 3, "d")
    with pytest.raises(DataError, match=r"needs float targets \[N, 4\]"):
        check_targets(LossSpec("mse"), MetricSpec("mse"), labels, 4, "d")
    with pytest.raises(DataError, match=r"needs integer class labels \[N\]"):
        check_targets(LossSpec(), MetricSpec(), values, 4, "d")
    with pytest.raises(ConfigError, match="want different targets"):
        check_targets(LossSpec("mse"), MetricSpec(), values, 4, "d")
    with pytest.raises(ConfigError, match="class_weights has 2 entries"):
        check_targets(LossSpec(class_weights=(1, 2)), MetricSpec(), labels, 4, "d")


# -- sequence targets: outputs [N, T, C], labels [N, T] ---------------------------------------

SEQUENCE_LOSSES = ("ce", "ce-smooth", "ce-weights", "ce-smooth-weights")


def _sequence_case(dtype: str) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(5)
    return rng.standard_normal((3, 5, 4)).astype(dtype), rng.integers(0, 4, (3, 5))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name", SEQUENCE_LOSSES)
def test_sequence_loss_value_and_gradient_match_numpy(backend: Any, name: str, dtype: str) -> None:
    _check_value_and_gradient(backend, name, LOSSES[name], *_sequence_case(dtype), dtype)


@pytest.mark.parametrize("name", SEQUENCE_LOSSES)
def test_sequence_reference_is_the_mean_over_positions_of_the_tokens(name: str) -> None:
    spec = LOSSES[name]
    outputs, targets = _sequence_case("float64")
    tokens = loss_reference(spec, outputs.reshape(15, 4), targets.reshape(15), "none")
    per_sample = loss_reference(spec, outputs, targets, "none")
    np.testing.assert_allclose(per_sample, tokens.reshape(3, 5).mean(axis=1), rtol=1e-14)
    token_grad = loss_grad_reference(spec, outputs.reshape(15, 4), targets.reshape(15))
    grad = loss_grad_reference(spec, outputs, targets)
    np.testing.assert_allclose(grad, token_grad.reshape(3, 5, 4) / 5, rtol=1e-14)


def test_sequence_metrics_count_the_share_of_positions_per_sample() -> None:
    z = np.zeros((2, 3, 3))
    z[0, :, 0] = 1  # sample 0 predicts class 0 at every position
    z[1, :, 2] = 1
    y = np.array([[0, 0, 1], [2, 1, 1]])  # hits: 2 of 3, 1 of 3
    assert metric_sum(MetricSpec(), z, y) == pytest.approx(2 / 3 + 1 / 3)
    assert metric_sum(MetricSpec("top_k", k=3), z, y) == pytest.approx(2.0)
    check_targets(LossSpec(), MetricSpec(), y, 3, "d")  # [N, T] labels are class targets
    with pytest.raises(DataError, match=r"labels of shape \[2, 3\] do not fit outputs of shape"):
        loss_reference(LossSpec(), np.zeros((2, 3)), y)


def test_sequence_metrics_through_the_step_runner(backend: Any) -> None:
    """Accuracy of [N, T] labels: per sample the share of positions hit, summed (not a
    count of samples, so not rounded); a mismatched shape is one line."""
    from polytrain.neutral.models import Embedding

    spec = ModelSpec("tokens", seq(("emb", Embedding(4, 4))), input_shape=(5,), num_classes=4)
    model = backend.build_model(spec)
    params = spec.init_params(seed=1)
    backend.set_params(model, params)
    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 4, (6, 5)), rng.integers(0, 4, (6, 5))
    runner = StepRunner(backend, model, backend.make_optimizer(model, _sgd()))
    got, n = runner.eval_batch(x, y)
    logits = params["emb.weight"][x]
    assert n == 6
    assert got == pytest.approx(metric_sum(MetricSpec(), logits, y), rel=1e-6)
    assert got != round(got)  # a share of positions, not a rounded count
    _, loss_sum, _ = runner.eval_batch_tokens(x, y)
    assert loss_sum == pytest.approx(float(loss_reference(LossSpec(), logits, y)), rel=1e-5)
    result = runner.train_step(x, y)
    assert result.loss_sum == pytest.approx(loss_sum, rel=1e-5)
    with pytest.raises(DataError, match=r"do not fit outputs of shape \[6, 5, 4\]"):
        runner.train_step(x, y[:, :4])
