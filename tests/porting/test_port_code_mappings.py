"""Every entry of the port-code table, proven by running it: the entry's example (Paddle
code) runs on Paddle, the tool converts it, the result runs on PyTorch on the same inputs
(layers: the same weights, moved by polytrain's porting layout rules), and the outputs,
gradients and states must agree (float64: 1e-10; float32 where Paddle has no float64).
A mapping without an example fails the suite."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from port_code_helpers import (
    FP64,
    assert_close,
    check_init,
    entry_arrays,
    entry_seed,
    entry_tolerance,
)

from polytrain.porting.code import convert_source
from polytrain.porting.code.port_pass import MARKER
from polytrain.porting.code.table import TABLE_DIR, Entry, all_entries, load_framework

paddle = pytest.importorskip("paddle")
torch = pytest.importorskip("torch")

HEADER = (
    "import paddle\n"
    "import paddle.nn as nn\n"
    "import paddle.nn.functional as F\n"
    "import paddle.fluid as fluid\n"
    "from paddle.fluid.dygraph.nn import Conv2D, Pool2D, Linear\n"
)
TRAIN_LOOP = """
for _ in range(3):
    loss = (net(x) ** 2).mean()
    loss.backward()
    opt.step()
    opt.clear_grad()
"""
SCHEDULER_LOOP = """
for _ in range(12):
    loss = (net(x) ** 2).mean()
    loss.backward()
    opt.step()
    opt.clear_grad()
    record(opt)
    sched.step()
"""
ENTRIES = all_entries("paddle")  # Gluon's: tests/porting/test_port_code_gluon.py
# check = "distributed" (fluid's data-parallel calls): run in two processes by
# tests/porting/test_port_code_fluid_multi.py
CONVERTED = [e for e in ENTRIES if not e.unsupported and e.check != "distributed"]
MARKED = [e for e in ENTRIES if e.unsupported]


def _tensors(entry: Entry, arrays: dict[str, np.ndarray], side: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in arrays.items():
        if entry.inputs[name].startswith("n"):
            out[name] = value.copy()
            continue
        floating = value.dtype.kind == "f"
        if side == "paddle":
            t = paddle.to_tensor(value)
            t.stop_gradient = not floating
        else:
            t = torch.tensor(value, requires_grad=floating)
        out[name] = t
    return out


def _numpy(value: Any) -> Any:
    if isinstance(value, list | tuple):
        return [_numpy(v) for v in value]
    if isinstance(value, dict):
        return {k: _numpy(v) for k, v in value.items()}
    if isinstance(value, paddle.Tensor):
        return value.numpy()
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    return np.asarray(value) if isinstance(value, float | int | bool | np.ndarray) else value


@contextlib.contextmanager
def _float64() -> Iterator[None]:
    """Both frameworks' default float dtype float64 (layers, creation functions)."""
    old, old_torch = paddle.get_default_dtype(), torch.get_default_dtype()
    paddle.set_default_dtype("float64")
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        paddle.set_default_dtype(old)
        torch.set_default_dtype(old_torch)


def converted_example(entry: Entry, code: str) -> str:
    """The tool's PyTorch code of an example; no use may be left marked."""
    result = convert_source(HEADER + code, entry.source)
    left = [u for u in result.report.uses if not u.converted]
    assert not left, f"{entry.source}: left unconverted: {left}\n{result.code}"
    assert "paddle" not in _names(result.code), result.code  # a path may name Paddle's cache
    return result.code


def _names(code: str) -> set[str]:
    """The names a module's code uses (not its strings and comments)."""
    tokens = tokenize.generate_tokens(io.StringIO(code).readline)
    return {t.string for t in tokens if t.type == tokenize.NAME}


def _walker(model: Any) -> Any:
    from polytrain.porting.api import walker_for

    return walker_for(model, "model")


