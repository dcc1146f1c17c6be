"""The program ``paddle.jit.save`` writes beside its ``.pdiparams``, read without Paddle.

``paddle.jit.save(net, "inf/net", input_spec=[...])`` (and ``paddle.Model.save(path,
training=False)``, ``paddle.static.save_inference_model``) writes the parameters to
``inf/net.pdiparams`` and the program to ``inf/net.json`` (PIR, Paddle 3 by default) or
``inf/net.pdmodel`` (a protobuf ``ProgramDesc``, Paddle 2 or ``FLAGS_enable_pir_api=0``).
The ``.pdiparams`` holds the tensors without their names, in the order of the program's
persistable variables sorted by name (``paddle.jit.save`` sorts them before
``save_combine``). This module reads, from the program:

* the persistable variables (name, shape, dtype): their sorted names name the tensors;
* the role of each: the op it feeds and in which input (``matmul`` y, ``conv2d`` filter,
  ``batch_norm`` scale / bias / mean / variance, ``add`` y), which gives its layer kind
  and canonical leaf (see ``ROLES``).

PIR JSON (paddle/fluid/pir/serialize_deserialize): ops as ``{"#": name, "I": operands,
"O": results, "A": attributes}``, a parameter as ``{"#": "p", "A": [is_distributed,
is_parameter, need_clip, name], "O": value, "OA": [persistable, stop_gradient,
trainable]}``. ProgramDesc: paddle/phi/core/framework/framework.proto, read with a small
protobuf wire-format reader (only the fields named here).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from polytrain.backend.native_format import TensorRole
from polytrain.errors import CheckpointError

PIR_SUFFIX, DESC_SUFFIX = ".json", ".pdmodel"
# (op, input) -> (layer kind, canonical leaf); op names without dialect prefix or the
# in-place ``_``, PIR's positional inputs named as in the op's definition (INPUTS).
_LINEAR = ("Linear", "weight")  # y of x @ y: [in, out], Paddle's Linear layout
ROLES: dict[tuple[str, str], tuple[str | None, str]] = {
    ("matmul", "y"): _LINEAR,
    ("matmul_v2", "y"): _LINEAR,
    ("mul", "y"): _LINEAR,
    ("conv2d", "filter"): ("Conv2d", "weight"),
    ("depthwise_conv2d", "filter"): ("Conv2d", "weight"),
    ("conv3d", "filter"): ("Conv3d", "weight"),
    ("conv2d_transpose", "filter"): ("ConvTranspose2d", "weight"),
    ("batch_norm", "scale"): ("BatchNorm2d", "weight"),
    ("batch_norm", "bias"): ("BatchNorm2d", "bias"),
    ("batch_norm", "mean"): ("BatchNorm2d", "running_mean"),
    ("batch_norm", "variance"): ("BatchNorm2d", "running_var"),
    ("layer_norm", "scale"): ("LayerNorm", "weight"),
    ("layer_norm", "bias"): ("LayerNorm", "bias"),
    ("embedding", "weight"): ("Embedding", "weight"),
    ("lookup_table_v2", "w"): ("Embedding", "weight"),
    ("add", "y"): (None, "bias"),  # a tensor added to a layer's output: 1-D
    ("elementwise_add", "y"): (None, "bias"),
}
# the inputs of PIR ops, in operand order (paddle/phi/ops/yaml/ops.yaml)
INPUTS: dict[str, tuple[str, ...]] = {
    "matmul": ("x", "y"),
    "conv2d": ("input", "filter"),
    "depthwise_conv2d": ("input", "filter"),
    "conv3d": ("input", "filter"),
    "conv2d_transpose": ("x", "filter"),
    "batch_norm": ("x", "mean", "variance", "scale", "bias"),
    "layer_norm": ("x", "scale", "bias"),
    "embedding": ("x", "weight"),
    "add": ("x", "y"),
}
# ops that pass a parameter on unchanged in value (a conv bias reshaped to [1, C, 1, 1])
PASS_THROUGH = frozenset({"reshape", "reshape2", "cast", "assign"})
# a matmul's attribute that says y is used transposed ([out, in], PyTorch's layout)
TRANSPOSED_Y = frozenset({"transpose_y", "trans_y", "transpose_Y"})
# VarType.Type of framework.proto -> numpy dtype (BF16 is read as uint16 then widened)
DTYPES = {0: "?", 1: "<i2", 2: "<i4", 3: "<i8", 4: "<f2", 5: "<f4", 6: "<f8",
          20: "u1", 21: "i1", 22: "<u2", 37: "<u4", 38: "<u8"}  # fmt: skip
BF16 = 22
_PIR_DTYPES = {"f16": "<f2", "f32": "<f4", "f64": "<f8", "bf16": "<u2", "i8": "i1",
               "ui8": "u1", "i16": "<i2", "i32": "<i4", "i64": "<i8", "b": "?"}  # fmt: skip
_NOT_SAVED = frozenset({9, 10, 15})  # FEED_MINIBATCH, FETCH_LIST, READER: not in .pdiparams


@dataclass(frozen=True)
class Persistable:
    """A persistable variable of the program: one tensor of the ``.pdiparams``."""

    name: str
    shape: tuple[int, ...] | None
    dtype: str | None  # numpy dtype string, None when the program does not say


@dataclass
class Program:
    """What polytrain reads from an exported program."""

    path: Path
    persistables: list[Persistable]  # in .pdiparams order (sorted by name)
    uses: dict[str, list[tuple[str, str, bool]]] = field(default_factory=dict)
    """variable name -> (op, input, used transposed) for every op input it feeds"""

    def roles(self) -> dict[str, TensorRole]:
        """variable name -> its role, where its ops agree on one (see ``ROLES``); a matmul
        that uses y transposed is [out, in], not Paddle's Linear layout: no kind."""
        out = {}
        saved = {p.name for p in self.persistables}
        for name, uses in self.uses.items():
            if name not in saved:
                continue
            found = set()
            for op, slot, transposed in uses:
                role = ROLES.get((op, slot))
                if role is not None:
                    found.add((None, role[1]) if transposed else role)
            if len(found) == 1:
                kind, leaf = found.pop()
                out[name] = TensorRole(kind, leaf, name.rpartition(".")[2])
            elif found:  # shared by layers of different kinds: no layout can be decided
                leaves = {leaf for _, leaf in found}
                leaf = leaves.pop() if len(leaves) == 1 else "weight"
                out[name] = TensorRole(None, leaf, name.rpartition(".")[2])
        return out


