"""One small network per layer type of the neutral set, and how a backend's gradient
w.r.t. the layer's *input* is read through the backend contract.

The contract reports gradients of parameters only, so each case network starts with an
*injection* convolution: ``inject`` is a bias-free ``Conv2d(N, C, H)`` applied to
one-hot images (sample ``n`` is 1 at the centre of channel ``n``, 0 elsewhere). Its
output is its own weight, flipped: ``out[n, c, i, j] == W[c, n, H-1-i, H-1-j]``, exact
in any precision. Setting ``W`` from ``x`` feeds ``x`` to the layer under test, and the
gradient of ``W``, flipped back, is the gradient w.r.t. ``x``.

Inputs that are not square images ([N, C, L], [N, T, E], [N, F]) enter through a
bias-free ``Linear(N, size)`` on the rows of the N x N identity, reshaped: its output is
its weight, transposed, also exact. Integer inputs (``vocab > 0``: Embedding ids) are fed
as they are; no gradient flows to them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from polytrain.backend.base import Backend
from polytrain.neutral import reference_grad
from polytrain.neutral.models import (
    GELU,
    GRU,
    LSTM,
    Add,
    AvgPool2d,
    BatchNorm1d,
    BatchNorm2d,
    Conv1d,
    Conv2d,
    Dropout,
    Embedding,
    Flatten,
    GlobalAvgPool2d,
    Layer,
    LayerNorm,
    Linear,
    LogSoftmax,
    MaxPool2d,
    Mean,
    ModelSpec,
    MultiHeadSelfAttention,
    PositionalEmbedding,
    ReLU,
    Reshape,
    Residual,
    Sequential,
    Sigmoid,
    SiLU,
    Softmax,
    Tanh,
    Transpose,
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
    shape: tuple[int, ...] = (2, 5, 5)
    train: bool = True
    vocab: int = 0  # > 0: the input is integer ids in [0, vocab)


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


def _attention(**options: bool) -> Sequential:
    """Attention on the injected [N, 4, 2, 2] seen as 4 tokens of width 4 (2 heads)."""
    return seq(("tokens", Reshape((4, 4))), ("attn", MultiHeadSelfAttention(4, 2, **options)))


ATTENTION_CASES: tuple[LayerCase, ...] = (
    LayerCase("attention", _attention(), (4, 2, 2)),
    LayerCase("attention-causal", _attention(causal=True), (4, 2, 2)),
    LayerCase("attention-causal-no-bias", _attention(causal=True, bias=False), (4, 2, 2)),
)
LAYER_CASES += ATTENTION_CASES


def _add_cases() -> tuple[LayerCase, ...]:
    """Add over branches: a pre-norm style residual (identity + branch) and three branches."""
    conv = seq(("conv", Conv2d(2, 2, 3, padding=1)), ("gelu", GELU()))
    residual = Add((seq(), conv))
    seq_branch = seq(("ln", LayerNorm((5,))), ("conv", Conv1d(2, 2, 3, padding=1)))
    three = Add((seq(), seq(("tanh", Tanh())), seq_branch))
    return (LayerCase("add-residual", residual), LayerCase("add-three-branches", three, (2, 5)))


SEQUENCE_CASES: tuple[LayerCase, ...] = (
    LayerCase("gelu", GELU()),
    LayerCase("gelu-tanh", GELU("tanh")),
    LayerCase("silu", SiLU()),
    LayerCase("tanh", Tanh()),
    LayerCase("sigmoid", Sigmoid()),
    LayerCase("softmax-channels", Softmax(1)),
    LayerCase("softmax-last", Softmax(-1), (3, 4)),
    LayerCase("log-softmax-channels", LogSoftmax(1)),
    LayerCase("log-softmax-last", LogSoftmax(-1), (3, 4)),
    LayerCase("layernorm-last", LayerNorm((5,))),
    LayerCase("layernorm-last-two", LayerNorm((5, 5))),
    LayerCase("layernorm-tokens-no-affine", LayerNorm((4,), elementwise_affine=False), (3, 4)),
    LayerCase("conv1d", Conv1d(2, 3, 3), (2, 6)),
    LayerCase("conv1d-stride-pad", Conv1d(2, 3, 3, stride=2, padding=1), (2, 7)),
    LayerCase("conv1d-no-bias", Conv1d(2, 3, 1, bias=False), (2, 4)),
    LayerCase("batchnorm1d-features", BatchNorm1d(3), (3,)),
    LayerCase("batchnorm1d-sequence", BatchNorm1d(2), (2, 5)),
    LayerCase("batchnorm1d-eval", BatchNorm1d(2), (2, 5), train=False),
    LayerCase("embedding", Embedding(7, 4), (3,), vocab=7),
    LayerCase("positional-embedding", PositionalEmbedding(5, 4), (3, 4)),
    LayerCase("linear-tokens", seq(("fc", Linear(4, 5))), (3, 4)),
    *_add_cases(),
)
LAYER_CASES += SEQUENCE_CASES


def _vit_block() -> Sequential:
    """A ViT in small: 2x2 patches of [N, 2, 4, 4] to 4 tokens of width 4 (patch conv,
    Reshape, Transpose), one pre-norm attention residual, the tokens' mean."""
    attention = seq(("ln", LayerNorm((4,))), ("attn", MultiHeadSelfAttention(4, 2)))
    return seq(
        ("patches", Conv2d(2, 4, 2, stride=2)),
        ("tokens", Reshape((4, 4))),
        ("swap", Transpose(1, 2)),
        ("block", Add((seq(), attention))),
        ("pool", Mean(1)),
    )


