"""``polytrain port-code SRC -o OUT``: a file or a folder of ``.py`` files converted into a
new file or folder (SRC is never written); files that are not Python are copied as they
are. Every file is written atomically.

SRC is data: it is parsed, never imported or run. A path that is not a regular file or a
folder (``/dev/zero``, a FIFO), a ``.py`` file over :data:`MAX_SOURCE_BYTES`, or one that
is not UTF-8 text is refused with one line before anything is converted; OUT may not be
SRC, lie inside it, or hold it (see :mod:`polytrain.utils.output_paths`). Converting takes
seconds per 100 KB, so a run that lasts over :data:`PROGRESS_AFTER` seconds says what it
is converting.
"""

from __future__ import annotations

import ast
import contextlib
import errno
import glob
import os
import shutil
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType

from polytrain.errors import ConfigError, OutputError
from polytrain.porting.code.convert import Result, convert_source
from polytrain.porting.code.report import FileReport, Report
from polytrain.utils.fileio import atomic_write_bytes, fsync_dir
from polytrain.utils.output_paths import refuse_overwriting_inputs, refuse_unwritable
from polytrain.utils.user_files import read_text, regular_file

EXIT_UNCONVERTED = 3
"""The exit status of ``polytrain port-code`` when some use was left marked (0: all
converted; 2: an error, nothing or only part written)."""

SKIP_DIRS = {"__pycache__", ".git", ".venv", "venv", ".mypy_cache", ".ruff_cache"}

MAX_SOURCE_BYTES = 1 << 20
"""The largest ``.py`` file converted (1 MiB): libcst converts about 5-10 KB a second
here, so a larger one would run for minutes (hand-written modules are far smaller)."""
MAX_NESTING = 1000
"""Deeper expressions (syntax tree levels) are refused unconverted: libcst's recursion
fails on them anyway, after a time that grows with the depth's square (a minute at 5000)."""
CONVERT_RECURSION = 1000
"""Frames libcst may recurse converting one file (Python's default limit), whatever the
process's limit: an expression some 120 calls deep or more is refused, always."""
PROGRESS_AFTER = 3.0
"""Seconds of converting after which a progress line goes to ``progress`` (then one
every :data:`PROGRESS_EVERY` seconds)."""
PROGRESS_EVERY = 15.0

Progress = Callable[[str], None]


def default_output(src: Path) -> Path:
    """``train.py`` -> ``train_torch.py``; ``proj/`` -> ``proj_torch/``."""
    if src.is_dir():
        return src.with_name(src.name + "_torch")
    return src.with_name(f"{src.stem}_torch{src.suffix}")


def _sources(src: Path) -> list[Path]:
    """The files under the folder ``src`` (``SKIP_DIRS`` left out), sorted; anything that
    is neither a folder nor a regular file (a FIFO, a device, a dangling link) is refused:
    reading or copying one may never end."""
    found = []
    root = src.resolve()
    for path in src.rglob("*"):
        if any(part in SKIP_DIRS for part in path.relative_to(src).parts):
            continue
        if path.is_symlink() and root not in path.resolve().parents:
            raise ConfigError(
                f"{path} is a symbolic link to {path.resolve()}, outside {src}: port-code "
                "copies only what is inside SRC. Remove the link, or convert a copy of the "
                "project without it."
            )
        if not path.is_dir():
            found.append(regular_file(path, "the file"))
    return sorted(found)


def _is_folder(src: Path) -> bool:
    """Whether SRC is a folder; a regular file otherwise, and anything else is refused."""
    if src.is_dir():
        return True
    regular_file(src, "SRC")
    return False


def _convert(path: Path) -> Result:
    """One ``.py`` file read as UTF-8 text (at most :data:`MAX_SOURCE_BYTES`) and converted."""
    why = " (libcst converts a few KB a second: a larger file would take minutes); split it"
    text = read_text(path, "the source", MAX_SOURCE_BYTES, why)
    too_deep = ConfigError(
        f"{path} nests expressions too deeply for port-code to convert (Python's recursion "
        "limit); simplify the deepest expression."
    )
    if _nesting(text) > MAX_NESTING:
        raise too_deep
    try:
        with _recursion_headroom(CONVERT_RECURSION):
            return convert_source(text, str(path))
    except RecursionError:
        raise too_deep from None


@contextlib.contextmanager
def _recursion_headroom(frames: int) -> Iterator[None]:
    """Python's recursion limit set to the current depth plus ``frames`` for the block, so
    what converts does not depend on a limit another library raised in this process."""
    depth = 0
    frame: FrameType | None = sys._getframe()
    while frame is not None:
        depth, frame = depth + 1, frame.f_back
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(depth + frames)
    try:
        yield
    finally:
        sys.setrecursionlimit(old)


