"""Find a dataset's files on disk, or fetch them; report where and how. The one module
that knows where datasets are (the registry only describes them); text corpora at the end.

Every split of a dataset is read from ONE folder, the first of these that holds any of
the dataset's files (any split, raw or .gz):

1. with ``data_dir`` (``--data-dir DIR``): ``DIR/<name>/``, then ``DIR/``, and nothing
   else: never the cache or system copies, and no download unless asked for;
2. otherwise ``$POLYTRAIN_DATA`` (``os.pathsep``-separated): each ``DIR/<name>/``, then
   ``DIR/``; the user cache (``$XDG_CACHE_HOME/polytrain/<name>`` or
   ``~/.cache/polytrain/<name>``); system directories (``/usr/share/datasets/<name>``,
   Debian's ``dataset-fashion-mnist``).

A split missing from that folder is an error naming the folder, never a fall-back to
another one. Downloads go into that folder (``DIR/<name>/`` or the user cache when none
holds the dataset yet); a partial ``$POLYTRAIN_DATA`` or system folder is not written to.

Cheap to import: no numpy, no network modules until a download is needed.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from polytrain.data.registry import DatasetSpec, FileSpec, SplitSpec, TextCorpus, get_dataset
from polytrain.errors import ConfigError, DataError

ENV_DATA = "POLYTRAIN_DATA"
MIRROR_ENV_PREFIX = "POLYTRAIN_MIRROR_"
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
    """Per-split locations of a dataset, the one folder they come from, what was searched,
    and how to get what is missing."""

    spec: DatasetSpec
    splits: Mapping[str, SplitLocation]
    searched: tuple[SearchDir, ...]
    download_dir: Path | None  # None: the folder holding the dataset is not polytrain's to fill
    folder: SearchDir | None = None  # the folder every split is read from
    data_dir: Path | None = None  # the explicit --data-dir, if any

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

    def _files(self, split: str) -> str:
        return " and ".join(f.filename for f in self.spec.split(split).files)

    def instructions(self, split: str) -> list[str]:
        """Exact ways to get ``split`` onto this machine."""
        files, name = self._files(split), self.spec.name
        if self.data_dir is not None:
            where = self.folder.path if self.folder else self.data_dir / name
            return [
                f"polytrain data --download {name} --data-dir {self.data_dir}",
                f"put {files} (raw or .gz) in {where}",
                "drop --data-dir to use polytrain's usual search",
            ]
        if self.folder is not None and self.download_dir is None:
            return [
                f"put {files} (raw or .gz) in {self.folder.path}",
                "pass --data-dir DIR with a folder DIR that holds every split",
            ]
        ways = []
        if self.spec.apt_package:
            ways.append(f"apt-get install {self.spec.apt_package}")
        ways.append(f"polytrain data --download {name}")
        ways.append(
            f"put {files} (raw or .gz) in a directory DIR and pass --data-dir DIR "
            f"(or set {ENV_DATA}=DIR)"
        )
        return ways

    def missing_message(self, split: str, *, download: bool = True) -> str:
        """One line: which folder lacks ``split``, the files looked for, and the fix."""
        name, loc = self.spec.name, self.location(split)
        looked = f"looked for {self._files(split)} (raw or .gz)"
        lone = "".join(f"; found {p} without its partner file" for p in loc.lone_files)
        if self.data_dir is not None:
            fix = (
                f"Run `polytrain data --download {name} --data-dir {self.data_dir}`, or drop "
                "--data-dir to use polytrain's usual search."
            )
            if self.folder is None:
                places = " and ".join(str(d.path) for d in self.searched)
                return (
                    f"--data-dir {self.data_dir}: {_folder_state(self.data_dir)}, no {name} "
                    f"files in {places}; {looked}. {fix}"
                )
            return (
                f"--data-dir {self.data_dir}: no {name} {split} split in {self.folder.path}, "
                f"the folder every split is read from; {looked}{lone}"
                f"{self._elsewhere(split)}. {fix}"
            )
        if self.folder is None:
            off = " (download disabled)" if not download else ""
            places = ", ".join(str(d.path) for d in self.searched)
            ways = "; ".join(self.instructions(split))
            return (
                f"Dataset {name!r} split {split!r} not found{off}: {looked} in {places}. "
                f"To get it, any of: {ways}."
            )
        if self.download_dir is not None:
            fix = f"Run `polytrain data --download {name}` to fetch it there."
        else:
            fix = "Put the missing files there, or pass --data-dir with a folder of every split."
        return (
            f"Dataset {name!r} split {split!r} is missing in {self.folder.path} "
            f"({self.folder.rule}), the folder that holds its other files, and every split is "
            f"read from one folder; {looked}{lone}{self._elsewhere(split)}. {fix}"
        )

    def _elsewhere(self, split: str) -> str:
        """Where else the split is, as a hint (it is never read from there)."""
        files = self.spec.split(split)
        for entry in self.searched:
            if self.folder is not None and entry.path == self.folder.path:
                continue
            if _find(entry.path, files.images) and _find(entry.path, files.labels):
                if self.data_dir is not None:
                    return (
                        f"; {entry.path} has them, but all splits must come from one folder: "
                        f"move them into {self.folder.path if self.folder else entry.path}"
                    )
                if all(_pair(entry.path, self.spec.split(s)) for s in self.spec.splits):
                    return f"; {entry.path} holds every split: pass `--data-dir {entry.path}`"
        return ""

    def format(self) -> str:
        """Human-readable report, as printed by ``polytrain data``."""
        lines = [f"{self.spec.name}: {self.spec.title}, {self.spec.num_classes} classes"]
        if self.folder is not None:
            lines.append(f"  folder: {self.folder.path} ({self.folder.rule}), for every split")
        for split, loc in self.splits.items():
            if loc.found:
                lines.append(f"  {split}: found in {loc.directory} ({loc.rule})")
                continue
            lines.append(f"  {split}: missing" + (f" in {self.folder.path}" if self.folder else ""))
            for lone in loc.lone_files:
                lines.append(f"    found {lone} but not its partner file")
            lines.append("    to get it, any of:")
            lines += [f"      {way}" for way in self.instructions(split)]
        lines.append("  searched: " + (", ".join(str(d.path) for d in self.searched) or "-"))
        if self.download_dir is not None:
            lines.append(f"  downloads go to: {self.download_dir}")
        elif not self.complete:
            lines.append("  downloads: none (polytrain does not write into that folder)")
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
            "folder": None if self.folder is None else str(self.folder.path),
            "rule": None if self.folder is None else self.folder.rule,
            "splits": splits,
            "searched": [{"rule": d.rule, "path": str(d.path)} for d in self.searched],
            "download_dir": None if self.download_dir is None else str(self.download_dir),
        }


def _folder_state(path: Path) -> str:
    """What is at ``path``, in words, for a message about an unusable folder."""
    if not path.exists():
        return "no such folder"
    if not path.is_dir():
        return "not a folder"
    try:
        return "the folder is empty" if not any(path.iterdir()) else "the folder exists"
    except OSError as exc:
        return f"the folder cannot be read ({exc.strerror})"


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


def _explicit_dir(data_dir: PathLike | None) -> Path | None:
    """``data_dir`` as a Path; ConfigError if it is an empty string."""
    if data_dir is None:
        return None
    if not os.fspath(data_dir).strip():
        raise ConfigError(
            "--data-dir is empty: pass the folder that holds the dataset files, or leave the "
            "option out to use polytrain's usual search."
        )
    return Path(data_dir).expanduser()


def search_dirs(
    spec: DatasetSpec,
    data_dir: PathLike | None = None,
    *,
    env: Mapping[str, str] | None = None,
    system_dirs: Iterable[PathLike] | None = None,
) -> list[SearchDir]:
    """The directories searched for ``spec``, in priority order (only ``data_dir``'s two
    when it is given)."""
    explicit = _explicit_dir(data_dir)
    if explicit is not None:
        return _both(RULE_DATA_DIR, explicit, spec.name)
    env = os.environ if env is None else env
    dirs: list[SearchDir] = []
    for entry in env.get(ENV_DATA, "").split(os.pathsep):
        if entry.strip():
            dirs += _both(RULE_ENV, Path(entry.strip()).expanduser(), spec.name)
    dirs.append(SearchDir(RULE_CACHE, user_cache_dir(spec.name, env)))
    system = SYSTEM_DATA_DIRS if system_dirs is None else system_dirs
    dirs += [SearchDir(RULE_SYSTEM, Path(d) / spec.name) for d in system]
    return dirs


def names_on_disk(file: FileSpec) -> tuple[str, ...]:
    """Names accepted on disk: the .gz, the raw file, and the dotted raw variant."""
    raw = file.raw_name
    names = [file.filename, raw]
    dotted = raw.replace("-idx", ".idx", 1)
    if dotted != raw:
        names += [dotted, dotted + ".gz"]
    return tuple(dict.fromkeys(names))


def _find(directory: Path, spec: FileSpec) -> Path | None:
    for candidate in names_on_disk(spec):
        path = directory / candidate
        if path.is_file():
            return path
    return None


def _pair(directory: Path, split: SplitSpec) -> bool:
    """Whether ``directory`` holds both files of ``split``."""
    return all(_find(directory, f) is not None for f in split.files)


def _holds_dataset(directory: Path, spec: DatasetSpec) -> bool:
    """Whether ``directory`` holds any file of any split of ``spec``."""
    return any(
        _find(directory, f) is not None for split in spec.splits.values() for f in split.files
    )


def _locate_split(spec: DatasetSpec, split: str, folder: SearchDir | None) -> SplitLocation:
    if folder is None:
        return SplitLocation(split)
    files = spec.split(split)
    images, labels = _find(folder.path, files.images), _find(folder.path, files.labels)
    if images is not None and labels is not None:
        return SplitLocation(split, images, labels, folder.rule, folder.path)
    return SplitLocation(split, lone_files=tuple(p for p in (images, labels) if p is not None))


def mirror_env_var(spec: DatasetSpec) -> str:
    """The variable overriding ``spec``'s mirrors, e.g. ``POLYTRAIN_MIRROR_FASHION_MNIST``."""
    return MIRROR_ENV_PREFIX + spec.name.upper().replace("-", "_").replace(".", "_")


