"""An output never overwrites an input: the one check every command that writes a file
makes before it reads or writes anything.

Two paths are the same file when they name the same inode (a hard link, a symlink, ``./a``
and ``a``) or resolve to the same place; an output inside a folder given as an input
(a checkpoint, a source tree) and an output folder that holds an input (a folder that is
replaced whole) are refused too, as are two outputs that are one file.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from polytrain.errors import OutputError

PathLike = str | os.PathLike[str]


def refuse_overwriting_inputs(
    outputs: Mapping[str, PathLike | None], inputs: Mapping[str, PathLike | None]
) -> None:
    """An OutputError (one line) when an output in ``outputs`` (option -> path; None: not
    given) is, holds or lies inside an input of ``inputs`` (option -> path), or two outputs
    are one file. Writes nothing."""
    given_out = {label: path for label, path in outputs.items() if path is not None}
    given_in = {label: path for label, path in inputs.items() if path is not None}
    seen: dict[str, PathLike] = {}
    for label, out in given_out.items():
        for in_label, inp in given_in.items():
            if _same(out, inp):
                raise OutputError(
                    f"{os.fspath(out)} is the same file as the input given to {in_label}; "
                    "choose another output path."
                )
        for in_label, inp in given_in.items():
            _check_folders(out, inp, in_label)
        for other_label, other in seen.items():
            if _same(out, other):
                raise OutputError(
                    f"{os.fspath(out)} is given both as {other_label} and as {label}; "
                    "choose another output path."
                )
        seen[label] = out


def refuse_unwritable(outputs: Mapping[str, PathLike | None]) -> None:
    """An OutputError (one line) when the folder an output goes into (or, where that is
    still to be made, its nearest existing parent) takes no new file: a read-only
    filesystem or no permission, said before the work rather than after it. Writes
    nothing."""
    for label, out in outputs.items():
        if out is None:
            continue
        folder = _real(out).parent
        while not folder.exists() and folder != folder.parent:
            folder = folder.parent
        if os.access(folder, os.W_OK | os.X_OK):
            continue
        try:
            read_only = bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
        except OSError:
            read_only = False
        why = "Read-only file system" if read_only else "Permission denied"
        raise OutputError(
            f"{label} {os.fspath(out)} cannot be written: {folder} is not writable ({why}); "
            "choose another path."
        )


def folder_inputs(option: str, folder: PathLike) -> dict[str, PathLike]:
    """``{option: folder}`` and each file directly in ``folder``, for a folder read as a
    whole (a checkpoint): an output hard-linked to one of its files elsewhere is then
    refused too. Just ``{option: folder}`` where it cannot be listed."""
    found: dict[str, PathLike] = {option: folder}
    try:
        entries = sorted(Path(folder).iterdir())
    except (OSError, ValueError):
        return found
    found.update({f"{option} ({p.name})": p for p in entries if p.is_file()})
    return found


def _check_folders(out: PathLike, inp: PathLike, option: str) -> None:
    name = os.fspath(out)
    out_real, in_real = _real(out), _real(inp)
    if os.path.isdir(inp) and in_real in out_real.parents:
        raise OutputError(
            f"{name} is inside the folder given to {option} ({os.fspath(inp)}); choose "
            "another output path."
        )
    if os.path.isdir(out) and out_real in in_real.parents:
        raise OutputError(
            f"{name} holds the input given to {option} ({os.fspath(inp)}), and writing it "
            "replaces the folder; choose another output path."
        )


def _same(a: PathLike, b: PathLike) -> bool:
    ida, idb = _identity(a), _identity(b)
    return (ida is not None and ida == idb) or _real(a) == _real(b)


def _identity(path: PathLike) -> tuple[int, int] | None:
    """(device, inode) of what ``path`` names after symlinks; None where nothing is."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):  # missing, unreadable, a NUL in the name
        return None
    return st.st_dev, st.st_ino


def _real(path: PathLike) -> Path:
    try:
        return Path(os.path.realpath(path))
    except (OSError, ValueError):
        return Path(os.path.abspath(path))
