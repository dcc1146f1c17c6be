"""Atomic file writes: a temp file in the same directory, fsync, rename, fsync the directory.

A reader sees the old file or the new one, never half of one, even if the writer is
killed with SIGKILL in the middle.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path


def current_umask() -> int:
    """The process's umask, read without changing it where Linux allows."""
    with contextlib.suppress(OSError, ValueError), open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)  # elsewhere: set and restore (not thread-safe, but brief)
    os.umask(mask)
    return mask


def apply_umask(path: str | os.PathLike[str], *, directory: bool = False) -> None:
    """Give ``path`` the mode a plain ``open``/``mkdir`` would have: ``mkstemp`` and
    ``mkdtemp`` create private (0600/0700) entries whatever the umask."""
    os.chmod(path, (0o777 if directory else 0o666) & ~current_umask())


def fsync_dir(directory: str | os.PathLike[str]) -> None:
    """Make a rename inside ``directory`` durable (no-op where unsupported)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[str]:
    """Yield a temporary path next to ``path``; on success it replaces ``path``.

    The caller writes the whole file to the yielded path (with any library). On an
    exception the temporary file is removed and ``path`` is untouched.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    try:
        apply_umask(tmp)
        yield tmp
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, target)
        fsync_dir(target.parent)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` atomically. On Linux the bytes go to a file without a
    name (``O_TMPFILE``) that is named only once complete, so a writer killed with SIGKILL
    leaves no temporary file; elsewhere (or on a filesystem without it) :func:`atomic_path`."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = _unnamed_then_named(target, data)
    if tmp is None:
        with atomic_path(path) as named, open(named, "wb") as fh:
            fh.write(data)
        return
    try:
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_dir(target.parent)


def _unnamed_then_named(target: Path, data: bytes) -> Path | None:
    """``data`` written and fsynced to an ``O_TMPFILE`` file beside ``target``, then given a
    temporary name (returned); None where ``O_TMPFILE`` or ``/proc/self/fd`` is missing."""
    try:
        fd = os.open(target.parent, os.O_TMPFILE | os.O_WRONLY, 0o666)  # the umask applies
    except (AttributeError, OSError):
        return None
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    folder = os.open(target.parent, os.O_RDONLY)
    try:
        with open(fd, "wb", closefd=False) as fh:
            fh.write(data)
        os.fsync(fd)
        try:  # a dir fd makes Python call linkat(AT_SYMLINK_FOLLOW), which names the file
            os.link(f"/proc/self/fd/{fd}", tmp.name, dst_dir_fd=folder, follow_symlinks=True)
        except OSError:
            return None
    finally:
        os.close(fd)
        os.close(folder)
    return tmp


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    atomic_write_bytes(path, text.encode("utf-8"))
