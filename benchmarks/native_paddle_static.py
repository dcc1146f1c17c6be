"""LeNet (or ResNet-18) on Fashion-MNIST written by hand as a PaddlePaddle static-graph
program, the way Paddle's static-mode tutorials train: ``paddle.enable_static()``, the
model and its loss built under ``program_guard``, ``optimizer.minimize``, one
``Executor.run`` per batch that feeds the batch and fetches the loss and the accuracy
count (read every step, as the dygraph loop reads them).

``VARIANTS``: Paddle's default kernels, or ``FLAGS_use_onednn`` (every op oneDNN has on
oneDNN's kernels, what a user who knows the flag sets). ``benchmarks.run`` times both in
its discarded round and keeps the faster as the reference (docs/performance.md,
"Paddle's static graph")."""

from __future__ import annotations

import warnings

import numpy as np
import paddle
from paddle import nn

from .common import Clock, Measurement, Workload, batches, initial_weights
from .native_paddle import MODELS

VARIANTS = {"default kernels": False, "FLAGS_use_onednn": True}


def run(work: Workload, x: np.ndarray, y: np.ndarray, onednn: bool = False) -> Measurement:
    paddle.enable_static()
    flags = paddle.get_flags(["FLAGS_use_onednn"])
    paddle.set_flags({"FLAGS_use_onednn": onednn})
    try:
        return _train(work, x, y)
    finally:
        paddle.set_flags(flags)
        paddle.disable_static()


def _train(work: Workload, x: np.ndarray, y: np.ndarray) -> Measurement:
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup), warnings.catch_warnings():
        # Paddle warns at its own code: BatchNorm2D at every training forward, its backward
        # asking a program value for its place
        warnings.filterwarnings("ignore", category=UserWarning, module=r"paddle\.")
        images = paddle.static.data("images", [work.batch_size, *x.shape[1:]], "float32")
        labels = paddle.static.data("labels", [work.batch_size], "int64")
        net = MODELS[work.model]()
        logits = net(images)
        loss = nn.CrossEntropyLoss()(logits, labels)
        correct = (logits.argmax(axis=1) == labels).astype("int64").sum()
        paddle.optimizer.Momentum(learning_rate=work.lr, momentum=work.momentum).minimize(loss)
    scope = paddle.static.Scope()
    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(startup, scope=scope)
    weights = initial_weights(work.seed, work.model)  # parameters and BatchNorm statistics
    for p, w in zip(net.state_dict().values(), weights, strict=True):
        value = w.T if w.ndim == 2 else w  # Paddle's Linear weight is [in, out]
        scope.find_var(p.name).get_tensor().set(np.ascontiguousarray(value), paddle.CPUPlace())
    clock = Clock(work)
    total_loss, hits = 0.0, 0
    last = float("nan")
    for step, (xb, yb) in enumerate(batches(x, y, work)):
        out = exe.run(main, feed={"images": xb, "labels": yb}, fetch_list=[loss, correct],
                      scope=scope)  # fmt: skip
        last = float(out[0])
        total_loss += last * len(yb)
        hits += int(out[1])
        clock.tick(step, lambda: None)  # fetching the loss already waited
    return clock.measurement("native_static", last)
