"""Attention layers between files: PyTorch's ``nn.MultiheadAttention`` packs the query, key
and value projections into ``in_proj_weight`` [3E, E] and ``in_proj_bias`` [3E] (or keeps
``q_proj_weight``/``k_proj_weight``/``v_proj_weight`` when kdim or vdim differs from E),
beside an ``out_proj`` Linear; a format whose attention keeps four Linears apart (Paddle's
``nn.MultiHeadAttention``: ``q_proj``, ``k_proj``, ``v_proj``, ``out_proj``, each [in, out])
declares their names in its :class:`~polytrain.backend.native_format.LayoutRules`.

Read, the four Linears of one parent become PyTorch's names (packed where PyTorch packs);
written, PyTorch's names become the four Linears. A weights file records no option of the
layer (the number of heads, a transformer layer's norm placement or activation): a note
says so, and ``polytrain port`` compares them from the model objects. A tensor the user's
map names exactly is left as the map says (name the q/k/v weights to keep them apart).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from polytrain.backend.mismatch import name_list
from polytrain.backend.model_walker import ATTENTION
from polytrain.io.name_map import MapEntry, UserMap

SEPARATE = ("q_proj_weight", "k_proj_weight", "v_proj_weight")
OPTIONS_NOTE = (
    "a weights file records none of the attention's options (num_heads; a transformer "
    "layer's norm_first/normalize_before, activation, layer_norm_eps, dropout): build the "
    "target with the source's, or compare them from the model objects with polytrain port"
)


def _join(parent: str, leaf: str) -> str:
    return f"{parent}.{leaf}" if parent else leaf


def _parents(names: list[str], leaf: str) -> list[str]:
    """The parents of the names ending in ``leaf`` (the root's: "")."""
    return [
        n[: -len(leaf) - 1] if n != leaf else ""
        for n in names
        if n == leaf or n.endswith(f".{leaf}")
    ]


def pack_read(entries: Mapping[str, MapEntry], tensors: Mapping[str, np.ndarray],
              projections: tuple[str, ...], user: UserMap,
              notes: list[str]) -> dict[str, MapEntry]:  # fmt: skip
    """``entries`` (canonical name -> native) with the q/k/v Linears of every attention
    layer (its four Linear weights stored transposed, their names as ``projections``) as
    PyTorch names them; the others as they are. None (dropped): joined into another."""
    q = projections[0]
    renamed: dict[str, tuple[str, MapEntry] | None] = {}
    found = []
    for parent in _parents(list(entries), f"{q}.weight"):
        own = _layer_entries(parent, entries, tensors, projections, user)
        if own is not None:
            renamed |= own
            found.append(parent or "(the root)")
    if not found:
        return dict(entries)
    q, k, v, _ = projections
    notes.append(
        f"attention layers as PyTorch's nn.MultiheadAttention ({q}/{k}/{v} -> in_proj_weight, "
        f"in_proj_bias): {name_list(found, 6)}; {OPTIONS_NOTE}"
    )
    out: dict[str, MapEntry] = {}
    for name, entry in entries.items():
        new = renamed.get(name, (name, entry))
        if new is not None:
            out[new[0]] = new[1]
    return out


def _layer_entries(parent: str, entries: Mapping[str, MapEntry],
                   tensors: Mapping[str, np.ndarray], projections: tuple[str, ...],
                   user: UserMap) -> dict[str, tuple[str, MapEntry] | None] | None:  # fmt: skip
    """The q/k/v entries of the attention layer at ``parent`` -> their PyTorch names and
    entries (None: joined into another), or None when it is not one: four Linear weights
    stored transposed, q/k/v of one output width, biases on all three or none, none of
    them given a kind by the user's map."""
    weights = [_join(parent, f"{p}.weight") for p in projections]
    biases = [_join(parent, f"{p}.bias") for p in projections[:3]]
    given = [entries.get(n) for n in weights]
    have = [b for b in biases if b in entries]
    if any(e is None or e.transpose is not True for e in given) or have not in ([], biases):
        return None
    if any(_kept(n, user) for n in weights[:3] + have) or any(entries[b].transpose for b in have):
        return None
    w = [e for e in given[:3] if e is not None]
    shapes = [tuple(reversed(np.shape(tensors[e.native]))) for e in w]
    e = shapes[0][0]
    if any(shape[0] != e for shape in shapes):
        return None
    own: dict[str, tuple[str, MapEntry] | None] = {}
    if all(shape == (e, e) for shape in shapes):
        own[weights[0]] = (_join(parent, "in_proj_weight"), _packed(w, (3 * e, e)))
        own |= dict.fromkeys(weights[1:3])
    else:  # kdim or vdim differs from embed_dim: PyTorch keeps the three apart
        own |= {
            name: (_join(parent, new), entry)
            for name, entry, new in zip(weights, w, SEPARATE, strict=False)
        }
    if have:
        own[biases[0]] = (
            _join(parent, "in_proj_bias"), _packed([entries[b] for b in biases], (3 * e,))
        )  # fmt: skip
        own |= dict.fromkeys(biases[1:])
    return own


def _kept(name: str, user: UserMap) -> bool:
    """The user's map says what layer ``name`` is (``{"kind": "Linear"}``): kept apart."""
    return name in user.exact and user.exact[name].kind is not None


def _packed(parts: list[MapEntry], shape: tuple[int, ...]) -> MapEntry:
    natives = tuple(p.native for p in parts)
    return MapEntry(natives[0], parts[0].transpose, shape, ATTENTION, natives)


Split = dict[str, tuple[str, ...]]  # canonical name -> the native names of its parts


def unpack_write(params: Mapping[str, np.ndarray], projections: tuple[str, ...],
                 user: UserMap) -> tuple[Split, dict[str, str], list[str]]:  # fmt: skip
    """For every attention layer of ``params`` (PyTorch's names: ``in_proj_weight`` or the
    three ``*_proj_weight``, beside ``out_proj.weight``): canonical name -> the native
    names of its Linear parts; the layer kind of each (``Linear``, the output projection
    too); and a note. A name the user's map gives exactly is left to the map."""
    q, k, v, out = projections
    split: dict[str, tuple[str, ...]] = {}
    found = []
    names = list(params)
    for parent in dict.fromkeys(_parents(names, "in_proj_weight") + _parents(names, SEPARATE[0])):
        if _join(parent, "out_proj.weight") not in params:
            continue
        own = {
            _join(parent, "in_proj_weight"): tuple(_join(parent, f"{p}.weight") for p in (q, k, v)),
            _join(parent, "in_proj_bias"): tuple(_join(parent, f"{p}.bias") for p in (q, k, v)),
        }
        own |= {
            _join(parent, s): (_join(parent, f"{p}.weight"),)
            for s, p in zip(SEPARATE, (q, k, v), strict=True)
        }
        own |= {_join(parent, f"out_proj.{leaf}"): (_join(parent, f"{out}.{leaf}"),)
                for leaf in ("weight", "bias")}  # fmt: skip
        own = {n: parts for n, parts in own.items() if n in params and n not in user.exact}
        split |= own
        found.append(parent or "(the root)")
    notes = []
    if found:
        notes.append(
            f"attention layers written with the framework's {q}/{k}/{v}/{out} Linears (from "
            f"PyTorch's in_proj_weight, in_proj_bias): {name_list(found, 6)}; {OPTIONS_NOTE}"
        )
    return split, dict.fromkeys(split, "Linear"), notes
