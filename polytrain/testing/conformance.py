"""The backend conformance suite, shipped so third-party backends can run it.

Use it from a test module::

    from polytrain.testing.conformance import BackendConformance

    class TestMyBackend(BackendConformance):
        backend_name = "mine"

Every test checks the backend against numpy (:mod:`polytrain.neutral.reference`,
:mod:`polytrain.neutral.reference_grad`, :func:`polytrain.neutral.optim.numpy_step`):
every layer type of the neutral set forward and backward (gradients w.r.t. its input and
every parameter, :mod:`polytrain.testing.layer_cases`), then whole models, losses,
optimizers and files. Tests of optional capabilities (float64, per-layer outputs) skip,
with the reason, on a backend that does not declare them
(:mod:`polytrain.testing.capabilities`), and so do the tests of layer types, dtypes,
devices and collectives the backend's plugin does not declare
(:class:`polytrain.backend.capabilities.Capabilities`). Loaded as a pytest plugin (entry point
``pytest11``), it also fails the run, instead of skipping, when a backend listed in
``$POLYTRAIN_REQUIRE_BACKENDS`` is not installed, so CI cannot go green on an
empty install. ``POLYTRAIN_TEST_DEVICE=gpu:0`` runs the suite on that device
(:mod:`polytrain.testing.placement`).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest

from polytrain.backend.base import Backend
from polytrain.backend.collectives import Collectives
from polytrain.backend.inspection import Inspection
from polytrain.backend.native_io import NativeIO
from polytrain.errors import BackendError, CheckpointError, ConfigError
from polytrain.neutral import reference
from polytrain.neutral.models import (
    AvgPool2d,
    BatchNorm2d,
    Conv2d,
    Flatten,
    GlobalAvgPool2d,
    Linear,
    MaxPool2d,
    ModelSpec,
    ReLU,
    Residual,
    get_model_spec,
    seq,
)
from polytrain.neutral.optim import OPTIMIZERS, OptimizerConfig, numpy_step
from polytrain.plugins.registry import get_backend, installed_backends
from polytrain.testing.capabilities import (
    COLLECTIVES,
    EMULATED_DEVICES,
    FP64,
    INPLACE_COLLECTIVES,
    LAYER_OUTPUTS,
    NATIVE_IO,
    require,
    require_layers,
)
from polytrain.testing.layer_cases import LAYER_CASES, LayerCase, check_layer
from polytrain.testing.placement import on_test_device
from polytrain.training.step import StepRunner

FORWARD_ATOL = 1e-4
GRAD_ATOL = 1e-5


def required_backends() -> list[str]:
    """Backends this run must test (``$POLYTRAIN_REQUIRE_BACKENDS``, comma-separated)."""
    text = os.environ.get("POLYTRAIN_REQUIRE_BACKENDS", "")
    return [n.strip() for n in text.split(",") if n.strip()]


def backends_under_test() -> list[str]:
    """Installed backends, plus required ones (so a missing one fails, not skips)."""
    names = set(installed_backends()) | set(required_backends())
    only = os.environ.get("POLYTRAIN_TEST_BACKENDS")
    if only:
        names = {n.strip() for n in only.split(",") if n.strip()}
    return sorted(names)


def pytest_configure(config: Any) -> None:
    config.addinivalue_line("markers", "backend(name): test runs against one backend")


def pytest_sessionstart(session: Any) -> None:
    missing = [n for n in required_backends() if n not in installed_backends()]
    if missing:
        raise pytest.UsageError(
            f"POLYTRAIN_REQUIRE_BACKENDS lists {missing}, which are not installed. "
            "Install them (pip install 'polytrain[all]') or change the variable."
        )


def tiny_resnet() -> ModelSpec:
    """A two-block residual net with BatchNorm, small enough for a quick test."""
    body = seq(
        ("conv1", Conv2d(4, 8, 3, stride=2, padding=1)),
        ("bn1", BatchNorm2d(8)),
        ("relu", ReLU()),
        ("conv2", Conv2d(8, 8, 3, padding=1)),
        ("bn2", BatchNorm2d(8)),
    )
    return ModelSpec(
        "tiny-resnet",
        seq(
            ("conv1", Conv2d(1, 4, 3, padding=1)),
            ("bn1", BatchNorm2d(4)),
            ("relu", ReLU()),
            ("block", Residual(body, seq(("conv", Conv2d(4, 8, 1, stride=2))))),
            ("pool", MaxPool2d(2, 2)),
            ("gap", GlobalAvgPool2d()),
            ("flatten", Flatten()),
            ("fc", Linear(8, 10)),
        ),
        input_shape=(1, 12, 12),
        init="kaiming_normal",
    )


def pooling_spec(pool: AvgPool2d | MaxPool2d, size: int = 9) -> ModelSpec:
    """One conv then one pooling layer: pins a pooling configuration."""
    conv = Conv2d(1, 2, 1)
    k = pool.stride or pool.kernel_size
    out = reference.pool_output_size(
        size, pool.kernel_size, k, pool.padding, getattr(pool, "ceil_mode", False)
    )
    return ModelSpec(
        "pool",
        seq(
            ("conv", conv),
            ("pool", pool),
            ("flatten", Flatten()),
            ("fc", Linear(2 * out * out, 10)),
        ),
        input_shape=(1, size, size),
        init="fan_in_uniform",
    )


def batch(spec: ModelSpec, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A deterministic random batch for ``spec``."""
    rng = np.random.default_rng([seed, 12345])
    x = rng.standard_normal((n, *spec.input_shape)).astype(np.float32)
    y = rng.integers(0, spec.num_classes, n).astype(np.int64)
    return x, y


