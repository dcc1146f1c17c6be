"""MXNet's native weights file (``.params``), read and written with numpy.

``mx.nd.save`` / ``block.save_parameters`` write uint64 0x112, uint64 0, the arrays (each:
uint32 magic 0xF993FAC9, int32 storage type, int32 ndim, int64 dims, int32 dev_type,
int32 dev_id, int32 type flag, raw data), then the names (uint64 count, each uint64
length + UTF-8). See MXNet's src/ndarray/ndarray.cc (NDArray::Save / Load). Also reads
the older V1 and pre-V1 array headers and V3 (numpy-shape) arrays; writes V2, byte for
byte what ``mx.nd.save`` writes.
"""

from __future__ import annotations

import math
import os
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from polytrain.backend.native_format import CompanionRoles, LayoutRules, NativeFormat, PathLike
from polytrain.backend.optimizer_file import OptimizerFile
from polytrain.errors import CheckpointError

from ._rnn_names import GluonRecurrentLeaves

MX_LIST_MAGIC = 0x112
MX_V1, MX_V2, MX_V3 = 0xF993FAC8, 0xF993FAC9, 0xF993FACA
# mshadow type flags (mshadow/base.h); 12 is bfloat16, read as float32
MX_DTYPES = {0: "<f4", 1: "<f8", 2: "<f2", 3: "u1", 4: "<i4", 5: "i1", 6: "<i8", 7: "?"}
MX_BF16 = 12
_MODULE_PREFIXES = ("arg:", "aux:")  # of Module checkpoints' names, removed when read
MX_FLAGS = {np.dtype(v).newbyteorder("="): k for k, v in MX_DTYPES.items()}


class MXNetFormat(NativeFormat):
    """``.params`` files: BatchNorm weight / bias are ``gamma`` / ``beta``; Dense is
    [out, in] like the canonical layout; Module checkpoints' ``arg:``/``aux:`` prefixes
    are removed when read; an ``export()``'s tensors are named by their role in the
    ``-symbol.json`` beside them."""

    name = "mxnet"
    label = "MXNet .params"
    suffix = ".params"
    signature = "MXNet .params (12 01 00 00 ..)"
    order = 30
    layout = LayoutRules(
        renames={
            **{
                kind: {"weight": "gamma", "bias": "beta"}
                for kind in ("BatchNorm2d", "BatchNorm1d", "LayerNorm")
            },
            # gluon.rnn.LSTM/GRU: weight_ih_l0 -> _unfused.0.i2h_weight (same layout, gates)
            **dict.fromkeys(("LSTM", "GRU"), GluonRecurrentLeaves()),
        },
        note="MXNet layout",
    )

    def sniff(self, head: bytes, path: PathLike) -> bool:
        return len(head) >= 8 and struct.unpack("<Q", head[:8])[0] == MX_LIST_MAGIC

    def read(self, path: PathLike) -> dict[str, np.ndarray]:
        return _read(path)

    def companion_roles(self, path: PathLike) -> CompanionRoles | None:
        """For Gluon ``export()``'s ``model-0000.params``: the roles the ops of
        ``model-symbol.json`` give its tensors (see ``_symbol``); for an export without it,
        a note saying what could not be done; None for a ``save_parameters`` file."""
        from ._symbol import symbol_roles

        return symbol_roles(Path(path), list(_read_named(path)))

    def encode(self, tensors: Mapping[str, np.ndarray]) -> bytes:
        return _encode(tensors)

    def read_optimizer(
        self, path: PathLike, weights: PathLike, settings: Mapping[str, Any]
    ) -> OptimizerFile:
        """A Gluon ``Trainer.save_states`` file, see ``_optimizer_state``."""
        from ._optimizer_state import read_states

        def parse(raw: bytes, source: str) -> np.ndarray | None:
            return _mx_array(_Reader(raw, source))

        return read_states(path, weights, _read(weights), settings, parse)


class _Reader:
    def __init__(self, data: bytes, source: str) -> None:
        self.data, self.pos, self.source = data, 0, source

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise CheckpointError(
                f"{self.source} is truncated or corrupt: needed {n} bytes at offset "
                f"{self.pos}, the file has {len(self.data)}."
            )
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def unpack(self, fmt: str) -> Any:
        return struct.unpack("<" + fmt, self.take(struct.calcsize("<" + fmt)))[0]

    def shape(self, wide: bool = True) -> tuple[int, ...] | None:
        """A TShape: int32 ndim (-1: unknown) then int64 dims (uint32 when not ``wide``)."""
        ndim = self.unpack("i")
        if ndim < 0:
            return None
        if ndim > 32:
            raise CheckpointError(f"{self.source} is corrupt: an array with {ndim} dimensions.")
        dims = struct.unpack(f"<{ndim}{'q' if wide else 'I'}", self.take(ndim * (8 if wide else 4)))
        if any(d < 0 for d in dims):
            raise CheckpointError(f"{self.source} is corrupt: negative dimension in {dims}.")
        return tuple(dims)


