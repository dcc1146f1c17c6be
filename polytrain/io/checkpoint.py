"""The neutral checkpoint: safetensors tensors plus a JSON manifest, written atomically.

A checkpoint is a directory::

    model.safetensors      canonical parameters and buffers (PyTorch layout, float32;
                           float64 for a --precision fp64 run)
    optimizer.safetensors  optimizer slots as ``<param>/<slot>`` (absent without state)
    manifest.json          format and version, writer, model spec, tensor names, shapes and
                           dtypes, sha256 of each file, optimizer config/step/lr, position,
                           seed, recipe, loss scaler, metrics history, ``extra``

No framework, no pickle: numpy, ``safetensors.numpy`` and JSON only, so a checkpoint
written by one backend loads into any other (the save/load contract in docs/architecture.md).

Crash safety. :func:`save_checkpoint` writes every file into a hidden sibling
``.<name>.tmp-*``, fsyncs each file and the directory, then renames it to ``<name>``.
Replacing an existing checkpoint takes two renames: old -> ``.<name>.old``, new ->
``<name>``, then the old one is deleted. A reader (or a SIGKILL at any instant) therefore
finds the old complete checkpoint, the new complete one, or - between the two renames -
nothing at ``<name>`` and the old one intact at ``.<name>.old``: :func:`load_checkpoint`
then loads that one with a warning, and the next save to ``<name>`` restores or removes it.
Leftover temporary directories are never read and are removed by the next save.
:class:`CheckpointManager` adds a ``latest`` pointer, replaced atomically only after its
checkpoint is complete, and prunes old checkpoints by renaming them away before deleting.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import tempfile
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import safetensors.numpy as stnp

from polytrain.backend.mismatch import compare_shapes, name_list
from polytrain.errors import CheckpointError, ConfigError
from polytrain.io.manifest_fields import check_manifest
from polytrain.neutral.models import ModelSpec
from polytrain.utils.fileio import apply_umask, atomic_write_text, fsync_dir

FORMAT = "polytrain-checkpoint"
FORMAT_VERSION = 1
MODEL_FILE = "model.safetensors"
OPTIMIZER_FILE = "optimizer.safetensors"
MANIFEST_FILE = "manifest.json"
_KNOWN_FILES = {MODEL_FILE, OPTIMIZER_FILE, MANIFEST_FILE}
_STEP_DIR = re.compile(r"step-(\d+)")
_LIST_MAX = 8
ASIDE_DIR = "diverged"  # checkpoints/diverged/: set aside by a stop, out of --resume's way
_RUN_MARKERS = ("checkpoints", "metrics.jsonl")  # a run directory holds one of these

PathLike = str | os.PathLike[str]


@dataclass
class Checkpoint:
    """A loaded checkpoint. ``optimizer_state`` has the shape of ``Optimizer.state_dict()``;
    ``position`` holds ``epoch``, ``step`` (within the epoch) and ``global_step``."""

    path: Path
    params: dict[str, np.ndarray]
    optimizer_state: dict[str, Any] | None
    manifest: dict[str, Any]
    position: dict[str, int]
    recipe: dict[str, Any] | None
    scaler: dict[str, Any] | None
    history: list[dict[str, Any]]


# -- writing --------------------------------------------------------------------------------------


def save_checkpoint(
    directory: PathLike,
    *,
    params: Mapping[str, Any],
    optimizer_state: Mapping[str, Any] | None = None,
    spec: ModelSpec | None = None,
    model_name: str | None = None,
    backend: str | None = None,
    framework_version: str | None = None,
    position: Mapping[str, int] | None = None,
    seed: int | None = None,
    recipe: Mapping[str, Any] | None = None,
    scaler: Mapping[str, Any] | None = None,
    history: list[Mapping[str, Any]] | None = None,
    extra: Mapping[str, Any] | None = None,
    param_dtype: str = "float32",
) -> Path:
    """Write a complete checkpoint to ``directory`` atomically (see the module docstring)
    and return its path. Float parameters are stored as ``param_dtype`` (float32; float64
    for a ``--precision fp64`` run, so that it resumes exactly). Raises
    :class:`CheckpointError` before touching ``directory`` if an input cannot be stored,
    or if ``directory`` exists and is not a checkpoint."""
    from polytrain._version import __version__

    if param_dtype not in ("float32", "float64"):
        raise CheckpointError(f"param_dtype must be float32 or float64, not {param_dtype!r}.")
    target = Path(directory).absolute()
    model = _model_arrays(params, spec, np.dtype(param_dtype))
    tensors = {MODEL_FILE: model}
    optimizer = None
    if optimizer_state is not None:
        optimizer, slots = _split_optimizer(optimizer_state, model)
        if slots:
            tensors[OPTIMIZER_FILE] = slots
    manifest: dict[str, Any] = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "polytrain_version": __version__,
        "created": datetime.now(UTC).isoformat(timespec="milliseconds"),
        "backend": {"name": backend, "framework_version": framework_version},
        "model": {
            "name": model_name or (spec.name if spec else None),
            "spec": spec.to_dict() if spec else None,
        },
        "files": {},
        "optimizer": optimizer,
        "position": _position(position),
        "seed": seed,
        "recipe": _jsonable("recipe", recipe),
        "scaler": _jsonable("scaler", scaler),
        "history": _jsonable("history", list(history or [])),
        "extra": _jsonable("extra", dict(extra or {})),
    }
    blobs = _tensor_files(tensors, manifest["files"])
    blobs[MANIFEST_FILE] = (json.dumps(manifest, indent=1) + "\n").encode("utf-8")
    _write_directory(target, blobs)
    return target


def _model_arrays(
    params: Mapping[str, Any], spec: ModelSpec | None, floats: np.dtype
) -> dict[str, np.ndarray]:
    """The parameters as arrays of ``floats``, their shapes checked against ``spec``."""
    model = {
        name: _array(f"parameter {name!r}", value, floats=floats) for name, value in params.items()
    }
    if spec is not None:
        problems = _shape_problems(
            {n: a.shape for n, a in model.items()}, spec.parameter_shapes(), "given"
        )
        if problems:
            raise CheckpointError(f"The parameters do not match model {spec.name!r}:\n{problems}")
    return model


def _tensor_files(
    tensors: Mapping[str, Mapping[str, np.ndarray]], entries: dict[str, Any]
) -> dict[str, bytes]:
    """Each safetensors file's bytes; its hash, size and tensors go into ``entries``
    (the manifest's ``files``)."""
    blobs: dict[str, bytes] = {}
    for fname, arrays in tensors.items():
        blobs[fname] = stnp.save(dict(arrays))
        entries[fname] = {
            "sha256": hashlib.sha256(blobs[fname]).hexdigest(),
            "size": len(blobs[fname]),
            "tensors": {
                n: {"shape": list(a.shape), "dtype": str(a.dtype)} for n, a in arrays.items()
            },
        }
    return blobs


def _write_directory(target: Path, blobs: Mapping[str, bytes]) -> None:
    """Write the files (the manifest last) into a new folder and rename it to ``target``;
    an old ``target`` is replaced only once the new one is complete."""
    _check_replaceable(target)
    if not target.parent.is_dir():
        target.parent.mkdir(parents=True, exist_ok=True)
        fsync_dir(target.parent.parent)
    _recover(target)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    aside = _aside(target)
    try:
        apply_umask(tmp, directory=True)
        for fname, blob in blobs.items():  # the manifest last
            with open(tmp / fname, "wb") as fh:
                fh.write(blob)
                fh.flush()
                os.fsync(fh.fileno())
        fsync_dir(tmp)
        if target.exists():
            os.rename(target, aside)
        os.rename(tmp, target)
        fsync_dir(target.parent)
    except BaseException:
        _recover(target)  # put the old checkpoint back, remove the temporary directory
        raise
    shutil.rmtree(aside, ignore_errors=True)


def _array(what: str, value: Any, *, floats: np.dtype | None = None) -> np.ndarray:
    try:
        arr = np.asarray(value)
    except Exception as exc:
        raise CheckpointError(f"Cannot store {what}: {exc}") from exc
    if arr.dtype.kind == "f" and floats is not None:
        arr = arr.astype(floats, copy=False)
    elif arr.dtype.kind not in "fiub":
        raise CheckpointError(f"Cannot store {what}: dtype {arr.dtype} is not a number type.")
    # safetensors 0.8 writes wrong bytes for non-contiguous arrays (a transposed weight).
    return np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("="))