def program_path(params: Path) -> Path | None:
    """The program beside a ``.pdiparams`` (``net.json``, else ``net.pdmodel``), or None."""
    stem = params.with_suffix("") if params.suffix == ".pdiparams" else params
    for suffix in (PIR_SUFFIX, DESC_SUFFIX):
        candidate = stem.with_name(stem.name + suffix)
        if candidate.is_file():
            return candidate
    return None


def read_program(path: Path) -> Program:
    """The program at ``path`` (PIR JSON or ProgramDesc, told apart by content)."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise CheckpointError(f"Cannot read {path}: {exc.strerror or exc}.") from exc
    if data.lstrip()[:1] == b"{":
        return _read_pir(path, data)
    return _read_desc(path, data)


# -- PIR JSON -------------------------------------------------------------------------------------


def _read_pir(path: Path, data: bytes) -> Program:
    try:
        doc = json.loads(data)
        regions = doc["program"]["regions"]
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{path} is not a Paddle PIR program: {exc!r}.") from None
    values: dict[int, str] = {}  # value id -> the parameter it holds
    params: dict[str, Persistable] = {}
    program = Program(path, [])
    for op in _pir_ops(regions):
        name = str(op.get("#", ""))
        if name in ("p", "builtin.parameter", "0.parameter"):
            param = _pir_parameter(op, path)
            if param is not None:
                params[param.name] = param
                values[_value_id(op.get("O"))] = param.name
            continue
        kind = _op_name(name)
        operands = [_value_id(o) for o in op.get("I", [])]
        results = op.get("O", [])
        if kind in PASS_THROUGH and operands and operands[0] in values and results:
            values[_value_id(results[0])] = values[operands[0]]
            continue
        slots = INPUTS.get(kind, ())
        transposed = _pir_flag(op.get("A", []), TRANSPOSED_Y)
        for i, value in enumerate(operands):
            if value in values:
                slot = slots[i] if i < len(slots) else f"#{i}"
                program.uses.setdefault(values[value], []).append((kind, slot, transposed))
    program.persistables = [params[n] for n in sorted(params)]
    return program


def _pir_ops(regions: Any) -> Iterator[dict[str, Any]]:
    for region in regions or []:
        for block in region.get("blocks", []):
            for op in block.get("ops", []):
                yield op
                yield from _pir_ops(op.get("regions"))


def _pir_parameter(op: dict[str, Any], path: Path) -> Persistable | None:
    attrs = op.get("A", [])
    name = None
    if attrs and isinstance(attrs[-1], str):
        name = attrs[-1]  # [is_distributed, is_parameter, need_clip, parameter_name]
    for attr in attrs:
        if isinstance(attr, dict) and attr.get("N") == "parameter_name":
            name = attr.get("AT", {}).get("D")
    if not isinstance(name, str):
        raise CheckpointError(f"{path}: a parameter op without a name: {op!r:.120}.")
    flags = op.get("OA", [])  # [persistable, stop_gradient, trainable]; persistable by default
    if flags and isinstance(flags[0], int) and not flags[0]:
        return None
    result = op.get("O", {})
    shape, dtype = _pir_type(result.get("TT") if isinstance(result, dict) else None)
    return Persistable(name, shape, dtype)


def _pir_type(tt: Any) -> tuple[tuple[int, ...] | None, str | None]:
    """(shape, dtype) of a ``{"#": "0.t_dtensor", "D": [{"#": "0.t_f32"}, dims, ...]}``."""
    try:
        dtype_id = str(tt["D"][0]["#"]).rpartition(".t_")[2]
        return tuple(int(d) for d in tt["D"][1]), _PIR_DTYPES.get(dtype_id)
    except (KeyError, IndexError, TypeError, ValueError):
        return None, None


def _value_id(value: Any) -> int:
    return int(value.get("%", 0)) if isinstance(value, dict) else 0


def _op_name(name: str) -> str:
    """``1.batch_norm_`` / ``pd_op.batch_norm_`` -> ``batch_norm``."""
    return name.rpartition(".")[2].removesuffix("_")


def _pir_flag(attrs: Any, names: frozenset[str]) -> bool:
    for attr in attrs if isinstance(attrs, list) else []:
        if isinstance(attr, dict) and attr.get("N") in names:
            return bool(attr.get("AT", {}).get("D"))
    return False


# -- ProgramDesc (protobuf) -----------------------------------------------------------------------


def _read_desc(path: Path, data: bytes) -> Program:
    source = str(path)
    program = Program(path, [])
    found: dict[str, Persistable] = {}
    aliases: dict[str, str] = {}  # a pass-through op's output -> the variable it passes on
    for block in _fields(data, source).get(1, []):  # ProgramDesc.blocks
        parts = _fields(block, source)
        for var in parts.get(3, []):  # BlockDesc.vars
            param = _desc_var(var, source)
            if param is not None:
                found[param.name] = param
        for op in parts.get(4, []):  # BlockDesc.ops
            _desc_op(op, source, program, aliases)
    program.persistables = [found[n] for n in sorted(found)]
    return program


def _desc_var(data: bytes, source: str) -> Persistable | None:
    """A VarDesc that ``paddle.jit.save`` stores: persistable, not a feed/fetch/reader."""
    var = _fields(data, source)
    if not any(var.get(3, [])):  # persistable
        return None
    vtype = _fields(_one(var, 2, source), source)  # VarType
    if _int(vtype, 1, -1) in _NOT_SAVED:
        return None
    shape, dtype = None, None
    if 3 in vtype:  # dense_tensor.tensor: TensorDesc
        desc = _fields(_one(_fields(_one(vtype, 3, source), source), 1, source), source)
        shape, dtype = tensor_desc(desc)
    return Persistable(_one(var, 1, source).decode("utf-8"), shape, dtype)


def _desc_op(data: bytes, source: str, program: Program, aliases: dict[str, str]) -> None:
    op = _fields(data, source)
    kind = _one(op, 3, source).decode("utf-8")
    attrs = {}
    for attr in op.get(4, []):
        fields = _fields(attr, source)
        attrs[_one(fields, 1, source).decode("utf-8")] = _int(fields, 10, 0)  # Attr.b
    transposed = any(attrs.get(n) for n in TRANSPOSED_Y)
    inputs = _desc_slots(op.get(1, []), source)
    if kind in PASS_THROUGH:  # a conv bias reshaped to [1, C, 1, 1]: the output is it
        outputs = _desc_slots(op.get(2, []), source)
        for name in inputs.get("x", [])[:1]:
            for out in outputs.get("out", [])[:1]:
                aliases[out] = aliases.get(name, name)
        return
    for slot, names in inputs.items():
        for name in names:
            name = aliases.get(name, name)
            program.uses.setdefault(name, []).append((kind, slot, transposed))


def _desc_slots(variables: list[bytes], source: str) -> dict[str, list[str]]:
    """input/output slot (lower case) -> variable names, of an OpDesc's ``Var`` list."""
    out: dict[str, list[str]] = {}
    for var in variables:
        fields = _fields(var, source)
        slot = _one(fields, 1, source).decode("utf-8").lower()
        out.setdefault(slot, []).extend(a.decode("utf-8") for a in fields.get(2, []))
    return out


