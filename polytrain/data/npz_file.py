"""Reading a user's ``.npz`` (``--data``) as data only, with every claim checked first.

An ``.npz`` is a zip of ``.npy`` members, each with a header that states its shape and
dtype. Before any array is allocated, each header is read and its byte count compared with
what the member holds and with this machine's memory, so a header claiming 1e15 rows is
one line, not an allocation; object arrays (pickles) are refused; a truncated or corrupt
file, a plain ``.npy`` or a non-zip file is one :class:`DataError` line.
"""

from __future__ import annotations

import math
import os
import stat
import zipfile
import zlib
from typing import IO

import numpy as np

from polytrain.errors import DataError
from polytrain.neutral.spec_check import physical_memory

NPY_MAGIC = b"\x93NUMPY"
SAVEZ_HINT = "np.savez(path, x_train=x, y_train=y)"
# what zipfile and numpy raise on a damaged archive (NotImplementedError: an unknown zip
# version or compression; RuntimeError: an encrypted member)
DAMAGED = (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error, NotImplementedError,
           RuntimeError)  # fmt: skip


def read_npz(path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """The arrays of the ``.npz`` at ``path`` by key, read without pickles."""
    where = os.fspath(path)
    _check_file(where)
    try:
        with zipfile.ZipFile(where) as archive:
            _check_members(archive, where)
        with np.load(where, allow_pickle=False) as npz:
            return {key: npz[key] for key in npz.files}
    except DataError:
        raise
    except DAMAGED as exc:
        raise DataError(f"{where}: truncated or corrupt .npz ({exc}); save it again.") from None


def _check_file(where: str) -> None:
    try:
        info = os.stat(where)
        if not stat.S_ISREG(info.st_mode):
            raise DataError(f"{where} is not a regular file; --data takes an .npz file.")
        with open(where, "rb") as fh:
            head = fh.read(len(NPY_MAGIC))
    except OSError as exc:
        raise DataError(f"Cannot read {where}: {exc.strerror or exc}.") from None
    if head == NPY_MAGIC:
        raise DataError(
            f"{where} is a single .npy array; --data takes an .npz holding x_train and "
            f"y_train (and optionally x_test, y_test): {SAVEZ_HINT}."
        )
    if not zipfile.is_zipfile(where):
        raise DataError(
            f"{where} is not a whole .npz (zip) file (truncated, or another format); write "
            f"one with {SAVEZ_HINT}."
        )


def _check_members(archive: zipfile.ZipFile, where: str) -> None:
    """Each member's header against its size, and the total against memory."""
    total = 0
    for info in archive.infolist():
        key = info.filename.removesuffix(".npy")
        with archive.open(info) as fh:
            shape, dtype = _header(fh, where, key)
        if dtype.hasobject:
            raise DataError(
                f"{where}: array {key!r} holds Python objects (a pickle); --data takes "
                "numeric arrays only."
            )
        need = math.prod(shape) * dtype.itemsize
        if need > info.file_size:
            raise DataError(
                f"{where}: array {key!r} claims shape {shape} of {dtype} ({need:,} bytes) but "
                f"holds {info.file_size:,} bytes; the file is corrupt or was edited."
            )
        total += need
    have = physical_memory()
    if have and total > have:
        raise DataError(
            f"{where}: its arrays need {total / 2**30:,.1f} GiB, more than this machine's "
            f"{have / 2**30:,.1f} GiB of memory."
        )


def _header(fh: IO[bytes], where: str, key: str) -> tuple[tuple[int, ...], np.dtype]:
    fmt = np.lib.format
    try:
        version = fmt.read_magic(fh)
        read = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
        shape, _fortran, dtype = read(fh)
    except DAMAGED as exc:
        raise DataError(f"{where}: array {key!r} is not a readable .npy member ({exc}).") from None
    return tuple(int(n) for n in shape), np.dtype(dtype)
