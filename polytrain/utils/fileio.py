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
    exception the temporary file is removed and ``path`` is untouched; an OSError about
    the temporary file (a full disk, a read-only folder) names ``path`` instead.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as exc:
        raise _naming_target(exc, target) from None
    os.close(fd)
    try:
        apply_umask(tmp)
        yield tmp
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, target)
        fsync_dir(target.parent)
    except BaseException as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise _naming_target(exc, target) from None
        raise


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` atomically. On Linux the bytes go to a file without a
    name (``O_TMPFILE``) that is named only once complete, then renamed over ``path``, so a
    writer killed with SIGKILL leaves no temporary file (but in the two system calls between
    the naming and the rename); elsewhere (or on a filesystem without it)
    :func:`atomic_path`. An OSError names ``path``, never the temporary file."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        if _unnamed_then_renamed(target, data):
            fsync_dir(target.parent)
            return
    except OSError as exc:
        raise _naming_target(exc, target) from None
    with atomic_path(path) as named, open(named, "wb") as fh:
        fh.write(data)


def _unnamed_then_renamed(target: Path, data: bytes) -> bool:
    """``data`` written and fsynced to an ``O_TMPFILE`` file beside ``target``, given a
    temporary name, then renamed over ``target``; False (nothing written) where
    ``O_TMPFILE`` or ``/proc/self/fd`` is missing. Whatever interrupts it (an error, a
    signal turned into an exception) after the naming removes the named file."""
    try:
        fd = os.open(target.parent, os.O_TMPFILE | os.O_WRONLY, 0o666)  # the umask applies
    except (AttributeError, OSError):
        return False
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    try:
        folder = os.open(target.parent, os.O_RDONLY)
    except BaseException:
        os.close(fd)
        raise
    try:
        with open(fd, "wb", closefd=False) as fh:
            fh.write(data)
        os.fsync(fd)
        try:  # a dir fd makes Python call linkat(AT_SYMLINK_FOLLOW), which names the file
            os.link(f"/proc/self/fd/{fd}", tmp.name, dst_dir_fd=folder, follow_symlinks=True)
        except OSError:
            return False
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):  # named or not (a unique name: nobody else's)
            os.unlink(tmp)
        raise
    finally:
        os.close(fd)
        os.close(folder)
    return True


def _naming_target(exc: OSError, target: Path) -> OSError:
    """``exc`` with ``target`` as its file where it named no file or the temporary one
    beside ``target``: the user knows the file they asked for, not polytrain's temporary."""
    name = exc.filename
    temporary = name is not None and (
        Path(name).name.startswith(f".{target.name}.") and str(name).endswith(".tmp")
    )
    if exc.errno is None or not (name is None or temporary):
        return exc
    return OSError(exc.errno, exc.strerror, os.fspath(target))


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    atomic_write_bytes(path, text.encode("utf-8"))
