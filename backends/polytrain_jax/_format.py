"""The jax backend's native weights file: Flax's msgpack (``flax.serialization.to_bytes``
of a nested dict), what a JAX user loads with ``flax.serialization.msgpack_restore``.

A nested map of the canonical names split at their dots (``{"conv1": {"weight": ...}}``),
each array the msgpack extension 1 Flax writes: ``(shape, dtype name, C-order bytes)``
packed again. Canonical (PyTorch) layout: the backend computes in it. Chosen over ``.npz``,
which is the numpy backend's format already (files are recognised by content). The codec
is the small part of msgpack these files use, written here (no msgpack or Flax needed),
bounded on reading: sizes checked against the file before anything is allocated, nesting
limited, and only numbers read (no object arrays, no code).
"""

from __future__ import annotations

import math
import os
import struct
from collections.abc import Mapping
from typing import Any

import numpy as np

from polytrain.backend.native_format import LayoutRules, NativeFormat, PathLike
from polytrain.errors import CheckpointError

NDARRAY_EXT = 1  # flax.serialization._MsgpackExtType.ndarray
MAX_DEPTH = 64
_FIXMAP, _FIXARRAY, _FIXSTR = 0x80, 0x90, 0xA0


class FlaxMsgpackFormat(NativeFormat):
    """Flax msgpack state dicts of canonical tensors."""

    name = "jax"
    label = "Flax msgpack"
    suffix = ".msgpack"
    signature = "a msgpack map (81-8f, de, df) with text keys"
    order = 50
    layout = LayoutRules(note="canonical layout")

    def sniff(self, head: bytes, path: PathLike) -> bool:
        if head == b"\x80":  # the empty map: a file of no arrays
            return True
        if not head:
            return False
        key_at = {0xDE: 3, 0xDF: 5}.get(head[0], 1 if 0x81 <= head[0] <= 0x8F else 0)
        return bool(key_at) and len(head) > key_at and _is_str(head[key_at])

    def read(self, path: PathLike) -> dict[str, np.ndarray]:
        source = os.fspath(path)
        try:
            with open(source, "rb") as fh:
                data = fh.read()
        except OSError as exc:
            raise CheckpointError(f"Cannot read {source}: {exc.strerror or exc}.") from exc
        try:
            tree, end = _Reader(data, source).value(0, 0)
        except CheckpointError:
            raise
        except Exception as exc:  # a damaged file raises anything
            raise CheckpointError(f"{source} is truncated or corrupt: {exc!r}.") from exc
        if end != len(data) or not isinstance(tree, dict):
            raise CheckpointError(f"{source} is not one Flax msgpack state dict.")
        return _flatten(tree, "", source)

    def encode(self, tensors: Mapping[str, np.ndarray]) -> bytes:
        tree: dict[str, Any] = {}
        for name, array in tensors.items():
            parts = name.split(".")
            if "" in parts:
                raise CheckpointError(
                    f"Flax msgpack nests names at dots: {name!r} has an empty part."
                )
            node = tree
            for part in parts[:-1]:
                node = node.setdefault(part, {})
                if not isinstance(node, dict):
                    raise CheckpointError(f"Flax msgpack cannot hold both {part!r} and {name!r}.")
            if parts[-1] in node:
                raise CheckpointError(f"Flax msgpack cannot hold both {name!r} and names under it.")
            node[parts[-1]] = np.asarray(array)
        out = bytearray()
        _write(out, tree)
        return bytes(out)


def _is_str(byte: int) -> bool:
    return _FIXSTR <= byte <= 0xBF or byte in (0xD9, 0xDA, 0xDB)


def _flatten(tree: dict[str, Any], prefix: str, source: str) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for k, v in tree.items():
        name = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, dict):
            out |= _flatten(v, name, source)
        elif isinstance(v, np.ndarray):
            out[name] = v
        else:
            raise CheckpointError(f"{source}: entry {name!r} is not an array ({type(v).__name__}).")
    return out


# -- writing ---------------------------------------------------------------------------------


def _header(
    out: bytearray, n: int, fix: int | None, fix_limit: int, codes: tuple[int, ...]
) -> None:
    """A length header: the fix form below ``fix_limit``, else 8/16/32-bit (``codes``)."""
    if fix is not None and n < fix_limit:
        out.append(fix | n)
        return
    for code, fmt, limit in zip(
        codes, (">B", ">H", ">I"), (1 << 8, 1 << 16, 1 << 32), strict=False
    ):
        if code and n < limit:
            out.append(code)
            out += struct.pack(fmt, n)
            return
    raise CheckpointError(f"Flax msgpack cannot hold {n} items or bytes in one entry.")


def _write(out: bytearray, v: Any) -> None:
    if isinstance(v, dict):
        _header(out, len(v), _FIXMAP, 16, (0, 0xDE, 0xDF))
        for k, item in v.items():
            _write(out, str(k))
            _write(out, item)
    elif isinstance(v, str):
        raw = v.encode()
        _header(out, len(raw), _FIXSTR, 32, (0xD9, 0xDA, 0xDB))
        out += raw
    elif isinstance(v, bytes):
        _header(out, len(v), None, 0, (0xC4, 0xC5, 0xC6))
        out += v
    elif isinstance(v, tuple | list):
        _header(out, len(v), _FIXARRAY, 16, (0, 0xDC, 0xDD))
        for item in v:
            _write(out, item)
    elif isinstance(v, int):
        _write_int(out, v)
    elif isinstance(v, np.ndarray):
        _write_array(out, v)
    else:
        raise CheckpointError(f"Flax msgpack here holds no {type(v).__name__}.")