def copy_weights(src: Any, tgt: Any) -> list[Any]:
    """The Paddle layer's weights into the PyTorch one by the porting layout rules; the
    layer pairs."""
    from polytrain.porting.match import Pair, mismatch, ported_state

    sw, tw = _walker(src), _walker(tgt)
    src_layers, tgt_layers = sw.layers(src), tw.layers(tgt)
    assert len(src_layers) == len(tgt_layers), (src_layers, tgt_layers)
    pairs = []
    for s, t in zip(src_layers, tgt_layers, strict=True):  # in order; kinds may be named apart
        assert mismatch(s, t, check_kind=False) is None, (s.describe(), t.describe())
        pairs.append(Pair(s, t))
    state, _ = ported_state(pairs, tw.state(tgt))
    tw.load_state(tgt, state)
    return pairs


def _param_grads(model: Any, pairs: list[Any], side: str) -> dict[str, np.ndarray]:
    params = dict(model.named_parameters())
    out = {}
    for pair in pairs:
        layer = pair.source if side == "paddle" else pair.target
        for role, t in layer.tensors.items():
            p = params.get(t.native)
            if p is None or p.grad is None:
                continue
            g = _numpy(p.grad)
            out[f"{pair.target.name}.{role}"] = g.T if t.transpose else g
    return out


def _states(model: Any, pairs: list[Any], side: str) -> dict[str, np.ndarray]:
    layers = {layer.name: layer for layer in _walker(model).layers(model)}
    out = {}
    for pair in pairs:
        layer = layers[(pair.source if side == "paddle" else pair.target).name]
        for role, t in layer.tensors.items():
            out[f"{pair.target.name}.{role}"] = t.canonical
    return out


def _backward(out: Any, seed: int, side: str) -> None:
    w = np.random.default_rng(seed).standard_normal(tuple(out.shape))
    if side == "paddle":
        (out * paddle.to_tensor(w.astype(_numpy(out).dtype))).sum().backward()
    else:
        (out * torch.tensor(w.astype(_numpy(out).dtype))).sum().backward()


def _input_grads(tensors: dict[str, Any]) -> dict[str, Any]:
    return {k: _numpy(t.grad) for k, t in tensors.items() if getattr(t, "grad", None) is not None}


def check_layer(entry: Entry, code: str, arrays: dict[str, np.ndarray]) -> None:
    tol = entry_tolerance(entry)
    src_ns: dict[str, Any] = {"paddle": paddle, "nn": paddle.nn, "F": paddle.nn.functional}
    with _float64():
        exec(entry.stand_in or entry.example, src_ns)
    tgt_ns: dict[str, Any] = {}
    with _float64():
        exec(code, tgt_ns)
    src, tgt = src_ns["layer"], tgt_ns["layer"]
    pairs = copy_weights(src, tgt)
    name = next(iter(arrays))
    for mode in ("eval", "train"):
        xs, xt = _tensors(entry, arrays, "paddle"), _tensors(entry, arrays, "torch")
        getattr(src, mode)()
        getattr(tgt, mode)()
        for p in src.parameters():
            p.clear_gradient()
        tgt.zero_grad()
        out_s, out_t = src(xs[name]), tgt(xt[name])
        assert_close(_numpy(out_s), _numpy(out_t), tol, f"{entry.source} {mode} output")
        if mode == "train":
            _backward(out_s, entry_seed(entry), "paddle")
            _backward(out_t, entry_seed(entry), "torch")
            assert_close(_input_grads(xs), _input_grads(xt), tol, f"{entry.source} input grad")
            assert_close(
                _param_grads(src, pairs, "paddle"),
                _param_grads(tgt, pairs, "torch"),
                tol,
                f"{entry.source} parameter grads",
            )
            _check_states(entry, _states(src, pairs, "paddle"), _states(tgt, pairs, "torch"))


