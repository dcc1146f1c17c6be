"""What the port-code mapping tests of every framework share: an entry's random inputs
(from its input specs), its tolerance, and the comparison of two results."""

from __future__ import annotations

import sys
import types
import zlib
from typing import Any

import numpy as np

from polytrain.porting.code.table import Entry

FP64 = 1e-10


def entry_seed(entry: Entry) -> int:
    return zlib.crc32(entry.source.encode())


def entry_arrays(entry: Entry) -> dict[str, np.ndarray]:
    """Inputs from their specs: ``f 2,3`` float64 normal, ``p 2,3`` positive, ``i5 2``
    int64 in [0, 5), ``n 2,3`` a numpy array given as is, ``s 2,3`` float32."""
    rng = np.random.default_rng(entry_seed(entry))
    out = {}
    for name, spec in entry.inputs.items():
        kind, _, dims = spec.partition(" ")
        shape = tuple(int(d) for d in dims.split(",") if d)
        if kind.startswith("i"):
            out[name] = rng.integers(0, int(kind[1:]), size=shape).astype(np.int64)
        elif kind == "p":
            out[name] = rng.uniform(0.5, 2.0, size=shape)
        elif kind == "s":
            out[name] = rng.standard_normal(shape).astype(np.float32)
        else:
            out[name] = rng.standard_normal(shape)
    return out


def assert_close(a: Any, b: Any, tol: float, what: str) -> None:
    if isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), f"{what}: {a!r} vs {b!r}"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_close(x, y, tol, f"{what}[{i}]")
        return
    if isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), what
        for k in a:
            assert_close(a[k], b[k], tol, f"{what}[{k}]")
        return
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape, f"{what}: shapes {a.shape} vs {b.shape}"
    if a.dtype.kind in "USO" or b.dtype.kind in "USO":
        assert a.tolist() == b.tolist(), f"{what}: {a!r} vs {b!r}"
        return
    if a.dtype == bool or a.dtype.kind in "iu":
        assert np.array_equal(a, b), what
        return
    scale = max(1.0, float(np.max(np.abs(a)))) if a.size else 1.0
    diff = float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))) if a.size else 0.0
    assert diff <= tol * scale, f"{what}: max |diff| {diff:.3g} > {tol:g} (scale {scale:.3g})"


def entry_tolerance(entry: Entry) -> float:
    return entry.tolerance if entry.tolerance is not None else FP64


def assert_same_distribution(a: Any, b: Any, what: str) -> None:
    """Two parameters drawn by one initializer in two frameworks: equal where constant,
    else the same quantiles (1 %, 10 %, 50 %, 90 %, 99 %) within 5 % of their spread (the
    examples draw tens of thousands of values; other initializers differ by far more)."""
    a, b = np.ravel(np.asarray(a, dtype=np.float64)), np.ravel(np.asarray(b, dtype=np.float64))
    assert a.size == b.size, f"{what}: {a.size} vs {b.size} values"
    if np.ptp(a) == 0 or np.ptp(b) == 0:
        assert np.array_equal(a, b), f"{what}: constant {a[:3]} vs {b[:3]}"
        return
    levels = [0.01, 0.1, 0.5, 0.9, 0.99]
    qa, qb = np.quantile(a, levels), np.quantile(b, levels)
    spread = qa[-1] - qa[0]
    assert np.all(np.abs(qa - qb) <= 0.05 * spread), f"{what}: quantiles {qa} vs {qb}"


def check_init(entry: Entry, source: list[Any], converted: list[Any]) -> None:
    """The source layer's and the converted layer's parameters, in order (as numpy
    arrays), of the same distributions; those named in ``differs`` (the frameworks' own
    defaults, which differ) are skipped."""
    assert len(source) == len(converted), f"{entry.source}: {len(source)} vs {len(converted)}"
    roles = ["weight", "bias", *[f"p{i}" for i in range(2, len(source))]]
    for role, a, b in zip(roles, source, converted, strict=False):
        if role not in entry.differs:
            assert_same_distribution(a, b, f"{entry.source} {role}")


def run_as_module(source: str, name: str = "port_code_run") -> dict[str, Any]:
    """``source`` run as a module of its own, as a user runs it (``sys.modules[__name__]``
    is that module while it runs); its namespace."""
    module = types.ModuleType(name)
    sys.modules[name] = module
    try:
        exec(compile(source, "<converted>", "exec"), module.__dict__)
    finally:
        del sys.modules[name]
    return module.__dict__