def _split_optimizer(
    state: Mapping[str, Any], params: Mapping[str, np.ndarray]
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    try:
        meta = {"config": state["config"], "step": int(state["step"]), "lr": float(state["lr"])}
        slots = state["slots"]
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(
            f"optimizer_state must be Optimizer.state_dict() (config, step, lr, slots): {exc!r}"
        ) from exc
    flat: dict[str, np.ndarray] = {}
    names: dict[str, list[str]] = {}
    for pname, pslots in slots.items():
        if pname not in params:
            raise CheckpointError(
                f"Optimizer state has slots for {pname!r}, which is not a parameter."
            )
        names[pname] = list(pslots)
        for sname, value in pslots.items():
            if "/" in sname:
                raise CheckpointError(f"Optimizer slot name {sname!r} must not contain '/'.")
            flat[f"{pname}/{sname}"] = _array(f"optimizer slot {pname}/{sname}", value)
    meta.update(config=_jsonable("optimizer config", meta["config"]), slots=names)
    return meta, flat


def _position(position: Mapping[str, int] | None) -> dict[str, int]:
    pos = dict(position or {})
    try:
        for key in ("epoch", "step", "global_step"):
            pos[key] = int(pos.get(key, 0))
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"position must hold integers epoch/step/global_step: {exc}") from exc
    return _jsonable("position", pos)


