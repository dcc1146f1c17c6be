"""The three frameworks' native weight files, read and written with numpy and the standard
library only. Names and layouts stay native here; :mod:`polytrain.io.convert` maps them.

========  =================================================================================
format    what the file is, and how it is recognised (by content, never by suffix)
========  =================================================================================
torch     ``torch.save(state_dict)``: a zip (``PK\\x03\\x04``) holding ``<archive>/data.pkl``
          (a protocol-2 pickle whose tensors are ``torch._utils._rebuild_tensor_v2`` calls
          on persistent ids ``('storage', torch.FloatStorage, key, location, numel)``) and
          one raw little-endian file ``<archive>/data/<key>`` per storage. Read by a
          restricted unpickler that knows only those names and never imports torch;
          written by the torch backend (:func:`write_torch`).
paddle    ``paddle.save(layer.state_dict())``: a pickle (``\\x80``) of a dict of numpy arrays
          plus the ``StructuredToParameterName@@`` name table; protocol 2/3 cut arrays over
          1 GiB into slices listed in ``UnpackBigParamInfor@@``. Read with
          :mod:`polytrain.utils.safe_pickle`; written as ``pickle.dumps(dict, protocol=4)``,
          which is byte for byte what ``paddle.save`` writes for the same arrays.
mxnet     ``mx.nd.save`` / ``block.save_parameters``: uint64 0x112, uint64 0, the arrays
          (each: uint32 magic 0xF993FAC9, int32 storage type, int32 ndim, int64 dims,
          int32 dev_type, int32 dev_id, int32 type flag, raw data), then the names
          (uint64 count, each uint64 length + UTF-8). See MXNet's src/ndarray/ndarray.cc
          (NDArray::Save / Load). Also reads the older V1 and pre-V1 array headers and
          V3 (numpy-shape) arrays; writes V2, byte for byte what ``mx.nd.save`` writes.
========  =================================================================================

Every reader returns ``{native name: numpy array}`` and raises
:class:`~polytrain.errors.CheckpointError` for a truncated, corrupt or foreign file.
"""

from __future__ import annotations

import _codecs
import io
import os
import pickle
import struct
import zipfile
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

from polytrain.errors import CheckpointError
from polytrain.utils import safe_pickle
from polytrain.utils.fileio import atomic_path

PathLike = str | os.PathLike[str]

FRAMEWORKS = ("torch", "paddle", "mxnet")
SUFFIXES = {"torch": ".pt", "paddle": ".pdparams", "mxnet": ".params"}
LABELS = {"torch": "PyTorch .pt", "paddle": "Paddle .pdparams", "mxnet": "MXNet .params"}

ZIP_MAGIC = b"PK\x03\x04"
MX_LIST_MAGIC = 0x112
MX_V1, MX_V2, MX_V3 = 0xF993FAC8, 0xF993FAC9, 0xF993FACA
# mshadow type flags (mshadow/base.h); 12 is bfloat16, read as float32
MX_DTYPES = {0: "<f4", 1: "<f8", 2: "<f2", 3: "u1", 4: "<i4", 5: "i1", 6: "<i8", 7: "?"}
MX_BF16 = 12
MX_FLAGS = {np.dtype(v).newbyteorder("="): k for k, v in MX_DTYPES.items()}
# torch.save writes this pickled integer first in its pre-1.6, non-zip format
TORCH_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
PADDLE_NAME_TABLE = "StructuredToParameterName@@"
PADDLE_SLICES = "UnpackBigParamInfor@@"


# -- detection ------------------------------------------------------------------------------------


def detect_format(path: PathLike) -> str:
    """``torch``, ``paddle``, ``mxnet`` or ``neutral`` (a checkpoint or run directory),
    from the content; a CheckpointError says what was found instead."""
    p = Path(path)
    if p.is_dir():
        return "neutral"
    try:
        with open(p, "rb") as fh:
            head = fh.read(16)
    except FileNotFoundError:
        raise CheckpointError(f"No such file or directory: {p}.") from None
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the name
        raise CheckpointError(f"Cannot read {p}: {getattr(exc, 'strerror', None) or exc}.") from exc
    if head.startswith(ZIP_MAGIC):
        return "torch"
    if len(head) >= 8 and struct.unpack("<Q", head[:8])[0] == MX_LIST_MAGIC:
        return "mxnet"
    if head[:1] == b"\x80":
        if head.startswith(b"\x80\x02\x8a\x0a") and int.from_bytes(head[4:14], "little") == (
            TORCH_LEGACY_MAGIC
        ):
            raise CheckpointError(
                f"{p} is in PyTorch's pre-1.6 (non-zip) format, which polytrain does not "
                "read. Re-save it with a current torch: torch.save(torch.load(f), f)."
            )
        return "paddle"
    if not head:
        raise CheckpointError(f"{p} is empty.")
    raise CheckpointError(
        f"{p} is not a weights file polytrain knows: it starts with {head[:8].hex(' ')}; "
        "expected a PyTorch zip (50 4b 03 04), a Paddle pickle (80 ..) or MXNet .params "
        "(12 01 00 00 ..), or a polytrain checkpoint directory."
    )


