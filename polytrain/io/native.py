"""Native weight files, through the formats the plugins register.

Each backend plugin declares its framework's file format as a
:class:`~polytrain.backend.native_format.NativeFormat` (recognised by content, never by
suffix; read and written with numpy where the format allows). This module only
dispatches: :func:`detect_format` asks the registered formats, in their order, whether
they recognise a file; :func:`read_native` and :func:`write_native` go to the format of
that name. Names and layouts stay native here; :mod:`polytrain.io.convert` maps them.
A directory is a neutral (polytrain) checkpoint.

This is the one way polytrain reads a weights file a user gives (``convert``, ``port
--weights``): every registered reader treats the file as data (an allow-list unpickler, a
zip reader, a binary reader) and never runs code from it; a path that is not a regular
file (a FIFO, a device) is refused before it is opened.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from polytrain.backend.native_format import NativeFormat, PathLike
from polytrain.errors import CheckpointError, ConfigError
from polytrain.plugins.registry import registered_backends, registered_formats
from polytrain.utils.user_files import file_kind

NEUTRAL = "neutral"


def formats() -> dict[str, NativeFormat]:
    """The registered native formats, by name, in detection order."""
    return registered_formats()


def get_format(name: str) -> NativeFormat:
    """The registered format ``name``; a ConfigError lists the others."""
    found = formats()
    if name not in found:
        known = ", ".join(found) or "none (no backend plugin is installed)"
        raise ConfigError(f"Unknown format {name!r}; use one of {known}.")
    return found[name]


def detect_format(path: PathLike) -> str:
    """The name of the registered format of ``path``, or ``neutral`` for a checkpoint or
    run directory, from the content; a CheckpointError says what was found instead."""
    p = Path(path)
    if p.is_dir():
        return NEUTRAL
    try:
        mode = os.stat(p).st_mode
        if not stat.S_ISREG(mode):  # a FIFO blocks, /dev/zero never ends
            raise CheckpointError(f"{p} is {file_kind(mode)}, not a weights file.")
        with open(p, "rb") as fh:
            head = fh.read(16)
    except FileNotFoundError:
        raise CheckpointError(f"No such file or directory: {p}.") from None
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the name
        raise CheckpointError(f"Cannot read {p}: {getattr(exc, 'strerror', None) or exc}.") from exc
    if not head:
        raise CheckpointError(f"{p} is empty.")
    found = formats()
    for fmt in found.values():
        if fmt.sniff(head, p):
            return fmt.name
    expected = [fmt.signature or fmt.label for fmt in found.values()]
    raise CheckpointError(
        f"{p} is not a weights file polytrain knows: it starts with {head[:8].hex(' ')}; "
        f"expected {_one_of(expected)}, or a polytrain checkpoint directory."
    )


def read_native(path: PathLike) -> tuple[str, dict[str, np.ndarray]]:
    """(format name, native tensors) of a native weights file, detected by content."""
    name = detect_format(path)
    if name == NEUTRAL:
        raise CheckpointError(f"{path} is a directory, not a native weights file.")
    return name, get_format(name).read(path)


def write_native(path: PathLike, name: str, tensors: Mapping[str, np.ndarray]) -> None:
    """Write ``tensors`` (native names and layout) in format ``name``, atomically. A
    format whose writing needs its framework says how to install it when it is missing."""
    fmt = get_format(name)
    try:
        fmt.write(path, tensors)
    except ImportError as exc:
        info = registered_backends().get(fmt.name)
        install = f" Install it with: {info.install_hint}." if info is not None else ""
        raise CheckpointError(
            f"Writing {path} (a {fmt.label} file) needs {exc.name or 'its framework'}, which "
            f"cannot be imported ({exc}).{install} Or convert with --to {NEUTRAL}, which "
            "needs no framework and loads into any backend with polytrain."
        ) from None


def _one_of(items: list[str]) -> str:
    if len(items) <= 1:
        return "".join(items) or "a format a backend plugin registers (none is installed)"
    return f"{', '.join(items[:-1])} or {items[-1]}"