def _jsonable(what: str, value: Any) -> Any:
    """``value`` as plain JSON types (numpy scalars and arrays converted)."""

    def default(obj: Any) -> Any:
        if isinstance(obj, np.generic | np.ndarray):
            return obj.tolist()
        if isinstance(obj, os.PathLike):
            return os.fspath(obj)
        raise TypeError(f"{type(obj).__name__} is not JSON serialisable")

    try:
        return json.loads(json.dumps(value, default=default))
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"Cannot store the {what} in manifest.json: {exc}") from exc


def _aside(target: Path) -> Path:
    return target.with_name(f".{target.name}.old")


def _check_replaceable(target: Path) -> None:
    foreign = target.is_dir() and not set(os.listdir(target)) <= _KNOWN_FILES
    if foreign or (target.exists() and not target.is_dir()):
        raise CheckpointError(
            f"Refusing to replace {target}: it exists and is not a polytrain checkpoint. "
            "Choose another directory."
        )


def _recover(target: Path) -> None:
    """Undo what an interrupted save left next to ``target`` (the writer only)."""
    aside = _aside(target)
    if aside.exists() and not target.exists():
        os.rename(aside, target)  # killed between the two renames: restore the old one
        fsync_dir(target.parent)
    shutil.rmtree(aside, ignore_errors=True)
    for leftover in target.parent.glob(f".{target.name}.tmp-*"):
        shutil.rmtree(leftover, ignore_errors=True)


# -- reading --------------------------------------------------------------------------------------


def _run_dirs(path: Path) -> list[Path]:
    """The run folders ``path`` may name: itself, and its parent if it is ``checkpoints``."""
    return [path] + ([path.parent] if path.name == "checkpoints" else [])


