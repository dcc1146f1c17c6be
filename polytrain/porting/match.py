"""Pairs the layers of two walked models: user hints first, then the rest in order, each pair
checked by kind, tensors and canonical shapes; builds the target's state and the map."""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from polytrain.backend.model_walker import WalkedLayer
from polytrain.errors import ConfigError

HINT_HOW = "give a hint SOURCE_LAYER=TARGET_LAYER (or SOURCE_LAYER= to leave it out)"


@dataclass(frozen=True)
class Pair:
    source: WalkedLayer
    target: WalkedLayer
    hinted: bool = False


def _unknown(name: str, names: Sequence[str], side: str) -> ConfigError:
    close = difflib.get_close_matches(name, names, n=3)
    also = f"; did you mean {', '.join(close)}?" if close else ""
    return ConfigError(f"The hint names {name!r}, which is no {side} layer with tensors{also}")


def _shapes(layer: WalkedLayer) -> dict[str, tuple[int, ...]]:
    return {role: tuple(t.canonical.shape) for role, t in layer.tensors.items()}


def mismatch(source: WalkedLayer, target: WalkedLayer, *, check_kind: bool) -> str | None:
    """Why ``source`` cannot be ported into ``target``, or None."""
    if check_kind and source.kind.lower() != target.kind.lower():
        return f"kinds differ ({source.kind} and {target.kind})"
    if set(source.tensors) != set(target.tensors):
        return f"tensors differ ({sorted(source.tensors)} and {sorted(target.tensors)})"
    if _shapes(source) != _shapes(target):
        return "shapes differ"
    if source.groups != target.groups:
        return f"groups differ ({source.groups} and {target.groups})"
    return None


def match_layers(
    source: Sequence[WalkedLayer],
    target: Sequence[WalkedLayer],
    hints: Mapping[str, str | None] | None = None,
) -> tuple[list[Pair], list[str]]:
    """(pairs in target order, source layers left out by a hint). A ConfigError names the
    first pair that cannot match, or the layers left over, and how to resolve it."""
    hints = dict(hints or {})
    by_source = {layer.name: layer for layer in source}
    by_target = {layer.name: layer for layer in target}
    for s, t in hints.items():
        if s not in by_source:
            raise _unknown(s, list(by_source), "source")
        if t and t not in by_target:
            raise _unknown(t, list(by_target), "target")
    pairs: dict[str, Pair] = {}
    for s, t in hints.items():
        if t:
            why = mismatch(by_source[s], by_target[t], check_kind=False)
            if why:
                raise ConfigError(
                    f"The hint {s}={t} pairs layers that cannot match: {why}: "
                    f"{by_source[s].describe()} and {by_target[t].describe()}."
                )
            pairs[t] = Pair(by_source[s], by_target[t], hinted=True)
    rest_s = [layer for layer in source if layer.name not in hints]
    rest_t = [layer for layer in target if layer.name not in pairs]
    for s_layer, t_layer in zip(rest_s, rest_t, strict=False):
        why = mismatch(s_layer, t_layer, check_kind=True)
        if why:
            raise ConfigError(
                f"Layers in order do not match at source {s_layer.name!r} and target "
                f"{t_layer.name!r}: {why}: {s_layer.describe()} and {t_layer.describe()}. "
                f"Check the target's layer order, or {HINT_HOW}."
            )
        pairs[t_layer.name] = Pair(s_layer, t_layer)
    if len(rest_s) != len(rest_t):
        side, extra = (
            ("source", rest_s[len(rest_t) :])
            if len(rest_s) > len(rest_t)
            else ("target", rest_t[len(rest_s) :])
        )
        names = ", ".join(layer.describe() for layer in extra[:3])
        raise ConfigError(
            f"The {side} has {len(extra)} layer(s) with tensors left unmatched: {names}"
            f"{' ...' if len(extra) > 3 else ''}; {HINT_HOW}."
        )
    left_out = [s for s, t in hints.items() if not t]
    return [pairs[layer.name] for layer in target], left_out


def ported_state(
    pairs: Sequence[Pair], target_state: Mapping[str, np.ndarray]
) -> tuple[dict[str, np.ndarray], list[str]]:
    """The target's whole state with every paired tensor replaced by its source, in the
    target's layout and dtype; and the target's entries kept as they were."""
    state = {k: np.asarray(v) for k, v in target_state.items()}
    ported = set()
    for pair in pairs:
        for role, t in pair.target.tensors.items():
            value = pair.source.tensors[role].canonical
            value = value.T if t.transpose else value
            state[t.native] = np.ascontiguousarray(value, dtype=state[t.native].dtype)
            ported.add(t.native)
    return state, [k for k in state if k not in ported]


def derived_map(pairs: Sequence[Pair]) -> dict[str, dict[str, Any]]:
    """target (canonical) name -> where it comes from in the source's state: the JSON of
    ``polytrain convert --map``."""
    out: dict[str, dict[str, Any]] = {}
    for pair in pairs:
        for role, t in pair.target.tensors.items():
            s = pair.source.tensors[role]
            out[t.native] = {
                "native": s.native,
                "transpose": s.transpose,
                "shape": list(s.canonical.shape),
            }
    return out
