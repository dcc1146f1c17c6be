"""The jax backend beyond the conformance suite: the compiled step (fused with the update,
or not) equals the numpy backend's in float64, float32 programs stay float32 under the
scoped ``jax_enable_x64``, emulated devices past the count say how to get more, its Flax
msgpack files, and ``polytrain backends --json`` lists its declared capabilities."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from polytrain import get_backend
from polytrain.cli.main import main
from polytrain.errors import CheckpointError, ConfigError
from polytrain.neutral.dropout_masks import ParityMasks
from polytrain.neutral.models import Dropout, Flatten, Linear, ModelSpec, ReLU, seq
from polytrain.neutral.optim import OptimizerConfig
from polytrain.plugins.registry import installed_backends
from polytrain.testing.conformance import batch
from polytrain.training.step import StepRunner

if "jax" not in installed_backends():  # (jax itself is imported by the backend, after XLA_FLAGS)
    pytest.skip("the jax backend is not installed", allow_module_level=True)


def dropout_mlp() -> ModelSpec:
    layers = [("flatten", Flatten()), ("fc1", Linear(12, 16)), ("relu", ReLU())]
    layers += [("drop", Dropout(0.3)), ("fc2", Linear(16, 10))]
    return ModelSpec("dropout-mlp", seq(*layers), input_shape=(3, 2, 2))


def train(
    name: str, devices: str, accumulate: int, clip: float | None, fast: bool
) -> dict[str, Any]:
    """Three fp64 adam steps of a dropout MLP under parity masks: params and slots."""
    backend = get_backend(name, fast=fast)
    spec = dropout_mlp()
    model = backend.build_model(spec, backend.devices(devices), dtype="float64")
    backend.set_params(model, spec.init_params(seed=3))
    opt = backend.make_optimizer(model, OptimizerConfig(name="adam", lr=0.01, weight_decay=0.01))
    runner = StepRunner(backend, model, opt, precision="fp64", accumulate=accumulate,
                        clip_grad_norm=clip, dropout_masks=ParityMasks(seed=5))  # fmt: skip
    losses = []
    for i in range(3):
        x, y = batch(spec, 8, seed=i)
        opt.set_lr(0.01 / (i + 1))
        losses.append(runner.train_step(x, y).loss_sum)
    return {"params": backend.get_params(model), "slots": opt.get_slots(), "losses": losses}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("devices", "accumulate", "clip", "fast"),
    [
        ("cpu", 1, None, True),
        ("cpu", 1, 0.05, True),
        ("cpu", 2, None, True),
        ("cpu:2", 1, None, True),
        ("cpu", 1, None, False),
        ("cpu:2", 1, None, False),
    ],
    ids=["fused", "clipped", "accumulated", "two-devices", "fused-eager", "two-devices-eager"],
)
def test_steps_equal_numpy_in_float64(
    devices: str, accumulate: int, clip: float | None, fast: bool
) -> None:
    """The jit-compiled fused step (update in the same program), the unfused ones
    (clipping, micro-batches, replicas), and the same run op by op (--no-fast) equal the
    numpy backend to 1e-12: parameters, adam's slots, losses, with parity dropout masks
    and a learning rate that changes every step."""
    want, got = (train(n, devices, accumulate, clip, fast) for n in ("numpy", "jax"))
    np.testing.assert_allclose(got["losses"], want["losses"], rtol=0, atol=1e-12)
    for k, v in want["params"].items():
        np.testing.assert_allclose(got["params"][k], v, rtol=0, atol=1e-12, err_msg=k)
    for k, slots in want["slots"].items():
        for s, v in slots.items():
            np.testing.assert_allclose(got["slots"][k][s], v, rtol=0, atol=1e-12, err_msg=s)


@pytest.mark.slow
def test_float32_step_program_has_no_float64() -> None:
    """Under the scoped x64 flag every array has an explicit dtype: a float32 step's
    compiled program (forward, gradients, fused update) computes nothing in float64."""
    import jax

    backend = get_backend("jax", fast=True)
    spec = dropout_mlp()
    model = backend.build_model(spec)
    opt = backend.make_optimizer(model, OptimizerConfig(name="adam"))
    x, y = batch(spec, 4)
    runner = StepRunner(backend, model, opt)
    runner.train_step(x, y)
    (program,) = [p for k, p in model.programs.items() if not isinstance(k, str)]  # type: ignore[attr-defined]
    assert hasattr(program, "lower")  # jax.jit's
    from polytrain_jax._model import x64

    with x64():
        args = (model.params[0], model.buffers[0], backend.to_tensor(x), backend.to_tensor(y),  # type: ignore[attr-defined]
                (), backend._key, np.uint32(1), np.float32(0.25),  # type: ignore[attr-defined]
                (opt.slots[0], opt.scalars()))  # type: ignore[attr-defined]  # fmt: skip
        text = str(jax.make_jaxpr(program)(*args))
    assert "f32" in text and "f64" not in text


def test_devices_past_the_count_name_the_variable() -> None:
    backend = get_backend("jax")
    with pytest.raises(ConfigError, match="POLYTRAIN_JAX_DEVICES=100"):
        backend.device("cpu:99")


def test_flax_msgpack_files(tmp_path: Path) -> None:
    """Flax's bytes for a nested dict (what ``flax.serialization.to_bytes`` writes), read
    back by name; a truncated or foreign file is one CheckpointError."""
    from polytrain_jax._format import FlaxMsgpackFormat

    fmt = FlaxMsgpackFormat()
    values = np.array([1.0, 2.0], np.float32)
    data = fmt.encode({"a.b": values})
    payload = b"\x93\x91\x02\xa7float32\xc4\x08" + values.tobytes()
    assert data == b"\x81\xa1a\x81\xa1b\xc7" + bytes([len(payload), 1]) + payload
    assert fmt.sniff(data[:16], "x") and not fmt.sniff(b"\x80\x02}q\x00", "x")  # a pickle
    path = tmp_path / "w.msgpack"
    path.write_bytes(data)
    np.testing.assert_array_equal(fmt.read(path)["a.b"], values)
    path.write_bytes(data[:-3])
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        fmt.read(path)
    path.write_bytes(b"\x81\xa1a\xc1")  # msgpack's never-used byte
    with pytest.raises(CheckpointError, match="does not hold"):
        fmt.read(path)


def test_backends_json_lists_capabilities(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["backends", "--json"]) == 0
    report = {e["name"]: e for e in json.loads(capsys.readouterr().out) if "broken" not in e}
    jax_caps = report["jax"]["capabilities"]
    assert jax_caps["collectives"] == ["returned", "processes"]
    assert jax_caps["devices"] == ["cpu", "cpu:N"]
    assert {"LSTM", "MultiHeadSelfAttention", "Conv2d"} <= set(jax_caps["layers"])
    assert report["numpy"]["capabilities"]["collectives"] == ["in-place", "returned"]
    assert report["torch"]["capabilities"]["collectives"] == ["in-place", "returned", "processes"]
