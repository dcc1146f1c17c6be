"""One small network per layer type of the neutral set, and how a backend's gradient
w.r.t. the layer's *input* is read through the backend contract.

The contract reports gradients of parameters only, so each case network starts with an
*injection* convolution: ``inject`` is a bias-free ``Conv2d(N, C, H)`` applied to
one-hot images (sample ``n`` is 1 at the centre of channel ``n``, 0 elsewhere). Its
output is its own weight, flipped: ``out[n, c, i, j] == W[c, n, H-1-i, H-1-j]``, exact
in any precision. Setting ``W`` from ``x`` feeds ``x`` to the layer under test, and the
gradient of ``W``, flipped back, is the gradient w.r.t. ``x``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from polytrain.backend.base import Backend
from polytrain.neutral import reference_grad
from polytrain.neutral.models import (
    AvgPool2d,
    BatchNorm2d,
    Conv2d,
    Dropout,
    Flatten,
    GlobalAvgPool2d,
    Layer,
    Linear,
    MaxPool2d,
    ModelSpec,
    ReLU,
    Residual,
    seq,
)

BATCH = 2
INJECT = "inject"


@dataclass(frozen=True)
class LayerCase:
    """A layer on an input of ``shape`` (C, H, H). ``train``: checked in the training
    forward and backward as well as in eval mode (False: eval-mode forward only)."""

    id: str
    layer: Layer
    shape: tuple[int, int, int] = (2, 5, 5)
    train: bool = True


def _residual(shortcut: bool) -> Residual:
    c = 2 if not shortcut else 3
    body = seq(
        ("conv1", Conv2d(2, c, 3, stride=1 if not shortcut else 2, padding=1)),
        ("bn1", BatchNorm2d(c)),
        ("relu", ReLU()),
        ("conv2", Conv2d(c, c, 3, padding=1)),
    )
    return Residual(body, seq(("conv", Conv2d(2, 3, 1, stride=2))) if shortcut else None)


LAYER_CASES: tuple[LayerCase, ...] = (
    LayerCase("conv", Conv2d(2, 3, 3)),
    LayerCase("conv-stride-pad", Conv2d(2, 3, 3, stride=2, padding=1), (2, 6, 6)),
    LayerCase("conv-1x1-no-bias", Conv2d(2, 3, 1, bias=False)),
    LayerCase("linear", Linear(2 * 3 * 3, 10), (2, 3, 3)),
    LayerCase("linear-no-bias", Linear(2 * 3 * 3, 10, bias=False), (2, 3, 3)),
    LayerCase("batchnorm-train", BatchNorm2d(2)),
    LayerCase("batchnorm-eval", BatchNorm2d(2), train=False),
    LayerCase("relu", ReLU()),
    LayerCase("maxpool", MaxPool2d(2)),
    LayerCase("maxpool-pad", MaxPool2d(3, 2, padding=1)),
    LayerCase("avgpool", AvgPool2d(2, 2)),
    LayerCase("avgpool-pad", AvgPool2d(3, 2, padding=1)),
    LayerCase("avgpool-pad-ceil", AvgPool2d(3, 2, padding=1, ceil_mode=True), (2, 6, 6)),
    LayerCase("avgpool-ceil", AvgPool2d(2, 2, ceil_mode=True)),
    LayerCase("avgpool-pad-exclusive", AvgPool2d(3, 2, padding=1, count_include_pad=False)),
    LayerCase("global-avgpool", GlobalAvgPool2d()),
    LayerCase("flatten", Flatten()),
    LayerCase("dropout-p0", Dropout(0.0)),
    LayerCase("dropout-eval", Dropout(0.5), train=False),
    LayerCase("residual-identity", _residual(shortcut=False)),
    LayerCase("residual-projection", _residual(shortcut=True)),
)


def case_spec(case: LayerCase) -> ModelSpec:
    """``layer`` on input ``x`` of ``case.shape``, then Flatten and a Linear head to 10
    logits where needed (a Linear layer gets a Flatten before it and is the head)."""
    if isinstance(case.layer, Linear):
        net = seq(("flatten", Flatten()), ("layer", case.layer))
    else:
        probe = ModelSpec("probe", seq(("layer", case.layer)), input_shape=case.shape)
        out = reference_grad.forward(
            probe, probe.init_params(), np.zeros((1, *case.shape)), train=False
        )
        layers = [("layer", case.layer)]
        if out.ndim == 4:
            layers.append(("flatten", Flatten()))
        net = seq(*layers, ("head", Linear(int(np.prod(out.shape[1:])), 10)))
    return ModelSpec(f"layer-{case.id}", net, input_shape=case.shape, init="torch_default")


def injected_spec(spec: ModelSpec) -> ModelSpec:
    """``spec`` behind the injection convolution (see the module docstring)."""
    c, h, w = spec.input_shape
    if h != w:
        raise ValueError(f"the injection needs a square input, not {spec.input_shape}")
    net = seq((INJECT, Conv2d(BATCH, c, h, bias=False)), *spec.net.layers)
    return ModelSpec(spec.name, net, input_shape=(BATCH, 2 * h - 1, 2 * h - 1), init=spec.init)


def one_hot_images(spec: ModelSpec) -> np.ndarray:
    """The injection's input for ``injected_spec(spec)``: sample n is 1 at the centre of
    channel n."""
    _, h, _ = spec.input_shape
    x = np.zeros((BATCH, BATCH, 2 * h - 1, 2 * h - 1), np.float32)
    for n in range(BATCH):
        x[n, n, h - 1, h - 1] = 1.0
    return x


def flip(a: np.ndarray) -> np.ndarray:
    """Input <-> injection weight (and input gradient <-> weight gradient): its own inverse."""
    return np.ascontiguousarray(a.transpose(1, 0, 2, 3)[:, :, ::-1, ::-1])


def case_params(spec: ModelSpec, x: np.ndarray, seed: int = 0) -> dict[str, np.ndarray]:
    """Random parameters (BatchNorm's affine and running statistics too) for ``spec``,
    plus the injection weight that feeds ``x``."""
    rng = np.random.default_rng([seed, 7])
    params = spec.init_params(seed)
    for k, v in params.items():
        if k.endswith("running_var"):
            params[k] = rng.uniform(0.5, 2.0, v.shape).astype(np.float32)
        elif k.endswith(("running_mean", "bias")) or ".bn" in k or k.startswith("layer."):
            params[k] = (0.5 * rng.standard_normal(v.shape)).astype(np.float32)
    params[f"{INJECT}.weight"] = flip(x)
    return params


def _close(got: np.ndarray, want: np.ndarray, what: str, dtype: str) -> None:
    rtol, atol = (1e-9, 1e-10) if dtype == "float64" else (1e-4, 1e-5)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=what)


def check_layer(backend: Backend, case: LayerCase, dtype: str = "float32") -> None:
    """``case``'s output in eval mode and, for training cases, its training output, loss,
    and gradients w.r.t. its input and every parameter, against :mod:`reference_grad`."""
    spec = case_spec(case)
    rng = np.random.default_rng([len(case.id), 3])
    x = rng.standard_normal((BATCH, *case.shape)).astype(np.float32)
    y = rng.integers(0, 10, BATCH).astype(np.int64)
    params = case_params(spec, x)
    model = backend.build_model(injected_spec(spec), dtype=dtype)
    backend.set_params(model, params)
    ref_params = {k: v for k, v in params.items() if k != f"{INJECT}.weight"}
    device = model.devices[0]
    x0 = backend.to_tensor(one_hot_images(spec).astype(dtype), device)
    got = backend.to_numpy(backend.forward(model, x0))
    want = reference_grad.forward(spec, ref_params, x, train=False)
    _close(got, want, f"{case.id}: eval-mode output", dtype)
    if not case.train:
        return
    with backend.record():
        logits = backend.forward(model, x0, train=True)
        loss = backend.cross_entropy(logits, backend.to_tensor(y, device), "mean")
    backend.backward(loss)
    want_loss, want_gx, want_grads = reference_grad.loss_gradients(spec, ref_params, x, y)
    want = reference_grad.forward(spec, ref_params, x, train=True)
    _close(backend.to_numpy(logits), want, f"{case.id}: training output", dtype)
    _close(backend.to_numpy(loss), np.asarray(want_loss), f"{case.id}: loss", dtype)
    grads = backend.gradients(model)
    gx = flip(grads.pop(f"{INJECT}.weight"))
    assert sorted(grads) == sorted(want_grads), f"{case.id}: gradients of {sorted(grads)}"
    for name, g in want_grads.items():
        _close(grads[name], g, f"{case.id}: gradient of {name}", dtype)
    what = "gradient w.r.t. the layer's input (read from the injection Conv2d's weight gradient)"
    _close(gx, want_gx, f"{case.id}: {what}", dtype)
