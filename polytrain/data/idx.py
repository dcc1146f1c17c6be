"""Read and write IDX files (the MNIST format), raw or gzip-compressed.

An IDX file is a 4-byte magic (two zero bytes, a type code, the number of
dimensions), one big-endian uint32 per dimension, then the payload in
row-major order, big-endian. Compression is detected from the gzip magic
bytes, never from the file name.
"""

from __future__ import annotations

import gzip
import os
import sys
import zlib
from math import prod
from pathlib import Path

import numpy as np

from polytrain.errors import ConfigError, DataError
from polytrain.utils.fileio import atomic_write_bytes

GZIP_MAGIC = b"\x1f\x8b"
GZIP_WBITS = 16 + zlib.MAX_WBITS  # zlib reads (and checks) the gzip header and trailer
INFLATE_BLOCK = 1 << 20  # compressed bytes fed to zlib at a time
#: Content bytes inflated past the declared size before a gzip IDX file is refused; a
#: shorter excess is reported exactly by parse_idx.
INFLATE_MARGIN = 1 << 16

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
    """``(file_bytes, content)`` of ``path``; content is decompressed if gzip.

    Decompression is bounded by the size the IDX header declares (see
    :func:`inflate_idx`): a small gzip file cannot inflate to gigabytes.
    """
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
    return raw, inflate_idx(raw, path)


def declared_size(head: bytes) -> int | None:
    """Header plus payload bytes that the IDX header in ``head`` declares; None unless
    ``head`` starts with a complete, valid IDX header."""
    if not _valid_magic(head[:4]):
        return None
    ndim = head[3]
    header = 4 + 4 * ndim
    if len(head) < header:
        return None
    dims = [int.from_bytes(head[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    return header + prod(dims) * IDX_DTYPES[head[2]].itemsize


def _valid_magic(magic: bytes) -> bool:
    """Whether ``magic`` is a valid 4-byte IDX magic number."""
    return len(magic) == 4 and magic[:2] == b"\0\0" and magic[2] in IDX_DTYPES and magic[3] >= 1


def inflate_idx(raw: bytes, path: str | os.PathLike[str] = "<bytes>") -> bytes:
    """The decompressed content of the gzip IDX file ``raw``, inflated no further than the
    size its header declares plus :data:`INFLATE_MARGIN` bytes.

    A stream that holds more is refused before it is inflated (a decompression bomb); a
    stream that ends early (truncated) or fails its checks is a DataError. A content at
    most the margin longer or shorter than declared is returned, for :func:`parse_idx`
    to name the exact difference.
    """
    reader = _GzipReader(raw, path)
    head = reader.read(4)
    if _valid_magic(head):
        head += reader.read(4 * head[3])
    declared = declared_size(head)
    if declared is None:
        return head  # not a valid IDX header: parse_idx names what is wrong with it
    body = reader.read(declared - len(head) + INFLATE_MARGIN + 1)
    if len(body) > declared - len(head) + INFLATE_MARGIN:
        raise DataError(
            f"{path}: the IDX header declares {declared} bytes, but the gzip stream holds "
            f"more (stopped after inflating {len(head) + len(body)} bytes of a {len(raw)}-byte "
            f"file): the file is corrupt or not an IDX file. {_REFETCH}"
        )
    return head + body


class _GzipReader:
    """Inflates the gzip members of ``raw`` on demand, never more than asked for; the
    input is fed in blocks, so no call copies more than a block of it."""

    def __init__(self, raw: bytes, path: str | os.PathLike[str]) -> None:
        self._raw = memoryview(raw)
        self._fed = 0  # bytes of raw handed to the inflater so far
        self._path = path
        self._input = b""  # fed input the inflater has not consumed yet
        self._inflater = zlib.decompressobj(GZIP_WBITS)
        self._inflated = 0
        self._done = False

    def read(self, n: int) -> bytes:
        """Up to ``n`` more content bytes; fewer only at the end of the last member."""
        chunks = []
        while n > 0 and not self._done:
            if self._inflater.eof:
                self._next_member()
                continue
            if not self._input and self._fed < len(self._raw):
                self._input = self._raw[self._fed : self._fed + INFLATE_BLOCK].tobytes()
                self._fed += len(self._input)
            before = len(self._input)
            try:
                out = self._inflater.decompress(self._input, min(n, sys.maxsize))
            except zlib.error as exc:
                raise self._corrupt(str(exc)) from None
            self._input = self._inflater.unconsumed_tail
            if not out and not self._inflater.eof and len(self._input) == before:
                raise self._corrupt(
                    f"the stream ends early (truncated) after {self._inflated} inflated bytes"
                )
            chunks.append(out)
            n -= len(out)
            self._inflated += len(out)
        return b"".join(chunks)

    def _next_member(self) -> None:
        rest = (self._inflater.unused_data + self._raw[self._fed :]).lstrip(b"\0")
        self._fed = len(self._raw)
        if not rest:  # gzip allows zero padding after the last member
            self._done = True
        elif is_gzip(rest):  # concatenated gzip members form one content
            self._inflater = zlib.decompressobj(GZIP_WBITS)
            self._input = rest
        else:
            raise self._corrupt(f"{len(rest)} bytes after the gzip stream are not gzip data")

    def _corrupt(self, why: str) -> DataError:
        return DataError(
            f"{self._path}: corrupt gzip data ({why}); expected a complete gzip stream of an "
            f"IDX file ({len(self._raw)} compressed bytes read). {_REFETCH}"
        )


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
