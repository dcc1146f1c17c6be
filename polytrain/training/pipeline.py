"""Model parallelism: a model's top-level layers cut into two stages on two devices.

``--pipeline-split N`` puts the first ``N`` top-level layers of the spec on
``devices[0]`` and the rest on ``devices[1]``; the forward pass hands the activation
over with :meth:`Backend.copy_to`, which is differentiable, so one backward pass runs
through both stages, and each stage's optimizer updates its own parameters where they
live. This is the seed's encoder-on-GPU-0, decoder-on-GPU-1 recipe, for any spec: a
model too big for one device still trains, with the same numbers as unsplit (only the
place of each layer changes; the stage boundary adds no arithmetic).

Stages are plain models built by the backend from sub-specs that keep the layer names,
so canonical parameter names, checkpoints and optimizer state are those of the unsplit
model. :func:`pipeline_backend` wraps a backend so that the recipe loop (``StepRunner``,
``Trainer``) runs a split model with no change: the verbs that touch a model are
redefined here over the stages, every other verb is the framework backend's own. A
model verb not redefined here refuses a split model instead of misreading it.

The stages run one after the other (no micro-batch overlap as in GPipe): with
``--accumulate K`` the micro-batches go through the stages in turn.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np

from polytrain.backend.base import CAPABILITIES, Backend, Device, Model, Tensor
from polytrain.backend.collectives import Collectives
from polytrain.backend.devices import DeviceSeq
from polytrain.backend.discovery import Capability
from polytrain.backend.mismatch import compare_names
from polytrain.backend.precision_verbs import Precision
from polytrain.errors import BackendError, ConfigError
from polytrain.neutral.models import ModelSpec, Sequential
from polytrain.neutral.optim import Optimizer, OptimizerConfig


@dataclass
class PipelineModel(Model):
    """A split model: ``devices`` is ``[input device]`` (data goes there, as to one
    replica); ``stages[i]`` is the backend's model of stage ``i`` on ``stage_devices[i]``."""

    stages: list[Model] = field(default_factory=list)
    stage_devices: list[Device] = field(default_factory=list)
    stage_names: list[list[str]] = field(default_factory=list)  # canonical names per stage


def split_spec(spec: ModelSpec, split: int) -> tuple[ModelSpec, ModelSpec]:
    """The two stage specs: top-level layers ``[:split]`` and ``[split:]``, names kept."""
    layers = spec.net.layers
    if not 1 <= split < len(layers):
        names = ", ".join(f"{i}:{name}" for i, (name, _) in enumerate(layers))
        raise ConfigError(
            f"--pipeline-split {split} does not cut {spec.name!r}: give 1..{len(layers) - 1}, "
            f"the index of the first layer of stage 2 among its top-level layers ({names})."
        )
    first = dataclasses.replace(spec, name=f"{spec.name}[:{split}]", net=Sequential(layers[:split]))
    second = dataclasses.replace(
        spec, name=f"{spec.name}[{split}:]", net=Sequential(layers[split:])
    )
    return first, second


def pipeline_backend(backend: Backend, split: int) -> Backend:
    """``backend`` with models built and run as two stages (see the module docstring)."""
    if type(backend).copy_to is Backend.copy_to:
        raise BackendError(
            f"Backend {backend.name!r} cannot move activations between devices (no copy_to), "
            "so it cannot split a model: drop --pipeline-split."
        )
    kinds = tuple(kind for kind in CAPABILITIES if isinstance(backend, kind))
    return cast(Backend, pipeline_class(kinds)(backend, split))


@functools.cache
def pipeline_class(kinds: tuple[type[Capability], ...]) -> type[PipelineBackend]:
    """:class:`PipelineBackend`, registered as the capabilities ``kinds`` (those of the
    backend it wraps), so the core finds them on the wrapper as on that backend."""
    cls = type("PipelineBackend", (PipelineBackend,), {})
    for kind in kinds:
        kind.register(cls)
    return cls


