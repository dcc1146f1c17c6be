"""Paddle's native weights file (``.pdparams``), read and written with numpy.

``paddle.save(layer.state_dict())`` writes a pickle (``\\x80``) of a dict of numpy arrays
plus the ``StructuredToParameterName@@`` name table; protocol 2/3 cut arrays over 1 GiB
into slices listed in ``UnpackBigParamInfor@@``. Read with
:mod:`polytrain.utils.safe_pickle` (never running code from the file); written as
``pickle.dumps(dict, protocol=4)``, which is byte for byte what ``paddle.save`` writes
for the same arrays.

``paddle.jit.save``'s ``.pdiparams`` (unnamed tensors, named by the program beside it)
is read too, see ``_pdiparams``; it is never written.
"""

from __future__ import annotations

import io
import os
import pickle
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from polytrain.backend.native_format import CompanionRoles, LayoutRules, NativeFormat, PathLike
from polytrain.backend.optimizer_file import OptimizerFile
from polytrain.errors import CheckpointError
from polytrain.utils import safe_pickle

from ._optimizer_state import refuse_optimizer_state
from ._pdiparams import looks_like_pdiparams, pdiparams_roles, read_pdiparams

NAME_TABLE = "StructuredToParameterName@@"
SLICES = "UnpackBigParamInfor@@"
# Paddle names a parameter nobody named ``<layer>_<n>.w_<k>`` / ``.b_<k>``: ``<layer>`` is
# the snake-case class name of the layer that created it (paddle/nn/layer/layers.py,
# ``_convert_camel_to_snake``; ``Linear`` -> ``linear_0``), the rest from
# ``unique_name.generate`` (paddle/base/unique_name.py, layer_helper_base.py). The layers of
# paddle.nn whose parameters' layout is known, by that snake-case name:
KINDS = {
    "linear": "Linear",  # weight [in, out]
    "embedding": "Embedding",  # weight [num_embeddings, embedding_dim], as PyTorch
    "conv1d": "Conv1d",
    "conv2d": "Conv2d",
    "conv3d": "Conv3d",
    "batch_norm1d": "BatchNorm1d",
    "batch_norm2d": "BatchNorm2d",
    "batch_norm3d": "BatchNorm3d",
    "layer_norm": "LayerNorm",
    # paddle.nn.LSTM/GRU/SimpleRNN: weight_ih_l<k> [gates * hidden, in], weight_hh_l<k>
    # [gates * hidden, hidden], the gates in PyTorch's order (LSTM i, f, g, o; GRU r, z, n)
    "lstm_cell": "LSTM",
    "gru_cell": "GRU",
    "simple_rnn_cell": "RNN",
}
# paddle.nn.LSTM/GRU/SimpleRNN list each parameter twice in state_dict(): under the flat
# name PyTorch uses (``weight_ih_l0``) and under their cell (``0.cell.weight_ih``,
# ``0.cell_fw.``/``0.cell_bw.`` when bidirectional); the name table maps both to one tensor.
CELL_ALIAS = re.compile(r"(^|\.)\d+\.cell(_fw|_bw)?\.")
GENERATED = re.compile(r"(?P<layer>[a-z][a-z0-9_]*?)_\d+\.[wb]_\d+")


class PaddleFormat(NativeFormat):
    """``.pdparams`` files: Linear ``weight`` is stored [in, out] (transposed); BatchNorm
    running_mean / running_var are ``_mean`` / ``_variance``. For a model that is none of
    the built-in ones, the file's name table tells which 2-D tensors are Linear weights,
    where Paddle generated their names."""

    name = "paddle"
    label = "Paddle .pdparams"
    suffix = ".pdparams"
    signature = "a Paddle pickle (80 ..) or a paddle.jit.save .pdiparams (00 00 00 00 ..)"
    order = 20
    layout = LayoutRules(
        renames={
            kind: {"running_mean": "_mean", "running_var": "_variance"}
            for kind in ("BatchNorm2d", "BatchNorm1d")
        },
        transposed={
            "Linear": frozenset({"weight"}),
            # polytrain's Paddle attention keeps in_proj [3E, E]; out_proj is an nn.Linear
            "MultiHeadSelfAttention": frozenset({"out_proj.weight"}),
        },
        note="Paddle layout, Linear [in, out]",
        attention=("q_proj", "k_proj", "v_proj", "out_proj"),  # paddle.nn.MultiHeadAttention
    )

    def sniff(self, head: bytes, path: PathLike) -> bool:
        # a pickle opens with PROTO and its number (2-5); a lone 0x80 is an empty msgpack map
        is_pickle = len(head) > 1 and head[0] == 0x80 and 2 <= head[1] <= 5
        return is_pickle or looks_like_pdiparams(head, path)

    def read(self, path: PathLike) -> dict[str, np.ndarray]:
        if _is_pdiparams(path):
            return read_pdiparams(path)
        return _read(path)

    def companion_roles(self, path: PathLike) -> CompanionRoles | None:
        """For a ``paddle.jit.save`` ``.pdiparams``: the roles the ops of its program give
        (see ``_program``); None for a ``paddle.save`` pickle."""
        return pdiparams_roles(path) if _is_pdiparams(path) else None

    def encode(self, tensors: Mapping[str, np.ndarray]) -> bytes:
        return _encode(tensors)

    def read_optimizer(
        self, path: PathLike, weights: PathLike, settings: Mapping[str, Any]
    ) -> OptimizerFile:
        """A ``.pdopt`` (``paddle.save(opt.state_dict())``), see ``_optimizer_state``."""
        from ._optimizer_state import read_pdopt

        return read_pdopt(path, weights, settings)

    layer_evidence = (
        "its name table (where only a name Paddle generated, like linear_0.w_0, counts), "
        "or for a paddle.jit.save .pdiparams the ops of its program"
    )

    def layer_kinds(self, path: PathLike) -> dict[str, str] | None:
        """From the name table ``paddle.save`` stores (``fc.weight`` -> ``linear_0.w_0``),
        for the parameters whose names Paddle generated for a layer of paddle.nn (see
        KINDS). A name the user gave (``ParamAttr(name="fc_0.w_0")``, ``proj_weights``)
        or a custom layer's own parameter says nothing about the layout: left out."""
        table = _name_table(path)
        if not table:
            return None
        return {s: kind for s, p in table.items() if (kind := generated_kind(p)) is not None}