def loss_and_grads(
    backend: Backend, model: Any, x: np.ndarray, y: np.ndarray
) -> tuple[float, dict[str, np.ndarray]]:
    """One recorded forward/backward of the mean loss on device 0; returns numpy."""
    xt, yt = backend.to_tensor(x, model.devices[0]), backend.to_tensor(y, model.devices[0])
    with backend.record():
        logits = backend.forward(model, xt, train=True)
        loss = backend.cross_entropy(logits, yt, "mean")
    backend.backward(loss)
    return float(backend.to_numpy(loss)), backend.gradients(model)


class BackendConformance:
    """The contract of :class:`polytrain.backend.base.Backend`, checked against numpy."""

    backend_name: str = ""

    @pytest.fixture
    def backend(self) -> Backend:
        return on_test_device(get_backend(self.backend_name))  # $POLYTRAIN_TEST_DEVICE

    # -- devices and tensors ---------------------------------------------------------------

    def test_devices(self, backend: Backend) -> None:
        require(backend, EMULATED_DEVICES)
        assert backend.try_all_gpus(), "try_all_gpus must never be empty"
        assert backend.device_name(backend.try_gpu(99)) in ("cpu", "cpu:0")
        four = backend.devices("cpu:4")
        assert [backend.device_name(d) for d in four] == ["cpu:0", "cpu:1", "cpu:2", "cpu:3"]
        assert [backend.device_name(d) for d in backend.devices("cpu")] in (["cpu"], ["cpu:0"])
        with pytest.raises(ConfigError, match="cpu:N"):
            backend.devices("tpu:1")

    def test_tensor_round_trip(self, backend: Backend) -> None:
        require(backend, EMULATED_DEVICES)
        for dtype in (np.float32, np.int64):
            a = (np.arange(12).reshape(3, 4) * 3).astype(dtype)
            out = backend.to_numpy(backend.to_tensor(a, backend.device("cpu:1")))
            assert out.dtype == dtype
            np.testing.assert_array_equal(out, a)

    def test_split_and_load(self, backend: Backend) -> None:
        require(backend, EMULATED_DEVICES)
        devs = backend.devices("cpu:3")
        shards = backend.split_and_load(np.arange(10, dtype=np.float32), devs)
        got = [backend.to_numpy(s) for s in shards]
        assert [len(g) for g in got] == [4, 3, 3]
        np.testing.assert_array_equal(np.concatenate(got), np.arange(10, dtype=np.float32))
        with pytest.raises(ConfigError, match="2 samples over 3 devices"):
            backend.split_and_load(np.zeros((2, 1), np.float32), devs)

    @pytest.mark.parametrize("devices", ["cpu", "cpu:2"])
    def test_split_and_load_leaves_the_batch_as_it_was(
        self, backend: Backend, devices: str
    ) -> None:
        """A writeable C-ordered batch (which ``load_shard`` may share), a Fortran-ordered
        and a read-only one all load their values, and the caller's batch stays writeable
        (MXNet's ``from_numpy`` freezes the array it is given)."""
        if devices != "cpu":
            require(backend, EMULATED_DEVICES)
        batch = np.arange(24, dtype=np.float32).reshape(6, 4)
        read_only = batch.copy()
        read_only.flags.writeable = False
        for x in (batch, np.asfortranarray(batch), read_only):
            shards = backend.split_and_load(x, backend.devices(devices))
            got = np.concatenate([backend.to_numpy(s) for s in shards])
            np.testing.assert_array_equal(got, batch)
        assert batch.flags.writeable

    @pytest.mark.parametrize("op", ["sum", "mean"])
    def test_all_reduced(self, backend: Backend, op: str) -> None:
        """The collective every backend with collectives has: the results returned, one
        per device."""
        require(backend, EMULATED_DEVICES)
        require(backend, COLLECTIVES)
        collectives = Collectives.required(backend, "test_all_reduced")
        devs = backend.devices("cpu:3")
        tensors = [backend.to_tensor(np.full((2, 3), i + 1, np.float32), d)
                   for i, d in enumerate(devs)]  # fmt: skip
        got = collectives.all_reduced(tensors, op)
        want = np.full((2, 3), 6.0 if op == "sum" else 2.0, np.float32)
        assert len(got) == 3
        for t in got:
            np.testing.assert_allclose(backend.to_numpy(t), want, rtol=0, atol=1e-6)
        tensors = [backend.to_tensor(np.full((2, 3), i, np.float32), d) for i, d in enumerate(devs)]
        shares = collectives.broadcasted(tensors, src=2)
        for t in shares:
            np.testing.assert_array_equal(backend.to_numpy(t), np.full((2, 3), 2, np.float32))

    @pytest.mark.parametrize("op", ["sum", "mean"])
    def test_allreduce(self, backend: Backend, op: str) -> None:
        require(backend, EMULATED_DEVICES)
        require(backend, COLLECTIVES)
        require(backend, INPLACE_COLLECTIVES)
        devs = backend.devices("cpu:3")
        arrays = [np.full((2, 3), i + 1, np.float32) for i in range(3)]
        tensors = [backend.to_tensor(a, d) for a, d in zip(arrays, devs, strict=True)]
        Collectives.required(backend, "test_allreduce").allreduce(tensors, op)
        want = np.full((2, 3), 6.0 if op == "sum" else 2.0, np.float32)
        for t in tensors:
            np.testing.assert_allclose(backend.to_numpy(t), want, rtol=0, atol=1e-6)

    def test_broadcast(self, backend: Backend) -> None:
        require(backend, EMULATED_DEVICES)
        require(backend, COLLECTIVES)
        require(backend, INPLACE_COLLECTIVES)
        devs = backend.devices("cpu:3")
        tensors = [backend.to_tensor(np.full(4, i, np.float32), d) for i, d in enumerate(devs)]
        Collectives.required(backend, "test_broadcast").broadcast(tensors, src=1)
        for t in tensors:
            np.testing.assert_array_equal(backend.to_numpy(t), np.ones(4, np.float32))

    # -- every layer type: forward, and backward w.r.t. input and parameters ---------------

    @pytest.mark.parametrize("case", LAYER_CASES, ids=[c.id for c in LAYER_CASES])
    def test_layer_forward_and_backward(self, backend: Backend, case: LayerCase) -> None:
        require_layers(backend, case.layer)
        check_layer(backend, case, "float32")

    @pytest.mark.parametrize("case", LAYER_CASES, ids=[c.id for c in LAYER_CASES])
    def test_float64_layer_forward_and_backward(self, backend: Backend, case: LayerCase) -> None:
        require(backend, FP64)
        require_layers(backend, case.layer)
        check_layer(backend, case, "float64")

    # -- models: layout, forward, loss, gradients ------------------------------------------

    @pytest.mark.parametrize("name", ["lenet", "paddle-mnist", "mlp"])
    def test_params_round_trip(self, backend: Backend, name: str) -> None:
        spec = get_model_spec(name)
        model = backend.build_model(spec)
        got = backend.get_params(model)
        assert {k: v.shape for k, v in got.items()} == spec.parameter_shapes()
        init = spec.init_params(seed=3)
        backend.set_params(model, init)
        for k, v in backend.get_params(model).items():
            np.testing.assert_array_equal(v, init[k], err_msg=k)
        assert backend.parameter_names(model) == spec.trainable_names()

    def test_set_params_errors(self, backend: Backend) -> None:
        spec = get_model_spec("mlp")
        model = backend.build_model(spec)
        params = spec.init_params(0)
        bad = dict(params)
        bad["fc1.weight"] = np.zeros((3, 3), np.float32)
        with pytest.raises(CheckpointError, match=r"fc1\.weight"):
            backend.set_params(model, bad)
        missing = {k: v for k, v in params.items() if k != "fc2.bias"}
        with pytest.raises(CheckpointError, match=r"fc2\.bias"):
            backend.set_params(model, missing)

    @pytest.mark.parametrize("name", ["lenet", "paddle-mnist", "mlp", "tiny-resnet"])
    def test_forward_matches_numpy(self, backend: Backend, name: str) -> None:
        spec = tiny_resnet() if name == "tiny-resnet" else get_model_spec(name)
        require_layers(backend, spec.net)
        model = backend.build_model(spec)
        params = spec.init_params(seed=1)
        if name == "tiny-resnet":  # non-trivial running statistics
            rng = np.random.default_rng(5)
            for k in params:
                if k.endswith("running_mean"):
                    params[k] = rng.normal(0, 0.1, params[k].shape).astype(np.float32)
                if k.endswith("running_var"):
                    params[k] = rng.uniform(0.5, 2, params[k].shape).astype(np.float32)
        backend.set_params(model, params)
        x, _ = batch(spec, 5)
        got = backend.to_numpy(backend.forward(model, backend.to_tensor(x)))
        want = reference.forward(spec, params, x)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=FORWARD_ATOL)

    # -- float64 (--precision fp64, the parity mode) ----------------------------------------

    def test_float64_params_round_trip(self, backend: Backend) -> None:
        """A float64 model keeps float64 values (not representable in float32) exactly."""
        require(backend, FP64)
        spec = get_model_spec("lenet")
        model = backend.build_model(spec, dtype="float64")
        assert model.dtype == "float64"
        rng = np.random.default_rng(9)
        params = {k: rng.standard_normal(v.shape) for k, v in spec.init_params(0).items()}
        backend.set_params(model, params)
        got = backend.get_params(model)
        for k, v in got.items():
            assert v.dtype == np.float64, k
            np.testing.assert_array_equal(v, params[k], err_msg=k)
        with pytest.raises(BackendError, match="float32 or float64"):
            backend.build_model(spec, dtype="float16")

    @pytest.mark.parametrize("name", ["lenet", "tiny-resnet"])
    def test_float64_forward_matches_numpy(self, backend: Backend, name: str) -> None:
        require(backend, FP64)
        spec = tiny_resnet() if name == "tiny-resnet" else get_model_spec(name)
        model = backend.build_model(spec, dtype="float64")
        params = spec.init_params(seed=1)
        backend.set_params(model, params)
        x, _ = batch(spec, 5)
        got = backend.to_numpy(backend.forward(model, backend.to_tensor(x.astype(np.float64))))
        assert got.dtype == np.float64
        np.testing.assert_allclose(got, reference.forward(spec, params, x), rtol=0, atol=1e-12)

    @pytest.mark.parametrize("name", OPTIMIZERS)
    def test_float64_steps_match_numpy(self, backend: Backend, name: str) -> None:
        """fp64 through the StepRunner on two devices: three updates equal numpy's float64
        updates to 1e-12 (float32 agrees to ~1e-7), optimizer slots included."""
        require(backend, FP64)
        require(backend, EMULATED_DEVICES)
        spec = get_model_spec("mlp")
        config = OptimizerConfig(
            name=name, lr=0.1 if name != "adam" else 0.01, weight_decay=0.01, momentum=0.9
        )
        model = backend.build_model(spec, backend.devices("cpu:2"), dtype="float64")
        params = spec.init_params(seed=6)
        backend.set_params(model, params)
        opt = backend.make_optimizer(model, config)
        runner = StepRunner(backend, model, opt, precision="fp64")
        ref = {k: v.astype(np.float64) for k, v in params.items()}
        slots: dict[str, dict[str, np.ndarray]] = {}
        step = 0
        for i in range(3):
            x, y = batch(spec, 8, seed=i)
            result = runner.train_step(x, y)
            want = reference.cross_entropy(reference.forward(spec, ref, x), y)
            assert abs(result.loss_sum / result.samples - float(want)) < 1e-12
            grads = reference.mlp_gradients(spec, ref, x, y)
            step = numpy_step(config, ref, grads, slots, step)
        for replica in range(2):
            got = backend.get_params(model, replica)
            for k in ref:
                assert got[k].dtype == np.float64, k
                np.testing.assert_allclose(got[k], ref[k], rtol=0, atol=1e-12, err_msg=k)
        for k, st in opt.get_slots().items():
            for slot, value in st.items():
                np.testing.assert_allclose(
                    value, slots[k][slot], rtol=0, atol=1e-12, err_msg=f"{k}.{slot}"
                )

    @pytest.mark.parametrize(
        "pool",
        [
            AvgPool2d(3, 2, padding=1),
            AvgPool2d(3, 2, padding=1, ceil_mode=True),
            AvgPool2d(2, 2, ceil_mode=True),
            MaxPool2d(3, 2, padding=1),
        ],
        ids=["avg-pad", "avg-pad-ceil", "avg-ceil", "max-pad"],
    )
    def test_pooling_matches_canonical_rules(self, backend: Backend, pool: Any) -> None:
        spec = pooling_spec(pool)
        model = backend.build_model(spec)
        params = spec.init_params(seed=2)
        backend.set_params(model, params)
        x, _ = batch(spec, 2)
        got = backend.to_numpy(backend.forward(model, backend.to_tensor(x)))
        np.testing.assert_allclose(got, reference.forward(spec, params, x), atol=FORWARD_ATOL)

    def test_cross_entropy_and_accuracy(self, backend: Backend) -> None:
        rng = np.random.default_rng(0)
        logits = rng.standard_normal((7, 10)).astype(np.float32)
        labels = rng.integers(0, 10, 7).astype(np.int64)
        lt, yt = backend.to_tensor(logits), backend.to_tensor(labels)
        for reduction in ("mean", "sum", "none"):
            got = backend.to_numpy(backend.cross_entropy(lt, yt, reduction))
            want = reference.cross_entropy(logits, labels, reduction)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        column = backend.to_tensor(labels.reshape(-1, 1))
        np.testing.assert_allclose(
            backend.to_numpy(backend.cross_entropy(lt, column, "mean")),
            reference.cross_entropy(logits, labels),
            rtol=1e-5,
        )
        correct = int(backend.to_numpy(backend.count_correct(lt, yt)))
        assert correct == int((logits.argmax(1) == labels).sum())

    def test_cross_entropy_ignore_index_divides_by_kept(self, backend: Backend) -> None:
        """PyTorch's rule; Paddle's native mean divides by all samples, ignored included."""
        rng = np.random.default_rng(1)
        logits = rng.standard_normal((6, 10)).astype(np.float32)
        labels = np.array([3, -100, 7, 1, -100, 0], np.int64)
        lt, yt = backend.to_tensor(logits), backend.to_tensor(labels)
        for reduction in ("mean", "sum", "none"):
            got = backend.to_numpy(backend.cross_entropy(lt, yt, reduction, ignore_index=-100))
            want = reference.cross_entropy(logits, labels, reduction, ignore_index=-100)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=reduction)

    def test_gradients_match_numpy(self, backend: Backend) -> None:
        spec = get_model_spec("mlp")
        model = backend.build_model(spec)
        params = spec.init_params(seed=4)
        backend.set_params(model, params)
        x, y = batch(spec, 16)
        loss, grads = loss_and_grads(backend, model, x, y)
        want = reference.mlp_gradients(spec, params, x, y)
        assert (
            abs(loss - float(reference.cross_entropy(reference.forward(spec, params, x), y))) < 1e-5
        )
        for k, g in want.items():
            np.testing.assert_allclose(grads[k], g, rtol=1e-4, atol=GRAD_ATOL, err_msg=k)

    def test_scale_loss_normalises_by_global_batch(self, backend: Backend) -> None:
        spec = get_model_spec("mlp")
        model = backend.build_model(spec)
        params = spec.init_params(seed=4)
        backend.set_params(model, params)
        x, y = batch(spec, 12)
        xt, yt = backend.to_tensor(x), backend.to_tensor(y)
        with backend.record():
            loss = backend.cross_entropy(backend.forward(model, xt, train=True), yt, "sum")
            scaled = backend.scale_loss(loss, denominator=12)
        backend.backward(scaled)
        want = reference.mlp_gradients(spec, params, x, y)
        got = backend.gradients(model)
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=GRAD_ATOL, err_msg=k)

    def test_batchnorm_train_mode(self, backend: Backend) -> None:
        """Batch statistics in training; running stats with PyTorch's momentum and its
        unbiased running_var; eval mode uses the running stats."""
        spec = ModelSpec(
            "bn",
            seq(("bn", BatchNorm2d(3)), ("flatten", Flatten()), ("fc", Linear(48, 10))),
            input_shape=(3, 4, 4),
        )
        model = backend.build_model(spec)
        params = spec.init_params(seed=1)
        params["bn.weight"] = np.array([1.0, 2.0, 0.5], np.float32)
        params["bn.bias"] = np.array([0.1, -0.2, 0.3], np.float32)
        backend.set_params(model, params)
        x, _ = batch(spec, 6)
        x = x * np.array([1.0, 3.0, 0.5], np.float32)[None, :, None, None] + 2.0
        with backend.record():
            logits = backend.forward(model, backend.to_tensor(x), train=True)
        got_logits = backend.to_numpy(logits)
        mean = x.astype(np.float64).mean(axis=(0, 2, 3))
        var = x.astype(np.float64).var(axis=(0, 2, 3))
        n = x.shape[0] * x.shape[2] * x.shape[3]
        normed = (x - mean[None, :, None, None]) / np.sqrt(var[None, :, None, None] + 1e-5)
        h = (
            normed * params["bn.weight"][None, :, None, None]
            + params["bn.bias"][None, :, None, None]
        )
        want_logits = h.reshape(6, -1) @ params["fc.weight"].T + params["fc.bias"]
        np.testing.assert_allclose(got_logits, want_logits, rtol=1e-4, atol=1e-4)
        got = backend.get_params(model)
        np.testing.assert_allclose(got["bn.running_mean"], 0.1 * mean, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(
            got["bn.running_var"], 0.9 + 0.1 * var * n / (n - 1), rtol=1e-5, atol=1e-6
        )
        eval_logits = backend.to_numpy(backend.forward(model, backend.to_tensor(x)))
        np.testing.assert_allclose(
            eval_logits, reference.forward(spec, got, x), rtol=1e-4, atol=FORWARD_ATOL
        )

    # -- optimizers --------------------------------------------------------------------------

    @pytest.mark.parametrize("name", OPTIMIZERS)
    def test_optimizer_matches_numpy(self, backend: Backend, name: str) -> None:
        spec = get_model_spec("mlp")
        config = OptimizerConfig(
            name=name, lr=0.1 if name != "adam" else 0.01, weight_decay=0.01, momentum=0.9
        )
        model = backend.build_model(spec)
        params = spec.init_params(seed=6)
        backend.set_params(model, params)
        opt = backend.make_optimizer(model, config)
        ref = {k: v.astype(np.float64) for k, v in params.items()}
        slots: dict[str, dict[str, np.ndarray]] = {}
        step = 0
        for i in range(3):
            x, y = batch(spec, 8, seed=i)
            opt.zero_grad()
            loss_and_grads(backend, model, x, y)
            opt.step()
            grads = reference.mlp_gradients(
                spec, {k: v.astype(np.float32) for k, v in ref.items()}, x, y
            )
            step = numpy_step(config, ref, grads, slots, step)
        got = backend.get_params(model)
        for k in ref:
            np.testing.assert_allclose(got[k], ref[k], rtol=1e-4, atol=2e-5, err_msg=k)
        for k, st in opt.get_slots().items():
            for slot, value in st.items():
                np.testing.assert_allclose(
                    value, slots[k][slot], rtol=1e-4, atol=2e-5, err_msg=f"{k}.{slot}"
                )

    @pytest.mark.parametrize("name", ["sgd", "momentum"])
    def test_per_layer_weight_decay(self, backend: Backend, name: str) -> None:
        """L2 per layer (Paddle seed's per-layer regularisation): prefix match, numpy's rule."""
        spec = get_model_spec("mlp")
        config = OptimizerConfig(name=name, lr=0.1, weight_decay=0.01,
                                 per_layer_weight_decay={"fc1": 0.5, "fc2.bias": 0.0})  # fmt: skip
        model = backend.build_model(spec)
        params = spec.init_params(seed=11)
        backend.set_params(model, params)
        opt = backend.make_optimizer(model, config)
        ref = {k: v.astype(np.float64) for k, v in params.items()}
        slots: dict[str, dict[str, np.ndarray]] = {}
        x, y = batch(spec, 8)
        opt.zero_grad()
        loss_and_grads(backend, model, x, y)
        opt.step()
        grads = reference.mlp_gradients(spec, params, x, y)
        numpy_step(config, ref, grads, slots, 0)
        got = backend.get_params(model)
        for k in ref:
            np.testing.assert_allclose(got[k], ref[k], rtol=1e-4, atol=2e-5, err_msg=k)

    @pytest.mark.parametrize("name", ["momentum", "adam", "adagrad"])
    def test_optimizer_state_round_trip(self, backend: Backend, name: str) -> None:
        spec = get_model_spec("mlp")
        config = OptimizerConfig(name=name, lr=0.05)
        params = spec.init_params(seed=7)
        runs = []
        for resume in (False, True):
            model = backend.build_model(spec)
            backend.set_params(model, params)
            opt = backend.make_optimizer(model, config)
            for i in range(4):
                if resume and i == 2:  # rebuild everything from canonical state
                    saved_params, saved_opt = backend.get_params(model), opt.state_dict()
                    model = backend.build_model(spec)
                    backend.set_params(model, saved_params)
                    opt = backend.make_optimizer(model, config)
                    opt.load_state_dict(saved_opt)
                x, y = batch(spec, 8, seed=i)
                opt.zero_grad()
                loss_and_grads(backend, model, x, y)
                opt.step()
            runs.append(backend.get_params(model))
        for k in runs[0]:
            np.testing.assert_array_equal(runs[0][k], runs[1][k], err_msg=k)

    def test_learning_rate_change_is_canonical(self, backend: Backend) -> None:
        """lr multiplies outside the momentum buffer (MXNet's native SGD differs)."""
        spec = get_model_spec("mlp")
        config = OptimizerConfig(name="momentum", lr=0.1, momentum=0.9)
        model = backend.build_model(spec)
        params = spec.init_params(seed=8)
        backend.set_params(model, params)
        opt = backend.make_optimizer(model, config)
        ref = {k: v.astype(np.float64) for k, v in params.items()}
        slots: dict[str, dict[str, np.ndarray]] = {}
        step = 0
        for i, lr in enumerate((0.1, 0.01, 0.3)):
            x, y = batch(spec, 8, seed=i)
            opt.set_lr(lr)
            opt.zero_grad()
            loss_and_grads(backend, model, x, y)
            opt.step()
            grads = reference.mlp_gradients(
                spec, {k: v.astype(np.float32) for k, v in ref.items()}, x, y
            )
            step = numpy_step(config, ref, grads, slots, step, lr=lr)
        got = backend.get_params(model)
        for k in ref:
            np.testing.assert_allclose(got[k], ref[k], rtol=1e-4, atol=2e-5, err_msg=k)

    def test_layer_outputs_follow_the_forward(self, backend: Backend) -> None:
        """Per-layer outputs (for --inspect and NaN diagnosis) equal numpy's, by name."""
        require(backend, LAYER_OUTPUTS)
        spec = get_model_spec("lenet")
        model = backend.build_model(spec)
        params = spec.init_params(seed=2)
        backend.set_params(model, params)
        x, _ = batch(spec, 3)
        inspection = Inspection.required(backend, "test_layer_outputs_follow_the_forward")
        outputs = dict(inspection.layer_outputs(model, backend.to_tensor(x)))
        assert list(outputs) == [name for name, _ in spec.net.layers]
        h = x.astype(np.float64)
        for name, layer in spec.net.layers:
            h = reference._run(layer, name, params, h)
            np.testing.assert_allclose(outputs[name], h, rtol=1e-4, atol=FORWARD_ATOL, err_msg=name)

    # -- native files ------------------------------------------------------------------------

    def test_native_save_load(self, backend: Backend, tmp_path: Any) -> None:
        require(backend, NATIVE_IO)
        native = NativeIO.required(backend, "test_native_save_load")
        spec = get_model_spec("lenet")
        a, b = backend.build_model(spec), backend.build_model(spec)
        params = spec.init_params(seed=9)
        backend.set_params(a, params)
        path = str(tmp_path / f"model{native.native_suffix}")
        native.save_native(a, path)
        native.load_native(b, path)
        for k, v in backend.get_params(b).items():
            np.testing.assert_array_equal(v, params[k], err_msg=k)
        assert [p.name for p in tmp_path.iterdir()] == [f"model{native.native_suffix}"]
