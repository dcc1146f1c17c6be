"""``paddle.jit.save``'s ``.pdiparams``, read with numpy, named from the program beside it.

The file is Paddle's ``save_combine`` of dense tensors, one after the other, no names
(paddle/phi/core/framework/dense_tensor_serialize.cc, ``SerializeToStream``): uint32
version 0; uint64 LoD levels, each a uint64 byte count and its offsets; uint32 version 0;
int32 size of a ``VarType.TensorDesc`` protobuf (data_type, dims), the message; the raw
little-endian data. The names are the program's persistable variables sorted by name
(:mod:`._program`); ``paddle.jit.save`` without PIR also writes ``net.pdiparams.info``, a
pickle of ``{program name: {"structured_name": "fc.weight", ...}}``: those names are used
where it is there (read by the restricted unpickler).
"""

from __future__ import annotations

import math
import struct
from pathlib import Path

import numpy as np

from polytrain.backend.native_format import CompanionRoles, PathLike, TensorRole
from polytrain.errors import CheckpointError
from polytrain.utils import safe_pickle

from ._program import BF16, Program, _fields, program_path, read_program, tensor_desc

INFO_SUFFIX = ".info"  # net.pdiparams.info


def looks_like_pdiparams(head: bytes, path: PathLike) -> bool:
    """Whether the file starts like a ``save_combine`` of tensors: version 0, no LoD (or a
    few levels), version 0, a small TensorDesc starting with its data_type field."""
    if len(head) < 16 or head[:4] != b"\0\0\0\0":
        return False
    try:
        with open(path, "rb") as fh:
            start = fh.read(4096)
        pos = 4
        (levels,) = struct.unpack_from("<Q", start, pos)
        pos += 8
        if levels > 8:
            return False
        for _ in range(levels):
            (size,) = struct.unpack_from("<Q", start, pos)
            pos += 8 + size
        version, size = struct.unpack_from("<Ii", start, pos)
        return version == 0 and 0 < size < 1024 and start[pos + 8 : pos + 9] == b"\x08"
    except (OSError, struct.error):
        return False


def read_pdiparams(path: PathLike) -> dict[str, np.ndarray]:
    """The tensors of a ``.pdiparams``, named by the program beside it (by the structured
    names of ``.pdiparams.info`` where there is one)."""
    source = Path(path)
    program = _program(source)
    arrays = _arrays(source)
    params = program.persistables
    if len(arrays) != len(params):
        raise CheckpointError(
            f"{source} holds {len(arrays)} tensors but its program {program.path} has "
            f"{len(params)} persistable variables: they are not from the same save."
        )
    out = {}
    for param, array in zip(params, arrays, strict=True):
        if param.shape is not None and tuple(param.shape) != array.shape:
            raise CheckpointError(
                f"{source}: tensor {param.name!r} has shape {array.shape}, its program "
                f"{program.path} says {param.shape}: they are not from the same save."
            )
        out[param.name] = array
    names = structured_names(source)
    return {names.get(k, k): v for k, v in out.items()} if names else out


def pdiparams_roles(path: PathLike) -> CompanionRoles:
    """The role of each tensor from the ops of the program beside the ``.pdiparams``."""
    source = Path(path)
    program = _program(source)
    names = structured_names(source)
    roles = {}
    for name, role in program.roles().items():
        shown = names.get(name, name)
        roles[shown] = TensorRole(role.kind, role.leaf, shown.rpartition(".")[2])
    if names:
        notes = (
            f"tensor names: the structured names of {source.name}{INFO_SUFFIX} "
            "(as net.state_dict() names them)",
        )
    else:
        notes = (
            f"tensor names: the program's ({program.path.name}: linear_0.w_0, ...), not the "
            "structured names of state_dict(), which a PIR paddle.jit.save does not record: "
            'give --map (e.g. {"fc.": "linear_0."}) to name them as your model does',
        )
    return CompanionRoles(str(program.path), roles, notes)


def structured_names(params: Path) -> dict[str, str]:
    """program name -> structured name from ``net.pdiparams.info``, {} without one."""
    info = params.with_name(params.name + INFO_SUFFIX)
    if not info.is_file():
        return {}
    table = safe_pickle.load(info)
    if not isinstance(table, dict):
        return {}
    out = {}
    for name, extra in table.items():
        if isinstance(extra, dict) and isinstance(extra.get("structured_name"), str):
            out[str(name)] = extra["structured_name"]
    return out


def _program(params: Path) -> Program:
    found = program_path(params)
    if found is None:
        stem = params.with_suffix("") if params.suffix == ".pdiparams" else params
        raise CheckpointError(
            f"{params} is a paddle.jit.save parameters file: its tensors are named only by "
            f"the program saved with it, {stem}.json (or {stem}.pdmodel without PIR), which "
            "is not there; put it beside the .pdiparams."
        )
    return read_program(found)


def _arrays(path: Path) -> list[np.ndarray]:
    source = str(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise CheckpointError(f"Cannot read {source}: {exc.strerror or exc}.") from exc
    out = []
    pos = 0

    def take(n: int) -> bytes:
        nonlocal pos
        if n < 0 or pos + n > len(data):
            raise CheckpointError(
                f"{source} is truncated or corrupt: needed {n} bytes at offset {pos}, "
                f"the file has {len(data)}."
            )
        pos += n
        return data[pos - n : pos]

    while pos < len(data):
        (version,) = struct.unpack("<I", take(4))
        (levels,) = struct.unpack("<Q", take(8))
        if version != 0 or levels > 8:
            raise CheckpointError(f"{source} is corrupt: tensor header at offset {pos - 12}.")
        for _ in range(levels):  # LoD offsets: not part of a parameter's value
            take(struct.unpack("<Q", take(8))[0])
        version, size = struct.unpack("<Ii", take(8))
        if version != 0:
            raise CheckpointError(f"{source}: unknown tensor version {version}.")
        desc = _fields(take(size), source)
        dims, dtype = tensor_desc(desc)
        flag = desc.get(1, [-1])[-1]
        if dtype is None:
            raise CheckpointError(f"{source}: a tensor of Paddle data type {flag}, not read.")
        if any(d < 0 for d in dims):
            raise CheckpointError(f"{source} is corrupt: a tensor of shape {dims}.")
        raw = take(math.prod(dims) * np.dtype(dtype).itemsize)
        array = np.frombuffer(raw, dtype=dtype).reshape(dims)
        array = array.astype(array.dtype.newbyteorder("="))
        if flag == BF16:
            array = (array.astype(np.uint32) << 16).view(np.float32)
        out.append(array)
    return out
