"""The static fast path: a model's training step as a Paddle static program.

Under ``--fast`` (or when the automatic mode chooses it) the step verb
(:meth:`PaddleBackend.loss_and_gradients`) runs one program, built once per batch shape
from the neutral spec (``_static_net``): feed the batch and the loss's scale, forward,
the summed loss, backward, fetch the loss (and the accuracy count or the outputs) and
the gradients. Its convolutions run oneDNN (``_onednn``), which Paddle's dygraph never
does. The program reads the eager layer's own tensors: the scope holds each parameter
and buffer under the eager tensor's name, sharing its memory, so the eager model (its
evaluation, checkpoints, ``get_params``/``set_params``, the optimizer) always sees the
values the program trains, and the reverse. The gradients land in the eager
parameters' ``.grad``, where every gradient verb and the optimizer read them.

What the program does not build (another layer kind, several devices or processes,
mixed precision, float64) trains eagerly: :meth:`StaticStep.refusal` says why, once.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import paddle
from paddle.base.framework import _dygraph_guard

from polytrain.backend.autodiff import ShardStep
from polytrain.backend.identity import CompileProfile
from polytrain.neutral.losses import LossSpec

from . import _onednn
from ._model import PaddleModel
from ._static_net import NetBuilder, Params, StaticUnsupported

TOOL = "Paddle's static graph"
# what Paddle's C++ logs (glog, on fd 2) when a program is built and first run: dropped
NOISE = re.compile(
    r"^[IW]\d{4} [\d:.]+ +\d+ (pir_interpreter|onednn_context|eager_utils)\.cc:\d+\]"
)


@dataclass
class _Program:
    """One built training program and the values it fetches."""

    main: Any
    fetch: list[Any]  # loss sum, count or outputs, then one gradient per trained parameter
    trained: list[int]  # indices (into StaticStep.trainable) of the parameters with a gradient


class StaticStep:
    """The static training step of one model (replica 0, one process)."""

    def __init__(self, backend: Any, model: PaddleModel) -> None:
        self.backend = backend
        self.model = model
        layer = model.replicas[0]
        self.tensors = dict(layer.state_dict())  # key -> eager tensor (parameters, buffers)
        # the DenseTensor behind each eager tensor: its holder changes when set_value runs
        self.dense = {t.name: t.value().get_tensor() for t in self.tensors.values()}
        by_name = dict(layer.named_parameters())
        self.trainable = [(n, by_name[n]) for n in model.names]
        self.onednn = _onednn.available() and model.dtype == "float32"
        self.scope = paddle.static.Scope()
        self.executor = paddle.static.Executor(paddle.CPUPlace())
        self.programs: dict[tuple[Any, ...], _Program] = {}
        self._fetched: set[int] = set()  # buffers the last run's gradients live in

    def refusal(self) -> str | None:
        """Why this model's steps cannot run static (None: they can)."""
        model = self.model
        if model.num_devices != 1 or self.backend.world_size != 1:
            return "several devices or processes"
        if model.dtype != "float32":
            return f"{model.dtype} parameters (the static path is float32: oneDNN has no float64)"
        if self.backend.options.precision != "fp32":
            return f"precision {self.backend.options.precision} (the static path is float32)"
        return None

    def run(self, x: Any, y: Any, loss: LossSpec, scale: float, count: bool) -> ShardStep:
        """One shard's forward, loss and backward; the gradients are added to ``.grad``."""
        why = self.refusal()
        if why is not None:
            raise StaticUnsupported(why)
        key = (tuple(x.shape), str(x.dtype), tuple(y.shape), str(y.dtype), repr(loss), count)
        first = key not in self.programs
        with quiet_native_log() if first else contextlib.nullcontext():
            if first:
                try:
                    self.programs[key] = self._build(x, y, loss, count)
                except StaticUnsupported:
                    raise
                except Exception as exc:  # an op or loss Paddle cannot build statically
                    raise StaticUnsupported(f"Paddle could not build the program ({exc})") from exc
            out = self._execute(self.programs[key], x, y, scale)
        self._from_scope()
        value = paddle.to_tensor(np.array(out[0]))
        extra = paddle.to_tensor(np.array(out[1]))
        self._set_gradients(self.programs[key], out[2:])
        return ShardStep(value, None if count else extra, extra if count else None)

    def _execute(self, program: _Program, x: Any, y: Any, scale: float) -> list[Any]:
        self._detach_gradients()
        self._to_scope()
        feed = {"x": np.asarray(x.numpy()), "y": np.asarray(y.numpy()),
                "scale": np.asarray([scale], self.model.dtype)}  # fmt: skip
        with _dygraph_guard(None):
            return list(self.executor.run(program.main, feed=feed, fetch_list=program.fetch,
                                          scope=self.scope, return_numpy=False))  # fmt: skip

    # -- programs ---------------------------------------------------------------------------

    def _build(self, x: Any, y: Any, loss: LossSpec, count: bool) -> _Program:
        main, startup = paddle.static.Program(), paddle.static.Program()
        dtype = self.model.dtype
        with _dygraph_guard(None), paddle.static.program_guard(main, startup), \
                warnings.catch_warnings():  # fmt: skip
            # Paddle's own backward asks a program value for its place, and warns
            warnings.filterwarnings("ignore", category=UserWarning, module=r"paddle\.")
            xv = paddle.static.data("x", list(x.shape), _dtype(x))
            yv = paddle.static.data("y", list(y.shape), _dtype(y))
            scale = paddle.static.data("scale", [1], dtype)
            params = Params(self.tensors)
            assert self.model.spec is not None  # refusal() checked
            outputs = NetBuilder(params, self.onednn, dtype)(self.model.spec.net, xv)
            total = self.backend.loss(outputs, yv, loss, "sum")
            extra = self.backend.count_correct(outputs, yv) if count else outputs
            keys = {t.name: k for k, t in self.tensors.items()}
            values = [params.get(keys[p.name]) for _, p in self.trainable]
            grads = paddle.static.gradients([total * scale], values)
            trained = [i for i, g in enumerate(grads) if g is not None]
            fetch = [total, extra, *(grads[i] for i in trained)]
            if self.onednn:
                fetch = _onednn.place(main, fetch)
        return _Program(main, fetch, trained)

    # -- the eager tensors ------------------------------------------------------------------

    def _to_scope(self) -> None:
        """Before a run: every scope variable shares its eager tensor's memory (again where
        an eager ``set_value`` gave the tensor new memory)."""
        for name, dense in self.dense.items():
            held = self.scope.var(name).get_tensor()
            if not held._is_initialized() or held._ptr() != dense._ptr():
                held._share_data_with(dense)

    def _from_scope(self) -> None:
        """After a run: an eager tensor whose variable the program gave new memory (rather
        than writing in place) shares that memory."""
        for name, dense in self.dense.items():
            held = self.scope.find_var(name).get_tensor()
            if held._ptr() != dense._ptr():
                dense._share_data_with(held)

    def _detach_gradients(self) -> None:
        """A ``.grad`` still sharing the last run's fetched buffer (a micro-batch whose
        gradient is being accumulated) gets its own copy: the next run overwrites it."""
        if not self._fetched:
            return
        for _, p in self.trainable:
            if p.grad is not None and p.grad.data_ptr() in self._fetched:
                p._set_grad_ivar(p.grad.clone())

    def _set_gradients(self, program: _Program, grads: Sequence[Any]) -> None:
        self._fetched = set()
        for i, dense in zip(program.trained, grads, strict=True):
            _, p = self.trainable[i]
            grad = paddle.Tensor(dense)  # no copy
            self._fetched.add(grad.data_ptr())
            if p.grad is None:
                p._set_grad_ivar(grad)
            else:
                with paddle.no_grad():
                    p.grad.add_(grad)