def _mx_array(r: _Reader) -> np.ndarray | None:
    magic = r.unpack("I")
    if magic in (MX_V2, MX_V3):
        stype = r.unpack("i")
        if stype != 0:
            raise CheckpointError(
                f"{r.source} holds a sparse array (storage type {stype}); polytrain reads "
                "dense .params only: convert it with MXNet's tostype('default') first."
            )
        shape = r.shape()
        if shape is None or (magic == MX_V2 and len(shape) == 0):
            return None  # MXNet's "none" array: nothing follows
    elif magic == MX_V1:
        shape = r.shape()
        if not shape:
            return None
    else:  # before V1 the first word was the ndim, dims were uint32
        if magic > 32:
            raise CheckpointError(f"{r.source} is corrupt: unknown array magic {magic:#x}.")
        r.pos -= 4
        shape = r.shape(wide=False)
        if not shape:
            return None
    r.unpack("i")  # dev_type
    r.unpack("i")  # dev_id
    flag = r.unpack("i")
    if flag not in MX_DTYPES and flag != MX_BF16:
        raise CheckpointError(f"{r.source}: unsupported MXNet type flag {flag}.")
    dtype = np.dtype("<u2" if flag == MX_BF16 else MX_DTYPES[flag])
    raw = r.take(math.prod(shape) * dtype.itemsize)  # Python integers: no overflow
    try:
        out = np.frombuffer(raw, dtype=dtype).reshape(shape)
    except ValueError:  # an empty array with dimensions too big for numpy
        raise CheckpointError(f"{r.source} is corrupt: an array of shape {shape}.") from None
    out = out.astype(dtype.newbyteorder("="))
    if flag == MX_BF16:
        out = (out.astype(np.uint32) << 16).view(np.float32)
    return out


def _read_named(path: PathLike) -> dict[str, np.ndarray]:
    """Named arrays of an ``mx.nd.save`` file, names as stored."""
    source = os.fspath(path)
    try:
        data = Path(source).read_bytes()
    except OSError as exc:
        raise CheckpointError(f"Cannot read {source}: {exc.strerror or exc}.") from exc
    r = _Reader(data, source)
    if r.unpack("Q") != MX_LIST_MAGIC:
        raise CheckpointError(f"{source} is not an MXNet .params file (wrong magic).")
    r.unpack("Q")  # reserved
    count = r.unpack("Q")
    if count > len(data) // 16:
        raise CheckpointError(f"{source} is corrupt: it claims {count} arrays.")
    arrays = [_mx_array(r) for _ in range(count)]
    nnames = r.unpack("Q")
    if nnames != count:
        if nnames == 0:
            raise CheckpointError(f"{source} holds unnamed arrays, not named parameters.")
        raise CheckpointError(f"{source} is corrupt: {count} arrays but {nnames} names.")
    names = []
    for _ in range(nnames):
        raw = r.take(r.unpack("Q"))
        try:
            names.append(raw.decode("utf-8"))
        except UnicodeDecodeError:
            raise CheckpointError(f"{source} is corrupt: a name is not UTF-8.") from None
    if r.pos != len(data):
        raise CheckpointError(f"{source} is corrupt: {len(data) - r.pos} bytes after the names.")
    out = {}
    for name, array in zip(names, arrays, strict=True):
        if array is None:
            raise CheckpointError(f"{source}: parameter {name!r} has no data.")
        out[name] = array
    return out


def _read(path: PathLike) -> dict[str, np.ndarray]:
    """Named arrays of an ``mx.nd.save`` / ``save_parameters`` file; Module checkpoints'
    and ``export()``'s ``arg:``/``aux:`` prefixes are removed."""
    out = {}
    for name, array in _read_named(path).items():
        for prefix in _MODULE_PREFIXES:
            name = name.removeprefix(prefix)
        out[name] = array
    return out


def _encode(tensors: Mapping[str, np.ndarray]) -> bytes:
    """The bytes ``mx.nd.save(path, {name: array})`` writes (V2 arrays on cpu(0))."""
    parts = [struct.pack("<QQQ", MX_LIST_MAGIC, 0, len(tensors))]
    for name, value in tensors.items():
        array = np.asarray(value)
        flag = MX_FLAGS.get(array.dtype.newbyteorder("="))
        if flag is None:
            raise CheckpointError(
                f"MXNet .params cannot hold {name!r} of dtype {array.dtype}; "
                f"it stores {', '.join(np.dtype(d).name for d in MX_DTYPES.values())}."
            )
        if name.startswith(_MODULE_PREFIXES):  # read back without it
            raise CheckpointError(
                f"MXNet .params reads {name!r} back without its {name[:4]!r} prefix (a Module "
                "checkpoint's): rename it."
            )
        if array.ndim == 0:  # MXNet reads a 0-d array back as "none"
            raise CheckpointError(f"MXNet .params cannot hold the 0-d array {name!r}.")
        parts.append(struct.pack("<Iii", MX_V2, 0, array.ndim))
        parts.append(struct.pack(f"<{array.ndim}q", *array.shape))
        parts.append(struct.pack("<iii", 1, 0, flag))  # cpu(0), type flag
        parts.append(np.ascontiguousarray(array, dtype=MX_DTYPES[flag]).tobytes())
    parts.append(struct.pack("<Q", len(tensors)))
    for name in tensors:
        raw = name.encode("utf-8")
        parts.append(struct.pack("<Q", len(raw)) + raw)
    return b"".join(parts)