def _check_states(entry: Entry, a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    """Equal, but for the roles the entry documents as different (which must differ)."""
    tol = entry_tolerance(entry)
    for key in a:
        if key.rsplit(".", 1)[-1] in entry.differs:
            assert not np.allclose(a[key], b[key], rtol=0, atol=tol), f"{key} no longer differs"
        else:
            assert_close(a[key], b[key], tol, f"{entry.source} state {key}")


def check_paddle_init(entry: Entry, code: str) -> None:
    """The example's ``layer`` made by Paddle and, converted, by PyTorch: the parameters'
    distributions (an initializer's entry)."""
    src_ns: dict[str, Any] = {"paddle": paddle, "nn": paddle.nn}
    exec("import paddle\nimport paddle.nn as nn\n" + (entry.stand_in or entry.example), src_ns)
    tgt_ns: dict[str, Any] = {}
    exec(code, tgt_ns)
    src = [p.numpy() for p in src_ns["layer"].parameters()]
    tgt = [p.detach().numpy() for p in tgt_ns["layer"].parameters()]
    check_init(entry, src, tgt)


def _net_pair() -> tuple[Any, Any, list[Any]]:
    with _float64():
        src = paddle.nn.Linear(3, 2)
        tgt = torch.nn.Linear(3, 2)
    return src, tgt, copy_weights(src, tgt)


def check_program(entry: Entry, code: str, arrays: dict[str, np.ndarray], tmp: Path) -> None:
    """value / nograd / net / optimizer / scheduler / shape checks: the example is a small
    program that leaves ``out`` (and, with a net, the net's weights) to compare."""
    tol = entry_tolerance(entry)
    xs, xt = _tensors(entry, arrays, "paddle"), _tensors(entry, arrays, "torch")
    src_ns: dict[str, Any] = {"paddle": paddle, "nn": paddle.nn, "F": paddle.nn.functional}
    src_ns.update(xs, path=str(tmp / "src.bin"))
    tgt_ns: dict[str, Any] = {**xt, "path": str(tmp / "tgt.bin")}
    lrs: dict[str, list[float]] = {"paddle": [], "torch": []}
    if entry.check in ("net", "optimizer", "scheduler"):
        src_ns["net"], tgt_ns["net"], pairs = _net_pair()
        src_ns["record"] = lambda o: lrs["paddle"].append(o.get_lr())
        tgt_ns["record"] = lambda o: lrs["torch"].append(o.param_groups[0]["lr"])
    with _float64():
        exec(_program(entry, entry.stand_in or entry.example), src_ns)
        exec(code, tgt_ns)
    if entry.check == "shape":
        a, b = _numpy(src_ns["out"]), _numpy(tgt_ns["out"])
        assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, a.dtype, b.shape, b.dtype)
        return
    if "out" in src_ns or "out" in tgt_ns:
        assert_close(_numpy(src_ns["out"]), _numpy(tgt_ns["out"]), tol, f"{entry.source} out")
    if entry.check == "nograd":
        assert src_ns["out"].stop_gradient and not tgt_ns["out"].requires_grad
    if entry.check == "value" and isinstance(src_ns.get("out"), paddle.Tensor):
        out_s, out_t = src_ns["out"], tgt_ns["out"]
        if not out_s.stop_gradient and _numpy(out_s).dtype.kind == "f":
            _backward(out_s, entry_seed(entry), "paddle")
            _backward(out_t, entry_seed(entry), "torch")
            assert_close(_input_grads(xs), _input_grads(xt), tol, f"{entry.source} input grad")
    if entry.check in ("net", "optimizer", "scheduler"):
        assert_close(
            _states(src_ns["net"], pairs, "paddle"),
            _states(tgt_ns["net"], pairs, "torch"),
            tol,
            f"{entry.source} weights",
        )
        assert_close(lrs["paddle"], lrs["torch"], tol, f"{entry.source} learning rates")


def _program(entry: Entry, code: str) -> str:
    loop = {"optimizer": TRAIN_LOOP, "scheduler": SCHEDULER_LOOP}.get(entry.check, "")
    return code + "\n" + loop


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:When training, we now always track:UserWarning")
@pytest.mark.filterwarnings("ignore:amp_guard can only be enabled:UserWarning")  # CPU: no-op
@pytest.mark.filterwarnings("ignore:AmpScaler can only be enabled:UserWarning")
@pytest.mark.filterwarnings("ignore:CUDA is not available:UserWarning")
@pytest.mark.filterwarnings("ignore:To copy construct from a tensor:UserWarning")  # paddle.Model
@pytest.mark.filterwarnings("ignore:torch.cuda.amp.GradScaler is enabled:UserWarning")
@pytest.mark.filterwarnings("ignore:.*weight_norm. is deprecated:FutureWarning")  # its names
@pytest.mark.parametrize("entry", CONVERTED, ids=lambda e: e.source)
def test_mapping_computes_the_same_numbers(entry: Entry, tmp_path: Path) -> None:
    assert entry.example, f"{entry.source} has no example: a mapping without a test"
    code = converted_example(entry, _program(entry, entry.example))
    arrays = entry_arrays(entry)
    if entry.check == "layer":
        check_layer(entry, code, arrays)
    elif entry.check == "init":
        check_paddle_init(entry, code)
    elif entry.check == "recurrent":
        check_recurrent(entry.example, code, arrays["x"])
    else:
        check_program(entry, code, arrays, tmp_path)