def tensor_desc(desc: Mapping[int, list[Any]]) -> tuple[tuple[int, ...], str | None]:
    """(dims, numpy dtype) of a parsed ``VarType.TensorDesc`` (data_type 1, dims 2)."""
    dims: list[int] = []
    for value in desc.get(2, []):
        if isinstance(value, bytes):  # packed
            dims.extend(_signed(v) for v in _varints(value))
        else:
            dims.append(_signed(value))
    return tuple(dims), DTYPES.get(_int(desc, 1, -1))


def _fields(data: bytes, source: str) -> dict[int, list[Any]]:
    """The fields of one protobuf message: number -> values (varints as int, 64/32-bit
    as bytes, length-delimited as bytes)."""
    out: dict[int, list[Any]] = {}
    pos = 0
    try:
        while pos < len(data):
            key, pos = _varint(data, pos)
            number, wire = key >> 3, key & 7
            value: Any
            if wire == 0:
                value, pos = _varint(data, pos)
            elif wire == 1:
                value, pos = data[pos : pos + 8], pos + 8
            elif wire == 2:
                size, pos = _varint(data, pos)
                value, pos = data[pos : pos + size], pos + size
            elif wire == 5:
                value, pos = data[pos : pos + 4], pos + 4
            else:
                raise ValueError(f"wire type {wire}")
            if pos > len(data):
                raise ValueError("cut short")
            out.setdefault(number, []).append(value)
    except (ValueError, IndexError) as exc:
        raise CheckpointError(f"{source} is not a Paddle ProgramDesc: {exc}.") from None
    return out


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _varints(data: bytes) -> Iterator[int]:
    pos = 0
    while pos < len(data):
        value, pos = _varint(data, pos)
        yield value


def _signed(value: int) -> int:
    return struct.unpack("<q", struct.pack("<Q", value & (2**64 - 1)))[0]


def _one(fields: Mapping[int, list[Any]], number: int, source: str) -> bytes:
    values = fields.get(number)
    if not values or not isinstance(values[-1], bytes):
        raise CheckpointError(f"{source} is not a Paddle ProgramDesc: field {number} missing.")
    return values[-1]


def _int(fields: Mapping[int, list[Any]], number: int, default: int) -> int:
    values = fields.get(number)
    return values[-1] if values and isinstance(values[-1], int) else default