class PipelineBackend:
    """A backend whose models are two-stage pipelines; see :func:`pipeline_backend`."""

    def __init__(self, inner: Backend, split: int) -> None:
        self.inner = inner
        self.split = split

    def __getattr__(self, name: str) -> Any:
        value = getattr(self.inner, name)
        if name.startswith("_") or not callable(value):
            return value

        @functools.wraps(value)
        def refuse_split_models(*args: Any, **kwargs: Any) -> Any:
            if any(isinstance(a, PipelineModel) for a in (*args, *kwargs.values())):
                raise BackendError(
                    f"{self.inner.name} backend: {name}() does not work on a model split by "
                    "--pipeline-split; train it unsplit (same parameter names) for that."
                )
            return value(*args, **kwargs)

        return refuse_split_models

    def __repr__(self) -> str:
        return f"PipelineBackend({self.inner!r}, split={self.split})"

    # -- building -------------------------------------------------------------------------

    def build_model(
        self, model: ModelSpec | Any, devices: DeviceSeq | None = None, *, dtype: str = "float32"
    ) -> Model:
        if not isinstance(model, ModelSpec):
            raise BackendError("--pipeline-split splits polytrain model specs, not native modules.")
        devices = list(devices or [])
        if len(devices) != 2:
            raise ConfigError(
                f"--pipeline-split needs exactly two devices, one per stage; got {len(devices)} "
                "(use --devices cpu:2 to emulate them, or gpu:0,1)."
            )
        specs = split_spec(model, self.split)
        stages = [
            self.inner.build_model(s, [d], dtype=dtype) for s, d in zip(specs, devices, strict=True)
        ]
        return PipelineModel(
            native=[s.native for s in stages],
            devices=devices[:1],
            replicas=[],  # no replica holds the whole model
            spec=model,
            stages=stages,
            stage_devices=devices,
            stage_names=[list(s.parameter_shapes()) for s in specs],
            dtype=dtype,
        )

    # -- parameters -----------------------------------------------------------------------

    def get_params(self, model: PipelineModel) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        for stage in model.stages:
            out.update(self.inner.get_params(stage))
        return out

    def set_params(self, model: PipelineModel, params: dict[str, np.ndarray]) -> None:
        known = [n for names in model.stage_names for n in names]
        compare_names(known, params).check("Parameters do not match the model")
        for stage, names in zip(model.stages, model.stage_names, strict=True):
            self.inner.set_params(stage, {n: params[n] for n in names})

    def parameter_names(self, model: PipelineModel) -> list[str]:
        return [n for stage in model.stages for n in self.inner.parameter_names(stage)]

    # -- running --------------------------------------------------------------------------

    def forward(
        self, model: PipelineModel, x: Tensor, *, replica: int = 0, train: bool = False
    ) -> Tensor:
        if replica != 0:
            raise BackendError("A pipeline-split model has one replica (replica 0).")
        first, second = model.stages
        hidden = self.inner.forward(first, x, train=train)
        hidden = self.inner.copy_to(hidden, model.stage_devices[1])
        return self.inner.forward(second, hidden, train=train)

    def loss_and_gradients(self, model: PipelineModel, *args: Any, **kwargs: Any) -> Any:
        """The step verb's default, over the stages' :meth:`forward` (the inner backend's
        own step verb runs one model, not two stages)."""
        return Backend.loss_and_gradients(cast(Backend, self), model, *args, **kwargs)

    def gradients(self, model: PipelineModel, replica: int = 0) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        for stage in model.stages:
            out.update(self.inner.gradients(stage, replica))
        return out

    def replica_gradients(self, model: PipelineModel) -> list[list[Tensor]]:
        return [g for stage in model.stages for g in self.inner.replica_gradients(stage)]

    def sync_gradients(self, model: PipelineModel) -> None:
        inner = cast(Collectives, self.inner)  # registered as Collectives only if it is
        for stage in model.stages:  # across processes; each stage has one device
            inner.sync_gradients(stage)

    def unscale_gradients(self, model: PipelineModel, inv_scale: float) -> bool:
        inner = cast(Precision, self.inner)  # registered as Precision only if it is
        finite = [inner.unscale_gradients(stage, inv_scale) for stage in model.stages]
        return all(finite)

    def scale_gradients(self, model: PipelineModel, factor: float) -> None:
        for stage in model.stages:
            self.inner.scale_gradients(stage, factor)

    def clip_gradients(self, model: PipelineModel, limit: float) -> None:
        for stage in model.stages:
            self.inner.clip_gradients(stage, limit)

    def grad_norm(self, model: PipelineModel) -> float:
        return math.sqrt(sum(self.inner.grad_norm(stage) ** 2 for stage in model.stages))

    def make_optimizer(self, model: PipelineModel, config: OptimizerConfig) -> Optimizer:
        parts = [self.inner.make_optimizer(stage, config) for stage in model.stages]
        return PipelineOptimizer(config, parts, model.stage_names)


class PipelineOptimizer(Optimizer):
    """One backend optimizer per stage, stepping together under one lr and step count."""

    def __init__(
        self, config: OptimizerConfig, parts: list[Optimizer], names: list[list[str]]
    ) -> None:
        super().__init__(config)
        self.parts = parts
        self.names = names

    def _share(self) -> None:
        for part in self.parts:
            part.lr, part.step_count = self.lr, self.step_count

    def step(self) -> None:
        self._share()
        for part in self.parts:
            part.step()
        self.step_count += 1

    def zero_grad(self) -> None:
        for part in self.parts:
            part.zero_grad()

    def get_slots(self) -> dict[str, dict[str, np.ndarray]]:
        out: dict[str, dict[str, np.ndarray]] = {}
        for part in self.parts:
            out.update(part.get_slots())
        return out

    def set_slots(self, slots: dict[str, dict[str, np.ndarray]]) -> None:
        self._share()  # Adam's bias correction reads the step count
        for part, names in zip(self.parts, self.names, strict=True):
            part.set_slots({n: slots[n] for n in names if n in slots})


Backend.register(PipelineBackend)  # isinstance(wrapped, Backend) holds, as for any backend