def run_folder(path: PathLike) -> Path | None:
    """The run folder ``path`` names (itself, or the parent of its ``checkpoints/``), where
    ``train --resume`` goes on writing; None for a checkpoint directory itself."""
    path = Path(path)
    for folder in _run_dirs(path):
        if (folder / "checkpoints").is_dir() and not (folder / MANIFEST_FILE).is_file():
            return folder
    return None


def find_checkpoint(path: PathLike) -> Path:
    """The checkpoint directory ``path`` names: itself, or a run directory's (or its
    ``checkpoints/`` directory's) latest complete checkpoint."""
    path = Path(path)
    if (path / MANIFEST_FILE).is_file():
        return path
    for run_dir in _run_dirs(path):
        checkpoints = run_dir / "checkpoints"
        if (checkpoints / "latest").exists() or _step_dirs(checkpoints):
            found = CheckpointManager(run_dir).latest()
            if found is None:
                raise CheckpointError(
                    f"{path} holds no complete checkpoint: {missing_checkpoint(run_dir)}; "
                    "to start again in it: --overwrite instead of --resume."
                )
            return found
    aside = _aside(path.absolute())
    if not path.exists() and (aside / MANIFEST_FILE).is_file():
        warnings.warn(
            f"{path} is missing: a save was interrupted. Using the previous checkpoint "
            f"{aside}; the next save to {path} restores or replaces it.",
            RuntimeWarning,
            stacklevel=2,
        )
        return aside
    if path.is_dir() and (path / MODEL_FILE).exists():
        raise CheckpointError(
            f"{path} has no {MANIFEST_FILE}: it is incomplete or not a polytrain checkpoint."
        )
    if any((path / marker).exists() for marker in _RUN_MARKERS):
        raise CheckpointError(
            f"{path} holds a run with no checkpoint to resume: {missing_checkpoint(path)}; "
            "to start again in it: --overwrite instead of --resume."
        )
    raise CheckpointError(
        f"No checkpoint at {path}: expected a checkpoint directory (with {MANIFEST_FILE}) "
        "or a run directory (with checkpoints/)."
    )


def missing_checkpoint(run_dir: PathLike) -> str:
    """Why the run in ``run_dir`` has no checkpoint ``--resume`` would take (the words
    after "no checkpoint to resume: "); it names a set-aside checkpoint that can be
    resumed explicitly, if there is one."""
    checkpoints = Path(run_dir).absolute() / "checkpoints"
    aside = [p for _, p in reversed(_step_dirs(checkpoints / ASIDE_DIR))]
    usable = next((p for p in aside if not _invalid(p) and _finite_params(p)), None)
    if usable is not None:
        return (
            f"its checkpoints were set aside in {usable.parent} when the run went wrong; "
            f"to go on from the newest anyway: --resume {usable} (it stops again unless that "
            "stop was too strict: then raise --max-loss-growth)"
        )
    if aside:
        return (
            f"its only checkpoints were set aside in {aside[0].parent} with NaN/Inf weights "
            "or damaged, and nothing can train from them"
        )
    if incomplete := sorted(checkpoints.glob(".step-*.tmp-*")):
        return (
            f"its first checkpoint was never completed (the save was interrupted: "
            f"{incomplete[-1].name} is ignored)"
        )
    if _step_dirs(checkpoints):
        return f"no checkpoint in {checkpoints} is complete and uncorrupted"
    return "it stopped before its first checkpoint"


def is_set_aside(path: PathLike) -> bool:
    """Whether the checkpoint directory ``path`` was set aside by a run's stop
    (``checkpoints/diverged/step-N``)."""
    path = Path(path).absolute()
    return path.parent.name == ASIDE_DIR and path.parent.parent.name == "checkpoints"


def _finite_params(path: Path) -> bool:
    """Whether the float parameters of the (valid) checkpoint ``path`` are all finite."""
    arrays = stnp.load((path / MODEL_FILE).read_bytes())
    return all(a.dtype.kind != "f" or bool(np.isfinite(a).all()) for a in arrays.values())


