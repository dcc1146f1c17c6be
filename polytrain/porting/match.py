"""Pairs the layers of two walked models: user hints first, then the rest in order, each pair
checked by kind, tensors and canonical shapes; builds the target's state and the map.

An attention layer (PyTorch's roles, ``in_proj_weight`` packed) meeting a Linear on the
other side in order is paired with the four Linears from there (query, key, value, whose
names share a parent, then the output projection): a custom attention built of Linears
ports to ``nn.MultiheadAttention`` and back; its output is compared at the fourth. A
``QKVProjection`` (GluonNLP's attention cell) pairs likewise with three Linears sharing a
parent (Hugging Face's ``attention.self``), compared at that parent's output.

A hint whose source starts ``re:`` is a regular expression over the source layers' names,
its target the replacement (``\\1``): one hint for every layer of a stack."""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from polytrain.backend.model_walker import (
    ATTENTION,
    BARE,
    QKV,
    LayerTensor,
    WalkedLayer,
    attention_tensors,
    packed,
    unpack,
)
from polytrain.errors import ConfigError

CONV_AS_LINEAR = "Conv2d"  # the kind that pairs with a Linear when it acts as one (1x1)
HINT_HOW = "give a hint SOURCE_LAYER=TARGET_LAYER (or SOURCE_LAYER= to leave it out)"


@dataclass(frozen=True)
class Pair:
    source: WalkedLayer
    target: WalkedLayer
    hinted: bool = False
    reordered: bool = False  # paired out of registration order (see _bring_forward)


def _unknown(name: str, names: Sequence[str], side: str) -> ConfigError:
    close = difflib.get_close_matches(name, names, n=3)
    also = f"; did you mean {', '.join(close)}?" if close else ""
    return ConfigError(f"The hint names {name!r}, which is no {side} layer with tensors{also}")


def _shapes(layer: WalkedLayer, flat: bool = False) -> dict[str, tuple[int, ...]]:
    """The canonical shapes by role; ``flat``: a 1x1 convolution's weight as a Linear's."""
    shapes = {role: tuple(t.canonical.shape) for role, t in layer.tensors.items()}
    if flat and layer.kind == CONV_AS_LINEAR and "weight" in shapes:
        shapes["weight"] = shapes["weight"][:2]
    return shapes


def as_linear(a: WalkedLayer, b: WalkedLayer) -> bool:
    """Whether one is a Linear and the other a Conv2d that can act as one: a 1x1 kernel of
    one group (a classifier on a pooled map, gluon-cv's MobileNetV3); that its input is
    [N, C, 1, 1] the traces show (:func:`polytrain.porting.verify.check_as_linear`)."""
    if {a.kind, b.kind} != {CONV_AS_LINEAR, "Linear"}:
        return False
    conv = a if a.kind == CONV_AS_LINEAR else b
    weight = conv.tensors.get("weight")
    return conv.groups == 1 and weight is not None and weight.canonical.shape[2:] == (1, 1)


def mismatch(source: WalkedLayer, target: WalkedLayer, *, check_kind: bool) -> str | None:
    """Why ``source`` cannot be ported into ``target``, or None. A 1x1 Conv2d pairs with a
    Linear (:func:`as_linear`), its weight reshaped."""
    flat = as_linear(source, target)
    if check_kind and source.kind.lower() != target.kind.lower() and not flat:
        return f"kinds differ ({source.kind} and {target.kind})"
    if set(source.tensors) != set(target.tensors):
        return f"tensors differ ({sorted(source.tensors)} and {sorted(target.tensors)})"
    if _shapes(source, flat) != _shapes(target, flat):
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
    hints = expand_hints(hints or {}, [layer.name for layer in source])
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
    pairs |= _bare_by_name(source, target, set(hints), set(pairs))
    taken = set(hints) | {p.source.name for p in pairs.values()}
    rest_s = [layer for layer in source if layer.name not in taken]
    rest_t = [layer for layer in target if layer.name not in pairs]
    i = j = 0
    while i < len(rest_s) and j < len(rest_t):
        s_layer, t_layer = rest_s[i], rest_t[j]
        why = mismatch(s_layer, t_layer, check_kind=True)
        step_s = step_t = 1
        if why and {s_layer.kind, t_layer.kind} in ({ATTENTION, "Linear"}, {QKV, "Linear"}):
            grouped = _grouped(rest_s, i, t_layer, rest_t, j)
            if grouped is not None:
                s_layer, t_layer, step_s, step_t = grouped
                why = None
        reordered = bool(why) and _bring_forward(rest_s, i, rest_t, j)
        if reordered:
            s_layer, t_layer, why = rest_s[i], rest_t[j], None
        if why:
            raise ConfigError(
                f"Layers in order do not match at source {s_layer.name!r} and target "
                f"{t_layer.name!r}: {why}: {s_layer.describe()} and {t_layer.describe()}. "
                f"Check the target's layer order, or {HINT_HOW}."
            )
        pairs[rest_t[j].name] = Pair(s_layer, t_layer, reordered=reordered)
        i, j = i + step_s, j + step_t
    if i < len(rest_s) or j < len(rest_t):
        side, extra = ("source", rest_s[i:]) if i < len(rest_s) else ("target", rest_t[j:])
        names = ", ".join(layer.describe() for layer in extra[:3])
        raise ConfigError(
            f"The {side} has {len(extra)} layer(s) with tensors left unmatched: {names}"
            f"{' ...' if len(extra) > 3 else ''}; {HINT_HOW}."
        )
    left_out = [s for s, t in hints.items() if not t]
    return [pairs[layer.name] for layer in target if layer.name in pairs], left_out


