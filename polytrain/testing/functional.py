"""Conformance of :class:`polytrain.backend.functional.FunctionalOps`, shipped for
third-party backends.

Use it from a test module, next to :class:`polytrain.testing.conformance.BackendConformance`::

    from polytrain.testing.functional import FunctionalConformance

    class TestMyFunctional(FunctionalConformance):
        backend_name = "mine"

Every op is checked against numpy (:mod:`polytrain.neutral.reference`); the d2l scratch LeNet
is checked against the reference forward and against the backend's own native LeNet;
and d2l's hand-written data-parallel step (per-device parameter copies, gradients
summed with ``Backend.allreduce``, SGD on every device) must equal one device with the
whole batch.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from polytrain.backend.base import Backend, Device
from polytrain.backend.collectives import Collectives
from polytrain.backend.functional import FunctionalOps, Tensor
from polytrain.neutral import reference
from polytrain.neutral.models import get_model_spec
from polytrain.plugins.registry import get_backend
from polytrain.testing.conformance import FORWARD_ATOL, GRAD_ATOL

# d2l's LeNet parameters, in d2l's own layout: dense weights are [in, out].
D2L_LENET_SHAPES: list[tuple[int, ...]] = [
    (20, 1, 3, 3),
    (20,),
    (50, 20, 5, 5),
    (50,),
    (800, 128),
    (128,),
    (128, 10),
    (10,),
]


def d2l_lenet_params(seed: int = 0, scale: float = 0.01) -> list[np.ndarray]:
    """d2l's scratch initialisation: weights N(0, scale), biases zero, float32."""
    rng = np.random.default_rng(seed)
    return [
        (rng.normal(0.0, scale, s) if len(s) > 1 else np.zeros(s)).astype(np.float32)
        for s in D2L_LENET_SHAPES
    ]


