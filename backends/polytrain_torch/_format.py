"""PyTorch's native weights file, read without torch.

``torch.save(state_dict)`` writes a zip (``PK\\x03\\x04``) holding ``<archive>/data.pkl`` (a
protocol-2 pickle whose tensors are ``torch._utils._rebuild_tensor_v2`` calls on persistent
ids ``('storage', torch.FloatStorage, key, location, numel)``) and one raw little-endian
file ``<archive>/data/<key>`` per storage. It is read by a restricted unpickler that knows
only those names and never imports torch; writing needs torch (the pickle names torch's
own classes, which polytrain does not fake).
"""

from __future__ import annotations

import _codecs
import io
import os
import pickle
import zipfile
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import IO, Any

import numpy as np

from polytrain.backend.native_format import LayoutRules, NativeFormat, PathLike, zip_entry_names
from polytrain.backend.optimizer_file import OptimizerFile
from polytrain.errors import CheckpointError

ZIP_MAGIC = b"PK\x03\x04"
# torch.save writes this pickled integer first in its pre-1.6, non-zip format
LEGACY_MAGIC = 0x1950A86A20F9469CFC6C


class TorchFormat(NativeFormat):
    """``.pt`` state dicts: canonical names and layout; BatchNorm also has
    ``num_batches_tracked`` (written as 0, ignored when read: the specs' fixed momentum
    never uses it); the ``module.`` prefixes of DataParallel/DDP state dicts are removed."""

    name = "torch"
    label = "PyTorch .pt"
    suffix = ".pt"
    signature = "a PyTorch zip (50 4b 03 04)"
    order = 10
    layout = LayoutRules(
        constants={
            kind: {"num_batches_tracked": np.array(0, dtype=np.int64)}
            for kind in ("BatchNorm2d", "BatchNorm1d")
        },
        strip_prefixes=("module.",),
        note="PyTorch layout",
    )

    def sniff(self, head: bytes, path: PathLike) -> bool:
        if head.startswith(b"\x80\x02\x8a\x0a") and int.from_bytes(head[4:14], "little") == (
            LEGACY_MAGIC
        ):
            raise CheckpointError(
                f"{os.fspath(path)} is in PyTorch's pre-1.6 (non-zip) format, which polytrain "
                "does not read. Re-save it with a current torch: torch.save(torch.load(f), f)."
            )
        if not head.startswith(ZIP_MAGIC):
            return False
        names = zip_entry_names(path)  # None: damaged, and reading it says what
        return not names or not all(n.endswith(".npy") for n in names)  # not a NumPy .npz

    def read(self, path: PathLike) -> dict[str, np.ndarray]:
        return _read(path)

    def encode(self, tensors: Mapping[str, np.ndarray]) -> bytes:
        import torch

        state = {}
        for name, value in tensors.items():
            array = np.array(value, order="C")
            try:
                state[name] = torch.from_numpy(array)
            except TypeError:  # a dtype torch has no tensors of
                raise CheckpointError(
                    f"PyTorch .pt cannot hold {name!r} of dtype {array.dtype}."
                ) from None
        buffer = io.BytesIO()  # archive name "archive", whatever the file will be called
        torch.save(state, buffer)
        return buffer.getvalue()

    def encode_optimizer(self, state: OptimizerFile) -> bytes:
        """``torch.save(optimizer.state_dict())``, see ``_optimizer_state``."""
        from ._optimizer_state import encode_optimizer

        return encode_optimizer(state)

    def encode_scheduler(self, state: OptimizerFile) -> bytes:
        """``torch.save(scheduler.state_dict())``, see ``_optimizer_state``."""
        from ._optimizer_state import encode_scheduler

        return encode_scheduler(state)


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


def _read(path: PathLike) -> dict[str, np.ndarray]:
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