def mirror_urls(spec: DatasetSpec, env: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """Base URLs to try: the variable's (comma-separated) if set, else the registry's."""
    env = os.environ if env is None else env
    override = env.get(mirror_env_var(spec), "").strip()
    if override:
        return tuple(u.strip() for u in override.split(",") if u.strip())
    return spec.mirrors


def file_urls(spec: DatasetSpec, filename: str, env: Mapping[str, str] | None = None) -> list[str]:
    """The full URL of ``filename`` on every mirror, in order."""
    return [base.rstrip("/") + "/" + filename for base in mirror_urls(spec, env)]


def download_dir(
    spec: DatasetSpec, data_dir: PathLike | None = None, env: Mapping[str, str] | None = None
) -> Path:
    """Where downloads go when no folder holds the dataset yet: ``data_dir/<name>`` if
    given, else the user cache."""
    explicit = _explicit_dir(data_dir)
    if explicit is not None:
        return explicit / spec.name
    return user_cache_dir(spec.name, env)


def locate_dataset(
    name: str | DatasetSpec,
    data_dir: PathLike | None = None,
    *,
    env: Mapping[str, str] | None = None,
    system_dirs: Iterable[PathLike] | None = None,
) -> DatasetReport:
    """Find every split of ``name`` in its one folder, without downloading anything."""
    spec = get_dataset(name)
    dirs = search_dirs(spec, data_dir, env=env, system_dirs=system_dirs)
    folder = next((d for d in dirs if _holds_dataset(d.path, spec)), None)
    splits = {split: _locate_split(spec, split, folder) for split in spec.splits}
    if folder is None:
        target: Path | None = download_dir(spec, data_dir, env)
    else:
        target = folder.path if folder.rule in (RULE_DATA_DIR, RULE_CACHE) else None
    return DatasetReport(spec, splits, tuple(dirs), target, folder, _explicit_dir(data_dir))


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
    """Download every missing split (or only ``splits``) into the dataset's folder; return
    the new report.

    Raises DataError if a download fails (every mirror and reason listed), or if the
    folder holding part of the dataset is a ``$POLYTRAIN_DATA`` or system folder.
    """
    report = locate_dataset(name, data_dir, env=env, system_dirs=system_dirs)
    spec = report.spec
    wanted = list(spec.splits) if splits is None else [spec.split(s).name for s in splits]
    missing = [s for s in wanted if not report.splits[s].found]
    if not missing:
        return report
    target = report.download_dir
    if target is None:
        raise DataError(report.missing_message(missing[0]))
    from polytrain.data.download import download_file  # network modules only when needed

    for split in missing:
        for file in spec.split(split).files:
            if _find(target, file) is not None:
                continue
            try:
                download_file(
                    file_urls(spec, file.filename, env),
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
    download: bool | None = None,
    timeout: float = 60.0,
    env: Mapping[str, str] | None = None,
    system_dirs: Iterable[PathLike] | None = None,
    progress: bool | None = None,
) -> SplitLocation:
    """The files of one split, from the dataset's one folder; DataError says how to get them.

    ``download``: fetch a missing split into that folder; by default only without
    ``data_dir`` (a named folder is used as it is, unless ``download=True``).
    """
    spec = get_dataset(name)
    spec.split(split)
    if timeout <= 0:
        raise ConfigError(f"Download timeout must be positive, got {timeout}.")
    if download is None:
        download = data_dir is None
    report = locate_dataset(spec, data_dir, env=env, system_dirs=system_dirs)
    if not report.splits[split].found and download and report.download_dir is not None:
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
    raise DataError(report.missing_message(split, download=download))


# -- text corpora: the files of a package's folder, or of --data-dir -------------------------


def corpus_folders(corpus: TextCorpus, data_dir: PathLike | None = None) -> list[Path]:
    """Where ``corpus`` is looked for: ``data_dir/<name>/`` then ``data_dir/``, else the
    folder its package installs."""
    explicit = _explicit_dir(data_dir)
    if explicit is not None:
        return [explicit / corpus.name, explicit]
    return [Path(corpus.system_dir)]


def find_corpus(corpus: TextCorpus, data_dir: PathLike | None = None) -> Path:
    """The first folder holding every file of ``corpus``; DataError says how to get it."""
    names = [name for name, _ in corpus.files]
    folders = corpus_folders(corpus, data_dir)
    for folder in folders:
        if all((folder / n).is_file() for n in names):
            return folder
    raise DataError(
        f"{corpus.name}: no folder holds all of {', '.join(names)} (looked in "
        f"{' or '.join(str(d) for d in folders)}): `apt-get install {corpus.apt_package}`, "
        "or --data-dir DIR with those files."
    )