def _is_position(value: Any) -> bool:
    return isinstance(value, dict) and all(
        isinstance(value.get(k), int) and not isinstance(value.get(k), bool) and value[k] >= 0
        for k in ("epoch", "step", "global_step")
    )


# What each manifest field must hold for a reader to use it without surprises.
_MANIFEST_TYPES: dict[str, Any] = {
    "files": lambda v: (
        isinstance(v, dict)
        and isinstance(v.get(MODEL_FILE), dict)
        and all(isinstance(e, dict) for e in v.values())
    ),
    "model": lambda v: isinstance(v, dict),
    "optimizer": lambda v: v is None or (isinstance(v, dict) and isinstance(v.get("slots"), dict)),
    "position": _is_position,
    "recipe": lambda v: v is None or isinstance(v, dict),
    "scaler": lambda v: v is None or isinstance(v, dict),
    "history": lambda v: v is None or (isinstance(v, list) and all(isinstance(h, dict) for h in v)),
    "extra": lambda v: v is None or isinstance(v, dict),
}


def read_manifest(directory: PathLike) -> dict[str, Any]:
    """The parsed manifest of a checkpoint directory, its format and version checked."""
    from polytrain._version import __version__

    file = Path(directory) / MANIFEST_FILE
    try:
        manifest = json.loads(file.read_text(encoding="utf-8"))
    except OSError as exc:
        raise CheckpointError(f"Cannot read {file}: {exc.strerror or exc}.") from exc
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        raise CheckpointError(
            f"{file} is not valid JSON ({exc}): the checkpoint is corrupt."
        ) from exc
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CheckpointError(f"{file} is not a polytrain checkpoint manifest (format {FORMAT!r}).")
    version = manifest.get("format_version")
    if not isinstance(version, int) or version < 1:
        raise CheckpointError(f"{file} has an invalid format_version {version!r}.")
    if version > FORMAT_VERSION:
        raise CheckpointError(
            f"{file.parent} uses checkpoint format version {version} (written by polytrain "
            f"{manifest.get('polytrain_version', '?')}); this polytrain {__version__} reads "
            f"format version {FORMAT_VERSION} at most. Upgrade polytrain: pip install -U polytrain"
        )
    missing = [k for k in ("files", "model", "optimizer", "position") if k not in manifest]
    if missing:
        raise CheckpointError(f"{file} is malformed: missing {', '.join(missing)}.")
    wrong = [key for key, ok in _MANIFEST_TYPES.items() if not ok(manifest.get(key))]
    if wrong:
        raise CheckpointError(
            f"{file} is malformed: wrong type for {', '.join(wrong)}. The checkpoint was "
            "damaged or edited; use an earlier checkpoint."
        )
    check_manifest(file, manifest)  # the numbers: a string, a negative or huge step
    return manifest


def load_checkpoint(
    path: PathLike, *, spec: ModelSpec | None = None, verify: bool = True
) -> Checkpoint:
    """Load a checkpoint (or a run directory's latest). ``verify`` checks each file's
    sha256; ``spec`` must then be the model the checkpoint holds. Never unpickles."""
    directory = find_checkpoint(path)
    manifest = read_manifest(directory)
    with _malformed(directory):
        if spec is not None:
            _check_spec(directory, manifest, spec)
        files = manifest["files"]
        params = _read_tensors(directory, MODEL_FILE, files[MODEL_FILE], verify)
        optimizer_state = opt = manifest["optimizer"]
        if opt is not None:
            flat = {}
            if OPTIMIZER_FILE in files:
                flat = _read_tensors(directory, OPTIMIZER_FILE, files[OPTIMIZER_FILE], verify)
            slots = {p: {s: flat[f"{p}/{s}"] for s in names} for p, names in opt["slots"].items()}
            optimizer_state = {**opt, "slots": slots}
        return Checkpoint(
            path=directory,
            params=params,
            optimizer_state=optimizer_state,
            manifest=manifest,
            position=manifest["position"],
            recipe=manifest.get("recipe"),
            scaler=manifest.get("scaler"),
            history=manifest.get("history") or [],
        )


