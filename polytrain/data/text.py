"""Plain-text corpora for character-level language models, cut into next-character windows.

``fortunes``: the English quotations, literature and riddles of Debian's ``fortunes-min``
package (``/usr/share/games/fortunes/{fortunes,literature,riddles}``, 98,399 bytes of ASCII,
BSD licence of fortune-mod). The files are read in that order, each checked against its md5,
and joined. The vocabulary is the sorted set of the corpus's characters (88 for
``fortunes``): character ``vocabulary[i]`` has id ``i``. The last ``test_fraction`` of the
text is the test split; each split is cut into windows of ``window`` ids every ``stride``
characters, ``x = ids[i:i+T]`` and ``y = ids[i+1:i+T+1]`` (next-character targets [N, T]).
The vocabulary travels with the split's ``origin`` (so the run's records and checkpoints
name the ids a later test set or sampler must use).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from polytrain.data.arrays import UserArrays
from polytrain.data.locate import find_corpus
from polytrain.data.registry import TEXT_DATASETS, TextCorpus
from polytrain.errors import ConfigError, DataError


class TextWindows(UserArrays):
    """One split of a corpus: int64 ids ``x`` [N, T] and next-character targets ``y`` [N, T]."""

    def __init__(self, x: np.ndarray, y: np.ndarray, vocabulary: str, **kw: object) -> None:
        super().__init__(x, y, **kw)  # type: ignore[arg-type]
        self.vocabulary = vocabulary
        self.num_classes = len(vocabulary)


def read_corpus(
    corpus: TextCorpus, data_dir: str | os.PathLike[str] | None = None
) -> tuple[str, Path]:
    """The corpus's text (its files joined, each checked) and the folder it came from."""
    folder = find_corpus(corpus, data_dir)
    parts = []
    for name, checks in corpus.files:
        path = folder / name
        raw = path.read_bytes()
        checks.verify(
            path,
            raw,
            raw,
            fix=f"reinstall it (`apt-get install --reinstall {corpus.apt_package}`).",
        )
        parts.append(raw.decode("utf-8"))
    return "".join(parts), folder


def vocabulary_of(text: str) -> str:
    """The sorted distinct characters of ``text``: character ``i`` has id ``i``."""
    return "".join(sorted(set(text)))


def encode(text: str, vocabulary: str) -> np.ndarray:
    """Ids of ``text``'s characters (int64); one line naming a character not in it."""
    index = {c: i for i, c in enumerate(vocabulary)}
    try:
        return np.fromiter((index[c] for c in text), dtype=np.int64, count=len(text))
    except KeyError as exc:
        raise DataError(f"character {exc.args[0]!r} is not in the vocabulary.") from None


def windows(ids: np.ndarray, window: int, stride: int) -> tuple[np.ndarray, np.ndarray]:
    """``x = ids[i:i+window]``, ``y = ids[i+1:i+window+1]`` for i = 0, stride, ...
    (every window whole)."""
    starts = np.arange(0, len(ids) - window, stride)
    index = starts[:, None] + np.arange(window)[None, :]
    return np.ascontiguousarray(ids[index]), np.ascontiguousarray(ids[index + 1])


def load_text_dataset(
    name: str, split: str, data_dir: str | os.PathLike[str] | None = None
) -> TextWindows:
    """Split ``train`` (the first 1 - test_fraction of the text) or ``test`` (the rest) of
    corpus ``name`` as next-character windows."""
    corpus = TEXT_DATASETS[name]
    if split not in ("train", "test"):
        raise ConfigError(f"Dataset {name!r} has no split {split!r}; known splits: train, test.")
    text, folder = read_corpus(corpus, data_dir)
    vocabulary = vocabulary_of(text)
    ids = encode(text, vocabulary)
    cut = int(len(ids) * (1 - corpus.test_fraction))
    lo, hi = (0, cut) if split == "train" else (cut, len(ids))
    part = ids[lo:hi]
    x, y = windows(part, corpus.window, corpus.stride)
    origin = {
        "dataset": corpus.name,
        "split": split,
        "directory": str(folder),
        "files": ", ".join(n for n, _ in corpus.files),
        "characters": f"{lo}..{hi} of {len(ids)}",
        "vocabulary": vocabulary,
    }
    source = f"{corpus.name} {split}: {folder}"
    return TextWindows(x, y, vocabulary, source=source, origin=origin)