def read_native(path: PathLike) -> tuple[str, dict[str, np.ndarray]]:
    """(framework, native tensors) of a native weights file, detected by content."""
    fmt = detect_format(path)
    if fmt == "neutral":
        raise CheckpointError(f"{path} is a directory, not a native weights file.")
    return fmt, READERS[fmt](path)


# -- torch ----------------------------------------------------------------------------------------

_TORCH_STORAGES = {
    "FloatStorage": "<f4",
    "DoubleStorage": "<f8",
    "HalfStorage": "<f2",
    "BFloat16Storage": "bf16",
    "LongStorage": "<i8",
    "IntStorage": "<i4",
    "ShortStorage": "<i2",
    "CharStorage": "i1",
    "ByteStorage": "u1",
    "BoolStorage": "?",
    "ComplexFloatStorage": "<c8",
    "ComplexDoubleStorage": "<c16",
    "UntypedStorage": "u1",
}
_TORCH_DTYPES = {
    "float32": "<f4", "float": "<f4", "float64": "<f8", "double": "<f8", "float16": "<f2",
    "half": "<f2", "bfloat16": "bf16", "int64": "<i8", "long": "<i8", "int32": "<i4",
    "int": "<i4", "int16": "<i2", "short": "<i2", "int8": "i1", "uint8": "u1", "bool": "?",
    "uint16": "<u2", "uint32": "<u4", "uint64": "<u8", "complex64": "<c8", "complex128": "<c16",
}  # fmt: skip


@dataclass(frozen=True)
class _DType:
    """A torch storage class or dtype as named in the pickle: only its element type."""

    code: str

    def numpy(self, big_endian: bool) -> np.dtype[Any]:
        dt = np.dtype("<u2" if self.code == "bf16" else self.code)
        return dt.newbyteorder(">") if big_endian and dt.itemsize > 1 else dt


@dataclass
class _Storage:
    dtype: _DType
    data: np.ndarray  # 1-D, numel elements (bf16 as uint16)
    big_endian: bool = False


def _strided(storage: _Storage, offset: int, size: Any, stride: Any, dtype: _DType) -> np.ndarray:
    """A copy of the tensor ``storage[offset]`` with ``size``/``stride`` (in elements),
    bounds-checked: as_strided itself would read any memory it is told to."""
    try:
        shape = tuple(int(s) for s in size)
        steps = tuple(int(s) for s in stride)
        offset = int(offset)
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"malformed tensor record: {exc}") from exc
    flat = storage.data
    if dtype != storage.dtype:  # v3: an untyped (byte) storage viewed as dtype
        flat = flat.view(np.uint8).view(dtype.numpy(storage.big_endian))
    if len(shape) != len(steps) or min((*shape, *steps, offset), default=0) < 0:
        raise CheckpointError(f"malformed tensor record: size {shape}, stride {steps}.")
    if 0 not in shape:
        last = offset + sum((n - 1) * s for n, s in zip(shape, steps, strict=True))
        if last >= len(flat):
            raise CheckpointError(
                f"a tensor of size {shape} at offset {offset} reaches past its storage "
                f"of {len(flat)} elements: the file is corrupt."
            )
    item = flat.itemsize
    view = np.lib.stride_tricks.as_strided(
        flat[offset:] if 0 not in shape else flat[:0],
        shape=shape,
        strides=tuple(s * item for s in steps),
        writeable=False,
    )
    out = np.array(view, dtype=view.dtype.newbyteorder("="), order="C")
    if dtype.code == "bf16":  # numpy has no bfloat16: widen exactly to float32
        out = (out.astype(np.uint32) << 16).view(np.float32)
    return out


def _rebuild_tensor(
    storage: _Storage, offset: Any, size: Any, stride: Any, *_rest: Any
) -> np.ndarray:
    return _strided(storage, offset, size, stride, storage.dtype)


def _rebuild_tensor_v3(
    storage: _Storage, offset: Any, size: Any, stride: Any, _grad: Any, _hooks: Any,
    dtype: _DType, *_rest: Any,
) -> np.ndarray:  # fmt: skip
    if not isinstance(dtype, _DType):
        raise CheckpointError("malformed tensor record: no dtype.")
    return _strided(storage, offset, size, stride, dtype)


def _rebuild_parameter(data: np.ndarray, *_rest: Any) -> np.ndarray:
    return data