def _bare_by_name(
    source: Sequence[WalkedLayer], target: Sequence[WalkedLayer], hinted: set[str], paired: set[str]
) -> dict[str, Pair]:
    """Bare parameters under the same name and shape on both sides (a ViT's ``cls_token``
    and ``pos_embed``), which order could pair crosswise."""
    by_source = {layer.name: layer for layer in source if layer.kind == BARE}
    found = {}
    for t in target:
        s = by_source.get(t.name)
        if s is None or s.name in hinted or t.name in paired or t.kind != BARE:
            continue
        if mismatch(s, t, check_kind=True) is None:
            found[t.name] = Pair(s, t)
    return found


def expand_hints(hints: Mapping[str, str | None], names: Sequence[str]) -> dict[str, str | None]:
    """The hints with each ``re:PATTERN`` source expanded over the source layers it matches
    (whole names), its target the pattern's replacement; a ConfigError when none matches."""
    found: dict[str, str | None] = {}
    for s, t in hints.items():
        if not s.startswith("re:"):
            found[s] = t
            continue
        try:
            pattern = re.compile(s[3:])
            matches = [m for n in names if (m := pattern.fullmatch(n))]
            matched = {m.string: m.expand(t) if t else None for m in matches}
        except (re.error, IndexError) as exc:
            raise ConfigError(
                f"The hint {s}={t} is no regular expression and replacement: {exc}."
            ) from None
        if not matched:
            raise ConfigError(f"The hint {s}={t} matches no source layer with tensors.")
        found |= matched
    return found


LOOKAHEAD = 3  # how far out of registration order a layer may pair


def _bring_forward(source: list[WalkedLayer], i: int, target: list[WalkedLayer], j: int) -> bool:
    """Where ``source[i]`` and ``target[j]`` cannot pair: move a layer of one side that
    pairs with the other's from at most LOOKAHEAD places on, past layers of other kinds
    only, to position ``i`` or ``j``. Kinds cannot be confused: Hugging Face's BERT
    registers a layer's attention LayerNorm before its feed-forward Linears, PaddleNLP's
    after; two Linears out of order stay a question for the user (a hint)."""
    for mine, other, at, fixed in ((target, source, j, i), (source, target, i, j)):
        for k in range(at + 1, min(at + 1 + LOOKAHEAD, len(mine))):
            if mine[k].kind in {layer.kind for layer in mine[at:k]}:
                break
            if mismatch(other[fixed], mine[k], check_kind=True) is None:
                mine.insert(at, mine.pop(k))
                return True
    return False


def _grouped(
    source: Sequence[WalkedLayer], i: int, t_layer: WalkedLayer,
    target: Sequence[WalkedLayer], j: int,
) -> tuple[WalkedLayer, WalkedLayer, int, int] | None:  # fmt: skip
    """(source, target, layers used on each side) where four Linears on one side, from
    ``i`` or ``j``, form the attention layer the other side has there (three: the
    ``QKVProjection``); else None."""
    if t_layer.kind in (ATTENTION, QKV):
        size = 4 if t_layer.kind == ATTENTION else 3
        group = _group(source[i : i + size])
        if group is not None and mismatch(group, t_layer, check_kind=True) is None:
            return group, t_layer, size, 1
        return None
    size = 4 if source[i].kind == ATTENTION else 3
    group = _group(target[j : j + size])
    if group is not None and mismatch(source[i], group, check_kind=True) is None:
        return source[i], group, 1, size
    return None


def _group(layers: Sequence[WalkedLayer]) -> WalkedLayer | None:
    return attention_group(layers) if len(layers) == 4 else qkv_group(layers)


