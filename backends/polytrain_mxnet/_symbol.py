"""The symbol graph Gluon's ``export()`` writes beside its parameters, read without MXNet.

``net.hybridize(); net(x); net.export("model")`` writes ``model-symbol.json`` and
``model-0000.params`` (names prefixed ``arg:`` / ``aux:``, as a Module checkpoint's).
The symbol file is nnvm's graph JSON: ``nodes`` in order, each ``{"op", "name",
"inputs": [[node index, output, version], ...], "attrs"}``; a parameter is an ``op:
"null"`` node, and the op that uses it says what it is by the input it fills, in the
op's input order (MXNet's operator definitions: ``FullyConnected(data, weight, bias)``,
``Convolution(data, weight, bias)``, ``BatchNorm(data, gamma, beta, moving_mean,
moving_var)``, ...). That gives each tensor's layer kind and canonical leaf (``ROLES``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from polytrain.backend.native_format import CompanionRoles, TensorRole
from polytrain.errors import CheckpointError

# op -> (layer kind, its inputs in order: None for data, else (canonical leaf, the ends of
# the parameter's name Gluon or the symbol API give it)); Convolution's kind by its kernel
_DATA = None
_W, _B = ("weight", "weight"), ("bias", "bias")
ROLES: dict[str, tuple[str, tuple[tuple[str, ...] | None, ...]]] = {
    "FullyConnected": ("Linear", (_DATA, _W, _B)),  # weight [out, in], as PyTorch's Linear
    "Convolution": ("Conv", (_DATA, _W, _B)),
    "Deconvolution": ("ConvTranspose", (_DATA, _W, _B)),
    "BatchNorm": (
        "BatchNorm2d",
        (
            _DATA,
            ("weight", "gamma"),
            ("bias", "beta"),
            ("running_mean", "running_mean", "moving_mean"),
            ("running_var", "running_var", "moving_var"),
        ),
    ),
    "Embedding": ("Embedding", (_DATA, _W)),
    "LayerNorm": ("LayerNorm", (_DATA, ("weight", "gamma"), ("bias", "beta"))),
}
_PARAMS = re.compile(r"(?P<prefix>.+)-\d+\.params")


def symbol_path(params: Path) -> Path | None:
    """``model-symbol.json`` for ``model-0000.params`` (the name ``export()`` gives)."""
    found = _PARAMS.fullmatch(params.name)
    return params.with_name(f"{found['prefix']}-symbol.json") if found else None


def symbol_roles(params: Path, names: list[str]) -> CompanionRoles | None:
    """The roles of the tensors of ``params`` (its names as stored, ``arg:``/``aux:``
    included) from the symbol file beside it; None for a file that is not an export."""
    symbol = symbol_path(params)
    exported = bool(names) and all(n.startswith(("arg:", "aux:")) for n in names)
    if symbol is None or not symbol.is_file():
        if not exported:
            return None
        where = symbol or params.with_name("<prefix>-symbol.json")
        return CompanionRoles(
            str(where),
            notes=(
                f"an export()/Module checkpoint (arg:/aux: names) without its symbol file "
                f"{where.name}: no layer kinds and no BatchNorm renames (names kept as they "
                "are); put the symbol file beside it, or give --map",
            ),
        )
    roles = read_symbol(symbol)
    example = '{"re:bn\\\\.": "net0_batchnorm0_"}'  # as written in the JSON of --map
    notes = (
        f"tensor names: the symbol's ({roles_example(roles)}), not those of your model: "
        f"give --map (e.g. {example}) to name them as it does",
    )
    return CompanionRoles(str(symbol), roles, notes)


def roles_example(roles: dict[str, TensorRole]) -> str:
    return ", ".join(list(roles)[:2]) + (", ..." if len(roles) > 2 else "")


def read_symbol(path: Path) -> dict[str, TensorRole]:
    """parameter name -> its role, from the ops of the symbol graph at ``path``; a
    parameter that ops of different kinds use has no kind (its layout is not known)."""
    try:
        nodes = json.loads(path.read_text(encoding="utf-8"))["nodes"]
    except OSError as exc:
        raise CheckpointError(f"Cannot read {path}: {exc.strerror or exc}.") from exc
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{path} is not an MXNet symbol file: {exc!r}.") from None
    found: dict[str, set[tuple[str | None, str, str | None]]] = {}
    for node in nodes:
        spec = ROLES.get(str(node.get("op")))
        if spec is None:
            continue
        kind = _kind(spec[0], node)
        for leaves, entry in zip(spec[1], node.get("inputs", []), strict=False):
            source = nodes[entry[0]] if isinstance(entry, list) and entry else None
            if leaves is None or not isinstance(source, dict) or source.get("op") != "null":
                continue
            name = str(source.get("name"))
            leaf, *spellings = leaves
            native = next((s for s in spellings if _ends(name, s)), None)
            found.setdefault(name, set()).add((kind, leaf, native))
    out = {}
    for name, roles in found.items():
        if len(roles) == 1:
            only = next(iter(roles))
            out[name] = TensorRole(*only)
        else:  # shared by ops of different kinds
            out[name] = TensorRole(None, sorted(r[1] for r in roles)[0], None)
    return out


def _kind(kind: str, node: dict[str, Any]) -> str:
    """Convolution's kind by the rank of its kernel (``(3, 3)`` -> Conv2d)."""
    if kind not in ("Conv", "ConvTranspose"):
        return kind
    attrs = node.get("attrs") or node.get("attr") or node.get("param") or {}
    rank = len(re.findall(r"\d+", str(attrs.get("kernel", "(0, 0)")))) or 2
    return f"{kind}{rank}d"


def _ends(name: str, leaf: str) -> bool:
    return name.endswith(("_" + leaf, "." + leaf))