def d2l_to_canonical(params: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
    """The same weights as the ``lenet`` spec's canonical parameters (Linear [out, in])."""
    w1, b1, w2, b2, w3, b3, w4, b4 = params
    return {
        "conv1.weight": w1,
        "conv1.bias": b1,
        "conv2.weight": w2,
        "conv2.bias": b2,
        "fc1.weight": np.ascontiguousarray(w3.T),
        "fc1.bias": b3,
        "fc2.weight": np.ascontiguousarray(w4.T),
        "fc2.bias": b4,
    }


def lenet(ops: FunctionalOps, x: Tensor, params: Sequence[Tensor]) -> Tensor:
    """d2l's functional LeNet of the multi-GPU chapter."""
    h1 = ops.avg_pool2d(ops.relu(ops.conv2d(x, params[0], params[1])), 2, 2)
    h2 = ops.avg_pool2d(ops.relu(ops.conv2d(h1, params[2], params[3])), 2, 2)
    h3 = ops.relu(ops.add(ops.matmul(ops.flatten(h2), params[4]), params[5]))
    return ops.add(ops.matmul(h3, params[6]), params[7])


def scratch_train_batch(
    backend: Backend,
    ops: FunctionalOps,
    x: np.ndarray,
    y: np.ndarray,
    device_params: Sequence[Sequence[Tensor]],
    devices: Sequence[Device],
    lr: float,
) -> None:
    """d2l's ``train_batch``: each shard's summed loss on its device, gradients summed
    over devices, SGD with the whole batch size on every device."""
    xs, ys = backend.split_and_load(x, devices), backend.split_and_load(y, devices)
    with backend.record():
        losses = [
            backend.cross_entropy(lenet(ops, xi, w), yi, "sum")
            for xi, yi, w in zip(xs, ys, device_params, strict=True)
        ]
    for loss in losses:
        backend.backward(loss)
    collectives = Collectives.required(backend, "d2l's multi-device scratch program")
    with ops.no_grad():
        for i in range(len(device_params[0])):
            collectives.allreduce([ops.grad(params[i]) for params in device_params], "sum")
    for params in device_params:
        ops.sgd_(params, lr, len(x))


def backward_of_sum(backend: Backend, ops: FunctionalOps, p: Tensor, device: Device) -> None:
    """Backpropagate the sum of the 2-d parameter ``p`` (its gradient: ones), written
    with the ops themselves as ``ones_row @ p @ ones_column``."""
    rows, cols = (int(n) for n in p.shape)
    left = backend.to_tensor(np.ones((1, rows), np.float32), device)
    right = backend.to_tensor(np.ones((cols, 1), np.float32), device)
    with backend.record():
        total = ops.matmul(ops.matmul(left, p), right)
    backend.backward(total)


def _data(shape: tuple[int, ...], seed: int) -> np.ndarray:
    return np.random.default_rng([seed, 777]).standard_normal(shape).astype(np.float32)


def _labels(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng([seed, 778]).integers(0, 10, n).astype(np.int64)


class FunctionalConformance:
    """The contract of :class:`~polytrain.backend.functional.FunctionalOps`, checked
    against numpy."""

    backend_name: str = ""

    @pytest.fixture
    def backend(self) -> Backend:
        return get_backend(self.backend_name)

    @pytest.fixture
    def ops(self, backend: Backend) -> FunctionalOps:
        ops = backend.functional()
        assert isinstance(ops, FunctionalOps)
        return ops

    # -- parameters, gradients, copies ------------------------------------------------------

    def test_parameter_is_an_independent_leaf(self, backend: Backend, ops: FunctionalOps) -> None:
        devs = backend.devices("cpu:2")
        a = _data((3, 4), 0)
        p = ops.parameter(a, devs[0])
        a[:] = 0  # a copy, not a view of the numpy array
        np.testing.assert_array_equal(backend.to_numpy(p), _data((3, 4), 0))
        np.testing.assert_array_equal(backend.to_numpy(ops.grad(p)), np.zeros((3, 4)))
        q = ops.parameter(p, devs[1])  # d2l's get_params: p.to(device).requires_grad_()
        backward_of_sum(backend, ops, q, devs[1])
        ops.sgd_([q], lr=1.0, batch_size=1)
        np.testing.assert_array_equal(backend.to_numpy(p), _data((3, 4), 0))
        np.testing.assert_allclose(backend.to_numpy(q), _data((3, 4), 0) - 1.0, atol=1e-6)

    def test_gradients_accumulate_until_zero_grad(
        self, backend: Backend, ops: FunctionalOps
    ) -> None:
        dev = backend.device("cpu")
        p = ops.parameter(_data((2, 5), 1), dev)
        backward_of_sum(backend, ops, p, dev)
        backward_of_sum(backend, ops, p, dev)
        np.testing.assert_array_equal(backend.to_numpy(ops.grad(p)), np.full((2, 5), 2.0))
        ops.zero_grad(p)
        np.testing.assert_array_equal(backend.to_numpy(ops.grad(p)), np.zeros((2, 5)))

    def test_sgd_updates_in_place_and_zeroes_gradients(
        self, backend: Backend, ops: FunctionalOps
    ) -> None:
        a, dev = _data((2, 5), 2), backend.device("cpu")
        p = ops.parameter(a, dev)
        for _ in range(3):
            backward_of_sum(backend, ops, p, dev)
        before = p
        ops.sgd_([p], lr=0.2, batch_size=4)
        assert p is before
        np.testing.assert_allclose(backend.to_numpy(p), a - 0.2 * 3 / 4, rtol=0, atol=1e-7)
        np.testing.assert_array_equal(backend.to_numpy(ops.grad(p)), np.zeros((2, 5)))

    def test_gradients_match_numpy(self, backend: Backend, ops: FunctionalOps) -> None:
        """A two-layer perceptron written with the ops: gradients of the mean loss."""
        spec = get_model_spec("mlp")
        canonical = spec.init_params(seed=4)
        x, y = _data((16, 1, 28, 28), 3), _labels(16, 3)
        dev = backend.device("cpu")
        w1 = ops.parameter(canonical["fc1.weight"].T, dev)
        b1 = ops.parameter(canonical["fc1.bias"], dev)
        w2 = ops.parameter(canonical["fc2.weight"].T, dev)
        b2 = ops.parameter(canonical["fc2.bias"], dev)
        xt, yt = backend.to_tensor(x, dev), backend.to_tensor(y, dev)
        with backend.record():
            h = ops.relu(ops.add(ops.matmul(ops.flatten(xt), w1), b1))
            loss = backend.cross_entropy(ops.add(ops.matmul(h, w2), b2), yt, "mean")
        backend.backward(loss)
        want = reference.mlp_gradients(spec, canonical, x, y)
        got = {
            "fc1.weight": backend.to_numpy(ops.grad(w1)).T,
            "fc1.bias": backend.to_numpy(ops.grad(b1)),
            "fc2.weight": backend.to_numpy(ops.grad(w2)).T,
            "fc2.bias": backend.to_numpy(ops.grad(b2)),
        }
        for k, g in want.items():
            np.testing.assert_allclose(got[k], g, rtol=1e-4, atol=GRAD_ATOL, err_msg=k)

    @pytest.mark.parametrize("how", ["copy_to", "no_grad"])
    def test_detached_values_record_no_gradient(
        self, backend: Backend, ops: FunctionalOps, how: str
    ) -> None:
        """A copy (or a value computed under no_grad) enters the loss as a constant."""
        devs = backend.devices("cpu:2")
        a, x, y = _data((6, 10), 5), _data((4, 6), 6), _labels(4, 6)
        xt, yt = backend.to_tensor(x, devs[0]), backend.to_tensor(y, devs[0])
        grads = []
        for variant in ("detached", "constant"):
            p = ops.parameter(a, devs[0])
            if variant == "constant":
                other = backend.to_tensor(np.maximum(a, 0), devs[0])
            elif how == "copy_to":
                copied = ops.copy_to(ops.copy_to(p, devs[1]), devs[0])
                with backend.record():
                    other = ops.relu(copied)
            with backend.record():
                if variant == "detached" and how == "no_grad":
                    with ops.no_grad():
                        other = ops.relu(p)
                loss = backend.cross_entropy(ops.matmul(xt, ops.add(p, other)), yt, "sum")
            backend.backward(loss)
            grads.append(backend.to_numpy(ops.grad(p)))
        np.testing.assert_allclose(grads[0], grads[1], rtol=1e-6, atol=1e-7)

    def test_copy_to_is_never_an_alias(self, backend: Backend, ops: FunctionalOps) -> None:
        devs = backend.devices("cpu:2")
        a = _data((3,), 7)
        t = backend.to_tensor(a, devs[0])
        for dev in devs:  # the same device too: an emulated copy must not share memory
            c = ops.copy_to(t, dev)  # reduced in place where the backend can (the default)
            ones = backend.to_tensor(np.ones(3, np.float32), dev)
            (c, _) = Collectives.required(backend, "this test").all_reduced([c, ones], "sum")
            np.testing.assert_allclose(backend.to_numpy(c), a + 1, atol=1e-6)
            np.testing.assert_array_equal(backend.to_numpy(t), a)

    # -- layers -----------------------------------------------------------------------------

    @pytest.mark.parametrize(
        ("stride", "padding", "bias"), [(1, 0, True), (2, 1, True), (1, 2, False)]
    )
    def test_conv2d_matches_numpy(
        self, backend: Backend, ops: FunctionalOps, stride: int, padding: int, bias: bool
    ) -> None:
        x, w, b = _data((2, 3, 9, 9), 8), _data((4, 3, 3, 3), 9), _data((4,), 10)
        xt, wt = backend.to_tensor(x), backend.to_tensor(w)
        bt = backend.to_tensor(b) if bias else None
        with ops.no_grad():
            got = backend.to_numpy(ops.conv2d(xt, wt, bt, stride=stride, padding=padding))
        want = reference.conv2d(x, w, b if bias else None, stride, padding)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=FORWARD_ATOL)

    @pytest.mark.parametrize("kind", ["avg", "max"])
    @pytest.mark.parametrize(("kernel", "stride", "padding"), [(2, None, 0), (3, 2, 1), (3, 1, 0)])
    def test_pooling_matches_numpy(
        self,
        backend: Backend,
        ops: FunctionalOps,
        kind: str,
        kernel: int,
        stride: int | None,
        padding: int,
    ) -> None:
        x = _data((2, 3, 9, 9), 11) - 2.0  # negative values: padding must not win a max
        pool = ops.avg_pool2d if kind == "avg" else ops.max_pool2d
        with ops.no_grad():
            got = backend.to_numpy(pool(backend.to_tensor(x), kernel, stride, padding))
        want = reference.pool2d(x, kernel, stride or kernel, padding, kind)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)

    def test_elementwise_and_dense_ops_match_numpy(
        self, backend: Backend, ops: FunctionalOps
    ) -> None:
        x, a, b, r = (
            _data((2, 3, 4, 4), 12),
            _data((5, 48), 13),
            _data((48, 7), 14),
            _data((7,), 15),
        )
        with ops.no_grad():
            flat = ops.flatten(backend.to_tensor(x))
            np.testing.assert_array_equal(backend.to_numpy(flat), x.reshape(2, -1))
            np.testing.assert_array_equal(
                backend.to_numpy(ops.relu(backend.to_tensor(x))), np.maximum(x, 0)
            )
            prod = ops.matmul(backend.to_tensor(a), backend.to_tensor(b))
            np.testing.assert_allclose(backend.to_numpy(prod), a @ b, rtol=1e-5, atol=1e-5)
            total = ops.add(prod, backend.to_tensor(r))
            np.testing.assert_allclose(backend.to_numpy(total), a @ b + r, rtol=1e-5, atol=1e-5)

    # -- the d2l scratch LeNet ---------------------------------------------------------------

    def test_scratch_lenet_matches_reference(self, backend: Backend, ops: FunctionalOps) -> None:
        params = d2l_lenet_params(seed=1, scale=0.1)
        x = _data((5, 1, 28, 28), 16)
        dev = backend.device("cpu")
        tensors = [ops.parameter(p, dev) for p in params]
        with ops.no_grad():
            got = backend.to_numpy(lenet(ops, backend.to_tensor(x, dev), tensors))
        want = reference.forward(get_model_spec("lenet"), d2l_to_canonical(params), x)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=FORWARD_ATOL)

    def test_scratch_lenet_gradients_match_native_lenet(
        self, backend: Backend, ops: FunctionalOps
    ) -> None:
        """The ops' gradients through conv and pooling equal the backend's own LeNet's
        (whose gradients the backend conformance suite checks)."""
        params = d2l_lenet_params(seed=2, scale=0.1)
        x, y = _data((6, 1, 28, 28), 17), _labels(6, 17)
        dev = backend.device("cpu")
        tensors = [ops.parameter(p, dev) for p in params]
        xt, yt = backend.to_tensor(x, dev), backend.to_tensor(y, dev)
        with backend.record():
            loss = backend.cross_entropy(lenet(ops, xt, tensors), yt, "mean")
        backend.backward(loss)
        got = d2l_to_canonical([backend.to_numpy(ops.grad(t)) for t in tensors])
        model = backend.build_model(get_model_spec("lenet"))
        backend.set_params(model, d2l_to_canonical(params))
        with backend.record():
            native_loss = backend.cross_entropy(backend.forward(model, xt, train=True), yt)
        backend.backward(native_loss)
        want = backend.gradients(model)
        for k, g in want.items():
            np.testing.assert_allclose(got[k], g, rtol=1e-4, atol=1e-6, err_msg=k)

    @pytest.mark.parametrize("n", [2, 3])
    def test_scratch_data_parallel_step_equals_one_device(
        self, backend: Backend, ops: FunctionalOps, n: int
    ) -> None:
        """d2l's hand-written step on n emulated devices (10 samples: uneven for 3)
        equals the whole batch on one device, and every device ends with the same copy."""
        params = d2l_lenet_params(seed=3, scale=0.1)
        x, y = _data((10, 1, 28, 28), 18), _labels(10, 18)
        results = {}
        for count in (1, n):
            devices = backend.devices(f"cpu:{count}")
            device_params = [[ops.parameter(p, d) for p in params] for d in devices]
            for step in range(2):
                xb = np.ascontiguousarray(x[::-1]) if step else x
                scratch_train_batch(backend, ops, xb, y, device_params, devices, lr=0.2)
            copies = [[backend.to_numpy(t) for t in ps] for ps in device_params]
            for other in copies[1:]:
                for a, b in zip(copies[0], other, strict=True):
                    np.testing.assert_array_equal(a, b)
            results[count] = copies[0]
        for i, (a, b) in enumerate(zip(results[1], results[n], strict=True)):
            np.testing.assert_allclose(b, a, rtol=0, atol=1e-6, err_msg=f"params[{i}]")