@contextlib.contextmanager
def _malformed(directory: Path) -> Iterator[None]:
    """Report manifest fields that are missing or of the wrong type as a CheckpointError."""
    try:
        yield
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        raise CheckpointError(f"{directory / MANIFEST_FILE} is malformed: {exc!r}.") from exc


def _read_verified(file: Path, entry: Mapping[str, Any], verify: bool) -> bytes:
    try:
        blob = file.read_bytes()
    except OSError as exc:
        raise CheckpointError(f"Cannot read {file}: {exc.strerror or exc}.") from exc
    if len(blob) != entry["size"]:
        raise CheckpointError(
            f"{file} is truncated or corrupt: {len(blob)} bytes, the manifest says {entry['size']}."
        )
    if verify and hashlib.sha256(blob).hexdigest() != entry["sha256"]:
        raise CheckpointError(f"{file} is corrupt: its sha256 does not match the manifest.")
    return blob


def _read_tensors(
    directory: Path, fname: str, entry: Mapping[str, Any], verify: bool
) -> dict[str, np.ndarray]:
    file = directory / fname
    blob = _read_verified(file, entry, verify)
    try:
        arrays: dict[str, np.ndarray] = stnp.load(blob)
    except Exception as exc:  # safetensors' own error type; never show a raw traceback
        raise CheckpointError(f"{file} is not a valid safetensors file: {exc}.") from exc
    expected = {n: (tuple(t["shape"]), t["dtype"]) for n, t in entry["tensors"].items()}
    found = {n: (a.shape, str(a.dtype)) for n, a in arrays.items()}
    if found != expected:
        bad = sorted(n for n in expected.keys() | found.keys() if found.get(n) != expected.get(n))
        details = ", ".join(
            f"{n}: file {found.get(n)}, manifest {expected.get(n)}" for n in bad[:_LIST_MAX]
        )
        raise CheckpointError(f"{file} does not match the manifest: {details}.")
    return {n: arrays[n] for n in expected}  # in model order


def _check_spec(directory: Path, manifest: Mapping[str, Any], spec: ModelSpec) -> None:
    name = manifest["model"]["name"]
    shapes = {n: tuple(t["shape"]) for n, t in manifest["files"][MODEL_FILE]["tensors"].items()}
    lines = []
    if name not in (None, spec.name):
        lines.append(f"  it holds model {name!r}, not {spec.name!r}")
    problems = _shape_problems(shapes, spec.parameter_shapes(), "checkpoint")
    if problems:
        lines.append(problems)
    if lines:
        raise CheckpointError(
            f"Checkpoint {directory} does not match model {spec.name!r}:\n"
            + "\n".join(lines)
            + f"\nLoad it with the model it was saved from ({name or 'see its manifest.json'})."
        )


def _shape_problems(
    have: Mapping[str, tuple[int, ...]], want: Mapping[str, tuple[int, ...]], label: str
) -> str:
    found = compare_shapes(want, have)
    wrong = [f"{w.name} ({label} {w.found}, model {w.expected})" for w in found.wrong_shape]
    return "\n".join(
        f"  {head} ({len(items)}): {name_list(items, _LIST_MAX)}"
        for head, items in (
            (f"missing from the {label}", found.missing),
            (f"unexpected in the {label}", found.unexpected),
            ("wrong shape", wrong),
        )
        if items
    )


def describe_checkpoint(path: PathLike) -> str:
    """A few lines for ``polytrain`` CLI users: what a checkpoint holds (manifest only)."""
    directory = find_checkpoint(path)
    m = read_manifest(directory)
    with _malformed(directory):
        return _describe(directory, m)