@contextlib.contextmanager
def quiet_native_log() -> Iterator[None]:
    """Hold fd 2 (where Paddle's C++ logs) in a file while a program is built and first
    run, then write back every line but Paddle's executor and oneDNN start-up notes."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            text = held.read().decode("utf-8", "replace")
            kept = [line for line in text.splitlines(True) if not NOISE.match(line)]
            sys.stderr.write("".join(kept))


def _dtype(tensor: Any) -> str:
    return str(tensor.dtype).removeprefix("paddle.")


def warn_eager(why: str) -> None:
    """Say once, on stderr, that a model asked to run static trains eagerly."""
    print(f"polytrain: paddle static graph not used: {why}; training eagerly.", file=sys.stderr)


def build_step(backend: Any, model: PaddleModel) -> StaticStep | None:
    """The static step of ``model``, or None (said on stderr) where it cannot have one."""
    step = StaticStep(backend, model)
    why = step.refusal()
    if why is None:
        why = _unbuildable(step, model)
    if why is not None:
        warn_eager(why)
        return None
    return step


def _unbuildable(step: StaticStep, model: PaddleModel) -> str | None:
    """Why the spec has no static program (None: it has): a trial build of its forward."""
    assert model.spec is not None
    try:
        with _dygraph_guard(None):
            probe = paddle.static.Program()
            with paddle.static.program_guard(probe, paddle.static.Program()):
                x = paddle.static.data("x", [1, *model.spec.input_shape], model.dtype)
                NetBuilder(Params(step.tensors), False, model.dtype)(model.spec.net, x)
    except StaticUnsupported as exc:
        return str(exc)
    return None


def profile() -> CompileProfile | None:
    """The static path's measured costs (docs/performance.md, "Paddle's static graph"):
    None where this Paddle has no oneDNN (the static path then gains nothing)."""
    if not _onednn.available():
        return None
    return PROFILE


#: LeNet, float32, 2 threads (docs/performance.md, "Paddle's static graph"): the static step
#: against Paddle's eager one (batch 256), and the one-off: the first static step (building
#: the program, placing oneDNN, its kernels' set-up) over the first eager step, at batch 32
#: where it is largest. Paddle keeps no compiled program across processes: one cost, cold
#: or warm. Provisional: one-off scripts on a shared machine; to be remeasured on a quiet
#: one (the commands are in that section).
PROFILE = CompileProfile(tool=TOOL, speedup=3.0, cold_s=0.15, warm_s=0.15, eager_sample_s=8e-4)