def qkv_group(layers: Sequence[WalkedLayer]) -> WalkedLayer | None:
    """Three Linears sharing a parent (query, key, value: [E, E] each, the same roles) as
    one ``QKVProjection`` named and traced by that parent; None otherwise."""
    if len(layers) != 3 or any(layer.kind != "Linear" for layer in layers):
        return None
    parents = {layer.name.rpartition(".")[0] for layer in layers}
    q, k, v = (layer.tensors for layer in layers)
    e = q["weight"].canonical.shape[0]
    if len(parents) != 1 or any(t["weight"].canonical.shape != (e, e) for t in (q, k, v)):
        return None
    if len({frozenset(t) for t in (q, k, v)}) != 1 or set(q) - {"weight", "bias"}:
        return None
    found = {"in_proj_weight": packed((q["weight"], k["weight"], v["weight"]))}
    if "bias" in q:
        found["in_proj_bias"] = packed((q["bias"], k["bias"], v["bias"]))
    names = "/".join(layer.name.rpartition(".")[2] for layer in layers)
    return WalkedLayer(parents.pop(), QKV, f"Linear x3: {names}", found)


def attention_group(layers: Sequence[WalkedLayer]) -> WalkedLayer | None:
    """Four Linears as one attention layer with PyTorch's roles (q, k, v weights packed),
    named by the parent of the first three (which must share one), traced at the fourth;
    None when they are not four Linears of that form."""
    if len(layers) != 4 or any(layer.kind != "Linear" for layer in layers):
        return None
    parents = {layer.name.rpartition(".")[0] for layer in layers[:3]}
    roles = [{"weight"}, {"weight", "bias"}]
    if len(parents) != 1 or any(set(layer.tensors) not in roles for layer in layers):
        return None
    q, k, v, out = (layer.tensors for layer in layers)
    e = q["weight"].canonical.shape[0]
    if any(t["weight"].canonical.shape[0] != e for t in (k, v)) or out[
        "weight"
    ].canonical.shape != (e, e):
        return None
    if len({frozenset(t) for t in (q, k, v)}) != 1:
        return None
    names = "/".join(layer.name.rpartition(".")[2] for layer in layers)
    return WalkedLayer(
        parents.pop(), ATTENTION, f"Linear x4: {names}", attention_tensors(q, k, v, out),
        output=layers[3].name,
    )  # fmt: skip


def ported_state(
    pairs: Sequence[Pair], target_state: Mapping[str, np.ndarray]
) -> tuple[dict[str, np.ndarray], list[str]]:
    """The target's whole state with every paired tensor replaced by its source, in the
    target's layout and dtype (a packed target tensor split into its parts); and the
    target's entries kept as they were."""
    state = {k: np.asarray(v) for k, v in target_state.items()}
    ported = set()
    for pair in pairs:
        for role, t in pair.target.tensors.items():
            value = pair.source.tensors[role].canonical
            pieces = unpack(value, len(t.parts)) if t.parts else [value]
            for part, piece in zip(t.parts or (t,), pieces, strict=True):
                piece = piece.reshape(part.canonical.shape)  # a 1x1 conv's as a Linear's
                piece = piece.T if part.transpose else piece
                state[part.native] = np.ascontiguousarray(piece, dtype=state[part.native].dtype)
                ported.add(part.native)
    return state, [k for k in state if k not in ported]


def derived_map(pairs: Sequence[Pair]) -> dict[str, dict[str, Any]]:
    """target (canonical) name -> where it comes from in the source's state: the JSON of
    ``polytrain convert --map``. A source tensor packed from parts (Paddle's q/k/v
    projections) lists them: ``{"native": [q, k, v], "transpose": true}``; into a target
    that keeps them apart too, part for part; a target packed from parts (written back to
    Paddle's q/k/v) by its canonical name."""
    out: dict[str, dict[str, Any]] = {}
    for pair in pairs:
        for role, t in pair.target.tensors.items():
            s = pair.source.tensors[role]
            if t.parts and len(t.parts) == len(s.parts):  # part for part (q, k, v Linears)
                out.update(
                    _entry(tp.native, sp, tp) for tp, sp in zip(t.parts, s.parts, strict=True)
                )
                continue
            key = f"{pair.target.name}.{role}" if t.parts and pair.target.name else t.native
            out.update([_entry(key, s, t)])
    return out


def _entry(key: str, s: LayerTensor, t: LayerTensor) -> tuple[str, dict[str, Any]]:
    """One map entry; ``reshape`` where the target's canonical shape is another view of
    the source's (a 1x1 convolution's weight [out, in, 1, 1] as a Linear's [out, in])."""
    shape, target_shape = list(s.canonical.shape), list(t.canonical.shape)
    reshape = {"reshape": target_shape} if not t.parts and target_shape != shape else {}
    return key, {
        "native": list(s.natives) if s.parts else s.native,
        "transpose": _transpose(s),
        "shape": shape,
    } | reshape


def _transpose(tensor: LayerTensor) -> bool:
    """Whether the tensor (every part of a packed one) is stored transposed."""
    flags = {p.transpose for p in tensor.parts} or {tensor.transpose}
    if len(flags) != 1:
        raise ConfigError(f"{tensor.native}: its parts differ in layout; no map can say so.")
    return flags.pop()