def _describe(directory: Path, m: dict[str, Any]) -> str:
    pos, backend, opt = m["position"], m["backend"], m["optimizer"]
    tensors = m["files"][MODEL_FILE]["tensors"]
    count = sum(int(np.prod(t["shape"])) for t in tensors.values())
    spec_note = "spec included" if m["model"]["spec"] else "no spec: a user model"
    lines = [
        f"checkpoint  {directory}",
        f"model       {m['model']['name'] or '?'} ({spec_note})",
        f"written by  {backend['name'] or '?'} {backend['framework_version'] or ''}".rstrip()
        + f", polytrain {m.get('polytrain_version', '?')}, {m.get('created', '?')}",
        f"position    epoch {pos['epoch']}, step {pos['step']}, global step {pos['global_step']}",
        f"tensors     {len(tensors)} ({count:,} values)",
    ]
    if opt is not None:
        slots = sum(len(s) for s in opt["slots"].values())
        opt = f"{opt['config'].get('name')}, lr {opt['lr']:g}, step {opt['step']}, {slots} slots"
    lines += [f"optimizer   {opt or 'none'}", f"scaler      {m.get('scaler') or 'none'}"]
    return "\n".join(lines)


# -- several checkpoints in a run directory -------------------------------------------------------


def _step_dirs(directory: Path) -> list[tuple[int, Path]]:
    """Visible ``step-N`` checkpoint directories, oldest first."""
    if not directory.is_dir():
        return []
    found = [
        (int(m.group(1)), p) for p in directory.iterdir() if (m := _STEP_DIR.fullmatch(p.name))
    ]
    return sorted(found)


