"""The harness that runs a corpus file (tests/fixtures/port_code_corpus) on its framework
and, converted by ``polytrain port-code``, on PyTorch, from the same weights and batches
(tests/porting/test_port_code_corpus_run.py).

A case edits the original in a few documented places before it is converted (so both
runs execute the same program): a data source that downloads becomes the harness's small
arrays or files, epoch and step counts shrink, and a few harness calls are added, through
``import corpus_harness as H`` (a module that is not a framework's: the converter leaves
its calls alone):

- ``H.keep(model, *inputs)`` after a model is made: the original's weights are recorded
  (``inputs``: one forward pass first, without recording, where shapes are deferred);
  in the converted run, the PyTorch model gets them by polytrain's porting layout rules
  (the layers paired in order, as ``polytrain port`` pairs them);
- ``H.loss(value)``: a loss, recorded (its mean) in each run; the test compares them;
- ``H.watch(loss_fn)``: the loss function, each value it computes recorded;
- ``H.array(*shape)``, ``H.labels(n, classes)``, ``H.coin()``: data and random choices
  drawn from the harness's own generator, the same in both runs, as the run's tensors;
- ``H.image_file(name, count)``, ``H.label_file(name, count)``: gzipped MNIST-format
  files written in the run's folder (the same bytes in both runs), their paths;
  ``H.mnist_folder(folder, train, test)``: the four under the names Gluon reads;
  ``H.images(count, *shape, classes, transform)``: a list dataset of random images.

A case may also apply the fix a marker asks for to the converted code (``fixes``), as its
user would.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import os
import random
import runpy
import struct
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

COINS = [True, False, True, True, False, False, True, False]


@dataclass
class Store:
    """What the original's run leaves for the converted one: each kept model, with its
    weights as they were when kept (the run trains them afterwards)."""

    models: list[tuple[Any, dict[str, np.ndarray]]] = field(default_factory=list)


def numpy_of(value: Any) -> np.ndarray:
    """A tensor of any of the three frameworks, or a number, as a numpy array."""
    if hasattr(value, "asnumpy"):  # MXNet
        return value.asnumpy()
    if hasattr(value, "detach") and hasattr(value, "cpu"):  # PyTorch
        return value.detach().cpu().numpy()
    if hasattr(value, "numpy"):  # Paddle
        return np.asarray(value.numpy())
    return np.asarray(value)


class Harness:
    """``corpus_harness`` for one run: ``side`` is 'paddle', 'mxnet' or 'torch'."""

    def __init__(self, side: str, store: Store, folder: Path, dtype: str = "float32") -> None:
        self.side, self.store, self.folder, self.dtype = side, store, folder, dtype
        self.losses: list[float] = []
        self.rng = np.random.default_rng(0)
        self._kept = 0
        self._coins = 0

    # -- values ---------------------------------------------------------------------------

    def tensor(self, array: np.ndarray) -> Any:
        if self.side == "paddle":
            import paddle

            return paddle.to_tensor(array)
        if self.side == "mxnet":
            import mxnet as mx

            return mx.nd.array(array, dtype=array.dtype)
        import torch

        return torch.tensor(array)

    def array(self, *shape: int, scale: float = 1.0) -> Any:
        return self.tensor((self.rng.standard_normal(shape) * scale).astype(self.dtype))

    def labels(self, *shape: int, classes: int, dtype: str = "int64") -> Any:
        return self.tensor(self.rng.integers(0, classes, size=shape).astype(dtype))

    def coin(self) -> bool:
        self._coins += 1
        return COINS[(self._coins - 1) % len(COINS)]

    def idx_files(self, name: str, count: int) -> tuple[str, str]:
        """``name-images.gz`` and ``name-labels.gz`` in the MNIST idx format."""
        rng = np.random.default_rng(len(name) * 1000 + count)
        images = rng.integers(0, 256, size=(count, 28, 28)).astype(np.uint8)
        labels = rng.integers(0, 10, size=count).astype(np.uint8)
        paths = (self.folder / f"{name}-images.gz", self.folder / f"{name}-labels.gz")
        with gzip.open(paths[0], "wb") as f:
            f.write(struct.pack(">IIII", 2051, count, 28, 28) + images.tobytes())
        with gzip.open(paths[1], "wb") as f:
            f.write(struct.pack(">II", 2049, count) + labels.tobytes())
        return str(paths[0]), str(paths[1])

    def image_file(self, name: str, count: int) -> str:
        return self.idx_files(name, count)[0]

    def label_file(self, name: str, count: int) -> str:
        return self.idx_files(name, count)[1]

    def mnist_folder(self, folder: str, train: int, test: int) -> str:
        """MNIST-format files under the names Gluon's datasets read, in ``folder``."""
        path = self.folder / folder
        path.mkdir(parents=True, exist_ok=True)
        for part, count in (("train", train), ("t10k", test)):
            images, labels = self.idx_files(part, count)
            Path(images).replace(path / f"{part}-images-idx3-ubyte.gz")
            Path(labels).replace(path / f"{part}-labels-idx1-ubyte.gz")
        return str(path)

    def chw(self, image: np.ndarray) -> Any:
        """An HWC (or HW, a PIL image's) uint8 image as CHW values in [0, 1] of the run's
        dtype (what ToTensor gives, in float64 where the case runs so)."""
        array = np.array(image)
        array = array[:, :, None] if array.ndim == 2 else array
        return (array.transpose(2, 0, 1) / 255.0).astype(self.dtype)

    def images(self, count: int, *shape: int, classes: int, transform: Any = None) -> list:
        """A list dataset of ``count`` (image, label): HWC uint8 images through
        ``transform``, int64 labels (0-d arrays, as Paddle's vision datasets give)."""
        out = []
        for _ in range(count):
            image = self.rng.integers(0, 256, size=shape).astype(np.uint8)
            label = np.array(self.rng.integers(0, classes), dtype=np.int64)
            out.append((transform(image) if transform is not None else image, label))
        return out

    # -- losses ---------------------------------------------------------------------------

    def loss(self, value: Any) -> None:
        self.losses.append(float(np.mean(numpy_of(value).astype(np.float64))))

    def watch(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def watched(*args: Any, **kwargs: Any) -> Any:
            out = fn(*args, **kwargs)
            self.loss(out)
            return out

        watched.__dict__.update(getattr(fn, "__dict__", {}))
        return watched

    # -- weights --------------------------------------------------------------------------

    def keep(self, model: Any, *inputs: Any) -> Any:
        if inputs:
            self._materialize(model, inputs)
        if self.side != "torch":
            self.store.models.append((model, _snapshot(model, self.side)))
            return model
        source, weights = self.store.models[self._kept]
        self._kept += 1
        _restore(source, weights)
        copy_weights(source, model)
        return model

    def _materialize(self, model: Any, inputs: tuple[Any, ...]) -> None:
        """One forward pass where shapes are deferred (Gluon, PyTorch's lazy layers),
        without training's side effects (BatchNorm's statistics)."""
        if self.side == "torch":
            import torch

            was = model.training
            model.eval()
            with torch.no_grad():
                model(*inputs)
            model.train(was)
        else:
            model(*inputs)  # outside autograd.record(): Gluon's predict mode


def _snapshot(model: Any, side: str) -> dict[str, np.ndarray]:
    if side == "mxnet":
        return {k: p.data().asnumpy().copy() for k, p in model.collect_params().items()}
    return {k: np.array(v.numpy()) for k, v in model.state_dict().items()}


def _restore(model: Any, weights: dict[str, np.ndarray]) -> None:
    if hasattr(model, "collect_params"):
        import mxnet as mx

        for k, p in model.collect_params().items():
            p.set_data(mx.nd.array(weights[k], dtype=weights[k].dtype))
        return
    import paddle

    model.set_state_dict({k: paddle.to_tensor(v) for k, v in weights.items()})


def copy_weights(source: Any, target: Any) -> None:
    """The source model's weights into the PyTorch one by polytrain's porting rules: the
    layers of both, in order, paired as ``polytrain port`` pairs them."""
    from polytrain.porting.api import walker_for
    from polytrain.porting.match import Pair, mismatch, ported_state

    sw, tw = walker_for(source, "model"), walker_for(target, "model")
    pairs = []
    for s, t in zip(sw.layers(source), tw.layers(target), strict=True):
        assert mismatch(s, t, check_kind=False) is None, (s.describe(), t.describe())
        pairs.append(Pair(s, t))
    state, _ = ported_state(pairs, tw.state(target))
    tw.load_state(target, state)


@contextlib.contextmanager
def running(harness: Harness, folder: Path) -> Iterator[None]:
    """The process as a run of one file expects it: the harness importable, the run's
    folder current, a plain argv, numpy's and Python's generators seeded alike, PyTorch on
    one thread (tiny models on a busy machine), the default dtypes restored after."""
    import torch

    old = (os.getcwd(), list(sys.argv), torch.get_num_threads(), torch.get_default_dtype())
    sys.modules["corpus_harness"] = harness  # type: ignore[assignment]
    os.chdir(folder)
    sys.argv = [str(folder / "main.py")]
    np.random.seed(0)
    random.seed(0)
    torch.set_num_threads(1)
    try:
        yield
    finally:
        sys.modules.pop("corpus_harness", None)
        os.chdir(old[0])
        sys.argv = old[1]
        torch.set_num_threads(old[2])
        torch.set_default_dtype(old[3])


def run(
    text: str, harness: Harness, name: str, modules: dict[str, Any] | None = None
) -> dict[str, Any]:
    """``text`` run as a script in the harness's folder (its printing kept out), with
    ``modules`` importable (a package the original imports that is not installed)."""
    path = harness.folder / name
    path.write_text(text, encoding="utf-8")
    extra = dict(modules or {})
    before = {k: sys.modules.get(k) for k in extra}
    sys.modules.update(extra)
    try:
        with running(harness, harness.folder), contextlib.redirect_stdout(io.StringIO()):
            return runpy.run_path(str(path), run_name="__main__")
    finally:
        for k, v in before.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v


# -- what the corpus-run tests share ------------------------------------------------------


def with_harness(text: str, edits: Iterable[tuple[str, str]], driver: str, name: str) -> str:
    """``text`` (the file ``name``) with a case's ``edits``, ``import corpus_harness as H``
    after its ``__future__`` imports and the case's ``driver`` at the end."""
    for old, new in edits:
        assert old in text, f"{name}: {old!r} is not in it"
        text = text.replace(old, new)
    lines = text.splitlines(keepends=True)
    at = max((i + 1 for i, x in enumerate(lines) if x.startswith("from __future__")), default=0)
    head, tail = "".join(lines[:at]), "".join(lines[at:])
    return f"{head}import corpus_harness as H\n{tail}\n{driver}"


def converted_code(
    text: str, name: str, left: Iterable[str], fixes: Iterable[tuple[str, str]]
) -> str:
    """``text`` converted by port-code, which leaves exactly the calls ``left`` unconverted,
    with the ``fixes`` their markers ask for applied as the user would."""
    from polytrain.porting.code import convert_source

    result = convert_source(text, name)
    assert {u.api for u in result.report.uses if not u.converted} == set(left)
    code = result.code
    for old, new in fixes:
        assert old in code, f"{name}: {old!r} is not in the converted code"
        code = code.replace(old, new)
    return code


def harness_pair(framework: str, tmp: Path, dtype: str = "float32") -> tuple[Harness, Harness]:
    """The original's harness (on ``framework``) and the converted one's (PyTorch), each in
    its own folder under ``tmp``, sharing one :class:`Store`."""
    store = Store()
    folders = tmp / "original", tmp / "converted"
    for folder in folders:
        folder.mkdir()
    return Harness(framework, store, folders[0], dtype), Harness("torch", store, folders[1], dtype)


def assert_same_losses(original: Harness, converted: Harness, tolerance: float) -> None:
    """Both runs recorded the same number (>= 3) of losses, which change, equal to
    ``tolerance`` relative to max(1, |loss|)."""
    want, got = np.array(original.losses), np.array(converted.losses)
    assert len(want) == len(got) >= 3, (len(want), len(got))
    assert len(set(want.tolist())) > 1  # it trains: the losses change
    diff = np.abs(want - got) / np.maximum(1.0, np.abs(want))
    worst = int(diff.argmax())
    assert diff[worst] <= tolerance, (
        f"step {worst + 1} of {len(want)}: {want[worst]!r} vs {got[worst]!r}"
    )
