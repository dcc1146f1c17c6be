"""polytrain's route on the very models onnx_route.py exported, and the side-by-side table.

Run in the project's venv after onnx_route.py's three steps (see README.md)::

    .venv/bin/python benchmarks/onnx_route/polytrain_route.py --out DIR

For each model it rebuilds the source from the weights onnx_route.py wrote (checking that
its logits are the ones written), ports it with ``polytrain.port`` into the PyTorch twin
written in tests/ (test_port.py, test_port_zoo.py, torch_twins.py), and measures the same
figure as the ONNX route: max |logit difference| relative to the largest logit. It also
tries ``load_state_dict(strict=True)`` of the onnx2torch module's state_dict into that twin.
Prints the table (markdown) and writes it to ``DIR/table.md`` (rows: ``DIR/polytrain.json``).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))  # the twins are written in the tests

OPTIMIZER_STATE = {
    "polytrain": "ported (.pdopt / Trainer.save_states -> torch.optim)",
    "onnx": "none (ONNX carries none)",
}


def one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text}"[:160]


def relative_diff(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


def paddle_twins() -> dict[str, Callable[[], Any]]:
    import test_port
    import test_port_zoo
    from torch_twins import ResNet18

    return {
        "LeNet": test_port.TorchLeNet,
        "resnet18": lambda: ResNet18(num_classes=10),
        "mobilenet_v2": test_port.TorchMobileNetV2,
        "alexnet": test_port_zoo.TorchPaddleAlexNet,
    }


def gluon_twins() -> dict[str, Callable[[], Any]]:
    import test_port
    import test_port_zoo

    return {
        "resnet18_v1": test_port.TorchGluonResNet18,
        "mobilenet1.0": test_port_zoo.TorchGluonMobileNet,
        "alexnet": test_port_zoo.TorchGluonAlexNet,
    }


def paddle_source(name: str, out: Path) -> Any:
    """``paddle.vision.models.<name>`` holding the weights onnx_route.py wrote."""
    import paddle
    from paddle.vision import models

    model = getattr(models, name)(num_classes=10)
    weights = np.load(out / f"paddle_{name}.weights.npz")
    model.set_state_dict({k: paddle.to_tensor(weights[k]) for k in weights.files})
    model.eval()
    return model


def paddle_logits(model: Any, batch: np.ndarray) -> np.ndarray:
    import paddle

    with paddle.no_grad():
        return np.asarray(model(paddle.to_tensor(batch)).numpy())


def gluon_source(name: str, out: Path) -> Any:
    """``gluon.model_zoo.vision.get_model(name)`` holding the parameters gluon-export wrote."""
    import mxnet as mx
    from mxnet.gluon.model_zoo import vision

    batch = np.load(out / f"gluon_{name}.input.npy")
    model = vision.get_model(name, classes=10)
    model.initialize()
    model(mx.nd.zeros((1, *batch.shape[1:])))
    model.load_parameters(str(out / f"gluon_{name}.params"))
    return model


def gluon_logits(model: Any, batch: np.ndarray) -> np.ndarray:
    import mxnet as mx

    return np.asarray(model(mx.nd.array(batch)).asnumpy())


def twin_load(twin: Any, onnx_state: Path) -> str:
    """What ``twin.load_state_dict(onnx2torch state_dict, strict=True)`` says."""
    import torch

    if not onnx_state.exists():
        return "no onnx2torch module"
    state = torch.load(onnx_state, weights_only=True)
    try:
        twin.load_state_dict(state, strict=True)
    except RuntimeError:
        missing = sum(1 for k in twin.state_dict() if k not in state)
        unexpected = sum(1 for k in state if k not in twin.state_dict())
        return f"no: strict load fails ({missing} missing, {unexpected} unexpected keys)"
    except Exception as error:
        return f"no: {one_line(error)}"
    return "yes"


def polytrain_rows(
    framework: str,
    twins: dict[str, Callable[[], Any]],
    source: Callable[[str, Path], Any],
    logits_of: Callable[[Any, np.ndarray], np.ndarray],
    out: Path,
) -> list[dict[str, Any]]:
    import torch

    from polytrain import port

    rows = []
    for name, make_twin in twins.items():
        stem = f"{framework}_{name}"
        batch, want = np.load(out / f"{stem}.input.npy"), np.load(out / f"{stem}.logits.npy")
        model = source(name, out)
        same = relative_diff(logits_of(model, batch), want)
        assert same < 1e-6, f"{stem}: the rebuilt source is not the exported model ({same:.2g})"
        twin = make_twin()
        result = port(model, twin, inputs=batch)
        with torch.no_grad():
            got = twin.eval()(torch.from_numpy(batch)).numpy()
        onnx_file = out / f"{stem}.onnx"
        onnx_state = onnx_file.with_suffix(".onnx2torch.pt")
        if not onnx_state.exists():  # the fixed export (Gluon) sits beside it
            onnx_state = out / f"{stem}.fixed.onnx2torch.pt"
        row = {
            "framework": framework,
            "model": name,
            "passed": result.passed,
            "layers": len(result.pairs),
            "rel_diff": relative_diff(got, want),
            "names_sample": list(twin.state_dict())[:3],
            "trainable": sum(1 for _ in twin.parameters()),
            "onnx_into_twin": twin_load(make_twin(), onnx_state),
        }
        print(f"{framework} {name}: {row['rel_diff']:.1e} passed={result.passed}", flush=True)
        rows.append(row)
    return rows


def short(error: str | None) -> str:
    """An onnx2torch 'Converter is not implemented' error as 'no converter for OP-VERSION'."""
    found = re.search(r"operation_type='(\w+)', version=(\d+)", error or "")
    return f"no onnx2torch converter for {found[1]}-{found[2]}" if found else error or "-"


def table(ours: list[dict[str, Any]], theirs: dict[tuple[str, str], dict[str, Any]]) -> str:
    """Markdown: per model, polytrain's figures next to the ONNX route's."""
    lines = [
        "| model | polytrain: rel. logit diff | ONNX route: first error | fix applied | "
        "ONNX route after fix: rel. logit diff, onnx2torch (onnxruntime) | "
        "trainable tensors: onnx2torch / twin | onnx2torch names (sample) |",
        "|---|---|---|---|---|---|---|",
    ]
    import_errors = set()
    for row in ours:
        other = theirs.get((row["framework"], row["model"]), {})
        if other.get("import_error"):
            import_errors.add(other["import_error"])
        diff = other.get("onnx2torch_rel_diff")
        after = f"{diff:.1e} ({other['onnxruntime_rel_diff']:.1e})" if diff is not None else ""
        names = ", ".join(f"`{n}`" for n in other.get("names_sample", [])[:3])
        lines.append(
            f"| {row['framework']} {row['model']} | {row['rel_diff']:.1e}"
            f"{'' if row['passed'] else ' (verification FAILED)'} | {short(other.get('error'))} "
            f"| {other.get('fixed_by') or '-'} | {after or short(other.get('fix_error'))} | "
            f"{other.get('trainable', '-')} / {row['trainable']} | {names} |"
        )
    loads = sorted({r["onnx_into_twin"].split(" (")[0] for r in ours})
    twin_names = "; ".join(f"{r['model']}: `{r['names_sample'][0]}`" for r in ours[:2])
    lines += [
        "",
        "Out of the box: "
        + ("; ".join(sorted(import_errors)) or "onnx2torch imported")
        + " (`import onnx2torch`, every model: see README.md for the stand-in used).",
        f"onnx2torch's state_dict into the hand-written twin: {', '.join(loads)} "
        "for every model (its names are the ONNX graph's).",
        f"polytrain's result is the twin's own state_dict (e.g. {twin_names}), "
        "written as a `.pt` only when the layer-by-layer verification passes.",
        f"Optimizer state: polytrain {OPTIMIZER_STATE['polytrain']}; "
        f"ONNX route {OPTIMIZER_STATE['onnx']}.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("/tmp/onnx_route"))
    args = parser.parse_args(argv)
    out: Path = args.out
    ours = polytrain_rows("paddle", paddle_twins(), paddle_source, paddle_logits, out)
    ours += polytrain_rows("gluon", gluon_twins(), gluon_source, gluon_logits, out)
    theirs = {}
    for framework in ("paddle", "gluon"):
        for row in json.loads((out / f"onnx_{framework}.json").read_text()):
            theirs[(row["framework"], row["model"])] = row
    (out / "polytrain.json").write_text(json.dumps(ours, indent=1))
    text = table(ours, theirs)
    (out / "table.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