def _is_pdiparams(path: PathLike) -> bool:
    """A ``paddle.jit.save`` parameters file (by content), not a ``paddle.save`` pickle."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(16)
    except OSError:
        return False
    return looks_like_pdiparams(head, path)


def generated_kind(param: str) -> str | None:
    """The layer kind of a parameter name Paddle generated for a layer of paddle.nn
    (``linear_3.w_0`` -> ``Linear``), else None."""
    found = GENERATED.fullmatch(param)
    return None if found is None else KINDS.get(found["layer"])


def _read(path: PathLike) -> dict[str, np.ndarray]:
    """Arrays of a ``paddle.save`` pickle (the name table dropped, sliced arrays joined),
    never running code from the file."""
    source = os.fspath(path)
    try:
        data = Path(source).read_bytes()
    except OSError as exc:
        raise CheckpointError(f"Cannot read {source}: {exc.strerror or exc}.") from exc
    try:
        state = safe_pickle.RestrictedUnpickler(io.BytesIO(data), source).load()
    except CheckpointError:
        raise
    except Exception as exc:  # a cut or damaged pickle raises anything
        raise CheckpointError(f"{source} is truncated or corrupt: {exc!r}.") from exc
    if not isinstance(state, dict):
        raise CheckpointError(f"{source} holds a {type(state).__name__}, not a state dict.")
    try:  # paddle.save with pickle protocol 2/3 cuts arrays over 1 GiB into slices
        for key, info in state.pop(SLICES, {}).items():
            parts = [state.pop(name) for name in info["slices"]]
            state[key] = np.concatenate(parts).reshape(info["OriginShape"])
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise CheckpointError(f"{source}: corrupt sliced-array table: {exc!r}") from exc
    refuse_optimizer_state(state, source)
    aliases = _cell_aliases(state.get(NAME_TABLE))
    out = {}
    for key, value in state.items():
        if isinstance(key, str) and (key.endswith("@@") or key in aliases):
            continue  # the name table, not a tensor; a second name of an RNN's tensor
        if not isinstance(value, np.ndarray) or value.dtype.kind not in "fiucb":
            raise CheckpointError(f"{source}: entry {key!r} is not a numeric array.")
        out[str(key)] = value
    return out


def _cell_aliases(table: Any) -> set[str]:
    """The RNN-cell names of tensors the name table also lists under another name (see
    CELL_ALIAS): the same tensor twice, kept once under the name PyTorch's RNNs use."""
    if not isinstance(table, dict):
        return set()
    by_param: dict[str, list[str]] = {}
    for structured, param in table.items():
        by_param.setdefault(str(param), []).append(str(structured))
    return {
        name
        for names in by_param.values()
        if len(names) > 1 and any(not CELL_ALIAS.search(n) for n in names)
        for name in names
        if CELL_ALIAS.search(name)
    }


def _name_table(path: PathLike) -> dict[str, str]:
    """The structured name -> Paddle parameter name table (``fc.weight`` ->
    ``linear_0.w_0``) that ``paddle.save`` stores, or {} when the file has none."""
    state = safe_pickle.load(path)
    table = state.get(NAME_TABLE) if isinstance(state, dict) else None
    if not isinstance(table, dict):
        return {}
    return {str(k): str(v) for k, v in table.items()}


def _encode(tensors: Mapping[str, np.ndarray]) -> bytes:
    """What ``paddle.save`` writes for this dict of arrays (protocol 4, no name table:
    ``layer.set_state_dict`` matches the structured names)."""
    state = {k: np.ascontiguousarray(v) for k, v in tensors.items()}
    return pickle.dumps(state, protocol=4)
