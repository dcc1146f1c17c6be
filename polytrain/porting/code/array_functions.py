"""Gluon functions on arrays: a ``dtype=`` given as a numpy type (``dtype=np.int32``,
numpy's or MXNet's numpy interface's) is read as its name (``'int32'``) where the table
entry converts that name, so the table's own dtype conversion applies to it."""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

import libcst as cst

from polytrain.porting.code.table import Entry

NUMPY_MODULES = ("numpy.", "mxnet.np.", "mxnet.numpy.")  # where ``np.int32`` is numpy's type


def dtype_name(names: Collection[str]) -> str | None:
    """The numpy type's name (``int32``) among a value's qualified names, or None."""
    for name in names:
        for module in NUMPY_MODULES:
            rest = name[len(module) :]
            if name.startswith(module) and rest.isidentifier():
                return rest
    return None


def numpy_dtypes(
    entry: Entry,
    original: Sequence[cst.Arg],
    updated: Sequence[cst.Arg],
    names_of: Callable[[cst.CSTNode], Collection[str]],
) -> list[cst.Arg]:
    """``updated`` with each keyword argument whose original value is a numpy type the
    entry's ``convert`` lists by name written as that name (``dtype=np.int32`` ->
    ``dtype='int32'``); any other argument as it is."""
    out = list(updated)
    for i, (before, after) in enumerate(zip(original, updated, strict=False)):
        spec = entry.arg(before.keyword.value) if before.keyword is not None else None
        if spec is None or not spec.convert:
            continue
        name = dtype_name(names_of(before.value))
        if name is not None and f"'{name}'" in spec.convert:
            out[i] = after.with_changes(value=cst.SimpleString(f"'{name}'"))
    return out