@pytest.mark.parametrize("entry", MARKED, ids=lambda e: e.source)
def test_known_but_unsupported_api_stays_marked(entry: Entry) -> None:
    assert entry.example, f"{entry.source} has no example"
    result = convert_source(HEADER + entry.example, entry.source)
    marker = MARKER.format(api=entry.source, why=entry.unsupported)
    assert marker in result.code
    assert [u.api for u in result.report.uses if not u.converted] == [entry.source]


CHECKS = ("value", "layer", "nograd", "net", "optimizer", "scheduler", "shape", "recurrent",
          "distributed", "init")  # fmt: skip


def test_every_entry_has_an_example_and_inputs_it_needs() -> None:
    paddle3 = load_framework(TABLE_DIR / "paddle.toml")  # issue 18: 200 Paddle 3.x APIs
    paddle3_entries = (*paddle3.entries.values(), *paddle3.methods.values())
    assert sum(not e.unsupported for e in paddle3_entries) >= 200
    for entry in ENTRIES:
        assert entry.example, entry.source
        assert entry.check in CHECKS, entry.source
        if entry.check == "layer":
            assert entry.inputs, entry.source


# helpers that keep a numpy array's own method: transpose_axes (a tensor's permute),
# tensor_astype (a tensor's .to)
NUMPY_KEPT = {".transpose", ".astype"}


def test_method_entries_cannot_be_numpy_methods() -> None:
    """A method is converted whatever its receiver, so its name must not be one of numpy's
    array methods (``x.astype`` on an array in a Paddle script stays as it is), unless its
    target is a helper that keeps a numpy array's own method (its example runs both)."""
    for entry in ENTRIES:
        if entry.is_method and entry.source not in NUMPY_KEPT:
            assert not hasattr(np.ndarray, entry.source[1:]), entry.source


def _run(code: str, ns: dict[str, Any]) -> Any:
    with _float64():
        exec(code, ns)
    return _numpy(ns["out"])


def _marked(code: str, api: str) -> str:
    result = convert_source(HEADER + code, api)
    left = [u for u in result.report.uses if not u.converted]
    assert [u.api for u in left] == [api], result.code
    return left[0].why


