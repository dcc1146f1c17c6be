"""LeNet on Fashion-MNIST in Keras 3, as a Keras user writes it: ``keras.Sequential``,
``compile`` (SGD, sparse categorical cross-entropy from logits, the accuracy metric,
``jit_compile`` left at Keras' default "auto": off on torch, XLA on jax) and ``fit``.

Runs only in the peers' own venv (``benchmarks/peers_venv.py``), with ``KERAS_BACKEND`` set
before the import. The model is polytrain's zoo LeNet layer for layer, loaded with the same
initial weights (``spec.init_params(seed)``, converted to Keras' kernel layouts) and fed the
same batches in the same order (``shuffle=False`` over the data already in polytrain's loader's
order), so its losses follow the other loops'. ``channels_first`` is the same memory layout
as torch's and the native loops'; ``channels_last`` (Keras' default) takes NHWC images and
the first dense layer's rows permuted to match.
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np

from .common import Clock, Measurement, Workload
from .peers_layouts import keras_weights, ordered


def lenet(data_format: str) -> keras.Sequential:
    """The zoo's LeNet: conv 1->20 k3, avgpool, conv 20->50 k5, avgpool, 800->128->10."""
    layers, df = keras.layers, data_format
    shape = (1, 28, 28) if df == "channels_first" else (28, 28, 1)
    return keras.Sequential(
        [
            keras.Input(shape),
            layers.Conv2D(20, 3, activation="relu", data_format=df),
            layers.AveragePooling2D(2, 2, data_format=df),
            layers.Conv2D(50, 5, activation="relu", data_format=df),
            layers.AveragePooling2D(2, 2, data_format=df),
            layers.Flatten(),  # the tensor's own order: C,H,W for channels_first
            layers.Dense(128, activation="relu"),
            layers.Dense(10),
        ]
    )


class StepClock(keras.callbacks.Callback):
    """Reads the loss every step (as the other loops do: it waits for the step) and ticks
    the :class:`Clock`. Keras reports the epoch's running mean, so the last batch's own loss
    is recovered from the last two means (equal batches)."""

    def __init__(self, work: Workload) -> None:
        super().__init__()
        self.clock = Clock(work)
        self.means: list[float] = []

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self.means.append(float((logs or {})["loss"]))
        self.clock.tick(batch, lambda: None)

    def last_loss(self) -> float:
        k = len(self.means)
        if k < 2:
            return self.means[-1]
        return k * self.means[-1] - (k - 1) * self.means[-2]


def run(work: Workload, x: np.ndarray, y: np.ndarray, data_format: str) -> Measurement:
    """One epoch of ``work.total_steps`` batches through ``model.fit``, timed after the
    warm-up steps (the first step traces and, on jax, compiles)."""
    model = lenet(data_format)
    model.set_weights(keras_weights(work.seed, data_format))
    momentum = work.momentum if work.optimizer == "momentum" else 0.0
    model.compile(
        optimizer=keras.optimizers.SGD(learning_rate=work.lr, momentum=momentum),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    xs, ys = ordered(x, y, work, data_format)
    clock = StepClock(work)
    model.fit(xs, ys, batch_size=work.batch_size, epochs=1, shuffle=False, verbose=0,
              callbacks=[clock])  # fmt: skip
    return clock.clock.measurement(
        f"keras_{data_format}", clock.last_loss(), jit_compile=bool(model.jit_compile)
    )
