"""Reading a small text file the user names (a recipe file, a model spec, a hints map):
a regular file of bounded size, UTF-8, or one ConfigError line saying what it is instead."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from polytrain.errors import ConfigError

MAX_TEXT_BYTES = 16 * 2**20  # a recipe or spec file is a few kB; this is far above any


def read_user_text(path: str | os.PathLike[str], what: str, limit: int = MAX_TEXT_BYTES) -> str:
    """The text of ``path``, for ``what`` (e.g. ``--config recipe.toml``): refused in one
    line when it is missing, not a regular file (a folder, /dev/zero, a pipe), larger than
    ``limit`` bytes, or not UTF-8 (the line names the line and byte)."""
    file = Path(path)
    try:
        info = file.stat()
        if not stat.S_ISREG(info.st_mode):
            kind = "a folder" if stat.S_ISDIR(info.st_mode) else "not a regular file"
            raise ConfigError(f"{what}: {file} is {kind}; name a text file.")
        if info.st_size > limit:
            raise ConfigError(
                f"{what}: {file} has {info.st_size:,} bytes, more than the {limit:,} a text "
                "file of settings may have; is it the right file?"
            )
        data = file.read_bytes()[: limit + 1]
    except OSError as exc:
        raise ConfigError(f"{what}: cannot read {file}: {exc.strerror or exc}.") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise ConfigError(
            f"{what}: {file} is not UTF-8 text (byte 0x{data[exc.start]:02x} on line {line}); "
            "save it as UTF-8."
        ) from None
