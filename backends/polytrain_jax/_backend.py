"""The jax backend: the Backend contract over JAX's pure functions and immutable arrays.

A spec becomes one pure function (:mod:`._net`); the training step is the step verb
(:meth:`JaxBackend.loss_and_gradients`) as one ``jax.jit``-compiled program
(:mod:`._step`), the optimizer's update another, or the same program when fused.
Emulated devices ``cpu:K`` are XLA host devices (their count fixed before jax is
imported: :mod:`._env`). Collectives return new arrays (declared: ``collectives=("returned",
"processes")``); across processes through ``jax.distributed`` (:mod:`._processes`).
fp32 and fp64 (``jax_enable_x64`` scoped: :func:`._model.x64`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from polytrain.backend.autodiff import ShardStep
from polytrain.backend.base import (
    Backend,
    Collectives,
    Compilation,
    Device,
    Inspection,
    Model,
    NativeIO,
    Precision,
    check_params,
)
from polytrain.backend.collectives import check_reduce_op
from polytrain.backend.devices import split_device_name
from polytrain.backend.functional import FunctionalOps
from polytrain.backend.identity import CompileProfile
from polytrain.backend.precision import PrecisionSupport, check_dtype
from polytrain.distributed.cluster import ClusterInfo
from polytrain.errors import BackendError, ConfigError
from polytrain.neutral import dropout_masks
from polytrain.neutral.losses import LossSpec
from polytrain.neutral.models import ModelSpec, is_buffer
from polytrain.neutral.optim import Optimizer, OptimizerConfig
from polytrain.utils.fileio import atomic_write_bytes

from . import _env, _losses, _processes, _rnn_layers, _seq_layers  # noqa: F401  (the builders register)
from ._layout import build_fast_layout, wants_channels_last
from ._masks import KeyMasks, dropout_calls, parity_masks
from ._model import JaxDevice, JaxModel, Speculative, x64
from ._net import Context, build
from ._optim import JaxOptimizer
from ._recorded import (
    GradHandle,
    Recorded,
    ReplayedMasks,
    ReplicaLeaf,
    lift,
    recorded_forward,
    value,
)
from ._step import StepKind, eval_program, step_program

JOIN_TIMEOUT = 120.0  # seconds, for a launched job's processes to meet
#: LeNet, batch 256, fp32, 2 threads, on the shared 2-core machine under load 7 (two
#: rounds of 8 steps after 2 untimed; figures ~8x slower than on a quiet machine, alike for
#: both modes): jit 400-506 ms per step against 644-687 op by op; the first step and one
#: evaluation batch compile in 2.0-2.1 s; jax keeps no persistent cache here (warm = cold)
#: op by op, jax compiles each op on first use: a 2-process LeNet's first eager step took
#: ~50 s under load 14, the jitted one ~18 s
PROFILE = CompileProfile(
    tool="jax.jit", speedup=1.4, cold_s=2.0, warm_s=2.0, eager_sample_s=0.0026,
    eager_compiles=True,
)  # fmt: skip


class JaxBackend(Backend, Collectives, Precision, NativeIO, Inspection, Compilation):
    name = "jax"
    framework = "jax"
    native_suffix = ".msgpack"
    compiled_mode = "jax.jit"

    def __init__(self, options: Any = None) -> None:
        super().__init__(options)
        _processes.join_if_launched(JOIN_TIMEOUT)  # before jax runs anything here
        self.seed(0)

    # -- identity, threads, seeds ---------------------------------------------------------

    def version(self) -> str:
        return str(jax.__version__)

    def threads(self) -> dict[str, int]:
        return {"intra_op": _env.THREADS or 1}

    def set_threads(self, n: int) -> None:
        """XLA sizes its thread pool when jax loads (from the count exported then)."""

    def seed(self, seed: int) -> None:
        self._seed = seed
        self._key_made: Any = None  # made at first use: jax.distributed must be joined
        self._draws = 0  # before jax runs anything

    @property
    def _key(self) -> Any:
        if self._key_made is None:
            with x64():
                self._key_made = jax.random.PRNGKey(self._seed)
        return self._key_made

    def synchronize(self) -> None:
        (jax.device_put(0.0) + 0).block_until_ready()

    def compile_profile(self) -> CompileProfile | None:
        return PROFILE

    # -- devices and tensors --------------------------------------------------------------

    def gpu_count(self) -> int:
        return 0

    def device(self, name: str) -> Device:
        kind, index = split_device_name(name)
        if kind != "cpu":
            raise BackendError(f"The jax backend here has no GPU ({name!r}): use cpu or cpu:K.")
        hosts = jax.local_devices(backend="cpu")
        if index is not None and index >= len(hosts):
            raise ConfigError(
                f"Device {name!r}: jax started with {len(hosts)} host device(s) (XLA reads "
                f"XLA_FLAGS once): set {_env.DEVICES_ENV}={index + 1} or more, or, where jax "
                f"is imported before polytrain, XLA_FLAGS={_env.COUNT_FLAG}={index + 1}."
            )
        return JaxDevice(name, hosts[index or 0])

    def device_name(self, device: Device) -> str:
        return str(device)

    def to_tensor(self, array: np.ndarray, device: Device | None = None) -> Any:
        target = (device or self.device("cpu")).device
        with x64():
            return jax.device_put(np.array(array, copy=True, order="C"), target)

    def to_numpy(self, tensor: Any) -> np.ndarray:
        return np.array(value(tensor), copy=True)

    # -- collectives: new arrays ----------------------------------------------------------

    def allreduce(self, tensors: Sequence[Any], op: str) -> None:
        """In place only on the gradients of functional parameters (handles that
        :meth:`JaxOps.grad` gives, d2l's all-reduce); arrays are immutable."""
        if not (tensors and all(isinstance(t, GradHandle) for t in tensors)):
            raise BackendError(
                "jax arrays are immutable: the jax backend cannot reduce in place; use "
                "Backend.all_reduced, which returns the reduced arrays."
            )
        for t, total in zip(tensors, self.all_reduced(tensors, op), strict=True):
            t.set(total)

    def broadcast(self, tensors: Sequence[Any], src: int = 0) -> None:
        if not (tensors and all(isinstance(t, GradHandle) for t in tensors)):
            raise BackendError(
                "jax arrays are immutable: the jax backend cannot broadcast in place; use "
                "Backend.broadcasted, which returns the arrays."
            )
        for t, copy in zip(tensors, self.broadcasted(tensors, src), strict=True):
            t.set(copy)

    def all_reduced(self, tensors: Sequence[Any], op: str) -> list[Any]:
        check_reduce_op(op)
        arrays = [value(t) for t in tensors]
        with x64():
            total, count = _summed_here(arrays), len(arrays)
            if self.world_size > 1:  # then over the processes, in one fixed order
                total, count = _processes.summed(total), count * self.world_size
            if op == "mean":
                total = total / count
            return [jax.device_put(total, _device_of(a)) for a in arrays]

    def broadcasted(self, tensors: Sequence[Any], src: int = 0) -> list[Any]:
        arrays = [value(t) for t in tensors]
        source = arrays[src]
        if self.world_size > 1:
            with x64():
                source = _processes.from_rank0(source)
        return [jax.device_put(source, _device_of(a)) for a in arrays]

    # -- models ---------------------------------------------------------------------------

    def build_model(
        self, model: ModelSpec | Any, devices: Sequence[Device] | None = None, *,
        dtype: str = "float32",
    ) -> Model:  # fmt: skip
        check_dtype(dtype)
        if not isinstance(model, ModelSpec):
            raise BackendError(
                f"The jax backend builds polytrain ModelSpecs, not {type(model).__name__}: "
                "describe the model as a spec."
            )
        placed = list(devices) if devices else [self.device("cpu")]
        platforms = [d.device.platform for d in placed]
        fast_layout = wants_channels_last(dtype, platforms)
        apply = build_fast_layout(model.net) if fast_layout else build(model.net)
        shapes = model.parameter_shapes()
        m = JaxModel(apply, placed, [apply] * len(placed), model, dtype, apply=apply, shapes=shapes)
        with x64():
            for d in placed:
                arrays = {
                    n: jax.device_put(np.zeros(s, dtype), d.device) for n, s in shapes.items()
                }
                m.params.append({n: a for n, a in arrays.items() if not is_buffer(n)})
                m.buffers.append({n: a for n, a in arrays.items() if is_buffer(n)})
        m.zero_grads(one_backward=False)
        return m

    def get_params(self, model: Model, replica: int = 0) -> dict[str, np.ndarray]:
        m = JaxModel.of(model)
        state = m.state(replica)
        return {n: np.array(state[n]) for n in m.shapes}

    def set_params(self, model: Model, params: dict[str, np.ndarray]) -> None:
        m = JaxModel.of(model)
        check_params(m.shapes, params, tuple)
        with x64():
            for i, d in enumerate(m.devices):
                put = {
                    n: jax.device_put(np.asarray(params[n], dtype=m.dtype), d.device)
                    for n in m.shapes
                }
                m.params[i] = {n: put[n] for n in m.params[i]}
                m.buffers[i] = {n: put[n] for n in m.buffers[i]}

    def parameter_names(self, model: Model) -> list[str]:
        return list(JaxModel.of(model).params[0])

    def _input(self, x: Any, m: JaxModel, replica: int) -> Any:
        x = value(x)
        if not isinstance(x, jax.Array):
            x = jax.device_put(np.asarray(x), m.devices[replica].device)
        return x.astype(m.dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x

    def _compiled(self, m: JaxModel, key: Any, make: Callable[[], Callable[..., Any]]) -> Any:
        """The model's program ``key``, made once: jit-compiled unless --no-fast."""
        if key not in m.programs:
            program = make()
            m.programs[key] = jax.jit(program) if self.fast else program
        return m.programs[key]

    def forward(self, model: Model, x: Any, *, replica: int = 0, train: bool = False) -> Any:
        m = JaxModel.of(model)
        with x64():
            assert m.apply is not None
            apply = m.apply
            if not train:
                run = self._compiled(m, "eval", lambda: eval_program(apply))
                return run(m.state(replica), self._input(x, m, replica))
            return self._recorded_forward(m, x, replica)

    def _recorded_forward(self, m: JaxModel, x: Any, replica: int) -> Recorded:
        assert m.apply is not None
        apply, buffers = m.apply, m.buffers[replica]
        key = self._next_key()
        parity = ReplayedMasks()
        xv = self._input(x, m, replica)

        def run(p: dict[str, Any], masks: Any, xin: Any) -> tuple[Any, dict[str, Any]]:
            ctx = Context(train=True, mask=masks)
            return apply(p | buffers, xin, ctx), ctx.updates

        def source() -> Any:
            return parity.replay() if parity.masks else KeyMasks(key)

        first = parity if dropout_masks.parity_active() else KeyMasks(key)
        y, updates = run(m.params[replica], first, xv)
        m.buffers[replica] = buffers | updates
        leaf = ReplicaLeaf(m, replica)
        return recorded_forward(leaf, y, lambda p, xin: run(p, source(), xin)[0], x, xv)

    def _next_key(self) -> Any:
        self._draws += 1
        return jax.random.fold_in(self._key, self._draws)

    def layer_outputs(self, model: Model, x: Any) -> list[tuple[str, np.ndarray]]:
        m = JaxModel.of(model)
        captured: list[tuple[str, np.ndarray]] = []
        with x64():
            x = self._input(x, m, 0)
            assert m.apply is not None
            hook = lambda name, y: captured.append((name, np.array(y)))  # noqa: E731
            m.apply(m.state(0), x, Context(train=False, hook=hook))
        return captured

    def make_optimizer(self, model: Model, config: OptimizerConfig) -> Optimizer:
        return JaxOptimizer(model, config, compiled=self.fast)

    # -- losses, gradients ---------------------------------------------------------------

    def cross_entropy(
        self, logits: Any, labels: Any, reduction: str = "mean", ignore_index: int | None = None
    ) -> Any:
        y = _beside(labels, logits)
        return self._lift(lambda z: _losses.cross_entropy(z, y, reduction, ignore_index), logits)

    def loss(self, outputs: Any, targets: Any, loss: LossSpec, reduction: str = "sum") -> Any:
        y = _beside(targets, outputs)
        return self._lift(lambda z: _losses.named_loss(loss, z, y, reduction), outputs)

    def _lift(self, f: Callable[[Any], Any], x: Any) -> Any:
        with x64():
            return lift(f, x)

    def count_correct(self, logits: Any, labels: Any) -> Any:
        with x64():
            return _losses.count_correct(value(logits), _beside(labels, logits))

    def sum_counts(self, counts: Sequence[Any]) -> Any:
        with x64():
            return jnp.sum(jnp.stack([jnp.asarray(value(c)) for c in counts]), axis=0)

    def backward(self, loss: Any) -> None:
        if not isinstance(loss, Recorded):
            raise BackendError(
                "jax backend: backward needs a loss computed from a training forward pass "
                "(forward(..., train=True)) or from functional parameters."
            )
        with x64():
            values = {k: leaf.current() for k, leaf in loss.leaves.items()}
            fn = loss.fn if loss.ndim == 0 else lambda v: loss.fn(v).sum()  # one element
            if loss.value.size != 1:
                raise BackendError(f"jax backend: backward of a loss of shape {loss.shape}.")
            grads = jax.grad(fn)(values)
            for k, leaf in loss.leaves.items():
                leaf.accumulate(grads[k])

    def loss_and_gradients(
        self, model: Model, xs: Sequence[Any], ys: Sequence[Any], *, loss: LossSpec,
        denominator: int, loss_scale: float = 1.0, count_correct: bool = False,
        autocast: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext,
    ) -> list[ShardStep]:  # fmt: skip
        m = JaxModel.of(model)
        opt = m.optimizer
        fused = m.one_backward and m.num_devices == 1 and opt is not None and m.grads[0] is None
        kind = StepKind(loss, count_correct, fused)
        steps = []
        with x64(), autocast():
            for i, (x, y) in enumerate(zip(xs, ys, strict=True)):
                x = self._input(x, m, i)
                program = self._compiled(m, kind, lambda: step_program(m.apply, kind, opt))  # type: ignore[arg-type]
                masks = tuple(parity_masks(self._dropout_calls(m, x), m.dtype))
                scale = np.asarray(loss_scale / denominator, m.dtype)
                extra = (opt.slots[0], opt.scalars()) if fused and opt is not None else ()
                self._draws += 1
                r = program(m.params[i], m.buffers[i], x, value(y), masks, self._key,
                            np.uint32(self._draws), scale, extra)  # fmt: skip
                m.buffers[i] = r["buffers"]
                m.add_grads(i, r["grads"])
                if fused and opt is not None:
                    new_params, new_slots = r["update"]
                    m.speculative = Speculative(m.grads[0], new_params, new_slots, opt.lr,  # type: ignore[arg-type]
                                                opt.step_count + 1)  # fmt: skip
                steps.append(ShardStep(r["loss"], r.get("outputs"), r.get("correct")))
        return steps

    def _dropout_calls(self, m: JaxModel, x: Any) -> list[tuple[tuple[int, ...], float]]:
        """The shapes of a training pass's dropout calls (only under parity masks)."""
        if not dropout_masks.parity_active():
            return []
        key = ("dropout-calls", tuple(x.shape), str(x.dtype))
        if key not in m.programs:
            state, apply = m.state(0), m.apply
            assert apply is not None
            m.programs[key] = dropout_calls(  # type: ignore[assignment]
                lambda rec: apply(state, x, Context(train=True, mask=rec))
            )
        return m.programs[key]  # type: ignore[return-value]

    def gradients(self, model: Model, replica: int = 0) -> dict[str, np.ndarray]:
        m = JaxModel.of(model)
        grads = m.grads[replica]
        if grads is None:
            return {n: np.zeros(np.shape(p), m.dtype) for n, p in m.params[replica].items()}
        return {n: np.array(g) for n, g in grads.items()}

    def replica_gradients(self, model: Model) -> list[list[Any]]:
        m = JaxModel.of(model)
        if any(g is None for g in m.grads):
            return []
        return [[g[n] for g in m.grads] for n in m.params[0]]  # type: ignore[index]

    def sync_gradients(self, model: Model) -> None:
        """Sum over the replicas, then over the processes in one flat collective."""
        m = JaxModel.of(model)
        if (m.num_devices == 1 and self.world_size == 1) or any(g is None for g in m.grads):
            return
        with x64():
            per_param = self.replica_gradients(m)
            totals = [_summed_here(replicas) for replicas in per_param]
            if self.world_size > 1:
                totals = _processes.summed_together(totals)
            names = list(m.params[0])
            m.grads = [
                {
                    n: jax.device_put(t, _device_of(r[i]))
                    for n, t, r in zip(names, totals, per_param, strict=True)
                }
                for i in range(m.num_devices)
            ]

    def _map_grads(self, model: Model, f: Callable[[Any], Any]) -> None:
        m = JaxModel.of(model)
        with x64():
            m.grads = [None if g is None else {n: f(a) for n, a in g.items()} for g in m.grads]

    def scale_gradients(self, model: Model, factor: float) -> None:
        self._map_grads(model, lambda g: g * factor)

    def clip_gradients(self, model: Model, limit: float) -> None:
        self._map_grads(model, lambda g: jnp.clip(g, -limit, limit))

    def unscale_gradients(self, model: Model, inv_scale: float) -> bool:
        self._map_grads(model, lambda g: g * inv_scale)
        grads = JaxModel.of(model).grads
        return all(bool(jnp.isfinite(a).all()) for g in grads if g for a in g.values())

    def copy_to(self, tensor: Any, device: Device) -> Any:
        """``tensor`` on ``device``; recorded, so backward carries its gradient back."""
        with x64():
            return lift(lambda a: jax.device_put(a, device.device), tensor)

    def functional(self) -> FunctionalOps:
        from ._ops import JaxOps

        return JaxOps(self)

    # -- precision, processes -------------------------------------------------------------

    def precision_support(self, device: Device | None = None) -> dict[str, PrecisionSupport]:
        why = "the jax backend implements no mixed precision (fp32 and fp64 only)"
        return {
            "fp32": PrecisionSupport("fp32", True),
            "bf16": PrecisionSupport("bf16", False, why),
            "fp16": PrecisionSupport("fp16", False, why),
            "fp64": PrecisionSupport("fp64", True, "float64 under jax_enable_x64 (parity mode)"),
        }

    def init_distributed(
        self, info: ClusterInfo, devices: Sequence[Device], timeout: float = 120.0
    ) -> None:
        """Join ``info``'s job (if :meth:`devices` did not already) with Gloo's CPU
        collectives; :meth:`all_reduced` and :meth:`broadcasted` then span it."""
        _processes.join(info, timeout)
        self.rank, self.world_size = info.rank, info.world_size

    def shutdown_distributed(self) -> None:
        _processes.leave()
        self.rank, self.world_size = 0, 1

    # -- native files ---------------------------------------------------------------------

    def save_native(self, model: Model, path: str) -> None:
        from ._format import FlaxMsgpackFormat

        atomic_write_bytes(path, FlaxMsgpackFormat().encode(self.get_params(model)))

    def load_native(self, model: Model, path: str) -> None:
        from ._format import FlaxMsgpackFormat

        self.set_params(model, FlaxMsgpackFormat().read(path))


def _summed_here(arrays: Sequence[Any]) -> Any:
    """The sum of one process's replicas, in their order, on the first one's device."""
    home = _device_of(arrays[0])
    total = value(arrays[0])
    for a in arrays[1:]:
        total = total + jax.device_put(value(a), home)
    return total


def _device_of(tensor: Any) -> Any:
    (device,) = value(tensor).devices()
    return device


def _beside(targets: Any, outputs: Any) -> Any:
    """``targets`` on the device of ``outputs`` (a pipeline's last stage computes them)."""
    y, z = value(targets), value(outputs)
    if isinstance(y, jax.Array) and isinstance(z, jax.Array) and y.devices() != z.devices():
        with x64():
            return jax.device_put(y, _device_of(z))
    return y
