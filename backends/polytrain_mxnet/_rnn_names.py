"""How Gluon names the canonical (PyTorch) tensors of the recurrent layers.

``gluon.rnn.LSTM``/``GRU`` (unidirectional) save layer ``k``'s tensors as
``_unfused.<k>.i2h_weight``, ``h2h_weight``, ``i2h_bias``, ``h2h_bias`` (its
``_collect_params_with_prefix``, what ``save_parameters`` writes), in PyTorch's layout and
gate order: only the names differ from ``weight_ih_l<k>``, ``weight_hh_l<k>``,
``bias_ih_l<k>``, ``bias_hh_l<k>``. No framework import: the format's layout rules use it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping

_CANONICAL = re.compile(r"(weight|bias)_(ih|hh)_l(\d+)")
_GLUON = re.compile(r"(^|\.)_unfused\.(\d+)\.(i2h|h2h)_(weight|bias)$")
_TO_GLUON = {"ih": "i2h", "hh": "h2h"}


def gluon_leaf(leaf: str) -> str | None:
    """``weight_ih_l1`` -> ``_unfused.1.i2h_weight``; None for any other leaf."""
    found = _CANONICAL.fullmatch(leaf)
    if found is None:
        return None
    kind, side, layer = found.groups()
    return f"_unfused.{int(layer)}.{_TO_GLUON[side]}_{kind}"


def canonical_name(structural: str) -> str | None:
    """``rnn._unfused.1.i2h_weight`` -> ``rnn.weight_ih_l1``; None for any other name."""
    found = _GLUON.search(structural)
    if found is None:
        return None
    dot, layer, side, kind = found.groups()
    leaf = f"{kind}_{side.replace('2', '')}_l{layer}"
    return f"{structural[: found.start()]}{dot}{leaf}"


class GluonRecurrentLeaves(Mapping[str, str]):
    """Canonical leaf -> Gluon's, for a layer of any depth: the ``LayoutRules.renames`` of
    LSTM and GRU, which name their leaves (``native_leaf``). Iterating lists nothing: the
    generic rules for files of unknown models undo renames of a name's last dotted part,
    which Gluon's ``_unfused.0.i2h_weight`` is not (such files need a map, see
    tests/io/test_convert_rnn.py). It is true all the same, as a rule that renames."""

    def __getitem__(self, leaf: str) -> str:
        native = gluon_leaf(leaf)
        if native is None:
            raise KeyError(leaf)
        return native

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0

    def __bool__(self) -> bool:
        return True
