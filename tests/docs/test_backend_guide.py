"""docs/backends.md's checklist is the contract: its required verbs are exactly the
abstract ones of ``Backend`` (the required core), and a toy backend made of those verbs
alone (each one handed to the numpy backend) builds and passes part of the conformance
suite and a training step; with the ``Collectives`` capability listed, on two devices."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import toy_backends

from polytrain import get_backend
from polytrain.backend.base import Backend, Collectives
from polytrain.neutral.models import get_model_spec
from polytrain.neutral.optim import OptimizerConfig
from polytrain.testing.conformance import BackendConformance, batch
from polytrain.testing.layer_cases import LAYER_CASES
from polytrain.training.step import StepRunner

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "backends.md"


def checklist_verbs() -> list[str]:
    """The ``- `verb``` lines of the guide's Checklist section."""
    text = GUIDE.read_text().split("\n## Checklist\n", 1)[1]
    return re.findall(r"^- `(\w+)`$", text, flags=re.MULTILINE)


def toy_backend(verbs: list[str], collectives: bool = False) -> Backend:
    """A backend class with only ``verbs`` (and, with ``collectives``, that capability
    and its two verbs), each handed to a numpy backend."""
    if collectives:
        return toy_backends.toy_backend(verbs + toy_backends.COLLECTIVE_VERBS, (Collectives,))
    return toy_backends.toy_backend(verbs)


def test_the_checklist_is_the_abstract_verbs() -> None:
    verbs = checklist_verbs()
    assert len(verbs) == len(set(verbs))
    assert set(verbs) == set(Backend.__abstractmethods__)
    with pytest.raises(TypeError, match="abstract"):
        toy_backend(verbs[1:])  # one verb short: refused when built


def test_a_toy_backend_from_the_checklist_conforms() -> None:
    backend = toy_backend(checklist_verbs())
    suite = BackendConformance()
    suite.test_forward_matches_numpy(backend, "lenet")
    suite.test_gradients_match_numpy(backend)
    suite.test_optimizer_matches_numpy(backend, "adam")
    suite.test_layer_forward_and_backward(backend, next(c for c in LAYER_CASES if c.id == "conv"))
    with pytest.raises(pytest.skip.Exception, match="does not list Collectives"):
        suite.test_all_reduced(backend, "sum")
    suite.test_all_reduced(toy_backend(checklist_verbs(), collectives=True), "sum")


def test_a_toy_backend_trains_as_its_framework_does() -> None:
    """The step verb's default (built from the checklist's verbs) gives the numpy
    backend's own step on two devices (summed by the Collectives' default)."""
    spec = get_model_spec("mlp")
    results = []
    for backend in (toy_backend(checklist_verbs(), collectives=True), get_backend("numpy")):
        model = backend.build_model(spec, backend.devices("cpu:2"))
        backend.set_params(model, spec.init_params(seed=2))
        opt = backend.make_optimizer(model, OptimizerConfig(name="momentum", lr=0.1))
        runner = StepRunner(backend, model, opt)
        x, y = batch(spec, 8)
        results.append((runner.train_step(x, y), backend.get_params(model, 1)))
    (toy_step, toy_params), (step, params) = results
    assert (toy_step.loss_sum, toy_step.metric_sum) == (step.loss_sum, step.metric_sum)
    for k, v in params.items():
        np.testing.assert_array_equal(toy_params[k], v, err_msg=k)


def test_what_a_plugin_does_not_declare_is_skipped_with_the_reason(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A toy plugin declaring no LSTM, no float64, no cpu:N or only returned collectives:
    those tests of the suite skip, each naming what is missing; a declared layer runs."""
    from polytrain.backend.capabilities import Capabilities
    from polytrain.plugins.info import BackendInfo
    from polytrain.testing import capabilities

    backend = toy_backend(checklist_verbs(), collectives=True)
    suite = BackendConformance()
    lstm = next(c for c in LAYER_CASES if c.id == "lstm")
    no_lstm = tuple(n for n in Capabilities().layers if n != "LSTM")
    cases = [
        (Capabilities(layers=no_lstm), "layer types LSTM",
         lambda: suite.test_layer_forward_and_backward(backend, lstm)),
        (Capabilities(dtypes=("float32",)), "fp64: its plugin's capabilities list no float64",
         lambda: suite.test_float64_forward_matches_numpy(backend, "lenet")),
        (Capabilities(devices=("cpu",)), "emulated devices: its devices are cpu:",
         lambda: suite.test_split_and_load(backend)),
        (Capabilities(collectives=("returned",)), "in-place collectives",
         lambda: suite.test_allreduce(backend, "sum")),
    ]  # fmt: skip
    for declared, reason, run in cases:
        info = BackendInfo("toy", "numpy", "numpy", lambda o: backend, capabilities=declared)
        monkeypatch.setattr(capabilities, "registered_backends", lambda i=info: {"toy": i})
        with pytest.raises(pytest.skip.Exception, match=f"backend 'toy' does not declare {reason}"):
            run()
    suite.test_layer_forward_and_backward(backend, next(c for c in LAYER_CASES if c.id == "gru"))
