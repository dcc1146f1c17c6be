"""Layer-by-layer comparison of two traces of the same input: a table, the first layer that
differs beyond the tolerance, and the same as JSON."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from polytrain.backend.model_walker import BARE, Trace
from polytrain.errors import ConfigError
from polytrain.porting.match import HINT_HOW, Pair, as_linear

OUTPUT = "(output)"


@dataclass(frozen=True)
class Row:
    """One traced layer: target and source names, output shapes, max |diff| and max |diff|
    relative to the source's largest |value|; ``problem`` when it is not comparable."""

    layer: str
    source: str
    shape: list[int]
    source_shape: list[int]
    max_abs_diff: float | None
    relative: float | None
    ok: bool
    problem: str = ""


@dataclass
class Verification:
    tolerance: float
    rows: list[Row] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(row.ok for row in self.rows)

    @property
    def first_failure(self) -> Row | None:
        return next((row for row in self.rows if not row.ok), None)

    def to_dict(self) -> dict[str, Any]:
        first = self.first_failure
        return {
            "passed": self.passed,
            "tolerance": self.tolerance,
            "first_failure": None if first is None else first.layer,
            "layers": [asdict(row) for row in self.rows],
        }

    def format(self) -> str:
        head = ("layer", "source layer", "shape", "max |diff|", "relative", "")
        body = [
            (
                row.layer,
                row.source,
                "x".join(map(str, row.shape)) or "-",
                "-" if row.max_abs_diff is None else f"{row.max_abs_diff:.3g}",
                "-" if row.relative is None else f"{row.relative:.3g}",
                "ok" if row.ok else f"FAIL {row.problem}".strip(),
            )
            for row in self.rows
        ]
        widths = [max(len(str(r[i])) for r in [head, *body]) for i in range(len(head))]
        lines = ["  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)) for r in body]
        title = "  ".join(c.ljust(w) for c, w in zip(head, widths, strict=True))
        first = self.first_failure
        verdict = (
            f"verified: every layer within {self.tolerance:g} of the source's largest value"
            if first is None
            else f"FAILED: first layer beyond {self.tolerance:g}: {first.layer} "
            f"(source {first.source}): {first.problem or f'relative {first.relative:.3g}'}"
        )
        return "\n".join([title.rstrip(), *(line.rstrip() for line in lines), verdict])


def _row(layer: str, source: str, s: np.ndarray | None, t: np.ndarray | None, tol: float) -> Row:
    if s is None or t is None:
        missing = "source" if s is None else "target"
        return Row(
            layer, source, [] if t is None else list(t.shape), [] if s is None else list(s.shape),
            None, None, ok=False, problem=f"the {missing} layer did not run",
        )  # fmt: skip
    time_major = list(s.shape)
    if s.shape != t.shape and s.ndim >= 3 and s.swapaxes(0, 1).shape == t.shape:
        s = s.swapaxes(0, 1)  # time-major ([T, N, C], GluonNLP's encoder) against [N, T, C]
    else:
        time_major = []
    if s.shape != t.shape and _pooled(s.shape, t.shape):
        s = s.reshape(t.shape)  # [N, C, 1, 1] against [N, C]: the same values
    if s.shape != t.shape and s.ndim == t.ndim and _broadcasts(s.shape, t.shape):
        s, t = np.broadcast_arrays(s, t)  # one computed once for the batch (a position
        # embedding of [1, T]), the other per sample: the same values where they exist
    if s.shape != t.shape:
        return Row(
            layer, source, list(t.shape), list(s.shape), None, None, ok=False,
            problem=f"shapes differ: source {list(s.shape)}, target {list(t.shape)}",
        )  # fmt: skip
    s64, t64 = s.astype(np.float64), t.astype(np.float64)
    diff = float(np.max(np.abs(s64 - t64))) if s.size else 0.0
    scale = float(np.max(np.abs(s64))) if s.size else 0.0
    relative = diff / scale if scale > 0 else diff
    ok = bool(np.isfinite(relative)) and relative <= tol
    return Row(layer, source, list(t.shape), time_major or list(s.shape), diff, relative, ok)


def _pooled(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """Whether one shape is the other with trailing 1s ([N, C, 1, 1] and [N, C]: a 1x1
    convolution on a pooled map against a Linear)."""
    short, long = sorted((a, b), key=len)
    return len(short) >= 2 and long[: len(short)] == short and set(long[len(short) :]) == {1}


def check_as_linear(pairs: Sequence[Pair], source: Trace, target: Trace) -> None:
    """A ConfigError where a Conv2d paired with a Linear (:func:`~polytrain.porting.match.
    as_linear`) ran on a map larger than 1x1: only on [N, C, 1, 1] is it the Linear."""
    for pair in pairs:
        if not as_linear(pair.source, pair.target):
            continue
        linear_source = pair.source.kind == "Linear"
        conv, trace = (pair.target, target) if linear_source else (pair.source, source)
        out = trace.layers.get(conv.traced)
        if out is not None and (out.ndim != 4 or out.shape[2:] != (1, 1)):
            raise ConfigError(
                f"Layers source {pair.source.name!r} and target {pair.target.name!r} cannot "
                f"match: kinds differ ({pair.source.kind} and {pair.target.kind}): the 1x1 "
                f"convolution {conv.name} gives {list(out.shape)}, a Linear's output only "
                f"where it runs on [N, C, 1, 1]; {HINT_HOW}."
            )


def _broadcasts(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """Whether the two shapes differ only where one of them is 1."""
    return all(x == y or 1 in (x, y) for x, y in zip(a, b, strict=True))


def compare_traces(
    pairs: Sequence[Pair], source: Trace, target: Trace, tolerance: float
) -> Verification:
    """Rows in the order the target ran its layers (layers neither model ran are skipped,
    and bare parameters, which no layer of their own runs), then the models' outputs."""
    result = Verification(tolerance)
    traced = [p for p in pairs if BARE not in (p.source.kind, p.target.kind)]
    by_target = {pair.target.traced: pair for pair in traced}
    ran = [name for name in target.layers if name in by_target]
    ran += [
        p.target.traced
        for p in traced
        if p.target.traced not in target.layers and p.source.traced in source.layers
    ]
    for name in ran:
        pair = by_target[name]
        s_out = source.layers.get(pair.source.traced)
        t_out = target.layers.get(name)
        result.rows.append(_row(pair.target.name, pair.source.name, s_out, t_out, tolerance))
    result.rows.append(_row(OUTPUT, OUTPUT, source.output, target.output, tolerance))
    return result
