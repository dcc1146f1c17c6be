"""Find a dataset's files on disk, or fetch them; report where and how.

Search order, first complete split wins (both files in one directory):

1. the explicit ``data_dir`` argument (``--data-dir``): ``data_dir/<name>/``, then ``data_dir/``;
2. ``$POLYTRAIN_DATA`` (``os.pathsep``-separated): each ``DIR/<name>/``, then ``DIR/``;
3. the user cache: ``$XDG_CACHE_HOME/polytrain/<name>`` or ``~/.cache/polytrain/<name>``;
4. system directories: ``/usr/share/datasets/<name>`` (Debian's ``dataset-fashion-mnist``);
5. else download into ``data_dir/<name>/`` if ``data_dir`` was given, or the user cache.

Cheap to import: no numpy, no network modules until a download is needed.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from polytrain.data.registry import DatasetSpec, FileSpec, get_dataset
from polytrain.errors import ConfigError, DataError

ENV_DATA = "POLYTRAIN_DATA"
SYSTEM_DATA_DIRS: tuple[Path, ...] = (Path("/usr/share/datasets"),)

RULE_DATA_DIR = "--data-dir"
RULE_ENV = "$" + ENV_DATA
RULE_CACHE = "user cache"
RULE_SYSTEM = "system datasets"

PathLike = str | os.PathLike[str]


@dataclass(frozen=True)
class SearchDir:
    """One directory searched, and the rule that put it on the list."""

    rule: str
    path: Path


@dataclass(frozen=True)
class SplitLocation:
    """Where one split's files are, or that they are missing."""

    split: str
    images: Path | None = None
    labels: Path | None = None
    rule: str | None = None
    directory: Path | None = None
    lone_files: tuple[Path, ...] = ()  # one file of the pair found without its partner

    @property
    def found(self) -> bool:
        """Both files were found (in the same directory)."""
        return self.images is not None and self.labels is not None


@dataclass(frozen=True)
class DatasetReport:
    """Per-split locations of a dataset, what was searched, and how to get what is missing."""

    spec: DatasetSpec
    splits: Mapping[str, SplitLocation]
    searched: tuple[SearchDir, ...]
    download_dir: Path

    @property
    def name(self) -> str:
        """The dataset name."""
        return self.spec.name

    @property
    def complete(self) -> bool:
        """Every split was found."""
        return all(loc.found for loc in self.splits.values())

    def location(self, split: str) -> SplitLocation:
        """The location of ``split``; ConfigError if the dataset has no such split."""
        self.spec.split(split)
        return self.splits[split]

    def instructions(self, split: str) -> list[str]:
        """Exact ways to get ``split`` onto this machine."""
        files = " and ".join(f.filename for f in self.spec.split(split).files)
        ways = []
        if self.spec.apt_package:
            ways.append(f"apt-get install {self.spec.apt_package}")
        ways.append(f"polytrain data --download {self.spec.name}")
        ways.append(
            f"put {files} (raw or .gz) in a directory DIR and pass --data-dir DIR "
            f"(or set {ENV_DATA}=DIR)"
        )
        return ways

    def format(self) -> str:
        """Human-readable report, as printed by ``polytrain data``."""
        lines = [f"{self.spec.name}: {self.spec.title}, {self.spec.num_classes} classes"]
        for split, loc in self.splits.items():
            if loc.found:
                lines.append(f"  {split}: found in {loc.directory} ({loc.rule})")
                continue
            lines.append(f"  {split}: missing")
            for lone in loc.lone_files:
                lines.append(f"    found {lone} but not its partner file")
            lines.append("    to get it, any of:")
            lines += [f"      {way}" for way in self.instructions(split)]
        lines.append("  searched: " + (", ".join(str(d.path) for d in self.searched) or "-"))
        lines.append(f"  downloads go to: {self.download_dir}")
        return "\n".join(lines)

    def as_dict(self) -> dict[str, object]:
        """JSON-ready form of the report."""
        splits: dict[str, object] = {}
        for split, loc in self.splits.items():
            splits[split] = {
                "found": loc.found,
                "rule": loc.rule,
                "directory": None if loc.directory is None else str(loc.directory),
                "images": None if loc.images is None else str(loc.images),
                "labels": None if loc.labels is None else str(loc.labels),
                "instructions": [] if loc.found else self.instructions(split),
            }
        return {
            "name": self.spec.name,
            "complete": self.complete,
            "splits": splits,
            "searched": [{"rule": d.rule, "path": str(d.path)} for d in self.searched],
            "download_dir": str(self.download_dir),
        }


def user_cache_dir(name: str, env: Mapping[str, str] | None = None) -> Path:
    """``$XDG_CACHE_HOME/polytrain/<name>`` or ``~/.cache/polytrain/<name>``."""
    env = os.environ if env is None else env
    xdg = env.get("XDG_CACHE_HOME", "")
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else _home(env) / ".cache"
    return base / "polytrain" / name


def _home(env: Mapping[str, str]) -> Path:
    home = env.get("HOME")
    return Path(home) if home else Path.home()


def _both(rule: str, directory: Path, name: str) -> list[SearchDir]:
    return [SearchDir(rule, directory / name), SearchDir(rule, directory)]


