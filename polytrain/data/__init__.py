"""Datasets: IDX files, the dataset registry, discovery, verified download, the loader.

``load_dataset("fashion-mnist", "train")`` finds (or fetches) the files and
returns an :class:`ArrayDataset`; :class:`BatchLoader` yields contract-9
batches. Importing this package is cheap: numpy-backed names load on first use.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from polytrain.data.locate import (
    DatasetReport,
    SplitLocation,
    fetch_dataset,
    locate_dataset,
    resolve_split,
    user_cache_dir,
)
from polytrain.data.registry import (
    DATASETS,
    Checksums,
    DatasetSpec,
    FileSpec,
    SplitSpec,
    dataset_names,
    get_dataset,
)

if TYPE_CHECKING:
    from polytrain.data.download import download_file
    from polytrain.data.idx import read_idx, write_idx
    from polytrain.data.loader import ArrayDataset, BatchLoader, EpochIterator

_LAZY = {
    "ArrayDataset": "loader",
    "BatchLoader": "loader",
    "EpochIterator": "loader",
    "read_idx": "idx",
    "write_idx": "idx",
    "download_file": "download",
}

__all__ = [
    "DATASETS",
    "ArrayDataset",
    "BatchLoader",
    "Checksums",
    "DatasetReport",
    "DatasetSpec",
    "EpochIterator",
    "FileSpec",
    "SplitLocation",
    "SplitSpec",
    "dataset_names",
    "download_file",
    "fetch_dataset",
    "get_dataset",
    "load_dataset",
    "locate_dataset",
    "read_idx",
    "resolve_split",
    "user_cache_dir",
    "write_idx",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module = importlib.import_module(f"{__name__}.{_LAZY[name]}")
        return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def load_dataset(
    name: str | DatasetSpec,
    split: str,
    data_dir: str | os.PathLike[str] | None = None,
    download: bool | None = None,
    verify: bool = False,
    *,
    timeout: float = 60.0,
    env: Mapping[str, str] | None = None,
    system_dirs: Iterable[str | os.PathLike[str]] | None = None,
) -> ArrayDataset:
    """Find (or download) one split of a dataset and load it into memory.

    Every split comes from the dataset's one folder (``polytrain.data.locate``); with
    ``data_dir`` only from ``data_dir/<name>/`` or ``data_dir/``. ``download``: fetch a
    missing split into that folder; by default only when no ``data_dir`` is given. The
    dataset's ``origin`` records the folder and files actually read. ``verify`` checks
    each file's md5 (of its content, or of the .gz) even when it was not just downloaded.
    Raises ConfigError for an unknown dataset or split, DataError for missing, corrupt or
    mismatched files.
    """
    from polytrain.data.idx import parse_idx, read_payload
    from polytrain.data.loader import ArrayDataset
    from polytrain.data.registry import TEXT_DATASETS
    from polytrain.data.text import load_text_dataset

    if isinstance(name, str) and name in TEXT_DATASETS:  # a corpus, always checked
        return load_text_dataset(name, split, data_dir)
    spec = get_dataset(name)
    files = spec.split(split)
    where = resolve_split(
        spec, split, data_dir, download=download, timeout=timeout, env=env, system_dirs=system_dirs
    )
    assert where.images is not None and where.labels is not None
    arrays = []
    for path, file in ((where.images, files.images), (where.labels, files.labels)):
        raw, content = read_payload(path)
        if verify:
            fix = (
                f"Delete it and run `polytrain data --download {spec.name}`, or replace it "
                f"with the canonical {file.filename}."
            )
            file.checks.verify(path, raw, content, fix=fix)
        arrays.append(parse_idx(content, path))
    images, labels = arrays
    source = f"{spec.name} {split}: images {where.images}, labels {where.labels}"
    if images.ndim != 3 or tuple(images.shape[1:]) != spec.image_shape:
        raise _shape_error(where.images, images.shape, spec)
    origin = {
        "dataset": spec.name,
        "split": split,
        "directory": str(where.directory),
        "rule": str(where.rule),
        "images": str(where.images),
        "labels": str(where.labels),
    }
    return ArrayDataset(images, labels, classes=spec.classes, source=source, origin=origin)


def _shape_error(path: object, shape: tuple[int, ...], spec: DatasetSpec) -> Exception:
    from polytrain.errors import DataError

    h, w = spec.image_shape
    return DataError(
        f"{path}: images have shape {shape}, expected [N, {h}, {w}] for {spec.name}. "
        "The file belongs to another dataset: use the matching images file."
    )
