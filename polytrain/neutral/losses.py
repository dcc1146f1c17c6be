"""Losses and metrics by name, with their numpy references (the canonical definitions).

A loss is a :class:`LossSpec` (``cross_entropy`` with ``label_smoothing`` and
``class_weights``, ``mse``, ``l1``, ``bce_with_logits``); a metric a :class:`MetricSpec`
(``accuracy``, ``top_k`` with ``k``, ``mse``). Every backend's ``Backend.loss`` verb must
match :func:`loss_reference` in value and :func:`loss_grad_reference` in gradient; metrics
are computed once, here, on the host (accuracy through the backend's ``count_correct``).

Per sample, a loss is a *mean over the sample's output elements*; a batch's loss is the sum
of its samples' (the step divides by the global batch size). So ``mse``, ``l1`` and
``bce_with_logits`` equal PyTorch's ``reduction="mean"`` over the batch, and
``cross_entropy`` equals PyTorch's ``reduction="sum"`` divided by the batch size: with
class weights that is *not* PyTorch's weighted mean, which divides by the sum of the
labels' weights and so could not be summed over shards and processes.

Sequence targets: class outputs ``[N, T, C]`` (the class axis is the last) with integer
labels ``[N, T]`` (any ``[N, *S, C]`` with ``[N, *S]``). Per sample the loss is then the
mean over its T positions of the token's cross-entropy, by the same rule; so the batch's
mean loss is the mean token cross-entropy (every sample has T positions) and its ``exp``
the perplexity. ``accuracy`` and ``top_k`` are per sample the share of its positions hit:
their mean over samples is the share of tokens hit.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from polytrain.errors import ConfigError, DataError

LOSSES = ("cross_entropy", "mse", "l1", "bce_with_logits")
METRICS = ("accuracy", "top_k", "mse")
CLASS_TARGETS = ("cross_entropy",)  # losses of integer class labels; the rest take floats


@dataclass(frozen=True)
class LossSpec:
    """A loss by name. ``label_smoothing`` and ``class_weights`` apply to cross_entropy."""

    name: str = "cross_entropy"
    label_smoothing: float = 0.0
    class_weights: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if self.name not in LOSSES:
            raise ConfigError(f"Unknown loss {self.name!r}; use one of {', '.join(LOSSES)}.")
        if not (
            isinstance(self.label_smoothing, int | float) and 0.0 <= self.label_smoothing < 1.0
        ):
            raise ConfigError(
                f"label_smoothing must be a number in [0, 1), got {self.label_smoothing!r}."
            )
        if self.name != "cross_entropy" and (self.label_smoothing or self.class_weights):
            raise ConfigError(
                f"Loss {self.name!r} takes no label_smoothing or class_weights "
                "(they belong to cross_entropy)."
            )
        if self.class_weights is not None:
            weights = tuple(self.class_weights)
            if not weights or not all(
                isinstance(w, int | float) and math.isfinite(w) and w >= 0 for w in weights
            ):
                raise ConfigError(
                    f"class_weights must be finite numbers >= 0, one per class; got {weights!r}."
                )
            object.__setattr__(self, "class_weights", tuple(float(w) for w in weights))

    @property
    def plain(self) -> bool:
        """Cross-entropy without smoothing or weights (the ``cross_entropy`` verb)."""
        return self.name == "cross_entropy" and not self.label_smoothing and not self.class_weights

    @property
    def class_targets(self) -> bool:
        return self.name in CLASS_TARGETS

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["class_weights"] = None if self.class_weights is None else list(self.class_weights)
        return out


@dataclass(frozen=True)
class MetricSpec:
    """A metric by name; ``k`` is top_k's. Reported as the mean over samples."""

    name: str = "accuracy"
    k: int = field(default=5)

    def __post_init__(self) -> None:
        if self.name not in METRICS:
            raise ConfigError(f"Unknown metric {self.name!r}; use one of {', '.join(METRICS)}.")
        if isinstance(self.k, bool) or not isinstance(self.k, int) or self.k < 1:
            raise ConfigError(f"top_k's k must be an integer >= 1, got {self.k!r}.")

    @property
    def counts(self) -> bool:
        """Whether a batch's sum is a count of samples (integer)."""
        return self.name != "mse"

    @property
    def class_targets(self) -> bool:
        return self.name != "mse"

    @property
    def label(self) -> str:
        return f"top-{self.k}" if self.name == "top_k" else self.name

    def shown(self, value: float) -> str:
        """A value as a line prints it: a share of samples in percent, mse as it is."""
        return f"{100 * value:.2f}%" if self.counts else f"{value:.5g}"


def _parse(value: object, what: str) -> dict[str, Any]:
    """A name, a JSON object text, or a mapping -> a dict with ``name``."""
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("{"):
            try:
                value = json.loads(text)
            except ValueError as exc:
                raise ConfigError(f"--{what} {text!r} is not valid JSON: {exc}.") from None
        else:
            return {"name": text}
    if not isinstance(value, dict) or "name" not in value:
        raise ConfigError(f"--{what} must be a name or a JSON object with a 'name', got {value!r}.")
    return dict(value)


