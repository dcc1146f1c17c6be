"""Losses and the accuracy count as pure JAX functions: the cross-entropy verb (PyTorch's
``ignore_index`` rule) and the named losses of :mod:`polytrain.neutral.losses` (per sample
the mean over its output elements, then the reduction), in the outputs' dtype."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from polytrain.backend.reduction import reduce_samples
from polytrain.errors import ConfigError, DataError
from polytrain.neutral.losses import LossSpec, class_positions

from ._net import Array


def cross_entropy(
    logits: Array, labels: Array, reduction: str = "mean", ignore_index: int | None = None
) -> Array:
    """Softmax cross-entropy of labels [N] or [N, 1]; ignored samples give 0, and "mean"
    divides by the samples kept."""
    labels = labels.reshape(-1)
    logp = jax.nn.log_softmax(logits, axis=1)
    keep = None if ignore_index is None else labels != ignore_index
    safe = labels if keep is None else jnp.where(keep, labels, 0)
    nll = -jnp.take_along_axis(logp, safe[:, None].astype(jnp.int32), axis=1)[:, 0]
    if keep is None:
        return reduce_samples(nll, reduction)
    nll = jnp.where(keep, nll, jnp.zeros((), nll.dtype))
    return reduce_samples(nll, reduction, keep.sum().astype(nll.dtype))


def count_correct(logits: Array, labels: Array) -> Array:
    """Rows whose arg-max equals the label."""
    return (jnp.argmax(logits, axis=1) == labels.reshape(-1)).sum()


def _class_loss(spec: LossSpec, outputs: Array, targets: Array) -> Array:
    positions = class_positions(tuple(outputs.shape), tuple(targets.shape))
    classes = outputs.shape[-1]
    rows = outputs.reshape(-1, classes)
    labels = targets.reshape(-1).astype(jnp.int32)
    w = jnp.ones(classes, outputs.dtype)
    if spec.class_weights is not None:
        if len(spec.class_weights) != classes:
            raise ConfigError(
                f"class_weights has {len(spec.class_weights)} entries for {classes} classes."
            )
        w = jnp.asarray(spec.class_weights, outputs.dtype)
    eps = spec.label_smoothing
    a = (1.0 - eps) * jax.nn.one_hot(labels, classes, dtype=outputs.dtype) * w + (eps / classes) * w
    per_token = -(a * jax.nn.log_softmax(rows, axis=1)).sum(axis=1)
    return per_token.reshape(-1, positions).mean(axis=1)


def loss_per_sample(spec: LossSpec, outputs: Array, targets: Array) -> Array:
    """The canonical per-sample loss (:func:`polytrain.neutral.losses.loss_per_sample`)."""
    if spec.class_targets:
        return _class_loss(spec, outputs, targets)
    if targets.size != outputs.size:
        raise DataError(
            f"targets of shape {tuple(targets.shape)} do not match outputs of shape "
            f"{tuple(outputs.shape)}."
        )
    z = outputs.reshape(outputs.shape[0], -1)
    t = targets.reshape(z.shape).astype(z.dtype)
    if spec.name == "mse":
        return jnp.square(z - t).mean(axis=1)
    if spec.name == "l1":
        return jnp.abs(z - t).mean(axis=1)
    return (jnp.maximum(z, 0) - z * t + jnp.log1p(jnp.exp(-jnp.abs(z)))).mean(axis=1)


def named_loss(spec: LossSpec, outputs: Array, targets: Array, reduction: str = "sum") -> Array:
    """``spec`` over a batch; plain cross-entropy of class rows is the verb itself."""
    if spec.plain and class_positions(tuple(outputs.shape), tuple(targets.shape)) == 1:
        return cross_entropy(outputs, targets, reduction)
    return reduce_samples(loss_per_sample(spec, outputs, targets), reduction)
