"""``polytrain port-code SRC -o OUT``: a file or a folder of ``.py`` files converted into a
new file or folder (SRC is never written); files that are not Python are copied as they
are. Every file is written atomically."""

from __future__ import annotations

import shutil
from pathlib import Path

from polytrain.errors import ConfigError, OutputError
from polytrain.porting.code.convert import convert_source
from polytrain.porting.code.report import FileReport, Report
from polytrain.utils.fileio import atomic_write_bytes

EXIT_UNCONVERTED = 3
"""The exit status of ``polytrain port-code`` when some use was left marked (0: all
converted; 2: an error, nothing or only part written)."""

SKIP_DIRS = {"__pycache__", ".git", ".venv", "venv", ".mypy_cache", ".ruff_cache"}


def default_output(src: Path) -> Path:
    """``train.py`` -> ``train_torch.py``; ``proj/`` -> ``proj_torch/``."""
    if src.is_dir():
        return src.with_name(src.name + "_torch")
    return src.with_name(f"{src.stem}_torch{src.suffix}")


def _sources(src: Path) -> list[Path]:
    return sorted(
        p
        for p in src.rglob("*")
        if p.is_file() and not any(part in SKIP_DIRS for part in p.relative_to(src).parts)
    )


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path} is not UTF-8 text ({exc.reason}); convert it first.") from exc


def _check_output(src: Path, out: Path, overwrite: bool) -> None:
    if out.resolve() == src.resolve() or src.resolve() in out.resolve().parents:
        raise ConfigError(f"The output {out} is the source or inside it; give another -o.")
    if src.is_dir() and src.resolve() in out.resolve().parents:
        raise ConfigError(f"The output {out} is inside the source folder {src}.")
    if out.exists() and not overwrite:
        raise OutputError(f"{out} exists; give another -o or --overwrite to replace it.")
    if out.exists() and out.is_dir() != src.is_dir():
        kind = "folder" if out.is_dir() else "file"
        raise OutputError(f"{out} is a {kind}, the source {src} is not; give another -o.")


def port_code(src: str | Path, out: str | Path | None = None, *, overwrite: bool = False) -> Report:
    """Convert ``src`` (a ``.py`` file or a folder) into ``out``; the report of every file.
    All files are converted before anything is written, so a file that does not parse
    leaves no output."""
    src = Path(src)
    if not src.exists():
        raise ConfigError(f"{src} does not exist.")
    target = Path(out) if out is not None else default_output(src)
    _check_output(src, target, overwrite)
    if src.is_file():
        result = convert_source(_read(src), str(src))
        atomic_write_bytes(target, result.code.encode("utf-8"))
        return Report([result.report])
    planned: list[tuple[Path, bytes | None, Path]] = []
    reports: list[FileReport] = []
    for path in _sources(src):
        rel = path.relative_to(src)
        if path.suffix == ".py":
            result = convert_source(_read(path), str(path))
            planned.append((target / rel, result.code.encode("utf-8"), path))
            reports.append(result.report)
        else:
            planned.append((target / rel, None, path))
    if target.exists() and overwrite:
        shutil.rmtree(target) if target.is_dir() else target.unlink()
    for dest, data, origin in planned:
        if data is None:
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(origin, dest)
        else:
            atomic_write_bytes(dest, data)
    return Report(reports)
