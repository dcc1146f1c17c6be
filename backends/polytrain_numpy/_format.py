"""The numpy backend's native weights file: a NumPy ``.npz`` archive.

What ``np.savez`` writes: a zip (stored, not compressed) with one ``<name>.npy`` per
array, canonical names and layout. Read as ``np.load(allow_pickle=False)`` reads it: a
file holding object arrays is refused, never unpickled.
"""

from __future__ import annotations

import io
import math
import os
import zipfile
from collections.abc import Mapping

import numpy as np

from polytrain.backend.native_format import LayoutRules, NativeFormat, PathLike, zip_entry_names
from polytrain.errors import CheckpointError

# a zip's first local header, or the end record of an archive with no entries
ZIP_STARTS = (b"PK\x03\x04", b"PK\x05\x06")
_EPOCH = (1980, 1, 1, 0, 0, 0)  # the entries' time stamp: equal arrays, equal bytes
_HEADERS = {
    (1, 0): np.lib.format.read_array_header_1_0,
    (2, 0): np.lib.format.read_array_header_2_0,
}


class NumpyFormat(NativeFormat):
    """``.npz`` archives of canonical tensors, as ``np.savez`` writes them."""

    name = "numpy"
    label = "NumPy .npz"
    suffix = ".npz"
    signature = "a NumPy .npz zip (50 4b 03 04) of .npy files"
    order = 40
    layout = LayoutRules(note="canonical layout")

    def sniff(self, head: bytes, path: PathLike) -> bool:
        if not head.startswith(ZIP_STARTS):
            return False
        names = zip_entry_names(path)
        return names is None or all(name.endswith(".npy") for name in names)

    def read(self, path: PathLike) -> dict[str, np.ndarray]:
        source = os.fspath(path)
        try:
            with zipfile.ZipFile(source) as archive:
                return {
                    info.filename.removesuffix(".npy"): _read_member(archive, info, source)
                    for info in archive.infolist()
                }
        except CheckpointError:
            raise
        except OSError as exc:
            raise CheckpointError(f"Cannot read {source}: {exc.strerror or exc}.") from exc
        except Exception as exc:  # a damaged zip or .npy header raises anything
            raise CheckpointError(f"{source} is truncated or corrupt: {exc!r}.") from exc

    def encode(self, tensors: Mapping[str, np.ndarray]) -> bytes:
        """``np.savez``'s archive (``np.savez(f, **tensors)`` fails for a tensor named
        ``file``), with fixed time stamps."""
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
            for name, value in tensors.items():
                array = np.asarray(value)
                if array.dtype.kind not in "fiucb":
                    raise CheckpointError(
                        f"NumPy .npz here holds numeric arrays only, not {name!r} of dtype "
                        f"{array.dtype}."
                    )
                if "\0" in name:  # zip cuts a name at a NUL
                    raise CheckpointError(f"NumPy .npz cannot hold the name {name!r} (a NUL).")
                entry = zipfile.ZipInfo(f"{name}.npy", date_time=_EPOCH)
                with archive.open(entry, "w", force_zip64=True) as fh:
                    np.lib.format.write_array(fh, array, allow_pickle=False)
        return buffer.getvalue()


def _read_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, source: str) -> np.ndarray:
    """One ``.npy`` entry, as ``np.load(allow_pickle=False)`` reads it, but its size is
    checked against the entry before anything is allocated, and only numbers are read."""
    if not info.filename.endswith(".npy"):
        raise CheckpointError(f"{source}: entry {info.filename!r} is not a .npy array.")
    name = info.filename.removesuffix(".npy")
    with archive.open(info) as fh:
        version = np.lib.format.read_magic(fh)
        if version not in _HEADERS:
            raise CheckpointError(f"{source}: entry {name!r} has .npy version {version}.")
        shape, fortran, dtype = _HEADERS[version](fh)
        if dtype.hasobject or dtype.kind not in "fiucb":
            raise CheckpointError(f"{source}: entry {name!r} is not a numeric array ({dtype}).")
        size = dtype.itemsize * math.prod(shape)  # Python integers: no overflow
        data = fh.read(size) if size <= info.file_size else b""
    if len(data) != size:
        raise CheckpointError(
            f"{source} is truncated or corrupt: entry {name!r} of shape {shape} needs {size} "
            f"bytes, the file holds {len(data)}."
        )
    array = np.frombuffer(data, dtype).reshape(shape, order="F" if fortran else "C")
    return np.array(array, dtype=dtype.newbyteorder("="), order="C")