class CheckpointManager:
    """``run_dir/checkpoints/step-<global_step>/`` plus a ``latest`` pointer; keeps the
    newest ``keep`` checkpoints (and always the one ``latest`` names)."""

    def __init__(self, run_dir: PathLike, keep: int = 2) -> None:
        if keep < 1:
            raise ConfigError(f"keep must be >= 1, got {keep!r}.")
        self.run_dir = Path(run_dir).absolute()
        self.directory = self.run_dir / "checkpoints"
        self.keep = keep
        self.protected: Path | None = None  # never pruned (the trainer's last good one)

    @property
    def pointer(self) -> Path:
        return self.directory / "latest"

    def save(self, **kwargs: Any) -> Path:
        """:func:`save_checkpoint` into ``step-<global_step>``, then point ``latest`` at it
        and prune. Takes the same keyword arguments; ``position`` must give global_step."""
        position = kwargs.get("position") or {}
        if "global_step" not in position:
            raise ConfigError("CheckpointManager.save needs position={'global_step': N, ...}.")
        step = int(position["global_step"])
        path = save_checkpoint(self.directory / f"step-{step:08d}", **kwargs)
        self.point(path)
        self.prune()
        return path

    def save_aside(self, **kwargs: Any) -> Path:
        """:func:`save_checkpoint` into ``diverged/step-<global_step>`` (a state a run must
        not resume from, kept for inspection); ``latest`` is not touched."""
        step = int((kwargs.get("position") or {}).get("global_step", 0))
        return save_checkpoint(self.directory / ASIDE_DIR / f"step-{step:08d}", **kwargs)

    def point(self, path: Path) -> None:
        """Make ``latest`` name ``path`` (a ``step-N`` directory of this run)."""
        step = int(path.name.split("-")[1])
        atomic_write_text(
            self.pointer, json.dumps({"checkpoint": path.name, "global_step": step}) + "\n"
        )

    def keep_as(self, path: Path, name: str) -> Path:
        """Copy the checkpoint ``path`` to ``checkpoints/<name>`` (replacing an older one
        atomically, as :func:`save_checkpoint` does); :meth:`prune` never touches it."""
        target = self.directory / name
        _check_replaceable(target)
        _recover(target)
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=self.directory))
        aside = _aside(target)
        try:
            apply_umask(tmp, directory=True)
            for file in sorted(path.iterdir(), key=lambda f: f.name == MANIFEST_FILE):
                shutil.copyfile(file, tmp / file.name)  # the manifest last
                with open(tmp / file.name, "rb") as fh:
                    os.fsync(fh.fileno())
            fsync_dir(tmp)
            if target.exists():
                os.rename(target, aside)
            os.rename(tmp, target)
            fsync_dir(self.directory)
        except BaseException:
            _recover(target)
            raise
        shutil.rmtree(aside, ignore_errors=True)
        return target

    def set_aside(self, after: Path | None) -> list[Path]:
        """Move every checkpoint newer than ``after`` (all of them if None) into
        ``checkpoints/diverged/``, where ``--resume`` does not look, and point ``latest`` at
        ``after`` (or remove it); return the new places. Nothing is deleted."""
        moved = []
        aside = self.directory / ASIDE_DIR
        for path in self.checkpoints():
            if after is None or path.name > after.name:
                aside.mkdir(exist_ok=True)
                target = aside / path.name
                if target.exists():
                    shutil.rmtree(target)
                os.rename(path, target)
                moved.append(target)
        if after is not None:
            self.point(after)
        else:
            self.pointer.unlink(missing_ok=True)
        fsync_dir(self.directory)
        return moved

    def checkpoints(self) -> list[Path]:
        """Every ``step-N`` directory, oldest first (complete or not)."""
        return [p for _, p in _step_dirs(self.directory)]

    def _pointed(self) -> tuple[Path | None, str]:
        try:
            name = json.loads(self.pointer.read_text(encoding="utf-8"))["checkpoint"]
        except FileNotFoundError:
            return None, f"{self.pointer} does not exist"
        except (OSError, ValueError, KeyError, TypeError) as exc:
            return None, f"{self.pointer} is unreadable ({exc!r})"
        if not isinstance(name, str) or not _STEP_DIR.fullmatch(name):
            return None, f"{self.pointer} names {name!r}, not a step-N checkpoint"
        return self.directory / name, ""

    def latest(self) -> Path | None:
        """The checkpoint ``latest`` names if it is complete and valid; otherwise, with a
        warning, the newest valid one; None if there is none."""
        pointed, problem = self._pointed()
        if pointed is not None:
            problem = _invalid(pointed)
            if not problem:
                return pointed
        candidates = [p for p in reversed(self.checkpoints()) if p != pointed]
        for path in candidates:
            if not _invalid(path):
                warnings.warn(
                    f"{problem}; using the newest valid checkpoint {path}.",
                    RuntimeWarning,
                    stacklevel=2,
                )
                return path
        if pointed is not None or candidates:
            warnings.warn(
                f"{problem}; no valid checkpoint in {self.directory}.", RuntimeWarning, stacklevel=2
            )
        return None

    def prune(self) -> list[Path]:
        """Remove all but the newest ``keep`` checkpoints (never the one ``latest`` names)
        and whatever interrupted saves left behind; return what was removed."""
        pointed, _ = self._pointed()
        for hidden in self.directory.glob(".step-*.old"):
            _recover(hidden.with_name(hidden.name[1:-4]))
        for leftover in self.directory.glob(".step-*.t*"):  # tmp-* of a killed save, trash
            shutil.rmtree(leftover, ignore_errors=True)
        for leftover in self.directory.glob(f".{self.pointer.name}.*.tmp"):  # see atomic_path
            leftover.unlink(missing_ok=True)
        removed = []
        for path in self.checkpoints()[: -self.keep]:
            if path not in (pointed, self.protected):
                trash = path.with_name(f".{path.name}.trash")
                os.rename(path, trash)  # disappears at once, then is deleted
                shutil.rmtree(trash, ignore_errors=True)
                removed.append(path)
        return removed


def _invalid(path: Path) -> str:
    """Why ``path`` is not a complete, uncorrupted checkpoint ('' if it is)."""
    try:
        manifest = read_manifest(path)
        with _malformed(path):
            for fname, entry in manifest["files"].items():
                _read_verified(path / fname, entry, verify=True)
    except CheckpointError as exc:
        return str(exc)
    return ""