def _write_int(out: bytearray, n: int) -> None:
    if 0 <= n < 128:
        out.append(n)
    elif 0 <= n < (1 << 64):
        out.append(0xCF)
        out += struct.pack(">Q", n)
    else:
        raise CheckpointError(f"Flax msgpack here holds no integer {n}.")


def _write_array(out: bytearray, a: np.ndarray) -> None:
    if a.dtype.kind not in "fiucb":
        raise CheckpointError(f"Flax msgpack here holds numeric arrays only, not {a.dtype}.")
    payload = bytearray()
    _write(
        payload, (tuple(int(n) for n in a.shape), a.dtype.name, np.ascontiguousarray(a).tobytes())
    )
    n = len(payload)
    if n in (1, 2, 4, 8, 16):
        out.append({1: 0xD4, 2: 0xD5, 4: 0xD6, 8: 0xD7, 16: 0xD8}[n])
    else:
        _header(out, n, None, 0, (0xC7, 0xC8, 0xC9))
    out.append(NDARRAY_EXT)
    out += payload


# -- reading ---------------------------------------------------------------------------------


class _Reader:
    """A bounded msgpack reader for the values Flax state dicts hold."""

    def __init__(self, data: bytes, source: str) -> None:
        self.data, self.source = data, source

    def _take(self, at: int, n: int) -> bytes:
        if n < 0 or at + n > len(self.data):
            raise CheckpointError(
                f"{self.source} is truncated or corrupt: an entry needs {n} bytes at offset "
                f"{at}, the file holds {len(self.data)}."
            )
        return self.data[at : at + n]

    def _length(self, at: int, size: int) -> tuple[int, int]:
        fmt = {1: ">B", 2: ">H", 4: ">I"}[size]
        return struct.unpack(fmt, self._take(at, size))[0], at + size

    def value(self, at: int, depth: int) -> tuple[Any, int]:
        if depth > MAX_DEPTH:
            raise CheckpointError(f"{self.source}: nested deeper than {MAX_DEPTH} levels.")
        b = self._take(at, 1)[0]
        at += 1
        if b < 0x80:
            return b, at
        if 0x80 <= b <= 0x8F or b in (0xDE, 0xDF):
            n, at = (b & 0x0F, at) if b <= 0x8F else self._length(at, 2 if b == 0xDE else 4)
            return self._map(n, at, depth)
        if 0x90 <= b <= 0x9F or b in (0xDC, 0xDD):
            n, at = (b & 0x0F, at) if b <= 0x9F else self._length(at, 2 if b == 0xDC else 4)
            items = []
            for _ in range(n):
                item, at = self.value(at, depth + 1)
                items.append(item)
            return items, at
        if _is_str(b):
            n, at = (
                (b & 0x1F, at) if b <= 0xBF else self._length(at, {0xD9: 1, 0xDA: 2, 0xDB: 4}[b])
            )
            return self._take(at, n).decode(), at + n
        if b in (0xC4, 0xC5, 0xC6):
            n, at = self._length(at, {0xC4: 1, 0xC5: 2, 0xC6: 4}[b])
            return self._take(at, n), at + n
        if b in (0xCC, 0xCD, 0xCE, 0xCF):
            size = {0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8}[b]
            fmt = {1: ">B", 2: ">H", 4: ">I", 8: ">Q"}[size]
            return struct.unpack(fmt, self._take(at, size))[0], at + size
        if 0xD4 <= b <= 0xD8 or b in (0xC7, 0xC8, 0xC9):
            if b >= 0xD4:
                n = 1 << (b - 0xD4)
            else:
                n, at = self._length(at, {0xC7: 1, 0xC8: 2, 0xC9: 4}[b])
            kind = self._take(at, 1)[0]
            return self._ext(kind, at + 1, n, depth), at + 1 + n
        raise CheckpointError(
            f"{self.source}: a msgpack value (0x{b:02x}) a Flax state dict does not hold."
        )

    def _map(self, n: int, at: int, depth: int) -> tuple[dict[str, Any], int]:
        out: dict[str, Any] = {}
        for _ in range(n):
            k, at = self.value(at, depth + 1)
            if not isinstance(k, str):
                raise CheckpointError(f"{self.source}: a map key that is not text ({k!r}).")
            out[k], at = self.value(at, depth + 1)
        return out, at

    def _ext(self, kind: int, at: int, n: int, depth: int) -> np.ndarray:
        if kind != NDARRAY_EXT:
            raise CheckpointError(f"{self.source}: msgpack extension {kind} is not a Flax array.")
        body = _Reader(self._take(at, n), self.source)
        fields, end = body.value(0, depth + 1)
        if end != n or not isinstance(fields, list) or len(fields) != 3:
            raise CheckpointError(f"{self.source}: a damaged Flax array entry.")
        shape, dtype_name, raw = fields
        if not (isinstance(shape, list) and all(isinstance(s, int) for s in shape)):
            raise CheckpointError(f"{self.source}: a Flax array with shape {shape!r}.")
        try:
            dtype = np.dtype(str(dtype_name))
        except TypeError:
            raise CheckpointError(f"{self.source}: unknown dtype {dtype_name!r}.") from None
        if dtype.kind not in "fiucb" or not isinstance(raw, bytes):
            raise CheckpointError(f"{self.source}: a Flax array of {dtype_name!r}, not numbers.")
        if len(raw) != dtype.itemsize * math.prod(shape):
            raise CheckpointError(
                f"{self.source} is truncated or corrupt: an array of shape {tuple(shape)} and "
                f"{dtype} needs {dtype.itemsize * math.prod(shape)} bytes, it holds {len(raw)}."
            )
        return np.frombuffer(raw, dtype).reshape(shape).copy()
