"""Port a run's optimizer state with its weights: ``polytrain convert W OUT --optimizer F``.

The weights file's plugin reads the optimizer file of the same run (its
``NativeFormat.read_optimizer``) into canonical slots named as the weights file names its
tensors; here they take the weights' canonical names and layout (a slot of a weight
stored transposed is transposed with it) and the model's parameter order. Then either

* ``--to neutral``: one checkpoint with the optimizer state (``Optimizer.state_dict()``
  form: config, step, lr, slots), so that ``polytrain train --resume`` continues with it;
* ``--to FORMAT``: the weights file, plus an optimizer file written by the target's
  plugin (``NativeFormat.encode_optimizer``; ``--optimizer-out``, by default the output
  with ``.optimizer`` before its suffix) and, where the run had a learning-rate schedule,
  its scheduler file (``encode_scheduler``; ``--scheduler-out``, by default ``.scheduler``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from polytrain.backend.optimizer_file import OptimizerFile, parse_settings
from polytrain.errors import CheckpointError, ConfigError, PolytrainError
from polytrain.io import native as native_io
from polytrain.io.checkpoint import save_checkpoint
from polytrain.io.convert import (
    ConvertReport,
    Weights,
    conversion_inputs,
    read_weights_with_map,
    write_weights,
)
from polytrain.io.name_map import NameMap
from polytrain.io.native import NEUTRAL
from polytrain.neutral.models import ModelSpec
from polytrain.neutral.optim import OPTIMIZERS as NEUTRAL_RULES
from polytrain.neutral.optim import OptimizerConfig
from polytrain.utils.fileio import atomic_write_bytes
from polytrain.utils.output_paths import refuse_overwriting_inputs
from polytrain.utils.user_files import regular_file

PathLike = str | os.PathLike[str]


def read_optimizer_state(
    path: PathLike,
    weights: Weights,
    name_map: NameMap | None,
    settings: Mapping[str, Any] | list[str] | None = None,
) -> OptimizerFile:
    """The optimizer state in ``path`` (the run of ``weights``, read with ``name_map``)
    with canonical names and layout, parameters in the order of ``weights.params``;
    master weights, when the file has them, replace ``weights.params`` entries."""
    if weights.format == NEUTRAL or name_map is None:
        raise ConfigError(
            f"{weights.path} is a neutral checkpoint: it carries its own optimizer state."
        )
    packed = [name for name, e in name_map.entries.items() if e.parts]
    if packed:  # q/k/v Linears joined into PyTorch's in_proj_weight (polytrain.io.attention)
        raise ConfigError(
            f"polytrain does not port the optimizer state of packed attention tensors yet "
            f"({', '.join(packed[:2])}{' ...' if len(packed) > 2 else ''}, joined from "
            f"{len(name_map.entries[packed[0]].parts)} tensors of {weights.path}): convert "
            "the weights without --optimizer."
        )
    given = parse_settings(settings)
    regular_file(path, "the optimizer file (--optimizer)")  # a FIFO would block its reader
    native = native_io.get_format(weights.format).read_optimizer(path, weights.path, given)
    entries = {e.native: (name, e.transpose) for name, e in name_map.entries.items()}
    strays = [n for n in (*native.slots, *native.master_weights) if n not in entries]
    if strays:
        raise CheckpointError(
            f"{os.fspath(path)} has state for {', '.join(strays[:4])}, which the weights of "
            f"{weights.path} do not map: are both files from the same run?"
        )

    def canonical(native_name: str, value: np.ndarray) -> tuple[str, np.ndarray]:
        name, transpose = entries[native_name]
        value = np.asarray(value)
        value = np.ascontiguousarray(value.T if transpose else value)
        if value.shape != np.shape(weights.params[name]):
            raise CheckpointError(
                f"{os.fspath(path)}: the state of {native_name!r} has shape {value.shape}, "
                f"the weight {np.shape(weights.params[name])}."
            )
        return name, value

    by_name = {
        entries[n][0]: {slot: canonical(n, v)[1] for slot, v in slots.items()}
        for n, slots in native.slots.items()
    }
    order = [name for name in weights.params if name in by_name]
    masters = dict(canonical(n, v) for n, v in native.master_weights.items())
    weights.params.update({n: v.astype(np.float32) for n, v in masters.items()})
    return OptimizerFile(
        native.rule,
        native.hyper,
        native.step,
        {name: by_name[name] for name in order},
        {name: tuple(np.shape(weights.params[name])) for name in order},
        masters,
        list(native.notes),
        native.variant,
        native.scheduler,
    )


def neutral_state(state: OptimizerFile) -> dict[str, Any]:
    """``Optimizer.state_dict()`` of the canonical rules for ``state``; a rule polytrain
    train has not (AdamW with weight decay, Nesterov momentum, Adamax, Adadelta, RMSProp,
    a framework's variant, a schedule) is an error naming ``--to torch``."""
    h = state.hyper
    name = "adam" if state.rule == "adamw" and not h["weight_decay"] else state.rule
    lacks = None
    if name not in NEUTRAL_RULES or state.variant:
        lacks = f"no {state.rule} optimizer{' of that rule' if state.variant else ''}"
    elif h.get("nesterov"):
        lacks = "no Nesterov momentum"
    elif state.scheduler is not None:
        lacks = f"no {state.scheduler['kind']} schedule in its checkpoint"
    if lacks:
        raise ConfigError(
            f"polytrain train has {lacks}: the state converts to PyTorch (--to torch), not "
            "to a neutral checkpoint."
        )
    config = OptimizerConfig(
        name=name,
        lr=float(h["lr"]),
        momentum=float(h.get("momentum", OptimizerConfig.momentum)),
        weight_decay=float(h["weight_decay"]),
        betas=tuple(h.get("betas", OptimizerConfig().betas)),
        eps=h.get("eps"),
    )
    return {"config": config.to_dict(), "step": state.step, "lr": float(h["lr"]),
            "slots": state.slots}  # fmt: skip


def scheduler_path(output: PathLike) -> Path:
    """Where the scheduler file goes by default: ``out.pt`` -> ``out.scheduler.pt``."""
    out = Path(output)
    return out.with_name(f"{out.stem}.scheduler{out.suffix}")


def optimizer_path(output: PathLike) -> Path:
    """Where the optimizer file goes by default: ``out.pt`` -> ``out.optimizer.pt``."""
    out = Path(output)
    return out.with_name(f"{out.stem}.optimizer{out.suffix}")


def convert_with_optimizer(
    source: PathLike,
    target: PathLike,
    to: str,
    *,
    optimizer: PathLike,
    settings: Mapping[str, Any] | list[str] | None = None,
    optimizer_out: PathLike | None = None,
    scheduler_out: PathLike | None = None,
    model: str | ModelSpec | None = None,
    name_map: PathLike | Mapping[str, Any] | None = None,
    dtype: str | None = None,
) -> ConvertReport:
    """:func:`~polytrain.io.convert.convert` of the weights ``source`` together with the
    optimizer state ``optimizer`` of the same run (see the module docstring). Nothing is
    written on any error, and no output is one of the inputs."""
    out = Path(optimizer_out) if optimizer_out else optimizer_path(target)
    sched_out = Path(scheduler_out) if scheduler_out else scheduler_path(target)
    native = to != NEUTRAL
    refuse_overwriting_inputs(
        {"the output": target, "--optimizer-out": out if native else None,
         "--scheduler-out": sched_out if native else None},
        {**conversion_inputs(source, name_map), "--optimizer": optimizer},
    )  # fmt: skip
    try:
        weights, read_map = read_weights_with_map(source, model=model, name_map=name_map, other=to)
        state = read_optimizer_state(optimizer, weights, read_map, settings)
        if to == NEUTRAL:
            origin = {"format": weights.format, "path": str(weights.path),
                      "optimizer": os.fspath(optimizer)}  # fmt: skip
            written = [
                save_checkpoint(
                    target,
                    params=weights.params,
                    optimizer_state=neutral_state(state),
                    spec=weights.spec,
                    extra={"converted_from": origin},
                    param_dtype=dtype or "float32",
                )
            ]
        else:
            written = _write_native(target, to, weights, state, (out, sched_out),
                                    name_map=name_map, dtype=dtype)  # fmt: skip
    except PolytrainError as exc:  # the CLI prints one line
        raise type(exc)(" ".join(str(exc).split())) from exc
    except OSError as exc:
        raise CheckpointError(f"Cannot write {target}: {exc.strerror or exc}.") from exc
    slots = sum(len(s) for s in state.slots.values())
    notes = [
        *weights.notes,
        *state.notes,
        f"optimizer state: {state.rule}, step {state.step}, lr {state.hyper['lr']:g}, "
        f"{len(state.slots)} parameters, {slots} slots -> {written[1 if native else 0]}",
    ]
    if native and state.scheduler:
        notes.append(f"lr schedule: {state.scheduler['kind']}, step "
                     f"{state.scheduler['last_epoch']} -> {written[-1]}")  # fmt: skip
    return ConvertReport(
        source=Path(source),
        source_format=weights.format,
        target=written[0],
        target_format=to,
        model=weights.spec.name if weights.spec else None,
        tensors=len(weights.params),
        values=sum(int(np.size(a)) for a in weights.params.values()),
        notes=notes,
    )


def _write_native(
    target: PathLike,
    to: str,
    weights: Weights,
    state: OptimizerFile,
    outputs: tuple[Path, Path],
    *,
    name_map: PathLike | Mapping[str, Any] | None,
    dtype: str | None,
) -> list[Path]:
    """Write the weights, the optimizer file and (with a schedule) the scheduler file of
    format ``to``, all encoded before the first is written: the paths written."""
    plugin = native_io.get_format(to)
    blob = plugin.encode_optimizer(state)
    schedule = plugin.encode_scheduler(state) if state.scheduler else None
    written = [write_weights(target, weights, to, name_map=name_map, other=weights.format,
                             dtype=dtype)]  # fmt: skip
    for path, data in zip(outputs, (blob, schedule), strict=True):
        if data is not None:
            atomic_write_bytes(path, data)
            written.append(path)
    return written
