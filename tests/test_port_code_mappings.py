"""Every entry of the port-code table, proven by running it: the entry's example (Paddle
code) runs on Paddle, the tool converts it, the result runs on PyTorch on the same inputs
(layers: the same weights, moved by polytrain's porting layout rules), and the outputs,
gradients and states must agree (float64: 1e-10; float32 where Paddle has no float64).
A mapping without an example fails the suite."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from port_code_helpers import assert_close, entry_arrays, entry_seed, entry_tolerance

from polytrain.porting.code import convert_source
from polytrain.porting.code.table import Entry, all_entries
from polytrain.porting.code.transformer import MARKER

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
for _ in range(4):
    loss = (net(x) ** 2).mean()
    loss.backward()
    opt.step()
    opt.clear_grad()
    record(opt)
    sched.step()
"""
ENTRIES = all_entries("paddle")  # Gluon's: tests/test_port_code_gluon.py
CONVERTED = [e for e in ENTRIES if not e.unsupported]
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
    assert "paddle" not in result.code, result.code
    return result.code


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


@pytest.mark.filterwarnings("ignore:When training, we now always track:UserWarning")
@pytest.mark.filterwarnings("ignore:amp_guard can only be enabled:UserWarning")  # CPU: no-op
@pytest.mark.filterwarnings("ignore:AmpScaler can only be enabled:UserWarning")
@pytest.mark.filterwarnings("ignore:CUDA is not available:UserWarning")
@pytest.mark.filterwarnings("ignore:torch.cuda.amp.GradScaler is enabled:UserWarning")
@pytest.mark.parametrize("entry", CONVERTED, ids=lambda e: e.source)
def test_mapping_computes_the_same_numbers(entry: Entry, tmp_path: Path) -> None:
    assert entry.example, f"{entry.source} has no example: a mapping without a test"
    code = converted_example(entry, _program(entry, entry.example))
    arrays = entry_arrays(entry)
    if entry.check == "layer":
        check_layer(entry, code, arrays)
    else:
        check_program(entry, code, arrays, tmp_path)


@pytest.mark.parametrize("entry", MARKED, ids=lambda e: e.source)
def test_known_but_unsupported_api_stays_marked(entry: Entry) -> None:
    assert entry.example, f"{entry.source} has no example"
    result = convert_source(HEADER + entry.example, entry.source)
    marker = MARKER.format(api=entry.source, why=entry.unsupported)
    assert marker in result.code
    assert [u.api for u in result.report.uses if not u.converted] == [entry.source]


def test_every_entry_has_an_example_and_inputs_it_needs() -> None:
    assert len(CONVERTED) >= 80
    for entry in ENTRIES:
        assert entry.example, entry.source
        assert entry.check in ("value", "layer", "nograd", "net", "optimizer", "scheduler",
                               "shape"), entry.source  # fmt: skip
        if entry.check == "layer":
            assert entry.inputs, entry.source


def test_method_entries_cannot_be_numpy_methods() -> None:
    """A method is converted whatever its receiver, so its name must not be one of numpy's
    array methods (``x.astype`` on an array in a Paddle script stays as it is)."""
    for entry in ENTRIES:
        if entry.is_method:
            assert not hasattr(np.ndarray, entry.source[1:]), entry.source