def _nesting(text: str) -> int:
    """The depth of the deepest syntax tree branch, by Python's own parser (fast, where
    libcst's recursion on a deep expression takes time that grows with its square); 0
    where Python cannot parse the text (libcst then says why)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # an invalid escape warns; not ours to say
            tree = ast.parse(text)
    except (RecursionError, MemoryError):  # too deep for Python itself
        return MAX_NESTING + 1
    except (SyntaxError, ValueError):
        return 0
    stack: list[tuple[ast.AST, int]] = [(tree, 1)]
    deepest = 0
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))
    return deepest


def _check_output(src: Path, out: Path, folder: bool, overwrite: bool) -> None:
    refuse_overwriting_inputs({"-o": out}, {"SRC": src})
    if out.exists() and not overwrite:
        raise OutputError(f"{out} exists; give another -o or --overwrite to replace it.")
    if out.exists() and out.is_dir() != folder:
        kind = "folder" if out.is_dir() else "file"
        raise OutputError(f"{out} is a {kind}, the source {src} is not; give another -o.")
    refuse_unwritable({"-o": out})  # before converting, which takes seconds per 100 KB


@contextlib.contextmanager
def _ticking(progress: Progress | None, total: int) -> Iterator[Callable[[int, Path], None]]:
    """A ``note(index, path)`` the loop calls before each file; once the block has run
    :data:`PROGRESS_AFTER` seconds, and every :data:`PROGRESS_EVERY` after, a line says
    which file is being converted."""
    now: list[tuple[int, Path]] = []
    stop, start = threading.Event(), time.monotonic()

    def tick() -> None:
        wait = PROGRESS_AFTER
        while not stop.wait(wait) and progress is not None:
            index, path = now[-1]
            where = f" (file {index} of {total})" if total > 1 else ""
            progress(f"converting {path}{where}, {time.monotonic() - start:.0f} s so far ...")
            wait = PROGRESS_EVERY

    thread = threading.Thread(target=tick, name="port-code progress", daemon=True)

    def note(index: int, path: Path) -> None:
        first = not now
        now[:] = [(index, path)]
        if progress is not None and first:
            thread.start()

    try:
        yield note
    finally:
        stop.set()
        if thread.is_alive():
            thread.join()


def port_code(
    src: str | Path,
    out: str | Path | None = None,
    *,
    overwrite: bool = False,
    progress: Progress | None = None,
) -> Report:
    """Convert ``src`` (a ``.py`` file or a folder) into ``out``; the report of every file.
    All files are converted before anything is written, so a file that does not parse
    leaves no output. ``progress`` gets a line now and then while converting takes long."""
    src = Path(src)
    folder = _is_folder(src)
    target = Path(out) if out is not None else default_output(src)
    _check_output(src, target, folder, overwrite)
    if not folder:
        with _ticking(progress, 1) as note:
            note(1, src)
            result = _convert(src)
        atomic_write_bytes(target, result.code.encode("utf-8"))
        return Report([result.report])
    planned, reports = _convert_folder(src, target, progress)
    _write_folder(target, planned)
    return Report(reports)


def _write_folder(target: Path, planned: list[tuple[Path, bytes | None, Path]]) -> None:
    """The planned files written into a hidden folder beside ``target``, which then takes
    ``target``'s place whole: an error or a signal leaves ``target`` as it was (or the
    whole new folder), never half of one. A SIGKILL while writing leaves the hidden folder
    (``.OUT.tmp-PID-...``), which the next conversion into ``target`` removes."""
    _remove_stale(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}-{os.urandom(4).hex()}")
    try:
        tmp.mkdir()
        for dest, data, origin in planned:
            where = tmp / dest.relative_to(target)
            where.parent.mkdir(parents=True, exist_ok=True)
            if data is None:
                shutil.copy2(origin, where)
            else:
                with open(where, "wb") as fh:
                    fh.write(data)
                    os.fsync(fh.fileno())
        _replace_folder(tmp, target)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, OSError) and exc.errno is not None:
            raise OSError(exc.errno, exc.strerror, os.fspath(target)) from None
        raise
    fsync_dir(target.parent)


def _replace_folder(tmp: Path, target: Path) -> None:
    """``tmp`` renamed to ``target``; a ``target`` already there is set aside first and
    removed after (another conversion into it at the same time: the last one stays)."""
    aside: list[Path] = []
    while True:
        try:
            os.rename(tmp, target)
            break
        except OSError as exc:  # target is a folder that is not empty
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
        aside.append(target.with_name(f".{target.name}.old-{os.getpid()}-{os.urandom(4).hex()}"))
        with contextlib.suppress(FileNotFoundError):  # the other conversion set it aside
            os.rename(target, aside[-1])
    for old in aside:
        shutil.rmtree(old, ignore_errors=True)


def _remove_stale(target: Path) -> None:
    """Hidden folders of conversions into ``target`` that were killed (their process has
    gone)."""
    for kind in ("tmp", "old"):
        for stale in target.parent.glob(f".{glob.escape(target.name)}.{kind}-*-*"):
            pid = stale.name.rsplit("-", 2)[-2]
            if pid.isdigit() and not _running(int(pid)):
                shutil.rmtree(stale, ignore_errors=True)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's
        return True
    return True


def _convert_folder(
    src: Path, target: Path, progress: Progress | None
) -> tuple[list[tuple[Path, bytes | None, Path]], list[FileReport]]:
    """(destination, converted bytes or None to copy, origin) of every file, and the
    report of each ``.py`` file."""
    planned: list[tuple[Path, bytes | None, Path]] = []
    reports: list[FileReport] = []
    files = _sources(src)
    python = [p for p in files if p.suffix == ".py"]
    with _ticking(progress, len(python)) as note:
        for path in files:
            rel = path.relative_to(src)
            if path.suffix == ".py":
                note(len(reports) + 1, path)
                result = _convert(path)
                planned.append((target / rel, result.code.encode("utf-8"), path))
                reports.append(result.report)
            else:
                planned.append((target / rel, None, path))
    return planned, reports
