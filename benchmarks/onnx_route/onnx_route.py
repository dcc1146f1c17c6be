"""The usual route from Paddle or Gluon to PyTorch, on the models of polytrain's port tests:
paddle2onnx (``paddle.onnx.export``) or MXNet's ``mx.onnx.export_model``, then onnx2torch.

Not part of the test suite: paddle2onnx and onnx2torch pull numpy 2, which breaks MXNet
1.9.1, and MXNet's exporter needs an onnx older than 1.16. See README.md beside this file::

    /tmp/onnxenv/bin/python benchmarks/onnx_route/onnx_route.py paddle --out DIR
    /tmp/mxonnx/bin/python  benchmarks/onnx_route/onnx_route.py gluon-export --out DIR
    /tmp/onnxenv/bin/python benchmarks/onnx_route/onnx_route.py gluon-convert --out DIR

Each model is built with fixed seeds (random BatchNorm statistics too), put in eval mode and
run on a fixed batch; the framework's own logits, the batch and the weights are written to
DIR so that ``polytrain_route.py`` ports the very same models. Results go to
``DIR/onnx_<framework>.json``: whether the route worked out of the box (else the first error,
one line), max |logit difference| relative to the largest logit for onnxruntime and for the
onnx2torch module, and a sample of the generated module's parameter names.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import types
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

SEED = 13
PADDLE_MODELS = {  # paddle.vision.models factory: input shape (AlexNet flattens 6x6 maps)
    "LeNet": (2, 1, 28, 28),
    "resnet18": (2, 3, 64, 64),
    "mobilenet_v2": (2, 3, 64, 64),
    "alexnet": (2, 3, 224, 224),
}
FIX_OPSET = 13  # paddle2onnx's default (9) exports Slice-1, which onnx2torch cannot convert
GLUON_MODELS = {  # gluon.model_zoo.vision name: input shape
    "resnet18_v1": (2, 3, 64, 64),
    "mobilenet1.0": (2, 3, 64, 64),
    "alexnet": (2, 3, 64, 64),
}


def one_line(error: BaseException) -> str:
    """``Type: message`` on one line, at most 200 characters."""
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text}"[:200]


def relative_diff(got: np.ndarray, want: np.ndarray) -> float:
    """max |got - want| over the largest |want|."""
    return float(np.abs(got - want).max() / np.abs(want).max())


def batch_for(shape: tuple[int, ...]) -> np.ndarray:
    return np.random.default_rng(SEED).standard_normal(shape).astype(np.float32)


# -- Paddle: build, export with paddle2onnx ---------------------------------------------------


def paddle_model(name: str) -> Any:
    """``paddle.vision.models.<name>(num_classes=10)``, seeded, BatchNorm statistics random."""
    import paddle
    from paddle.vision import models

    paddle.seed(SEED)
    model = getattr(models, name)(num_classes=10)
    rng = np.random.default_rng(SEED)
    state = model.state_dict()
    for key, value in state.items():
        if len(value.shape) != 1:
            continue
        if key.endswith(("_mean", "bias")):
            state[key] = paddle.to_tensor(rng.normal(0, 0.1, value.shape).astype("float32"))
        elif key.endswith(("_variance", "weight")):
            state[key] = paddle.to_tensor(rng.uniform(0.5, 1.5, value.shape).astype("float32"))
    model.set_state_dict(state)
    model.eval()
    return model


def paddle_reference(name: str, shape: tuple[int, ...], out: Path) -> Any:
    """The model; writes the batch, its own logits and its weights (.npz)."""
    import paddle

    model, batch = paddle_model(name), batch_for(shape)
    with paddle.no_grad():
        logits = model(paddle.to_tensor(batch)).numpy()
    np.save(out / f"paddle_{name}.input.npy", batch)
    np.save(out / f"paddle_{name}.logits.npy", logits)
    weights = {k: v.numpy() for k, v in model.state_dict().items()}
    np.savez(out / f"paddle_{name}.weights.npz", **weights)
    return model


def paddle_export(model: Any, shape: tuple[int, ...], prefix: Path, fixed: bool) -> Path:
    """``paddle.onnx.export`` with a dynamic batch dimension: its default opset, or, with
    ``fixed``, FIX_OPSET (the usual fix when onnx2torch lacks a converter for an old op)."""
    import paddle

    spec = [paddle.static.InputSpec([None, *shape[1:]], "float32", "x")]
    if fixed:
        paddle.onnx.export(model, str(prefix), input_spec=spec, opset_version=FIX_OPSET)
    else:
        paddle.onnx.export(model, str(prefix), input_spec=spec)
    return prefix.with_suffix(".onnx")


# -- Gluon: build, export with mx.onnx ------------------------------------------------------


def gluon_model(name: str, shape: tuple[int, ...]) -> Any:
    """``gluon.model_zoo.vision.get_model(name, classes=10)``, Xavier weights, seeded,
    BatchNorm statistics random, deferred shapes set by one call."""
    import mxnet as mx
    from mxnet.gluon.model_zoo import vision

    mx.random.seed(SEED)
    model = vision.get_model(name, classes=10)
    model.initialize(mx.init.Xavier())
    model(mx.nd.zeros((1, *shape[1:])))
    rng = np.random.default_rng(SEED)
    for key, param in model._collect_params_with_prefix().items():
        if key.endswith(("running_mean", "beta")):
            param.set_data(mx.nd.array(rng.normal(0, 0.1, param.shape).astype("float32")))
        elif key.endswith(("running_var", "gamma")):
            param.set_data(mx.nd.array(rng.uniform(0.5, 1.5, param.shape).astype("float32")))
    return model


def gluon_export(out: Path) -> int:
    """Writes each Gluon model's batch, logits, parameters and ``mx.onnx`` export (at the
    installed onnx's opset: export_model has no opset argument); its errors go to
    gluon_export.json."""
    import mxnet as mx

    errors = {}
    for name, shape in GLUON_MODELS.items():
        stem = f"gluon_{name}"
        model, batch = gluon_model(name, shape), batch_for(shape)
        logits = model(mx.nd.array(batch)).asnumpy()
        np.save(out / f"{stem}.input.npy", batch)
        np.save(out / f"{stem}.logits.npy", logits)
        model.save_parameters(str(out / f"{stem}.params"))
        try:
            model.hybridize()
            model(mx.nd.array(batch))
            model.export(str(out / stem))
            mx.onnx.export_model(
                str(out / f"{stem}-symbol.json"), str(out / f"{stem}-0000.params"),
                in_shapes=[shape], in_types=[np.float32],
                onnx_file_path=str(out / f"{stem}.onnx"),
            )  # fmt: skip
        except Exception as error:  # the route's own failure is the measurement
            errors[name] = one_line(error)
        print(f"{name}: {errors.get(name, 'exported')}", flush=True)
    (out / "gluon_export.json").write_text(json.dumps(errors, indent=1))
    return 0


# -- onnx2torch --------------------------------------------------------------------------------


def import_onnx2torch() -> tuple[Any, str | None]:
    """onnx2torch, and the error its plain import raised (None if it imported).

    onnx2torch imports torchvision for two converters (NonMaxSuppression, RoiAlign); the
    torchvision wheel for torch 2.13 is a CUDA build that fails to import with CPU torch
    (``operator torchvision::nms does not exist``). The workaround: a stand-in torchvision
    whose two ops raise if a model ever uses them (none of these models does)."""
    try:
        return importlib.import_module("onnx2torch"), None
    except Exception as error:
        first = one_line(error)
    for key in [k for k in sys.modules if k.split(".")[0] in ("torchvision", "onnx2torch")]:
        del sys.modules[key]

    def unavailable(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("torchvision does not import here")

    ops = types.ModuleType("torchvision.ops")
    ops.nms = unavailable  # type: ignore[attr-defined]
    ops.roi_align = unavailable  # type: ignore[attr-defined]
    stand_in = types.ModuleType("torchvision")
    stand_in.ops = ops  # type: ignore[attr-defined]
    sys.modules.update({"torchvision": stand_in, "torchvision.ops": ops})
    return importlib.import_module("onnx2torch"), first


def onnx_to_torch(onnx_file: Path, batch: np.ndarray, logits: np.ndarray, row: dict) -> None:
    """Fills ``row`` from onnxruntime and onnx2torch on ``onnx_file``; saves the generated
    module's state_dict next to it (``.onnx2torch.pt``) for the twin check."""
    import onnx
    import onnxruntime
    import torch

    onnx2torch, _ = import_onnx2torch()
    proto = onnx.load(str(onnx_file))
    row["opset"] = max(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx"))
    session = onnxruntime.InferenceSession(str(onnx_file), providers=["CPUExecutionProvider"])
    feed = {session.get_inputs()[0].name: batch}
    row["onnxruntime_rel_diff"] = relative_diff(session.run(None, feed)[0], logits)
    module = onnx2torch.convert(proto).eval()
    with torch.no_grad():
        row["onnx2torch_rel_diff"] = relative_diff(module(torch.from_numpy(batch)).numpy(), logits)
    state = module.state_dict()
    row["tensors"] = len(state)
    row["trainable"] = sum(1 for _ in module.parameters())  # initializers become buffers
    row["names_sample"] = list(state)[:4] + list(state)[-2:]
    torch.save(state, onnx_file.with_suffix(".onnx2torch.pt"))


def attempt(row: dict, step: str, call: Callable[[], Any]) -> Any:
    """Runs one step of the route; on failure records ``step: error`` and returns None."""
    try:
        return call()
    except Exception as error:  # the route's own failure is the measurement
        row["error"] = f"{step}: {one_line(error)}"
        return None


def route(row: dict, exporter: str, export: Callable[[bool], Path], fix: str, out: Path) -> None:
    """Out of the box (``export(False)``), then, if that failed, with the usual fix
    (``export(True)``, described by ``fix``): ``row`` gets the first error and the figures
    of the last try."""
    stem = f"{row['framework']}_{row['model']}"
    batch, logits = np.load(out / f"{stem}.input.npy"), np.load(out / f"{stem}.logits.npy")
    for fixed in (False, True):
        trial: dict[str, Any] = {"error": None}
        onnx_file = attempt(trial, exporter, partial(export, fixed))
        if onnx_file is not None:
            attempt(trial, "onnx2torch", partial(onnx_to_torch, onnx_file, batch, logits, trial))
        if not fixed:
            row["error"] = trial["error"]
        if trial["error"] is None or fixed:
            row.update({k: v for k, v in trial.items() if k != "error"})
            row["fixed_by"] = fix if fixed else None
            row["fix_error"] = trial["error"] if fixed else None
            return


def paddle_route(out: Path) -> int:
    _, import_error = import_onnx2torch()
    rows = []
    for name, shape in PADDLE_MODELS.items():
        row: dict[str, Any] = {"framework": "paddle", "model": name}
        model = paddle_reference(name, shape, out)
        export = partial(paddle_export, model, shape, out / f"paddle_{name}")
        route(row, "paddle2onnx", export, f"paddle.onnx.export(opset_version={FIX_OPSET})", out)
        finish(row, import_error)
        rows.append(row)
    (out / "onnx_paddle.json").write_text(json.dumps(rows, indent=1))
    return 0


def gluon_convert(out: Path) -> int:
    """onnx2torch on gluon-export's files; the fix: onnxoptimizer's ``eliminate_identity``
    (onnx2torch has no converter for Identity-19, which mx.onnx writes for Dropout)."""
    import onnx
    import onnxoptimizer

    _, import_error = import_onnx2torch()
    export_errors = json.loads((out / "gluon_export.json").read_text())

    def exported(name: str, fixed: bool) -> Path:
        if name in export_errors:
            raise RuntimeError(export_errors[name])
        onnx_file = out / f"gluon_{name}.onnx"
        if not fixed:
            return onnx_file
        optimized = onnxoptimizer.optimize(onnx.load(str(onnx_file)), ["eliminate_identity"])
        onnx.save(optimized, str(onnx_file.with_suffix(".fixed.onnx")))
        return onnx_file.with_suffix(".fixed.onnx")

    rows = []
    for name in GLUON_MODELS:
        row: dict[str, Any] = {"framework": "gluon", "model": name}
        fix = "onnxoptimizer eliminate_identity"
        route(row, "mx.onnx.export_model", partial(exported, name), fix, out)
        finish(row, import_error)
        rows.append(row)
    (out / "onnx_gluon.json").write_text(json.dumps(rows, indent=1))
    return 0


def finish(row: dict, import_error: str | None) -> None:
    """Out of the box: no step failed and onnx2torch imported as installed."""
    row["import_error"] = import_error
    row["out_of_the_box"] = row["error"] is None and import_error is None
    diff = row.get("onnx2torch_rel_diff")
    shown = f"{diff:.1e}" if diff is not None else row["error"]
    print(f"{row['framework']} {row['model']}: {shown}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=("paddle", "gluon-export", "gluon-convert"))
    parser.add_argument("--out", type=Path, default=Path("/tmp/onnx_route"))
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    steps = {"paddle": paddle_route, "gluon-export": gluon_export, "gluon-convert": gluon_convert}
    return steps[args.step](args.out)


if __name__ == "__main__":
    sys.exit(main())
