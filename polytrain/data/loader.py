"""In-memory datasets and the framework-neutral batch loader (the data-order contract in
docs/architecture.md).

Epoch ``e`` visits the samples in the order ``default_rng([seed, e]).permutation(N)``
(or ``0..N-1`` without shuffling), cut into global batches of ``batch_size``; the
last batch is kept smaller or dropped. With ``world_size`` P, rank r takes its
contiguous slice of each global batch (``shard_bounds``), so the global batch is
the same whatever P. Every batch is a fresh C-contiguous numpy array pair.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from polytrain.errors import ConfigError, DataError
from polytrain.neutral.sharding import shard_bounds

Batch = tuple[np.ndarray, np.ndarray]


class ArrayDataset:
    """Images and integer labels held in memory.

    ``images``: uint8 ``[N, H, W]`` or ``[N, C, H, W]`` (scaled by 1/255), or
    float ``[N, C, H, W]`` / ``[N, H, W]`` (used as is). ``x`` is float32
    ``[N, C, H, W]``, converted once on first use; ``y`` is int64 ``[N]``.
    ``source`` names where the arrays came from, for error messages; ``origin`` (from
    ``load_dataset``) records the dataset, split, folder and files read, for run records.
    """

    def __init__(
        self,
        images: np.ndarray,
        labels: np.ndarray,
        *,
        num_classes: int | None = None,
        classes: Sequence[str] | None = None,
        source: str | None = None,
        origin: Mapping[str, str] | None = None,
    ) -> None:
        images = np.asarray(images)
        labels = np.asarray(labels)
        where = source or "ArrayDataset"
        if images.ndim not in (3, 4) or images.dtype.kind not in "uf":
            raise DataError(
                f"{where}: images must be uint8 [N, H, W] / [N, C, H, W] or float "
                f"[N, C, H, W]; got {images.dtype} with shape {images.shape}."
            )
        if images.dtype.kind == "u" and images.dtype != np.uint8:
            raise DataError(f"{where}: integer images must be uint8, got {images.dtype}.")
        if labels.ndim != 1 or labels.dtype.kind not in "iu":
            raise DataError(
                f"{where}: labels must be a 1-d integer array; got {labels.dtype} with shape "
                f"{labels.shape}."
            )
        if len(images) != len(labels):
            raise DataError(
                f"{where}: {len(images)} images but {len(labels)} labels; expected one label "
                "per image. The two files belong to different splits or one is truncated: "
                "use the images and labels files of the same split."
            )
        if len(labels) == 0:
            raise DataError(f"{where}: the dataset is empty (0 samples).")
        if classes is not None:
            num_classes = len(classes)
        low, high = int(labels.min()), int(labels.max())
        if num_classes is None:
            num_classes = high + 1
        if low < 0 or high >= num_classes:
            raise DataError(
                f"{where}: labels range over {low}..{high}, expected 0..{num_classes - 1} "
                f"({num_classes} classes). The labels file is corrupt or belongs to another "
                "dataset."
            )
        self._raw = images
        self._x: np.ndarray | None = None
        self._lock = threading.Lock()
        self.y: np.ndarray = np.ascontiguousarray(labels, dtype=np.int64)
        self.num_classes = num_classes
        self.classes = tuple(classes) if classes is not None else None
        self.source = source
        self.origin: dict[str, str] = dict(origin or {})

    def __len__(self) -> int:
        return len(self.y)

    def __repr__(self) -> str:
        return (
            f"ArrayDataset({len(self)} samples, image shape {self.image_shape}, "
            f"{self.num_classes} classes, source={self.source!r})"
        )

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """``(C, H, W)`` of one sample."""
        shape = self._raw.shape
        c, h, w = (1, *shape[1:]) if len(shape) == 3 else shape[1:]
        return (int(c), int(h), int(w))

    @property
    def x(self) -> np.ndarray:
        """float32 ``[N, C, H, W]`` images, converted (and scaled) once, thread-safely."""
        if self._x is None:
            with self._lock:
                if self._x is None:
                    self._x = _to_float(self._raw)
        return self._x

    def _take(self, index: slice | np.ndarray, what: str) -> ArrayDataset:
        images = self._x if self._x is not None else self._raw
        source = f"{self.source or 'ArrayDataset'} [{what}]"
        return ArrayDataset(
            images[index],
            self.y[index],
            num_classes=self.num_classes,
            classes=self.classes,
            source=source,
            origin=self.origin,
        )

    def subset(self, n: int) -> ArrayDataset:
        """The first ``n`` samples."""
        if not 1 <= n <= len(self):
            raise ConfigError(f"subset({n}): need 1 <= n <= {len(self)} (the dataset size).")
        return self._take(slice(0, n), f"first {n}")

    def split(self, val_fraction: float, seed: int = 0) -> tuple[ArrayDataset, ArrayDataset]:
        """Deterministic ``(train, val)`` split; each part keeps the original order."""
        if not 0.0 < val_fraction < 1.0:
            raise ConfigError(f"val_fraction must be in (0, 1), got {val_fraction}.")
        n_val = round(len(self) * val_fraction)
        if not 0 < n_val < len(self):
            raise ConfigError(
                f"val_fraction {val_fraction} of {len(self)} samples leaves an empty part; "
                "use a larger dataset or another fraction."
            )
        perm = np.random.default_rng(seed).permutation(len(self))
        val, train = np.sort(perm[:n_val]), np.sort(perm[n_val:])
        return self._take(train, f"train split, seed {seed}"), self._take(val, "val split")


def _to_float(images: np.ndarray) -> np.ndarray:
    x = images.astype(np.float32)  # always a new array
    if images.dtype == np.uint8:
        np.divide(x, np.float32(255), out=x)
    if x.ndim == 3:
        x = x[:, None]
    return np.ascontiguousarray(x)


class BatchLoader:
    """Contract-9 batches of an :class:`ArrayDataset` for one rank.

    ``loader.epoch(e, start_step)`` iterates one epoch; iterating the loader
    itself runs epochs ``start_epoch``, ``start_epoch + 1``, ... one per loop.
    ``prefetch=k`` assembles up to ``k`` batches ahead in a daemon thread;
    the batches are bitwise identical to ``prefetch=0``.
    """

    def __init__(
        self,
        dataset: ArrayDataset,
        batch_size: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        rank: int = 0,
        world_size: int = 1,
        prefetch: int = 0,
        start_epoch: int = 0,
    ) -> None:
        for label, value, low in (
            ("batch_size", batch_size, 1),
            ("world_size", world_size, 1),
            ("seed", seed, 0),
            ("prefetch", prefetch, 0),
            ("start_epoch", start_epoch, 0),
        ):
            if not isinstance(value, int | np.integer) or value < low:
                raise ConfigError(f"{label} must be an integer >= {low}, got {value!r}.")
        if not 0 <= rank < world_size:
            raise ConfigError(f"rank must be in 0..{world_size - 1} (world_size), got {rank}.")
        n = len(dataset)
        full, rest = divmod(n, batch_size)
        sizes = [batch_size] * full + ([rest] if rest and not drop_last else [])
        if not sizes:
            raise ConfigError(
                f"No batch to load: {n} samples with batch_size {batch_size} and drop_last "
                "leaves nothing. Use a smaller batch_size or drop_last=False."
            )
        if batch_size < world_size:
            raise ConfigError(
                f"batch_size {batch_size} is smaller than world_size {world_size}: every rank "
                f"needs at least one sample per step. Use a batch size of at least {world_size}."
            )
        if sizes[-1] < world_size:
            raise ConfigError(
                f"The last global batch has {sizes[-1]} samples ({n} samples, batch_size "
                f"{batch_size}), fewer than world_size {world_size}: every rank needs at least "
                f"one sample. Pass drop_last=True, or pick a batch size whose remainder is 0 or "
                f">= {world_size}."
            )
        self.dataset = dataset
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = int(seed)
        self.drop_last = drop_last
        self.rank = rank
        self.world_size = world_size
        self.prefetch = prefetch
        self.next_epoch = int(start_epoch)
        self._sizes = sizes
        self._starts = [i * batch_size for i in range(len(sizes))]
        self._bounds = {s: shard_bounds(s, world_size, what="ranks")[rank] for s in set(sizes)}

    def __len__(self) -> int:
        return len(self._sizes)

    def __iter__(self) -> EpochIterator:
        epoch = self.next_epoch
        self.next_epoch += 1
        return self.epoch(epoch)

    def global_batch_sizes(self, epoch: int = 0) -> list[int]:
        """The global batch size of each step of ``epoch`` (for loss normalisation)."""
        self._check_epoch(epoch)
        return list(self._sizes)

    def local_batch_sizes(self, epoch: int = 0) -> list[int]:
        """This rank's batch size at each step of ``epoch``."""
        self._check_epoch(epoch)
        return [self._bounds[s][1] - self._bounds[s][0] for s in self._sizes]

    def order(self, epoch: int) -> np.ndarray:
        """The sample order of ``epoch`` (global, identical on every rank)."""
        self._check_epoch(epoch)
        n = len(self.dataset)
        if not self.shuffle:
            return np.arange(n)
        return np.random.default_rng([self.seed, epoch]).permutation(n)

    def indices(self, order: np.ndarray, step: int) -> np.ndarray:
        """This rank's sample indices at ``step`` of an epoch with sample ``order``."""
        lo, hi = self._bounds[self._sizes[step]]
        start = self._starts[step]
        return order[start + lo : start + hi]

    def epoch(self, epoch: int, start_step: int = 0) -> EpochIterator:
        """Iterate ``(x float32 [b, C, H, W], y int64 [b])`` of ``epoch`` from ``start_step``."""
        if not 0 <= start_step <= len(self):
            raise ConfigError(
                f"start_step must be in 0..{len(self)} (steps per epoch), got {start_step}."
            )
        order = self.order(epoch)
        x, y = self.dataset.x, self.dataset.y

        def make(step: int) -> Batch:
            index = self.indices(order, step)
            return np.take(x, index, axis=0), np.take(y, index, axis=0)

        return EpochIterator(make, range(start_step, len(self)), self.prefetch, epoch)

    def _check_epoch(self, epoch: int) -> None:
        if not isinstance(epoch, int | np.integer) or epoch < 0:
            raise ConfigError(f"epoch must be an integer >= 0, got {epoch!r}.")


