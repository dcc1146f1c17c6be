"""Generate the zoo maps polytrain ships (``polytrain/io/zoo_maps/``), each verified:

    pip install --no-deps --target /tmp/tvlib torchvision==0.28.0   # torch 2.13's
    PYTHONPATH=/tmp/tvlib python -m benchmarks.zoo_maps [--only paddle:densenet121 ...]

For every pair of ``benchmarks.zoo_twins.TWINS`` (a Paddle or Gluon zoo model and its
torchvision twin), with random weights and BatchNorm statistics: ``polytrain port`` pairs
the two models and compares them layer by layer on one batch (it must pass); its map
becomes the shipped file (torchvision's state dict in order: names, shapes and the zoo
file's tensor for each). Then the shipped path itself is checked: the zoo model saved as
its framework saves it, ``convert --zoo`` into a ``.pt``, loaded into a fresh torchvision
model with ``strict=True``, logits compared with the zoo model's; and the ``.pt``
converted back with the same map gives the saved file's tensors bit for bit. The pairs of
``TRIED`` are ported too and must fail: their reason goes into ``index.json``. Prints the
table of docs/porting.md ("Zoo models without the objects").

torchvision comes from PyPI as a CUDA build whose C operators do not load beside a CPU
torch (``import torchvision`` fails registering ``torchvision::nms``); its model
definitions need none of them, so they are imported without the package's ``__init__``.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import sys
import tempfile
import time
import types
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from polytrain.errors import PolytrainError
from polytrain.io import native as native_io
from polytrain.io.convert import convert
from polytrain.io.zoo import INDEX, convert_zoo, load_zoo_map, maps_folder
from polytrain.porting.api import PortResult, port
from polytrain.utils.fileio import atomic_write_text

from .zoo_twins import NO_COUNTERPART, TRIED, TWINS, Twin, build_source, save_source, source_logits

HEAD_PROBE = 10  # a class count that differs from the zoo's, to find the classifier's tensors


def torchvision_models() -> Any:
    """``torchvision.models``; where torchvision's C operators fail to load (a CUDA build
    beside a CPU torch), its model definitions without the package's ``__init__``."""
    try:
        import torchvision.models as models

        return models
    except (ImportError, OSError, RuntimeError):
        for name in [n for n in sys.modules if n.split(".")[0] == "torchvision"]:
            del sys.modules[name]
    spec = importlib.util.find_spec("torchvision")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("torchvision is not importable: see this module's docstring")
    package = types.ModuleType("torchvision")
    package.__path__ = list(spec.submodule_search_locations)
    sys.modules["torchvision"] = package
    import torchvision.models as models

    return models


def build_twin(twin: Twin, classes: int | None = None, *, meta: bool = False) -> Any:
    """torchvision's model (``meta``: without memory, for its names and shapes)."""
    import torch

    kwargs = {**twin.tv_kwargs, **({"num_classes": classes} if classes else {})}
    builder = getattr(torchvision_models(), twin.torchvision)
    if meta:
        with torch.device("meta"):
            return builder(weights=None, **kwargs)
    torch.manual_seed(0)
    return builder(weights=None, **kwargs).eval()


def head_names(twin: Twin) -> list[str]:
    """torchvision's tensors whose shapes change with the class count (the classifier)."""
    default = {k: tuple(v.shape) for k, v in build_twin(twin, meta=True).state_dict().items()}
    probe = build_twin(twin, HEAD_PROBE, meta=True).state_dict()
    return [k for k, v in probe.items() if tuple(v.shape) != default[k]]


def map_rows(result: PortResult, target: Any) -> list[list[Any]]:
    """torchvision's state dict in order: [name, shape] (the target's own entry), or
    [name, shape, native] (+ "transposed")."""
    rows: list[list[Any]] = []
    for name, value in target.state_dict().items():
        row: list[Any] = [name, list(value.shape)]
        entry = result.name_map.get(name)
        if entry is None:
            if name not in result.kept:
                raise SystemExit(f"{name} is neither ported nor kept")
        else:
            if not isinstance(entry["native"], str):
                raise SystemExit(f"{name}: a packed tensor; the zoo maps have none")
            row += [entry["native"], *(["transposed"] if entry["transpose"] else [])]
        rows.append(row)
    return rows


