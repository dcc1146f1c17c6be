"""The contract composed: ``Backend`` is the required core, and each optional capability
is an ABC of its own that a backend lists beside it, found by isinstance; a backend
without one gets one line naming it and what needed it, at setup."""

from __future__ import annotations

import numpy as np
import pytest
from toy_backends import COLLECTIVE_VERBS, NATIVE_IO_VERBS, core_verbs, toy_backend

from polytrain.backend.base import (
    CAPABILITIES,
    Backend,
    Collectives,
    Compilation,
    Inspection,
    NativeIO,
    Precision,
)
from polytrain.backend.discovery import Capability, MissingCapabilityError
from polytrain.data import ArrayDataset
from polytrain.errors import BackendError
from polytrain.neutral.models import get_model_spec
from polytrain.neutral.optim import OptimizerConfig
from polytrain.testing.conformance import batch
from polytrain.training.data import Datasets
from polytrain.training.inspection import StepInspector
from polytrain.training.pipeline import pipeline_backend
from polytrain.training.recipe import Recipe
from polytrain.training.step import StepRunner
from polytrain.training.trainer import Trainer

ALL = set(CAPABILITIES)
EXPECTED: dict[str, set[type[Capability]]] = {"numpy": ALL - {Compilation}}  # others: ALL


def has(backend: object) -> set[type[Capability]]:
    return {kind for kind in CAPABILITIES if kind.of(backend) is not None}


def test_backend_is_the_core_and_no_capability() -> None:
    """The capabilities are not in Backend's MRO, and none of them is a Backend."""
    assert not set(Backend.__mro__) & ALL
    assert not any(issubclass(kind, Backend) for kind in CAPABILITIES)
    assert Backend.__abstractmethods__.isdisjoint(
        {verb for kind in CAPABILITIES for verb in kind.__abstractmethods__}
    )


def test_each_backend_has_its_capabilities(backend: Backend) -> None:
    expected = EXPECTED.get(backend.name, ALL)
    assert has(backend) == expected
    assert has(pipeline_backend(backend, 2)) == expected  # the wrapper has what it wraps


def test_a_core_only_backend_has_none() -> None:
    backend = toy_backend(core_verbs())
    assert has(backend) == set()
    assert Collectives.of(backend) is None
    with pytest.raises(MissingCapabilityError, match="backend 'toy' has no collectives"):
        Collectives.required(backend, "this")


def test_a_backend_written_as_one_class_keeps_its_capabilities() -> None:
    """A Backend subclass defining the capability verbs itself (as before capabilities
    existed) has those capabilities, with their defaults (all_reduced, sync_gradients)."""
    verbs = core_verbs() + COLLECTIVE_VERBS + NATIVE_IO_VERBS + ["layer_outputs"]
    backend = toy_backend(verbs, name="old")
    assert has(backend) == {Collectives, NativeIO, Inspection}
    collectives = Collectives.required(backend, "this test")
    devs = backend.devices("cpu:2")
    tensors = [backend.to_tensor(np.full(2, i + 1, np.float32), d) for i, d in enumerate(devs)]
    for t in collectives.all_reduced(tensors, "sum"):
        np.testing.assert_array_equal(backend.to_numpy(t), [3, 3])


def test_a_backend_listing_one_capability_keeps_the_others_it_defines() -> None:
    verbs = core_verbs() + COLLECTIVE_VERBS + NATIVE_IO_VERBS
    assert has(toy_backend(verbs, (Collectives,))) == {Collectives, NativeIO}


def runner(backend: Backend, devices: str, **kw: object) -> StepRunner:
    spec = get_model_spec("mlp")
    model = backend.build_model(spec, backend.devices(devices))
    backend.set_params(model, spec.init_params(seed=0))
    opt = backend.make_optimizer(model, OptimizerConfig(name="sgd", lr=0.1))
    return StepRunner(backend, model, opt, **kw)  # type: ignore[arg-type]


def test_two_devices_without_collectives_is_one_line() -> None:
    """Was an AttributeError (no allreduce) in the first step's gradient sum."""
    backend = toy_backend(core_verbs())
    with pytest.raises(MissingCapabilityError) as caught:
        runner(backend, "cpu:2")
    assert str(caught.value) == (
        "backend 'toy' has no collectives (its class does not list "
        "polytrain.backend.base.Collectives), which training on 2 devices (cpu:0, cpu:1) "
        "needs: run without it, or on a backend that has it."
    )
    x, y = batch(get_model_spec("mlp"), 8)
    result = runner(backend, "cpu").train_step(x, y)  # one device needs no collectives
    assert np.isfinite(result.loss_sum)


def test_the_trainer_says_it_for_devices_cpu_2() -> None:
    rng = np.random.default_rng(0)
    data = ArrayDataset(rng.integers(0, 256, (32, 28, 28), dtype=np.uint8), rng.integers(0, 10, 32))
    recipe = Recipe(model="mlp", batch_size=16, epochs=1, devices="cpu:2")
    with pytest.raises(MissingCapabilityError, match="which training on 2 devices"):
        Trainer(
            recipe, toy_backend(core_verbs()), progress=False, datasets=Datasets(data, data)
        ).fit()


def test_inspect_without_inspection_is_one_line_at_setup() -> None:
    """Was a BackendError only when the first inspected step ran."""
    backend = toy_backend(core_verbs())
    model = backend.build_model(get_model_spec("mlp"))
    with pytest.raises(MissingCapabilityError, match=r"no per-layer outputs .* --inspect 1,5"):
        StepInspector("1,5", backend, model, backend.device("cpu"))
    StepInspector(None, backend, model, backend.device("cpu"))  # not asked: fine


def test_precision_without_the_capability_is_fp32_only() -> None:
    backend = toy_backend(core_verbs())
    with pytest.raises(BackendError, match=r"cannot train in bf16 .* no mixed precision"):
        runner(backend, "cpu", precision="bf16")
    assert Precision.of(backend) is None
