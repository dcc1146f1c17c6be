"""Paddle's ``nn.utils.weight_norm(layer, name, dim)`` as ``torch.nn.utils.weight_norm``:
the same parameters (``weight_g``, ``weight_v``, whose names a checkpoint keeps; the
parametrizations version renames them) and the same norm, ``dim`` counting the axes of the
layer's weight. Those are PyTorch's axes where the weight has the same layout (a
convolution, an embedding); a Linear's weight is [in, out] in Paddle, the transpose in
PyTorch, so there ``dim`` names the other axis, and a layer the tool does not know could be
either: marked, unless ``dim`` is None or -1 (the whole tensor, in both). Names are built
from the table's roots (the core names no framework)."""

from __future__ import annotations

import ast
from collections.abc import Callable

import libcst as cst

from polytrain.porting.code.arguments import code
from polytrain.porting.code.table import Framework

FUNCTIONS = ("nn.utils.weight_norm",)  # under the framework's root
WHOLE = (None, -1)  # a dim that normalises the whole tensor: no axis named
TRANSPOSED = (
    "dim counts the axes of the layer's weight, which is [in, out] in the source and "
    "[out, in] in PyTorch: write dim=1 for the source's dim=0 (and 0 for 1)"
)
UNKNOWN = (
    "dim counts the axes of the layer's weight, the same in PyTorch for a convolution, "
    "not for a Linear ([in, out] in the source): make the layer in the call, or write "
    "dim for torch's layout (a Linear's dim=0 is dim=1)"
)


def _argument(call: cst.Call, name: str, at: int) -> cst.BaseExpression | None:
    for i, arg in enumerate(call.args):
        if (arg.keyword is not None and arg.keyword.value == name) or (
            arg.keyword is None and not arg.star and i == at
        ):
            return arg.value
    return None


def _whole(dim: cst.BaseExpression) -> bool:
    try:
        return ast.literal_eval(code(dim).strip()) in WHOLE
    except (ValueError, SyntaxError):
        return False


def why_not(
    api: str,
    call: cst.Call,
    layer_api: Callable[[cst.BaseExpression], str | None],
    fw: Framework,
) -> str:
    """Why ``call`` (of ``api``) cannot be converted as the table says: its dim names an
    axis of a weight laid out otherwise, or of a layer the tool does not know; "" where it
    can (``layer_api``: the framework API that made a layer expression, if known)."""
    if api not in {f"{fw.root}.{f}" for f in FUNCTIONS}:
        return ""
    dim = _argument(call, "dim", 2)
    if dim is not None and _whole(dim):
        return ""
    layer = _argument(call, "layer", 0)
    made = layer_api(layer) if layer is not None else None
    if made is not None and made in fw.transposed:
        return TRANSPOSED
    return "" if made is not None and made in fw.entries else UNKNOWN
