"""Read and write IDX files (the MNIST format), raw or gzip-compressed.

An IDX file is a 4-byte magic (two zero bytes, a type code, the number of
dimensions), one big-endian uint32 per dimension, then the payload in
row-major order, big-endian. Compression is detected from the gzip magic
bytes, never from the file name.
"""

from __future__ import annotations

import gzip
import os
import zlib
from math import prod
from pathlib import Path

import numpy as np

from polytrain.errors import ConfigError, DataError
from polytrain.utils.fileio import atomic_write_bytes

GZIP_MAGIC = b"\x1f\x8b"

#: IDX type code -> big-endian numpy dtype of the payload.
IDX_DTYPES: dict[int, np.dtype] = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}

_KNOWN_CODES = ", ".join(f"0x{code:02X} ({dt.name})" for code, dt in IDX_DTYPES.items())
_REFETCH = "Delete the file and fetch it again (`polytrain data --download <dataset>`)."


def is_gzip(data: bytes) -> bool:
    """Whether ``data`` starts with the gzip magic bytes."""
    return data[:2] == GZIP_MAGIC


def read_payload(path: str | os.PathLike[str]) -> tuple[bytes, bytes]:
    """``(file_bytes, content)`` of ``path``; content is decompressed if gzip."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise DataError(
            f"{path}: no such file. Check the path, or run `polytrain data` to see where "
            "polytrain looks for dataset files."
        ) from None
    except OSError as exc:
        raise DataError(f"{path}: cannot read the file ({exc}). Check its permissions.") from exc
    if not is_gzip(raw):
        return raw, raw
    try:
        content = gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as exc:
        raise DataError(
            f"{path}: corrupt gzip data ({exc}); expected a complete gzip stream of an IDX "
            f"file ({len(raw)} compressed bytes read). {_REFETCH}"
        ) from None
    return raw, content


def parse_idx(data: bytes, path: str | os.PathLike[str] = "<bytes>") -> np.ndarray:
    """Decode uncompressed IDX ``data``; ``path`` only names the source in errors."""
    if len(data) < 4:
        raise DataError(
            f"{path}: {len(data)} bytes is too short for an IDX file (expected at least a "
            f"4-byte magic number). {_REFETCH}"
        )
    zero0, zero1, code, ndim = data[0], data[1], data[2], data[3]
    if zero0 != 0 or zero1 != 0:
        raise DataError(
            f"{path}: not an IDX file: magic starts with bytes {zero0:#04x} {zero1:#04x}, "
            "expected 0x00 0x00. Pass the IDX file itself (gzip-compressed or raw; other "
            "archive formats must be unpacked first)."
        )
    if code not in IDX_DTYPES:
        raise DataError(
            f"{path}: unknown IDX type code {code:#04x}; expected one of {_KNOWN_CODES}. "
            "The file is corrupt or not an IDX file."
        )
    if ndim < 1:
        raise DataError(f"{path}: IDX header declares 0 dimensions; expected at least 1.")
    header = 4 + 4 * ndim
    if len(data) < header:
        raise DataError(
            f"{path}: truncated IDX header: {ndim} dimensions need {header} header bytes, "
            f"the file has {len(data)}. {_REFETCH}"
        )
    dims = tuple(int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    dtype = IDX_DTYPES[code]
    expected = prod(dims) * dtype.itemsize
    actual = len(data) - header
    shape_text = " x ".join(str(d) for d in dims)
    if actual < expected:
        raise DataError(
            f"{path}: truncated IDX file: header declares {shape_text} {dtype.name} values = "
            f"{expected} payload bytes, but only {actual} bytes follow the {header}-byte "
            f"header (sizes after decompression). {_REFETCH}"
        )
    if actual > expected:
        raise DataError(
            f"{path}: IDX file has {actual - expected} unexpected trailing bytes: header "
            f"declares {shape_text} {dtype.name} values = {expected} payload bytes, found "
            f"{actual}. The file is corrupt or the header is wrong. {_REFETCH}"
        )
    array = np.frombuffer(data, dtype=dtype, count=prod(dims), offset=header)
    return array.astype(dtype.newbyteorder("="), copy=True).reshape(dims)


def read_idx(path: str | os.PathLike[str]) -> np.ndarray:
    """Read a raw or gzip IDX file into a writable native-endian array."""
    _, content = read_payload(path)
    return parse_idx(content, path)


def encode_idx(array: np.ndarray) -> bytes:
    """The uncompressed IDX bytes of ``array``."""
    array = np.asarray(array)
    matches = [
        (code, dtype)
        for code, dtype in IDX_DTYPES.items()
        if array.dtype.kind == dtype.kind and array.dtype.itemsize == dtype.itemsize
    ]
    if not matches:
        raise ConfigError(
            f"Cannot write dtype {array.dtype} as IDX: supported dtypes are uint8, int8, "
            "int16, int32, float32 and float64. Convert the array first."
        )
    if array.ndim < 1 or array.ndim > 255:
        raise ConfigError(f"Cannot write a {array.ndim}-d array as IDX: need 1 to 255 dims.")
    code, dtype = matches[0]
    header = bytes([0, 0, code, array.ndim])
    header += b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    return header + np.ascontiguousarray(array, dtype=dtype).tobytes()


def write_idx(path: str | os.PathLike[str], array: np.ndarray, compress: bool = False) -> None:
    """Write ``array`` as an IDX file (gzip if ``compress``), atomically."""
    data = encode_idx(array)
    if compress:
        data = gzip.compress(data, mtime=0)
    atomic_write_bytes(path, data)