class _TorchUnpickler(pickle.Unpickler):
    """Builds numpy arrays from a torch ``data.pkl``; every other global is refused."""

    def __init__(self, file: IO[bytes], source: str, archive: zipfile.ZipFile, prefix: str,
                 big_endian: bool) -> None:  # fmt: skip
        super().__init__(file)
        self.source, self.archive, self.prefix = source, archive, prefix
        self.big_endian = big_endian
        self.storages: dict[str, _Storage] = {}

    def find_class(self, module: str, name: str) -> Any:
        if module == "torch._utils":
            if name in ("_rebuild_tensor", "_rebuild_tensor_v2"):
                return _rebuild_tensor
            if name == "_rebuild_tensor_v3":
                return _rebuild_tensor_v3
            if name in ("_rebuild_parameter", "_rebuild_parameter_with_state"):
                return _rebuild_parameter
        if module in ("torch", "torch.storage") and name in _TORCH_STORAGES:
            return _DType(_TORCH_STORAGES[name])
        if module == "torch" and name in _TORCH_DTYPES:
            return _DType(_TORCH_DTYPES[name])
        if (module, name) == ("collections", "OrderedDict"):
            return OrderedDict
        if (module, name) == ("_codecs", "encode"):
            return _codecs.encode  # protocol-2 pickles build bytes with it
        raise CheckpointError(
            f"{self.source} refers to {module}.{name}, which is not part of a state dict: "
            "polytrain reads only tensors and dicts of them. If you trust the file, load it "
            "with torch and save model.state_dict() alone."
        )

    def persistent_load(self, pid: Any) -> Any:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] in ("storage", b"storage")):
            raise CheckpointError(f"{self.source}: unknown persistent id {pid!r}.")
        _, dtype, key, _location, numel = pid  # the location (cuda:0, ...) does not matter
        if not isinstance(dtype, _DType):
            raise CheckpointError(f"{self.source}: storage of unknown type {dtype!r}.")
        key = key.decode() if isinstance(key, bytes) else str(key)
        if key not in self.storages:
            np_dtype = dtype.numpy(self.big_endian)
            name = f"{self.prefix}data/{key}"
            try:
                raw = self.archive.read(name)
            except KeyError:
                raise CheckpointError(f"{self.source} lacks storage {name}: corrupt.") from None
            need = int(numel) * np_dtype.itemsize
            if len(raw) < need:
                raise CheckpointError(
                    f"{self.source}: storage {name} has {len(raw)} bytes, {need} expected: "
                    "the file is truncated or corrupt."
                )
            array = np.frombuffer(raw[:need], dtype=np_dtype)
            self.storages[key] = _Storage(dtype, array, self.big_endian)
        return self.storages[key]


def read_torch(path: PathLike) -> dict[str, np.ndarray]:
    """Tensors of a ``torch.save`` zip (a state dict, possibly nested under
    ``state_dict``/``model_state_dict``/``model``), without importing torch."""
    source = os.fspath(path)
    try:
        with zipfile.ZipFile(source) as archive:
            names = archive.namelist()
            pickles = [n for n in names if n.endswith("data.pkl") and n.count("/") == 1]
            if any(n.endswith("constants.pkl") for n in names):
                raise CheckpointError(
                    f"{source} is a TorchScript archive, not a state dict: load it with "
                    "torch.jit.load and save its state_dict()."
                )
            if len(pickles) != 1:
                raise CheckpointError(f"{source} is a zip file but not a torch.save archive.")
            prefix = pickles[0][: -len("data.pkl")]
            order = b"little"
            if f"{prefix}byteorder" in names:
                order = archive.read(f"{prefix}byteorder").strip()
            data = archive.read(pickles[0])
            unpickler = _TorchUnpickler(
                io.BytesIO(data), source, archive, prefix, big_endian=order == b"big"
            )
            obj = unpickler.load()
    except CheckpointError:
        raise
    except (zipfile.BadZipFile, EOFError, zipfile.LargeZipFile) as exc:
        raise CheckpointError(f"{source} is truncated or corrupt ({exc}).") from exc
    except Exception as exc:  # a broken pickle raises anything
        raise CheckpointError(f"Cannot read {source} as a PyTorch state dict: {exc!r}") from exc
    return _state_dict(obj, source)