def parse_loss(value: object) -> LossSpec:
    """``"mse"``, ``'{"name": "cross_entropy", "label_smoothing": 0.1}'`` or such a dict."""
    if isinstance(value, LossSpec):
        return value
    data = _parse(value, "loss")
    if isinstance(data.get("class_weights"), list):
        data["class_weights"] = tuple(data["class_weights"])
    try:
        return LossSpec(**data)
    except TypeError as exc:
        raise ConfigError(
            f"--loss {value!r}: {exc}; the options are label_smoothing and class_weights."
        ) from None


def parse_metric(value: object) -> MetricSpec:
    """``"accuracy"``, ``'{"name": "top_k", "k": 3}'`` or such a dict."""
    if isinstance(value, MetricSpec):
        return value
    try:
        return MetricSpec(**_parse(value, "metric"))
    except TypeError as exc:
        raise ConfigError(f"--metric {value!r}: {exc}; top_k takes k.") from None


# -- numpy references --------------------------------------------------------------------------


def class_positions(outputs_shape: tuple[int, ...], targets_shape: tuple[int, ...]) -> int:
    """Positions per sample of class targets: 1 for outputs ``[N, C]`` with labels ``[N]``
    (or ``[N, 1]``), T for outputs ``[N, T, C]`` with labels ``[N, T]``; one line otherwise."""
    outputs_shape, targets_shape = tuple(outputs_shape), tuple(targets_shape)
    if len(outputs_shape) == 2 and targets_shape in ((outputs_shape[0],), (outputs_shape[0], 1)):
        return 1
    if len(outputs_shape) < 2 or targets_shape != outputs_shape[:-1]:
        raise DataError(
            f"class labels of shape {list(targets_shape)} do not fit outputs of shape "
            f"{list(outputs_shape)}: labels are [N] for outputs [N, C], [N, T] for outputs "
            "[N, T, C] (the class axis is the last)."
        )
    return math.prod(outputs_shape[1:-1])


def _class_rows(outputs: np.ndarray, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """(logits [N * T, C] in float64, labels [N * T], T) of class outputs and labels."""
    z = np.asarray(outputs, dtype=np.float64)
    positions = class_positions(z.shape, np.shape(targets))
    labels = np.asarray(targets).reshape(-1).astype(np.int64)
    return z.reshape(len(labels), z.shape[-1]), labels, positions


def _flat(outputs: np.ndarray) -> np.ndarray:
    return np.asarray(outputs, dtype=np.float64).reshape(len(outputs), -1)


def _float_targets(outputs: np.ndarray, targets: np.ndarray) -> np.ndarray:
    t = np.asarray(targets, dtype=np.float64)
    if t.size != np.asarray(outputs).size:
        raise DataError(
            f"targets of shape {t.shape} do not match outputs of shape {np.shape(outputs)}."
        )
    return t.reshape(len(t), -1)


def _smoothed_coefficients(spec: LossSpec, labels: np.ndarray, classes: int) -> np.ndarray:
    """``a[i, c]``: the loss of sample i is ``-sum_c a[i, c] * log_softmax(z_i)[c]``."""
    w = np.ones(classes) if spec.class_weights is None else np.asarray(spec.class_weights)
    if len(w) != classes:
        raise ConfigError(f"class_weights has {len(w)} entries for {classes} classes.")
    onehot = np.zeros((len(labels), classes))
    onehot[np.arange(len(labels)), labels] = 1.0
    eps = spec.label_smoothing
    return (1.0 - eps) * onehot * w + (eps / classes) * w


def _log_softmax(z: np.ndarray) -> np.ndarray:
    shifted = z - z.max(axis=1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))