def port_figures(result: PortResult) -> dict[str, Any]:
    rows = result.verification.rows
    out = rows[-1]
    layers = [r.relative for r in rows[:-1] if r.relative is not None]
    return {
        "layers": len(result.pairs),
        "port_logit_abs": float(out.max_abs_diff or 0.0),
        "port_logit_relative": float(out.relative or 0.0),
        "port_worst_layer_relative": float(max(layers, default=0.0)),
    }


def write_map(path: Path, data: dict[str, Any]) -> None:
    """The map as JSON, one tensor a line."""
    head = json.dumps({k: v for k, v in data.items() if k != "tensors"}, indent=1)
    rows = ",\n".join("  " + json.dumps(row) for row in data["tensors"])
    atomic_write_text(path, f'{head[:-2]},\n "tensors": [\n{rows}\n ]\n}}\n')


def versions(twin: Twin) -> dict[str, str]:
    framework = "paddlepaddle" if twin.zoo == "paddle" else "mxnet"
    return {name: metadata.version(name) for name in (framework, "torch", "torchvision")}


def generate(twin: Twin, work: Path, rng: np.random.Generator) -> dict[str, Any]:
    """Port, write the map into ``work``, check the shipped path; the map's data."""
    source, target = build_source(twin, rng), build_twin(twin)
    batch = rng.standard_normal((1, 3, twin.size, twin.size)).astype(np.float32)
    result = port(source, target, inputs=batch)
    if not result.passed:
        raise SystemExit(f"{twin.key}: polytrain port failed\n{result.format()}")
    verified = {"by": "python -m benchmarks.zoo_maps", "input": list(batch.shape),
                **port_figures(result), "versions": versions(twin)}  # fmt: skip
    head = head_names(twin)
    data = {
        "zoo": twin.key,
        "source": twin.source_call(), "torchvision": twin.torchvision_call(),
        "classes": int(target.state_dict()[head[0]].shape[0]), "head": head,
        "verified": verified, "tensors": map_rows(result, target),
    }  # fmt: skip
    write_map(work / map_file(twin), data)
    _write_index(work, {twin.key: {"file": map_file(twin)}}, {})
    verified.update(check_shipped_path(twin, source, batch, work))
    return data


def check_shipped_path(twin: Twin, source: Any, batch: np.ndarray, work: Path) -> dict[str, Any]:
    """The zoo model's saved file through ``convert --zoo`` into a fresh torchvision model
    (strict), logits compared; the ``.pt`` back with the same map, compared bit for bit."""
    import torch

    suffix = ".pdparams" if twin.zoo == "paddle" else ".params"
    saved, pt, back = work / f"model{suffix}", work / "model.pt", work / f"back{suffix}"
    save_source(twin, source, str(saved))
    convert_zoo(saved, pt, "torch", twin.key, folder=work)
    fresh = build_twin(twin)
    fresh.load_state_dict(torch.load(pt, weights_only=True), strict=True)
    with torch.no_grad():
        logits = fresh(torch.from_numpy(batch)).numpy()
    want = source_logits(twin, source, batch)
    gap = float(np.max(np.abs(logits - want)))
    zmap = load_zoo_map(twin.key, work)
    fmt = zmap.framework
    convert(pt, back, fmt, name_map=zmap.name_map(zmap.classes))
    original, returned = native_io.read_native(saved)[1], native_io.read_native(back)[1]
    same = original.keys() == returned.keys() and all(
        np.array_equal(original[k], returned[k]) for k in original
    )
    if not same:
        raise SystemExit(f"{twin.key}: the .pt converted back differs from the saved file")
    relative = gap / float(np.max(np.abs(want)))
    return {"convert_logit_abs": gap, "convert_logit_relative": relative,
            "round_trip": "identical"}  # fmt: skip


def map_file(twin: Twin) -> str:
    return f"{twin.zoo}.{twin.name}.json"