VIT_CASES: tuple[LayerCase, ...] = (
    LayerCase("transpose-tokens", Transpose(1, 2), (3, 4)),
    LayerCase("transpose-negative", Transpose(-1, 1), (2, 5, 5)),
    LayerCase("mean-tokens", Mean(1), (3, 4)),
    LayerCase("mean-last", Mean(-1), (2, 5, 5)),
    LayerCase("vit-block", _vit_block(), (2, 4, 4)),
)
LAYER_CASES += VIT_CASES


RECURRENT_CASES: tuple[LayerCase, ...] = (  # [N, T=4, in=3] -> [N, 4, 5]
    LayerCase("lstm", LSTM(3, 5), (4, 3)),
    LayerCase("lstm-2-layers", LSTM(3, 5, num_layers=2), (4, 3)),
    LayerCase("gru", GRU(3, 5), (4, 3)),
    LayerCase("gru-2-layers", GRU(3, 5, num_layers=2), (4, 3)),
)
LAYER_CASES += RECURRENT_CASES


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
        if out.ndim > 2:
            layers.append(("flatten", Flatten()))
        net = seq(*layers, ("head", Linear(int(np.prod(out.shape[1:])), 10)))
    return ModelSpec(f"layer-{case.id}", net, input_shape=case.shape, init="fan_in_uniform")


def _is_image(shape: tuple[int, ...]) -> bool:
    return len(shape) == 3 and shape[1] == shape[2]


def case_input(case: LayerCase, rng: np.random.Generator, dtype: str = "float32") -> np.ndarray:
    """The layer's input: standard normal values, or integer ids when ``case.vocab``."""
    if case.vocab:
        return rng.integers(0, case.vocab, (BATCH, *case.shape)).astype(np.int64)
    return rng.standard_normal((BATCH, *case.shape)).astype(dtype)


def injected_spec(spec: ModelSpec) -> ModelSpec:
    """``spec`` behind the injection (see the module docstring)."""
    if not _is_image(spec.input_shape):
        size = int(np.prod(spec.input_shape))
        inject = seq(
            ("linear", Linear(BATCH, size, bias=False)), ("reshape", Reshape(spec.input_shape))
        )
        net = seq((INJECT, inject), *spec.net.layers)
        return ModelSpec(spec.name, net, input_shape=(BATCH,), init=spec.init)
    c, h, w = spec.input_shape
    if h != w:
        raise ValueError(f"the injection needs a square input, not {spec.input_shape}")
    net = seq((INJECT, Conv2d(BATCH, c, h, bias=False)), *spec.net.layers)
    return ModelSpec(spec.name, net, input_shape=(BATCH, 2 * h - 1, 2 * h - 1), init=spec.init)


def one_hot_images(spec: ModelSpec) -> np.ndarray:
    """The injection's input for ``injected_spec(spec)``: sample n is 1 at the centre of
    channel n."""
    if not _is_image(spec.input_shape):
        return np.eye(BATCH, dtype=np.float32)
    _, h, _ = spec.input_shape
    x = np.zeros((BATCH, BATCH, 2 * h - 1, 2 * h - 1), np.float32)
    for n in range(BATCH):
        x[n, n, h - 1, h - 1] = 1.0
    return x


def inject_weight_name(spec: ModelSpec) -> str:
    return f"{INJECT}.weight" if _is_image(spec.input_shape) else f"{INJECT}.linear.weight"


def to_injection(x: np.ndarray) -> np.ndarray:
    """The injection weight that feeds ``x`` (a batch of the case's inputs)."""
    if x.ndim == 4 and x.shape[2] == x.shape[3]:
        return flip(x)
    return np.ascontiguousarray(x.reshape(x.shape[0], -1).T)


def from_injection(w: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """The injection weight's gradient back to the gradient w.r.t. the layer's input."""
    if _is_image(shape):
        return flip(w)
    return np.ascontiguousarray(w.T.reshape(BATCH, *shape))


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
    if not np.issubdtype(x.dtype, np.integer):
        params[inject_weight_name(spec)] = to_injection(x)
    return params


def _close(got: np.ndarray, want: np.ndarray, what: str, dtype: str) -> None:
    rtol, atol = (1e-9, 1e-10) if dtype == "float64" else (1e-4, 1e-5)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=what)


def check_layer(backend: Backend, case: LayerCase, dtype: str = "float32") -> None:
    """``case``'s output in eval mode and, for training cases, its training output, loss,
    and gradients w.r.t. its input and every parameter, against :mod:`reference_grad`."""
    spec = case_spec(case)
    rng = np.random.default_rng([len(case.id), 3])
    x = case_input(case, rng)
    y = rng.integers(0, 10, BATCH).astype(np.int64)
    params = case_params(spec, x)
    inject = inject_weight_name(spec)
    model = backend.build_model(spec if case.vocab else injected_spec(spec), dtype=dtype)
    backend.set_params(model, params)
    ref_params = {k: v for k, v in params.items() if k != inject}
    device = model.devices[0]
    fed = x if case.vocab else one_hot_images(spec).astype(dtype)
    x0 = backend.to_tensor(fed, device)
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
    if case.vocab:  # integer ids: nothing to check w.r.t. the input
        assert sorted(grads) == sorted(want_grads), f"{case.id}: gradients of {sorted(grads)}"
        for name, g in want_grads.items():
            _close(grads[name], g, f"{case.id}: gradient of {name}", dtype)
        return
    gx = from_injection(grads.pop(inject), case.shape)
    assert sorted(grads) == sorted(want_grads), f"{case.id}: gradients of {sorted(grads)}"
    for name, g in want_grads.items():
        _close(grads[name], g, f"{case.id}: gradient of {name}", dtype)
    what = "gradient w.r.t. the layer's input (read from the injection Conv2d's weight gradient)"
    _close(gx, want_gx, f"{case.id}: {what}", dtype)