# Rules where a naive one-to-one mapping computes other numbers: the naive PyTorch call
# differs from Paddle on the case, and the tool either converts it exactly or marks it.
SEMANTIC_RULES = [
    # paddle.split's int is a number of parts; torch.split's a part size
    ("out = paddle.split(x, 2, axis=1)", "out = torch.split(x, 2, 1)", {"x": (2, 6)}),
    # Paddle's smooth_l1_loss is the Huber loss: delta != 1 scales it
    ("out = F.smooth_l1_loss(x, y * 3, delta=2.0)",
     "out = torch.nn.functional.smooth_l1_loss(x, y * 3, beta=2.0)", {"x": (2, 3), "y": (2, 3)}),
]  # fmt: skip
MARKED_RULES = [
    # constant padding of a 2-d input: Paddle pads axis 0 first, PyTorch the last axis
    ("paddle.nn.functional.pad", "out = F.pad(x, [1, 0, 0, 2])",
     "out = torch.nn.functional.pad(x, [1, 0, 0, 2])", {"x": (3, 4)}),
    # align_mode=1: source coordinates x·scale, not PyTorch's half pixel
    ("paddle.nn.functional.interpolate",
     "out = F.interpolate(x, scale_factor=2, mode='bilinear', align_mode=1)",
     "out = torch.nn.functional.interpolate(x, scale_factor=2, mode='bilinear')",
     {"x": (1, 1, 3, 3)}),
    # an even count: Paddle averages the two middle values
    ("paddle.median", "out = paddle.median(x)", "out = torch.median(x)", {"x": (4,)}),
    # the default end_lr 0.0001: PyTorch's PolynomialLR ends at 0
    ("paddle.optimizer.lr.PolynomialDecay",
     "out = paddle.optimizer.lr.PolynomialDecay(0.5, decay_steps=1)\nout.step()\nout = out()",
     "o = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.5)\n"
     "s = torch.optim.lr_scheduler.PolynomialLR(o, total_iters=1)\n"
     "o.step()\ns.step()\nout = s.get_last_lr()[0]",
     {}),
    # a cooldown: Paddle ignores the metric during it, PyTorch still tracks the best
    ("paddle.optimizer.lr.ReduceOnPlateau",
     "s = paddle.optimizer.lr.ReduceOnPlateau(0.5, factor=0.5, patience=0, cooldown=1)\n"
     "o = paddle.optimizer.SGD(learning_rate=s, parameters=paddle.nn.Linear(1, 1).parameters())\n"
     "out = []\nfor m in [3.0, 4.0, 1.0, 2.0]:\n    s.step(m)\n    out.append(o.get_lr())",
     "o = torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), lr=0.5)\n"
     "s = torch.optim.lr_scheduler.ReduceLROnPlateau(o, factor=0.5, patience=0, cooldown=1)\n"
     "out = []\nfor m in [3.0, 4.0, 1.0, 2.0]:\n"
     "    s.step(m)\n    out.append(o.param_groups[0]['lr'])",
     {}),
]  # fmt: skip