class _End:
    """Marks the end of the producer's batches."""


class _Failure:
    """Carries an exception from the producer thread to the consumer."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


def _offer(q: queue.Queue[Any], item: object, stop: threading.Event) -> bool:
    """Put ``item`` unless ``stop`` is set first; return whether it was put."""
    while not stop.is_set():
        try:
            q.put(item, timeout=0.05)
            return True
        except queue.Full:
            continue
    return False


def _produce(
    make: Callable[[int], Batch], steps: range, q: queue.Queue[Any], stop: threading.Event
) -> None:
    """Producer thread body; holds no reference to the consuming iterator."""
    try:
        for step in steps:
            if stop.is_set() or not _offer(q, (step, make(step)), stop):
                return
        _offer(q, _End(), stop)
    except BaseException as exc:
        _offer(q, _Failure(exc), stop)


class EpochIterator(Iterator[Batch]):
    """Batches of one epoch; ``step`` is the index of the next batch to be returned.

    With prefetching, ``close()`` (also run on exhaustion, on ``with`` exit and
    on garbage collection) stops and joins the producer thread.
    """

    def __init__(
        self, make: Callable[[int], Batch], steps: range, prefetch: int, epoch: int
    ) -> None:
        self.epoch = epoch
        self.step = steps.start
        self._make = make
        self._steps = iter(steps)
        self._closed = False
        self._thread: threading.Thread | None = None
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=max(prefetch, 1))
        self._stop = threading.Event()
        if prefetch > 0 and len(steps) > 0:
            self._thread = threading.Thread(
                target=_produce,
                args=(make, steps, self._queue, self._stop),
                name=f"polytrain-prefetch-epoch{epoch}",
                daemon=True,
            )
            self._thread.start()

    def __iter__(self) -> EpochIterator:
        return self

    def __next__(self) -> Batch:
        if self._closed:
            raise StopIteration
        if self._thread is None:
            step = next(self._steps, None)
            if step is None:
                self.close()
                raise StopIteration
            batch = self._make(step)
        else:
            item = self._get()
            if isinstance(item, _End):
                self.close()
                raise StopIteration
            if isinstance(item, _Failure):
                self.close()
                raise item.exc
            step, batch = item
        self.step = step + 1
        return batch

    def _get(self) -> Any:
        assert self._thread is not None
        while True:
            try:
                return self._queue.get(timeout=0.1)
            except queue.Empty:
                if not self._thread.is_alive() and self._queue.empty():
                    raise RuntimeError("The prefetch thread ended without a result.") from None

    def close(self) -> None:
        """Stop the producer thread (if any) and wait for it."""
        self._closed = True
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stop.set()
        while True:  # unblock a producer waiting on a full queue
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        if thread is not threading.current_thread():
            thread.join(timeout=10.0)

    def __enter__(self) -> EpochIterator:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()