def _state_dict(obj: Any, source: str) -> dict[str, np.ndarray]:
    if isinstance(obj, Mapping) and not all(isinstance(v, np.ndarray) for v in obj.values()):
        nested = [k for k in ("state_dict", "model_state_dict", "model") if k in obj]
        if nested and isinstance(obj[nested[0]], Mapping):
            return _state_dict(obj[nested[0]], f"{source}[{nested[0]!r}]")
        bad = [str(k) for k, v in obj.items() if not isinstance(v, np.ndarray)][:4]
        raise CheckpointError(
            f"{source} holds a dict with entries that are not tensors ({', '.join(bad)}): "
            "save model.state_dict() alone."
        )
    if not isinstance(obj, Mapping):
        raise CheckpointError(f"{source} holds a {type(obj).__name__}, not a state dict.")
    return {str(k): v for k, v in obj.items()}


def write_torch(path: PathLike, tensors: Mapping[str, np.ndarray]) -> None:
    """``torch.save`` of a state dict, atomically. The bytes come from the torch backend
    (the zip's pickle must name torch's own classes, so polytrain does not fake it, and
    the core never imports a framework itself)."""
    from polytrain.errors import BackendError
    from polytrain.plugins.registry import get_backend

    try:
        backend = get_backend("torch")
    except BackendError as exc:
        raise CheckpointError(
            f"Writing {path} (a PyTorch .pt file) needs polytrain's torch backend: {exc} "
            "Or convert with --to neutral, which needs no framework and loads into torch "
            "with polytrain."
        ) from None
    _write_bytes(path, backend.encode_weights(dict(tensors)))


# -- paddle ---------------------------------------------------------------------------------------


def read_paddle(path: PathLike) -> dict[str, np.ndarray]:
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
        for key, info in state.pop(PADDLE_SLICES, {}).items():
            parts = [state.pop(name) for name in info["slices"]]
            state[key] = np.concatenate(parts).reshape(info["OriginShape"])
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise CheckpointError(f"{source}: corrupt sliced-array table: {exc!r}") from exc
    out = {}
    for key, value in state.items():
        if isinstance(key, str) and key.endswith("@@"):  # the name table, not a tensor
            continue
        if not isinstance(value, np.ndarray) or value.dtype.kind not in "fiucb":
            raise CheckpointError(f"{source}: entry {key!r} is not a numeric array.")
        out[str(key)] = value
    return out


def paddle_name_table(path: PathLike) -> dict[str, str]:
    """The structured name -> Paddle parameter name table (``fc.weight`` ->
    ``linear_0.w_0``) that ``paddle.save`` stores, or {} when the file has none."""
    state = safe_pickle.load(path)
    table = state.get(PADDLE_NAME_TABLE) if isinstance(state, dict) else None
    if not isinstance(table, dict):
        return {}
    return {str(k): str(v) for k, v in table.items()}


def encode_paddle(tensors: Mapping[str, np.ndarray]) -> bytes:
    """What ``paddle.save`` writes for this dict of arrays (protocol 4, no name table:
    ``layer.set_state_dict`` matches the structured names)."""
    state = {k: np.ascontiguousarray(v) for k, v in tensors.items()}
    return pickle.dumps(state, protocol=4)


def write_paddle(path: PathLike, tensors: Mapping[str, np.ndarray]) -> None:
    _write_bytes(path, encode_paddle(tensors))


# -- mxnet ----------------------------------------------------------------------------------------


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
    count = int(np.prod(shape, dtype=np.int64))
    raw = r.take(count * dtype.itemsize)
    out = np.frombuffer(raw, dtype=dtype).reshape(shape).astype(dtype.newbyteorder("="))
    if flag == MX_BF16:
        out = (out.astype(np.uint32) << 16).view(np.float32)
    return out


def read_mxnet(path: PathLike) -> dict[str, np.ndarray]:
    """Named arrays of an ``mx.nd.save`` / ``save_parameters`` file; Module checkpoints'
    ``arg:``/``aux:`` prefixes are removed."""
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
        for prefix in ("arg:", "aux:"):
            name = name.removeprefix(prefix)
        out[name] = array
    return out


def encode_mxnet(tensors: Mapping[str, np.ndarray]) -> bytes:
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


def write_mxnet(path: PathLike, tensors: Mapping[str, np.ndarray]) -> None:
    _write_bytes(path, encode_mxnet(tensors))


# -- common ---------------------------------------------------------------------------------------


def _write_bytes(path: PathLike, data: bytes) -> None:
    if Path(path).is_dir():
        raise CheckpointError(f"{path} is a directory: give a file name for a native file.")
    with atomic_path(path) as tmp, open(tmp, "wb") as fh:
        fh.write(data)


READERS = {"torch": read_torch, "paddle": read_paddle, "mxnet": read_mxnet}
WRITERS = {"torch": write_torch, "paddle": write_paddle, "mxnet": write_mxnet}


def write_native(path: PathLike, framework: str, tensors: Mapping[str, np.ndarray]) -> None:
    """Write ``tensors`` (native names and layout) in ``framework``'s format, atomically."""
    WRITERS[framework](path, tensors)