def _inputs(shapes: dict[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {k: rng.standard_normal(shape) for k, shape in shapes.items()}


@pytest.mark.parametrize("paddle_code, naive, shapes", SEMANTIC_RULES, ids=lambda v: str(v)[:30])
def test_semantic_rule_converts_exactly_where_a_naive_mapping_differs(
    paddle_code: str, naive: str, shapes: dict[str, tuple[int, ...]]
) -> None:
    arrays = _inputs(shapes)
    want = _run(paddle_code, {"paddle": paddle, "F": paddle.nn.functional,
                              **{k: paddle.to_tensor(v) for k, v in arrays.items()}})  # fmt: skip
    torch_ns = {"torch": torch, **{k: torch.tensor(v) for k, v in arrays.items()}}
    with pytest.raises(AssertionError):
        assert_close(want, _run(naive, dict(torch_ns)), 1e-10, "naive")
    code = convert_source(HEADER + paddle_code, "rule").code
    assert_close(want, _run(code, dict(torch_ns)), 1e-10, paddle_code)


@pytest.mark.filterwarnings("ignore:.*median.*:UserWarning")
@pytest.mark.parametrize("api, paddle_code, naive, shapes", MARKED_RULES, ids=lambda v: str(v)[:30])
def test_semantic_rule_marks_where_a_naive_mapping_differs(
    api: str, paddle_code: str, naive: str, shapes: dict[str, tuple[int, ...]]
) -> None:
    arrays = _inputs(shapes)
    want = _run(paddle_code, {"paddle": paddle, "F": paddle.nn.functional,
                              **{k: paddle.to_tensor(v) for k, v in arrays.items()}})  # fmt: skip
    got = _run(naive, {"torch": torch, **{k: torch.tensor(v) for k, v in arrays.items()}})
    assert np.shape(want) != np.shape(got) or not np.allclose(want, got, rtol=0, atol=1e-10)
    assert _marked(paddle_code, api)


def test_split_whose_sections_are_a_name_is_marked() -> None:
    reason = _marked("out = paddle.split(x, n, axis=1)", "paddle.split")
    assert "num_or_sections=n" in reason and "torch.chunk" in reason


# ---- recurrent layers and the schedulers of issue 18 ------------------------------------


def _recurrent_states(layer: Any, x: np.ndarray, seed: int) -> list[np.ndarray] | None:
    """Random initial states for a PyTorch recurrent layer (h0, and c0 for an LSTM)."""
    if seed < 0:
        return None
    batch = x.shape[0] if layer.batch_first else x.shape[1]
    shape = (layer.num_layers * (2 if layer.bidirectional else 1), batch, layer.hidden_size)
    rng = np.random.default_rng(seed)
    count = 2 if isinstance(layer, torch.nn.LSTM) else 1
    return [rng.standard_normal(shape) for _ in range(count)]


def _run_recurrent(layer: Any, x: Any, states: list[Any] | None, side: str) -> list[Any]:
    """Outputs, final states, and the gradients of a random weighting of both: of the input,
    the initial states and every parameter (by name)."""
    if states:  # an LSTM's (h0, c0), else h0
        out, final = layer(x, tuple(states) if len(states) == 2 else states[0])
    else:
        out, final = layer(x)
    parts = [out, *(final if isinstance(final, tuple | list) else [final])]
    rng = np.random.default_rng(7)
    weights = [rng.standard_normal(tuple(p.shape)) for p in parts]
    wrap = paddle.to_tensor if side == "paddle" else torch.tensor
    sum(((p * wrap(w)).sum() for p, w in zip(parts, weights, strict=True))).backward()
    grads = {name: _numpy(p.grad) for name, p in layer.named_parameters()}
    return [_numpy(parts), _numpy(x.grad), [_numpy(s.grad) for s in states or []], grads]


def check_recurrent(paddle_code: str, torch_code: str, x: np.ndarray, seed: int = -1) -> None:
    """Paddle's layer and the converted one with the same weights (copied by name: both
    use ``weight_ih_l0`` ...) agree in outputs, final states and all gradients (float64)."""
    src_ns: dict[str, Any] = {"paddle": paddle, "nn": paddle.nn}
    tgt_ns: dict[str, Any] = {}
    with _float64():
        exec(paddle_code, src_ns)
        exec(torch_code, tgt_ns)
    src, tgt = src_ns["layer"], tgt_ns["layer"]
    src_params = dict(src.named_parameters())
    assert sorted(src_params) == sorted(k for k, _ in tgt.named_parameters())
    with torch.no_grad():
        for name, p in tgt.named_parameters():
            p.copy_(torch.tensor(src_params[name].numpy()))
    states = _recurrent_states(tgt, x, seed)

    def leaf(side: str, v: np.ndarray) -> Any:
        if side == "torch":
            return torch.tensor(v, requires_grad=True)
        t = paddle.to_tensor(v)
        t.stop_gradient = False
        return t

    got = {
        side: _run_recurrent(layer, leaf(side, x), [leaf(side, s) for s in states or []], side)
        for side, layer in (("paddle", src), ("torch", tgt))
    }
    assert_close(got["paddle"], got["torch"], FP64, f"{paddle_code.strip()} vs {torch_code}")


RECURRENT_CASES = [
    (kind, layers, direction, seed)
    for kind in ("LSTM", "GRU", "SimpleRNN")
    for layers in (1, 2)
    for direction in ("forward", "bidirect")
    for seed in (-1, 3)  # without, with initial states
]


@pytest.mark.parametrize("kind, layers, direction, seed", RECURRENT_CASES)
def test_recurrent_layer_converts_exactly(
    kind: str, layers: int, direction: str, seed: int
) -> None:
    code = f"layer = nn.{kind}(3, 4, num_layers={layers}, direction='{direction}')\n"
    x = np.random.default_rng(1).standard_normal((2, 5, 3))
    check_recurrent(code, converted_example(ENTRY_OF[f"paddle.nn.{kind}"], code), x, seed)


def test_time_major_recurrent_layer_converts_exactly() -> None:
    code = "layer = nn.LSTM(3, 4, 2, 'bidirectional', time_major=True)\n"
    x = np.random.default_rng(2).standard_normal((5, 2, 3))
    check_recurrent(code, converted_example(ENTRY_OF["paddle.nn.LSTM"], code), x, seed=4)


def test_a_naive_recurrent_mapping_computes_other_numbers() -> None:
    """``torch.nn.LSTM`` with Paddle's arguments as they are: PyTorch's default layout is
    time-major, so the converted batch_first=True is what makes it agree."""
    code = "layer = nn.LSTM(3, 4, num_layers=2, direction='bidirect')\n"
    x = np.random.default_rng(1).standard_normal((2, 5, 3))
    converted = converted_example(ENTRY_OF["paddle.nn.LSTM"], code)
    assert "batch_first=True" in converted
    with pytest.raises(AssertionError):
        check_recurrent(code, converted.replace("batch_first=True", "batch_first=False"), x)


ENTRY_OF = {e.source: e for e in ENTRIES}

# More argument forms of the schedulers: each run for 12 steps on both frameworks
SCHEDULER_FORMS = [
    ("OneCycleLR", "0.5, 12, three_phase=True, anneal_strategy='linear', phase_pct=0.25"),
    ("OneCycleLR", "max_learning_rate=0.5, total_steps=12, divide_factor=10, "
                   "end_learning_rate=0.002, phase_pct=0.4"),
    ("CyclicLR", "0.1, 0.5, 2, mode='exp_range', exp_gamma=0.9"),
    ("CyclicLR", "0.1, 0.5, 4"),
    ("NoamDecay", "d_model=16, warmup_steps=4, learning_rate=2.0"),
    ("LinearWarmup", "0.3, 4, 0.1, 0.3"),
    ("PiecewiseDecay", "[3, 6], [0.5, 0.2, 0.1]"),
]  # fmt: skip


@pytest.mark.parametrize("name, args", SCHEDULER_FORMS, ids=lambda v: str(v)[:30])
def test_scheduler_forms_compute_the_same_rates(name: str, args: str, tmp_path: Path) -> None:
    example = (
        f"sched = paddle.optimizer.lr.{name}({args})\n"
        "opt = paddle.optimizer.Momentum(learning_rate=sched, momentum=0.5, "
        "parameters=net.parameters())\n"
    )
    entry = dataclasses.replace(ENTRY_OF[f"paddle.optimizer.lr.{name}"], example=example)
    code = converted_example(entry, _program(entry, entry.example))
    check_program(entry, code, entry_arrays(entry), tmp_path)


def test_a_naive_one_cycle_mapping_computes_other_rates(tmp_path: Path) -> None:
    """PyTorch's OneCycleLR without the converted final_div_factor ends at another rate
    (Paddle's end_learning_rate is absolute), and without cycle_momentum=False it changes
    the momentum Paddle leaves alone."""
    entry = ENTRY_OF["paddle.optimizer.lr.OneCycleLR"]
    code = converted_example(entry, _program(entry, entry.example))
    assert "final_div_factor=" in code and "cycle_momentum=False" in code
    arrays = entry_arrays(entry)
    for naive in (re.sub(r",? *final_div_factor=[^,)]*", "", code),
                  code.replace("cycle_momentum=False", "cycle_momentum=True")):  # fmt: skip
        assert naive != code
        with pytest.raises(AssertionError):
            check_program(entry, naive, arrays, tmp_path)


def test_get_lr_of_a_receiver_not_made_here_is_marked() -> None:
    reason = _marked("def rate(sched):\n    return sched.get_lr()\n", ".get_lr")
    assert "get_last_lr" in reason


FLUID = load_framework(TABLE_DIR / "paddle_fluid.toml")
FLUID_ALIASES = {k: v for k, v in FLUID.same.items() if k.startswith("paddle.fluid.layers.")}


ALIAS_CALLS = {
    "cast": "(x, 'float32')", "squeeze": "(x, [1])", "unsqueeze": "(x, [1])", "topk": "(x, 2)",
    "logical_or": "(x, y)", "expand": "(x, [1, 2])",
    "stack": "([x, y], 1)", "transpose": "(x, [1, 0])", "equal": "(x, y)",
    "gather_nd": "(x, i)", "slice": "(x, [1], [0], [1])", "sequence_mask": "(n, 4)",
}  # fmt: skip


@pytest.mark.parametrize("alias, target", FLUID_ALIASES.items())
def test_a_fluid_alias_converts_as_its_paddle_3_function(alias: str, target: str) -> None:
    """fluid 1.8 functions whose parameters are those of a Paddle 3 function (in order) are
    that function's synonyms: converted alike, its entry's numbers proven above."""
    call = ALIAS_CALLS.get(alias.rsplit(".", 1)[1], "(x)") + "\n"
    fluid = convert_source(HEADER + "out = " + alias.replace("paddle.fluid", "fluid") + call)
    paddle3 = convert_source(HEADER + "out = " + target + call)
    assert fluid.code == paddle3.code
    assert [(u.api, u.converted) for u in fluid.report.uses] == [(target, True)]


# ---- fluid layers whose arguments are names (issue 36, the corpus's second pass) ---------

POOL_FORMS = [  # (fluid, its Paddle 3 stand-in, input shape)
    ("Pool2D(pool_size=3, pool_type='avg', pool_stride=2, pool_padding=1)",
     "nn.AvgPool2D(3, 2, 1, exclusive=True)", (2, 2, 5, 5)),
    ("Pool2D(pool_size=3, pool_type='avg', pool_stride=2, pool_padding=1, exclusive=False)",
     "nn.AvgPool2D(3, 2, 1, exclusive=False)", (2, 2, 5, 5)),
    ("Pool2D(pool_size=7, pool_type='avg', global_pooling=True)", "nn.AdaptiveAvgPool2D(1)",
     (2, 2, 5, 4)),
    ("Pool2D(pool_size=2, pool_type='max', global_pooling=True)", "nn.AdaptiveMaxPool2D(1)",
     (2, 2, 5, 4)),
    ("Pool2D(pool_size=2, pool_type='max', pool_stride=2, ceil_mode=True)",
     "nn.MaxPool2D(2, 2, ceil_mode=True)", (2, 2, 5, 5)),
    ("Pool2D(pool_size=3, pool_stride=2, pool_padding=[1, 1, 1, 1], pool_type='max')",
     "nn.MaxPool2D(3, 2, 1)", (2, 2, 6, 6)),
    ("Pool2D(kind_size, kind, kind_stride, kind_padding, kind_global)",
     "nn.AvgPool2D(3, 1, 1, exclusive=True)", (2, 2, 4, 4)),
]  # fmt: skip
NAMED = "kind_size, kind, kind_stride, kind_padding, kind_global = 3, 'avg', 1, 1, False\n"


@pytest.mark.parametrize("fluid, paddle3, shape", POOL_FORMS, ids=lambda v: str(v)[:40])
def test_fluid_pool2d_forms_compute_paddles_numbers(
    fluid: str, paddle3: str, shape: tuple[int, ...]
) -> None:
    """Pool2D's padding (exclusive or not), global pooling, ceil_mode, its padding as four
    sides, and every argument a name (the layer chosen when it runs)."""
    example = NAMED + f"layer = {fluid}\n"
    entry = dataclasses.replace(
        ENTRY_OF["paddle.fluid.dygraph.nn.Pool2D"], example=example,
        stand_in=f"layer = {paddle3}", inputs={"x": "f " + ",".join(map(str, shape))},
        tolerance=1e-7 if "Avg" in paddle3 else None,  # Paddle's float32 count (rule 18)
    )  # fmt: skip
    check_layer(entry, converted_example(entry, example), entry_arrays(entry))


def test_fluid_pool2d_refuses_a_ceil_mode_whose_last_window_differs() -> None:
    example = "layer = Pool2D(pool_size=2, pool_stride=3, ceil_mode=True)\n"
    code = converted_example(ENTRY_OF["paddle.fluid.dygraph.nn.Pool2D"], example)
    with pytest.raises(NotImplementedError, match="ceil_mode"):
        exec(code, {})


@pytest.mark.filterwarnings("ignore:When training, we now always track:UserWarning")
@pytest.mark.parametrize("act", ["None", "'relu'", "'tanh'"])
def test_fluid_act_given_as_a_name_is_chosen_when_it_runs(act: str) -> None:
    example = f"act = {act}\nlayer = fluid.dygraph.nn.BatchNorm(3, act=act)\n"
    stand_in = "layer = nn.Sequential(nn.BatchNorm2D(3, momentum=0.9), " + {
        "None": "nn.Identity())", "'relu'": "nn.ReLU())", "'tanh'": "nn.Tanh())"}[act]  # fmt: skip
    entry = dataclasses.replace(
        ENTRY_OF["paddle.fluid.dygraph.nn.BatchNorm"], example=example, stand_in=stand_in
    )
    check_layer(entry, converted_example(entry, example), entry_arrays(entry))