def why_not(twin: Twin, rng: np.random.Generator) -> str:
    """A tried pair's reason: what differs, and what polytrain port found."""
    source, target = build_source(twin, rng), build_twin(twin)
    batch = rng.standard_normal((1, 3, twin.size, twin.size)).astype(np.float32)
    try:
        result = port(source, target, inputs=batch)
    except PolytrainError as exc:
        found = ": ".join(str(exc).split(": ")[:2])  # where, and what differs
    else:
        first = result.verification.first_failure
        if result.passed or first is None:
            raise SystemExit(f"{twin.key} ports into {twin.torchvision_call()}: make it a twin")
        off = first.problem or f"relative {first.relative:.2g}"
        found = f"the outputs first differ at layer {first.layer} ({off})"
    return f"{twin.torchvision_call()} differs: {twin.why}; polytrain port: {found}."


ZOOS = {
    "paddle": {"format": "paddle", "label": "Paddle's paddle.vision.models"},
    "gluon": {"format": "mxnet", "label": "Gluon's model_zoo.vision"},
}


def _write_index(folder: Path, maps: dict[str, Any], no_twin: dict[str, str]) -> None:
    index = {"zoos": ZOOS, "maps": maps, "no_twin": no_twin}
    atomic_write_text(folder / INDEX, json.dumps(index, indent=1) + "\n")


def table(folder: Path, keys: list[str]) -> str:
    """The docs' table of the shipped maps (differences relative to the largest |logit|:
    random weights give logits up to ~1e5)."""
    lines = [
        "| zoo model | torchvision | tensors | largest \\|logit\\| | logits: port / "
        "convert --zoo | worst layer (port) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for key in keys:
        zmap = load_zoo_map(key, folder)
        v = zmap.verified
        tv = zmap.twin.removeprefix("torchvision.models.").replace("weights=None", "")
        tv = tv.replace("(, ", "(").replace("()", "")
        largest = v["convert_logit_abs"] / v["convert_logit_relative"]
        lines.append(
            f"| `{key}` | `{tv}` | {len(zmap.ported())} | {largest:.1e} | "
            f"{v['port_logit_relative']:.1e} / {v['convert_logit_relative']:.1e} | "
            f"{v['port_worst_layer_relative']:.1e} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.zoo_maps",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--only", nargs="*", default=None, metavar="ZOO:MODEL")
    parser.add_argument("--out", type=Path, default=maps_folder())
    args = parser.parse_args(argv)
    chosen = [t for t in TWINS if args.only is None or t.key in args.only]
    tried = [t for t in TRIED if args.only is None or t.key in args.only]
    args.out.mkdir(parents=True, exist_ok=True)
    old = json.loads((args.out / INDEX).read_text()) if (args.out / INDEX).exists() else {}
    maps, no_twin = dict(old.get("maps", {})), dict(old.get("no_twin", {}))
    for twin in chosen:
        maps[twin.key] = {"file": map_file(twin), **_one(twin, args.out)}
        _write_index(args.out, _ordered(maps), no_twin)
    for twin in tried:
        no_twin[twin.key] = why_not(twin, np.random.default_rng(0))
        print(f"{twin.key}: {no_twin[twin.key]}", flush=True)
        gc.collect()
    no_twin.update(NO_COUNTERPART)
    _write_index(args.out, _ordered(maps), dict(sorted(no_twin.items())))
    print(table(args.out, list(_ordered(maps))))
    return 0


def _one(twin: Twin, out: Path) -> dict[str, Any]:
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        data = generate(twin, Path(tmp), np.random.default_rng(0))
    write_map(out / map_file(twin), data)
    v = data["verified"]
    print(f"{twin.key}: {len(data['tensors'])} entries, port {v['port_logit_relative']:.1e}, "
          f"convert {v['convert_logit_relative']:.1e} ({time.perf_counter() - start:.0f} s)",
          flush=True)  # fmt: skip
    gc.collect()
    return {"torchvision": data["torchvision"]}


def _ordered(maps: dict[str, Any]) -> dict[str, Any]:
    """The maps in the tables' order."""
    order = {t.key: i for i, t in enumerate(TWINS)}
    return dict(sorted(maps.items(), key=lambda kv: order.get(kv[0], len(order))))


if __name__ == "__main__":
    raise SystemExit(main())