def loss_per_sample(spec: LossSpec, outputs: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Float64 loss of each sample (the canonical definition, see the module docstring)."""
    if spec.class_targets:
        rows, labels, positions = _class_rows(outputs, targets)
        a = _smoothed_coefficients(spec, labels, rows.shape[1])
        per_token = -(a * _log_softmax(rows)).sum(axis=1)
        return np.asarray(per_token.reshape(-1, positions).mean(axis=1))
    z = _flat(outputs)
    t = _float_targets(outputs, targets)
    if spec.name == "mse":
        return np.asarray(((z - t) ** 2).mean(axis=1))
    if spec.name == "l1":
        return np.asarray(np.abs(z - t).mean(axis=1))
    # bce_with_logits, in the stable form max(z, 0) - z t + log(1 + exp(-|z|))
    return np.asarray((np.maximum(z, 0) - z * t + np.log1p(np.exp(-np.abs(z)))).mean(axis=1))


def loss_reference(
    spec: LossSpec, outputs: np.ndarray, targets: np.ndarray, reduction: str = "sum"
) -> np.ndarray:
    """The loss reduced by ``"sum"``, ``"mean"`` (the sum over the number of samples) or
    ``"none"`` (per sample), in float64."""
    per = loss_per_sample(spec, outputs, targets)
    if reduction == "none":
        return per
    if reduction == "sum":
        return np.asarray(per.sum())
    if reduction == "mean":
        return np.asarray(per.sum() / len(per))
    raise ConfigError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}.")


def loss_grad_reference(spec: LossSpec, outputs: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """d(sum of the per-sample losses)/d(outputs), float64, shaped like ``outputs``."""
    z = _flat(outputs)
    if spec.class_targets:
        rows, labels, positions = _class_rows(outputs, targets)
        a = _smoothed_coefficients(spec, labels, rows.shape[1])
        p = np.exp(_log_softmax(rows))
        grad = (p * a.sum(axis=1, keepdims=True) - a) / positions
    else:
        t = _float_targets(outputs, targets)
        per_element = 1.0 / z.shape[1]
        if spec.name == "mse":
            grad = 2.0 * (z - t) * per_element
        elif spec.name == "l1":
            grad = np.sign(z - t) * per_element
        else:
            grad = (1.0 / (1.0 + np.exp(-z)) - t) * per_element
    return grad.reshape(np.shape(outputs))


def metric_sum(spec: MetricSpec, outputs: np.ndarray, targets: np.ndarray) -> float:
    """The metric summed over a batch's samples (its mean is what runs report); with
    sequence targets each sample counts the share of its positions hit."""
    if spec.name == "mse":
        z = _flat(outputs)
        return float(((z - _float_targets(outputs, targets)) ** 2).mean(axis=1).sum())
    z, labels, positions = _class_rows(outputs, targets)
    own = z[np.arange(len(z)), labels]
    if spec.name == "accuracy":
        hits = z.argmax(axis=1) == labels
    else:  # top_k: the label's logit has fewer than k logits strictly above it (ties: hits)
        hits = (z > own[:, None]).sum(axis=1) < spec.k
    if positions == 1:
        return float(hits.sum())
    return float(hits.reshape(-1, positions).mean(axis=1).sum())


# -- what the data must look like -------------------------------------------------------------


def check_targets(
    loss: LossSpec,
    metric: MetricSpec,
    targets: np.ndarray,
    outputs: int,
    where: str,
    sample_output: tuple[int, ...] | None = None,
) -> None:
    """One line unless ``targets`` fit the loss and metric for ``outputs`` outputs/sample:
    integer labels ``[N]`` (or ``[N, T]``: sequence targets) in ``0..outputs-1`` for class
    losses, else floats ``[N, outputs]`` (or ``[N]`` when ``outputs`` is 1). With the
    model's ``sample_output`` shape known, class labels must have its leading dims: ``[N]``
    for ``(classes,)``, ``[N, T]`` for ``(T, classes)``."""
    y = np.asarray(targets)
    if loss.class_targets and sample_output is not None:
        _check_label_dims(y, sample_output, where)
    if loss.class_targets != metric.class_targets:
        raise ConfigError(
            f"Loss {loss.name!r} and metric {metric.label!r} want different targets (class "
            "labels vs. float values): pick a metric of the same kind (accuracy/top_k for "
            "cross_entropy, mse for the others)."
        )
    if loss.class_targets:
        if y.ndim not in (1, 2) or y.dtype.kind not in "iu":
            raise DataError(
                f"{where}: loss {loss.name} needs integer class labels [N] (or [N, T] for "
                f"a sequence model); got {y.dtype} with shape {y.shape}."
            )
        low, high = (int(y.min()), int(y.max())) if len(y) else (0, 0)
        if low < 0 or high >= outputs:
            raise DataError(
                f"{where}: labels range over {low}..{high}, but the model has {outputs} "
                f"outputs (classes 0..{outputs - 1}): set the spec's num_classes."
            )
        if loss.class_weights is not None and len(loss.class_weights) != outputs:
            raise ConfigError(
                f"class_weights has {len(loss.class_weights)} entries for the model's "
                f"{outputs} classes."
            )
        if metric.name == "top_k" and metric.k > outputs:
            raise ConfigError(f"top_k's k={metric.k} exceeds the model's {outputs} classes.")
        return
    ok_shape = y.shape[1:] == (outputs,) or (outputs == 1 and y.ndim == 1)
    if y.dtype.kind != "f" or not ok_shape:
        raise DataError(
            f"{where}: loss {loss.name} needs float targets [N, {outputs}]"
            f"{' or [N]' if outputs == 1 else ''} (the model's outputs); got {y.dtype} with "
            f"shape {y.shape}."
        )


def _check_label_dims(y: np.ndarray, sample_output: tuple[int, ...], where: str) -> None:
    """Labels shaped as the model's predictions, without their class axis."""
    want = sample_output[:-1]
    if tuple(y.shape[1:]) == want:
        return
    model = "[N, " + ", ".join(map(str, sample_output)) + "]"
    if not want:
        fix = " (one label per sample: y.reshape(-1))" if y.ndim == 2 and y.shape[1] == 1 else ""
        raise DataError(
            f"{where}: labels have shape {list(y.shape)}, but the model predicts {model}, one "
            f"class per sample: the labels must be [N]{fix}."
        )
    raise DataError(
        f"{where}: labels have shape {list(y.shape)}, but the model predicts {model}: the "
        f"labels must be [N, {', '.join(map(str, want))}], one class per position."
    )