def search_dirs(
    spec: DatasetSpec,
    data_dir: PathLike | None = None,
    *,
    env: Mapping[str, str] | None = None,
    system_dirs: Iterable[PathLike] | None = None,
) -> list[SearchDir]:
    """The directories searched for ``spec``, in priority order."""
    env = os.environ if env is None else env
    dirs: list[SearchDir] = []
    if data_dir is not None:
        dirs += _both(RULE_DATA_DIR, Path(data_dir).expanduser(), spec.name)
    for entry in env.get(ENV_DATA, "").split(os.pathsep):
        if entry.strip():
            dirs += _both(RULE_ENV, Path(entry.strip()).expanduser(), spec.name)
    dirs.append(SearchDir(RULE_CACHE, user_cache_dir(spec.name, env)))
    system = SYSTEM_DATA_DIRS if system_dirs is None else system_dirs
    dirs += [SearchDir(RULE_SYSTEM, Path(d) / spec.name) for d in system]
    return dirs


def _find(directory: Path, spec: FileSpec) -> Path | None:
    for candidate in spec.candidate_names():
        path = directory / candidate
        if path.is_file():
            return path
    return None


def _locate_split(spec: DatasetSpec, split: str, dirs: Sequence[SearchDir]) -> SplitLocation:
    files = spec.split(split)
    lone: list[Path] = []
    for entry in dirs:
        images, labels = _find(entry.path, files.images), _find(entry.path, files.labels)
        if images is not None and labels is not None:
            return SplitLocation(split, images, labels, entry.rule, entry.path, tuple(lone))
        lone += [p for p in (images, labels) if p is not None]
    return SplitLocation(split, lone_files=tuple(lone))


def download_dir(
    spec: DatasetSpec, data_dir: PathLike | None = None, env: Mapping[str, str] | None = None
) -> Path:
    """Where downloads go: ``data_dir/<name>`` if given, else the user cache."""
    if data_dir is not None:
        return Path(data_dir).expanduser() / spec.name
    return user_cache_dir(spec.name, env)


def locate_dataset(
    name: str | DatasetSpec,
    data_dir: PathLike | None = None,
    *,
    env: Mapping[str, str] | None = None,
    system_dirs: Iterable[PathLike] | None = None,
) -> DatasetReport:
    """Find every split of ``name`` without downloading anything."""
    spec = get_dataset(name)
    dirs = search_dirs(spec, data_dir, env=env, system_dirs=system_dirs)
    splits = {split: _locate_split(spec, split, dirs) for split in spec.splits}
    return DatasetReport(spec, splits, tuple(dirs), download_dir(spec, data_dir, env))


def fetch_dataset(
    name: str | DatasetSpec,
    data_dir: PathLike | None = None,
    *,
    splits: Iterable[str] | None = None,
    timeout: float = 60.0,
    env: Mapping[str, str] | None = None,
    system_dirs: Iterable[PathLike] | None = None,
    progress: bool | None = None,
) -> DatasetReport:
    """Download every missing split (or only ``splits``); return the new report.

    Raises DataError if a download fails (every mirror and reason listed).
    """
    report = locate_dataset(name, data_dir, env=env, system_dirs=system_dirs)
    spec = report.spec
    wanted = list(spec.splits) if splits is None else [spec.split(s).name for s in splits]
    missing = [s for s in wanted if not report.splits[s].found]
    if not missing:
        return report
    from polytrain.data.download import download_file  # network modules only when needed

    target = report.download_dir
    for split in missing:
        for file in spec.split(split).files:
            if _find(target, file) is not None:
                continue
            try:
                download_file(
                    spec.file_urls(file.filename, env),
                    target / file.filename,
                    file.checks,
                    timeout,
                    progress=progress,
                )
            except DataError as exc:
                others = [w for w in report.instructions(split) if "--download" not in w]
                ways = "\n".join(f"  {w}" for w in others)
                other = f"Other ways to get it:\n{ways}\n" if ways else ""
                raise DataError(
                    f"{spec.name} {split}: {exc}\n{other}Run `polytrain data` to see where "
                    "polytrain looks."
                ) from None
    return locate_dataset(spec, data_dir, env=env, system_dirs=system_dirs)


def resolve_split(
    name: str | DatasetSpec,
    split: str,
    data_dir: PathLike | None = None,
    *,
    download: bool = True,
    timeout: float = 60.0,
    env: Mapping[str, str] | None = None,
    system_dirs: Iterable[PathLike] | None = None,
    progress: bool | None = None,
) -> SplitLocation:
    """The files of one split, downloading them if allowed; DataError says how to get them."""
    spec = get_dataset(name)
    spec.split(split)
    if timeout <= 0:
        raise ConfigError(f"Download timeout must be positive, got {timeout}.")
    report = locate_dataset(spec, data_dir, env=env, system_dirs=system_dirs)
    if not report.splits[split].found and download:
        report = fetch_dataset(
            spec,
            data_dir,
            splits=[split],
            timeout=timeout,
            env=env,
            system_dirs=system_dirs,
            progress=progress,
        )
    location = report.splits[split]
    if location.found:
        return location
    searched = "\n".join(f"  {d.path} ({d.rule})" for d in report.searched)
    ways = "\n".join(f"  {w}" for w in report.instructions(split))
    lone = "".join(f"\nFound {p} but not its partner file." for p in location.lone_files)
    disabled = " (download disabled)" if not download else ""
    raise DataError(
        f"Dataset {spec.name!r} split {split!r} not found{disabled}. "
        f"Looked for {' and '.join(f.filename for f in spec.split(split).files)} "
        f"(raw or .gz) in:\n{searched}{lone}\nTo get it, any of:\n{ways}"
    )
