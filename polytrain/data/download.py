"""Verified downloads: stream to a temp file, check the md5, fsync, rename.

Mirrors are tried in order; a file only ever appears at its destination once
it is complete and verified. Temp files are removed on every failure path,
KeyboardInterrupt included.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import http.client
import os
import sys
import tempfile
import urllib.error
import urllib.request
import zlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO

from polytrain.data.idx import GZIP_MAGIC
from polytrain.data.registry import Checksums
from polytrain.errors import DataError
from polytrain.utils.fileio import apply_umask, fsync_dir

CHUNK = 1 << 20
USER_AGENT = "polytrain-dataset-download/1"


class _MirrorFailed(Exception):
    """One URL did not give a verified file; the message says why."""


@contextlib.contextmanager
def _progress_bar(
    total: int | None, label: str, enabled: bool | None
) -> Iterator[Callable[[int], object]]:
    """Yield an ``update(n)`` callback: a tqdm bar if enabled (default: stderr is a TTY)."""
    if enabled is None:
        enabled = sys.stderr.isatty()
    try:
        from tqdm import tqdm
    except ImportError:
        enabled = False
    if not enabled:
        yield lambda n: None
        return
    with tqdm(total=total, desc=label, unit="B", unit_scale=True, leave=False) as bar:
        yield bar.update


def _stream(url: str, out: IO[bytes], timeout: float, progress: bool | None) -> str:
    """Copy ``url`` into ``out``; return the md5 of the bytes received."""
    request = urllib.request.Request(url, headers={"User-Agent": USER_AGENT})
    digest = hashlib.md5(usedforsecurity=False)
    received = 0
    total: int | None = None
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            length = response.headers.get("Content-Length")
            total = int(length) if length and length.isdigit() else None
            label = url.rsplit("/", 1)[-1]
            with _progress_bar(total, label, progress) as update:
                while chunk := response.read(CHUNK):
                    out.write(chunk)
                    digest.update(chunk)
                    received += len(chunk)
                    update(len(chunk))
    except urllib.error.HTTPError as exc:
        raise _MirrorFailed(f"HTTP error {exc.code} {exc.reason}") from None
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, TimeoutError):
            raise _MirrorFailed(f"timed out after {timeout:g} s") from None
        raise _MirrorFailed(f"cannot connect ({exc.reason})") from None
    except TimeoutError:
        raise _MirrorFailed(f"timed out after {timeout:g} s ({received} bytes received)") from None
    except http.client.IncompleteRead as exc:
        raise _MirrorFailed(
            f"connection closed early: {received + len(exc.partial)} bytes received, "
            f"{total} expected"
        ) from None
    except (http.client.HTTPException, OSError) as exc:
        raise _MirrorFailed(f"transfer failed ({type(exc).__name__}: {exc})") from None
    if total is not None and received != total:
        raise _MirrorFailed(f"connection closed early: {received} bytes received, {total} expected")
    return digest.hexdigest()


def _content_md5(path: Path, file_md5: str) -> str:
    """md5 of the decompressed content of ``path`` (of the file itself if not gzip)."""
    with open(path, "rb") as f:
        if f.read(2) != GZIP_MAGIC:
            return file_md5
    digest = hashlib.md5(usedforsecurity=False)
    try:
        with gzip.open(path, "rb") as f:
            while chunk := f.read(CHUNK):
                digest.update(chunk)
    except (OSError, EOFError, zlib.error) as exc:
        raise _MirrorFailed(f"corrupt gzip data ({exc})") from None
    return digest.hexdigest()


def _fetch_one(
    url: str, dest: Path, checks: Checksums, timeout: float, progress: bool | None
) -> None:
    """Download ``url`` to ``dest`` if it verifies; else raise _MirrorFailed."""
    try:
        fd, tmp_name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
    except OSError as exc:
        raise DataError(
            f"Cannot create a temp file in {dest.parent} to download {dest.name} ({exc}). "
            "Choose a writable directory with --data-dir or POLYTRAIN_DATA."
        ) from exc
    tmp = Path(tmp_name)
    try:
        apply_umask(tmp)
        with os.fdopen(fd, "wb") as out:
            file_md5 = _stream(url, out, timeout, progress)
            out.flush()
            os.fsync(out.fileno())
        content_md5 = file_md5 if file_md5 == checks.gz_md5 else _content_md5(tmp, file_md5)
        if not checks.matches(file_md5, content_md5):
            raise _MirrorFailed(
                f"checksum mismatch: got content md5 {content_md5} (file md5 {file_md5}), "
                f"expected {checks.describe()}"
            )
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(dest.parent)


def download_file(
    urls: str | Sequence[str],
    dest: str | os.PathLike[str],
    checks: Checksums,
    timeout: float = 60.0,
    *,
    progress: bool | None = None,
) -> Path:
    """Fetch the first URL that yields a file matching ``checks`` to ``dest``.

    Each URL is tried in order. Raises DataError listing every URL and why it
    failed; ``dest`` is then left untouched and no temp file remains.
    """
    url_list = [urls] if isinstance(urls, str) else list(urls)
    dest = Path(dest)
    if not url_list:
        raise DataError(
            f"No URL to download {dest.name} from: set a mirror (e.g. POLYTRAIN_MIRROR_<NAME>="
            "https://host/path/) or put the file in place by hand."
        )
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DataError(
            f"Cannot create {dest.parent} to download {dest.name} into ({exc}). Choose a "
            "writable directory with --data-dir or POLYTRAIN_DATA."
        ) from exc
    failures = []
    for url in url_list:
        try:
            _fetch_one(url, dest, checks, timeout, progress)
            return dest
        except _MirrorFailed as exc:
            failures.append(f"  {url}: {exc}")
    raise DataError(
        f"Could not download {dest.name} to {dest.parent}; every mirror failed:\n"
        + "\n".join(failures)
        + "\nCheck the network (or a proxy via HTTPS_PROXY), point POLYTRAIN_MIRROR_<NAME> at "
        "a working mirror, or download the file by hand into a directory passed with "
        "--data-dir."
    )
