"""The datasets polytrain knows: file names, checksums, mirrors and class names.

Pure descriptions, no I/O: cheap to import. Where a dataset's files are looked for and
fetched from is :mod:`polytrain.data.locate`'s, alone. A file verifies if the md5 of its
decompressed content or the md5 of the file as published (.gz) matches.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass

from polytrain.errors import ConfigError, DataError


def md5_hex(data: bytes) -> str:
    """Hex md5 of ``data`` (an integrity check, not a security one)."""
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


@dataclass(frozen=True)
class Checksums:
    """Accepted md5s of one file: of its decompressed content and/or of the .gz."""

    md5: str | None = None
    gz_md5: str | None = None
    size: int | None = None  # decompressed bytes, informational

    def __post_init__(self) -> None:
        if self.md5 is None and self.gz_md5 is None:
            raise ConfigError("Checksums need md5 (of the content) or gz_md5 (of the .gz).")

    def matches(self, file_md5: str, content_md5: str) -> bool:
        """Whether either digest matches (``content_md5`` is of the decompressed bytes)."""
        return content_md5 == self.md5 or file_md5 == self.gz_md5

    def verify(
        self, path: object, file_bytes: bytes, content: bytes, *, fix: str | None = None
    ) -> None:
        """Raise DataError naming ``path`` unless the file or its content matches."""
        file_md5 = md5_hex(file_bytes)
        content_md5 = file_md5 if content is file_bytes else md5_hex(content)
        if self.matches(file_md5, content_md5):
            return
        raise DataError(
            f"{path}: checksum mismatch: got content md5 {content_md5} (file md5 {file_md5}), "
            f"expected {self.describe()}. The file is corrupt or a different version: "
            + (fix or "delete it and fetch it again (`polytrain data --download <dataset>`).")
        )

    def describe(self) -> str:
        """Human text of what is expected."""
        parts = []
        if self.md5 is not None:
            parts.append(f"content md5 {self.md5}")
        if self.gz_md5 is not None:
            parts.append(f".gz md5 {self.gz_md5}")
        return " or ".join(parts)


@dataclass(frozen=True)
class FileSpec:
    """One published file, e.g. ``train-images-idx3-ubyte.gz``."""

    filename: str
    checks: Checksums

    @property
    def raw_name(self) -> str:
        """The file name without ``.gz``."""
        return self.filename.removesuffix(".gz")


@dataclass(frozen=True)
class SplitSpec:
    """A split (``train`` or ``test``): its images file, labels file and size."""

    name: str
    images: FileSpec
    labels: FileSpec
    num_samples: int | None = None

    @property
    def files(self) -> tuple[FileSpec, FileSpec]:
        """``(images, labels)``."""
        return (self.images, self.labels)


@dataclass(frozen=True)
class DatasetSpec:
    """A dataset: splits, mirrors (base URLs, tried in order), classes."""

    name: str
    title: str
    splits: Mapping[str, SplitSpec]
    mirrors: tuple[str, ...]
    classes: tuple[str, ...]
    image_shape: tuple[int, int] = (28, 28)
    apt_package: str | None = None

    @property
    def num_classes(self) -> int:
        """Number of classes."""
        return len(self.classes)

    def split(self, name: str) -> SplitSpec:
        """The split called ``name``; ConfigError listing the known ones otherwise."""
        try:
            return self.splits[name]
        except KeyError:
            known = ", ".join(self.splits)
            raise ConfigError(
                f"Dataset {self.name!r} has no split {name!r}; known splits: {known}."
            ) from None


def _idx_split(
    name: str,
    prefix: str,
    n: int,
    images: tuple[str | None, str | None, int],
    labels: tuple[str | None, str | None, int],
) -> SplitSpec:
    """A split in the MNIST naming scheme; tuples are (content md5, gz md5, size)."""
    return SplitSpec(
        name=name,
        images=FileSpec(f"{prefix}-images-idx3-ubyte.gz", Checksums(*images)),
        labels=FileSpec(f"{prefix}-labels-idx1-ubyte.gz", Checksums(*labels)),
        num_samples=n,
    )


FASHION_MNIST = DatasetSpec(
    name="fashion-mnist",
    title="Fashion-MNIST (Zalando)",
    splits={
        # Content md5s and sizes: the shared data README (they match Debian's
        # dataset-fashion-mnist, which recompressed the files); .gz md5s: upstream.
        "train": _idx_split(
            "train",
            "train",
            60000,
            ("f4a8712d7a061bf5bd6d2ca38dc4d50a", "8d4fb7e6c68d591d4c3dfef9ec88bf0d", 47040016),
            ("9018921c3c673c538a1fc5bad174d6f9", "25c81989df183df01b3e8a0aad5dffbe", 60008),
        ),
        "test": _idx_split(
            "test",
            "t10k",
            10000,
            ("8181f5470baa50b63fa0f6fddb340f0a", "bef4ecab320f06d8554ea6380940ec79", 7840016),
            ("15d484375f8d13e6eb1aabb0c3f46965", "bb300cfdad3c16e7a12a480ee83cd310", 10008),
        ),
    },
    mirrors=(
        "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
        "https://github.com/zalandoresearch/fashion-mnist/raw/master/data/fashion/",
    ),
    classes=(
        "T-shirt/top",
        "Trouser",
        "Pullover",
        "Dress",
        "Coat",
        "Sandal",
        "Shirt",
        "Sneaker",
        "Bag",
        "Ankle boot",
    ),
    apt_package="dataset-fashion-mnist",
)

MNIST = DatasetSpec(
    name="mnist",
    title="MNIST handwritten digits (LeCun, Cortes, Burges)",
    splits={
        # Content md5s: t10k from the shared data README; train from the
        # canonical decompressed files (the same values are published by many
        # independent loaders). .gz md5s: the canonical yann.lecun.com files.
        "train": _idx_split(
            "train",
            "train",
            60000,
            ("6bbc9ace898e44ae57da46a324031adb", "f68b3c2dcbeaaa9fbdd348bbdeb94873", 47040016),
            ("a25bea736e30d166cdddb491f175f624", "d53e105ee54ea40749a09fcbcd1e9432", 60008),
        ),
        "test": _idx_split(
            "test",
            "t10k",
            10000,
            ("2646ac647ad5339dbf082846283269ea", "9fb629c4189551a2d022fa330f9573f3", 7840016),
            ("27ae3e4e09519cfbb04c329615203637", "ec29112dd5afa0611ce80d1b7f02629c", 10008),
        ),
    },
    mirrors=(
        "https://ossci-datasets.s3.amazonaws.com/mnist/",
        "http://yann.lecun.com/exdb/mnist/",
    ),
    classes=tuple(str(d) for d in range(10)),
)

DATASETS: dict[str, DatasetSpec] = {spec.name: spec for spec in (FASHION_MNIST, MNIST)}


# -- text corpora (polytrain.data.text reads them) ---------------------------------------------


@dataclass(frozen=True)
class TextCorpus:
    """A corpus of plain-text files in one folder, with their checksums."""

    name: str
    title: str
    files: tuple[tuple[str, Checksums], ...]
    system_dir: str  # where the package installs the files
    apt_package: str
    window: int = 64
    stride: int = 64
    test_fraction: float = 0.1


FORTUNES = TextCorpus(
    name="fortunes",
    title="Fortune cookies: quotations, literature and riddles (Debian fortunes-min, BSD)",
    files=(
        ("fortunes", Checksums(md5="5005c1e4fe6f07038c4d95ae44194724", size=24516)),
        ("literature", Checksums(md5="62bbf5b141669b3fd2a13b333543e73f", size=53589)),
        ("riddles", Checksums(md5="e32d06e64673635ce8de7f34df7dffc9", size=20294)),
    ),
    system_dir="/usr/share/games/fortunes",
    apt_package="fortunes-min",
)

TEXT_DATASETS: dict[str, TextCorpus] = {FORTUNES.name: FORTUNES}


def dataset_names() -> list[str]:
    """Names of the known datasets."""
    return list(DATASETS)


def get_dataset(name: str | DatasetSpec) -> DatasetSpec:
    """The spec called ``name`` (a spec passes through); ConfigError if unknown."""
    if isinstance(name, DatasetSpec):
        return name
    key = name.strip().lower().replace("_", "-")
    if key in DATASETS:
        return DATASETS[key]
    if key in TEXT_DATASETS:  # read by polytrain.data.text, never downloaded
        corpus = TEXT_DATASETS[key]
        raise ConfigError(
            f"{key!r} is a text corpus, read from {corpus.system_dir} (`apt-get install "
            f"{corpus.apt_package}`) or --data-dir; it has no image files to locate or fetch."
        )
    known = ", ".join([*DATASETS, *TEXT_DATASETS])
    raise ConfigError(f"Unknown dataset {name!r}; known datasets: {known}.")
