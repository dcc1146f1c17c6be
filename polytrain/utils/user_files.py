"""Files a user hands in, read as data: never unpickled, never run.

Weights, optimizer and checkpoint files go to their format's own reader
(:func:`polytrain.io.native.read_native`: an allow-list unpickler, a zip reader, a binary
reader; checkpoints are safetensors and JSON). This module reads the rest, each in one
way: arrays (``.npy``, numbers only, ``allow_pickle=False``), JSON and text. A path that
is not a regular file (a FIFO, a device such as ``/dev/zero``: reading one blocks or
never ends) is refused before it is opened for reading, and every refusal is one line
that names the file.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import numpy as np

from polytrain.errors import ConfigError

PathLike = str | os.PathLike[str]
TEXT_LIMIT = 16 * 2**20  # a recipe, spec or map file is a few kB; this is far above any

TRUST_ARRAY = (
    "if you trust the file, load it yourself with np.load(path, allow_pickle=True) and "
    "save the numeric array with np.save"
)


def regular_file(path: PathLike, what: str) -> Path:
    """``path`` when it names a regular file (after symlinks); else a ConfigError that
    says what it is instead."""
    p = Path(path)
    try:
        mode = os.stat(p).st_mode
    except FileNotFoundError:
        raise ConfigError(f"{what} {p} does not exist.") from None
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the name
        raise ConfigError(
            f"Cannot read {what} {p}: {getattr(exc, 'strerror', None) or exc}."
        ) from None
    if not stat.S_ISREG(mode):
        raise ConfigError(f"{what} {p} is {file_kind(mode)}, not a regular file.")
    return p


def read_bytes(path: PathLike, what: str, limit: int | None = None, why: str = "") -> bytes:
    """The bytes of a regular file; with ``limit``, a larger file is refused unread (``why``
    ends the refusal: the reason for the limit, what to do)."""
    p = regular_file(path, what)
    try:
        with open(p, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if limit is not None and size > limit:
                raise ConfigError(
                    f"{what} {p} is {size / 2**20:.1f} MB; polytrain reads at most "
                    f"{limit / 2**20:g} MB here{why}."
                )
            return fh.read()
    except OSError as exc:
        raise ConfigError(f"Cannot read {what} {p}: {exc.strerror or exc}.") from exc


def read_text(path: PathLike, what: str, limit: int | None = None, why: str = "") -> str:
    """A regular file's UTF-8 text; a binary file (NUL bytes, not UTF-8) is refused."""
    data = read_bytes(path, what, limit, why)
    if b"\0" in data:
        raise ConfigError(f"{what} {path} holds NUL bytes: it is a binary file, not text.")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise ConfigError(
            f"{what} {path} is not UTF-8 text (byte 0x{data[exc.start]:02x} on line {line}: "
            f"{exc.reason}); save it as UTF-8."
        ) from None


def read_json(path: PathLike, what: str) -> Any:
    """A JSON file's value (data only)."""
    text = read_text(path, what)
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ConfigError(f"{what} {path} is not valid JSON: {exc}.") from None


def read_array(path: PathLike, what: str) -> np.ndarray:
    """A numeric array from a ``.npy`` file (``np.load(allow_pickle=False)``): pickled
    objects are never loaded."""
    p = regular_file(path, what)
    try:
        loaded = np.load(p, allow_pickle=False)
    except ValueError as exc:  # numpy refuses a pickle (or an object array) unread
        if "allow_pickle" not in str(exc):
            raise ConfigError(f"{what} {p} is not a NumPy .npy array ({exc}).") from None
        raise ConfigError(
            f"{what} {p} holds pickled Python objects, which polytrain never loads (a pickle "
            f"can run code); {TRUST_ARRAY}."
        ) from None
    except (OSError, EOFError) as exc:
        raise ConfigError(f"{what} {p} is truncated or corrupt ({exc}).") from None
    if not isinstance(loaded, np.ndarray):
        loaded.close()
        raise ConfigError(f"{what} {p} is a .npz archive; give one array saved with np.save.")
    if loaded.dtype.kind not in "fiucb":
        raise ConfigError(f"{what} {p} holds {loaded.dtype} values, not numbers.")
    return loaded


def file_kind(mode: int) -> str:
    """What a path of ``os.stat`` mode ``mode`` is, for messages (``a FIFO (named pipe)``)."""
    kinds = [
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ]
    return next((name for test, name in kinds if test(mode)), "not a regular file")
