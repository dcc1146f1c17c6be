"""``scripts/gpu-check``: does polytrain work on this machine's GPU, and how fast is it?

Runs polytrain from the source tree (no pip install: ``PYTHONPATH`` holds the tree and
``backends/``, ``POLYTRAIN_PLUGINS`` names the torch backend) and checks, each as a
numbered part with its own time box, in a fresh process:

1. conformance: the torch backend conformance suite on the GPU (POLYTRAIN_TEST_DEVICE)
2. training: LeNet and ResNet-18 in fp32, bf16 and fp16 (loss scale), test accuracy sane
3. lockstep: 50 steps GPU against CPU, each from the CPU's state
4. checkpoint: saved on the GPU, resumed on the CPU, then on the GPU: same losses
5. replicas: two replicas on the one GPU (gpu:0,0) equal to one replica
6. processes: two processes on the one GPU (polytrain launch) equal to one process
7. compile: torch.compile (--fast) on the GPU against eager
8. benchmark: polytrain against a hand-written torch loop (samples/s, ratio, % of peak)

Writes a JSON (``--out``) and prints a table. Without a CUDA device every part is
skipped with "no CUDA device" and the exit status is 0 (``--require-gpu``: 3).
Exit status: 0 no part failed, 1 a part failed, 2 polytrain or torch cannot be imported,
3 ``--require-gpu`` without a CUDA device.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from tempfile import mkdtemp
from typing import Any, NoReturn

ROOT = Path(__file__).resolve().parent.parent
RESULT_MARK = "GPU_CHECK_RESULT "
NO_DEVICE = "no CUDA device"


@dataclass(frozen=True)
class Part:
    number: int
    name: str
    box: float  # seconds: the part's time box on an H100
    what: str


PARTS = (
    Part(1, "conformance", 90, "torch conformance suite on the GPU"),
    Part(2, "training", 100, "LeNet and ResNet-18, fp32/bf16/fp16, accuracy sanity"),
    Part(3, "lockstep", 40, "50 lockstep steps, GPU against CPU"),
    Part(4, "checkpoint", 40, "checkpoint GPU -> CPU -> GPU, same losses"),
    Part(5, "replicas", 30, "two replicas on one GPU equal one"),
    Part(6, "processes", 60, "two processes on one GPU (launch) equal one"),
    Part(7, "compile", 80, "torch.compile (--fast) against eager"),
    Part(8, "benchmark", 100, "polytrain vs hand-written loop, samples/s"),
)
TOTAL_BUDGET = 540.0  # seconds: the device tool runs a command for at most 10 minutes


@dataclass
class PartResult:
    """What one part found: ``status`` is pass, fail or skip."""

    number: int
    name: str
    status: str
    summary: str = ""
    seconds: float = 0.0
    figures: dict[str, Any] = field(default_factory=dict)
    detail: str = ""


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.run_part:
        from benchmarks.gpu_parts import run_part

        return run_part(args.run_part, json.loads(args.config))
    parts = select_parts(args.parts)
    try:
        env = probe(args.device)
    except ImportError as exc:
        print(
            f"gpu-check: cannot import {exc.name or exc}: {exc}. Run scripts/gpu-check from "
            "the source tree with torch installed (PYTHONPATH=.:backends).",
            file=sys.stderr,
        )
        return 2
    if env["device_reason"] and args.require_gpu:
        print(f"gpu-check: {env['device_reason']}; --require-gpu was given.", file=sys.stderr)
        return 3
    config = {
        "device": args.device,
        "data_dir": args.data_dir,
        "quick": args.quick,
        "work_dir": args.work_dir or ("" if env["device_reason"] else mkdtemp("gpu-check-")),
        "peak_bf16_tflops": env.get("peak_bf16_tflops"),
    }
    results = run_parts(parts, config, env["device_reason"], args.budget)
    report = {"environment": env, "config": config, "parts": [asdict(r) for r in results]}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print_table(env, results)
    print(f"written: {out}")
    return 1 if any(r.status == "fail" for r in results) else 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="scripts/gpu-check",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--parts", default="1-8", help="which parts, e.g. 1,2,8 or 3-5")
    parser.add_argument("--out", default="runs/gpu-check.json", help="the JSON report")
    parser.add_argument(
        "--data-dir",
        default=str(ROOT / "data") if (ROOT / "data").is_dir() else None,
        help="folder with the Fashion-MNIST files (default: ./data if it exists, else "
        "polytrain's own search)",
    )
    parser.add_argument(
        "--device", default="gpu:0", help="the device under test; cpu: a dry run of the code"
    )
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a dry run of the code")
    parser.add_argument(
        "--budget", type=float, default=TOTAL_BUDGET, help="seconds for all parts together"
    )
    parser.add_argument("--work-dir", default=None, help="runs and logs (default: a temp dir)")
    parser.add_argument(
        "--require-gpu", action="store_true", help="exit 3 when there is no CUDA device"
    )
    parser.add_argument("--run-part", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--config", default="{}", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def select_parts(text: str) -> list[Part]:
    """Parts by number: ``1,2,8``, ``3-5`` or a mix; an unknown number is an error."""
    wanted: set[int] = set()
    for item in filter(None, (s.strip() for s in text.split(","))):
        lo, _, hi = item.partition("-")
        try:
            wanted.update(range(int(lo), int(hi or lo) + 1))
        except ValueError:
            usage_error(f"--parts {text!r}: use numbers like 1,2,8 or 3-5")
    known = {p.number for p in PARTS}
    if not wanted or wanted - known:
        usage_error(f"--parts {text!r}: the parts are 1 to {len(PARTS)}")
    return [p for p in PARTS if p.number in wanted]


def usage_error(message: str) -> NoReturn:
    print(f"gpu-check: {message}", file=sys.stderr)
    raise SystemExit(2)


# -- the machine ----------------------------------------------------------------------------


def probe(device: str) -> dict[str, Any]:
    """Versions, where polytrain comes from, the GPU and its bf16 peak. ``device_reason``
    is why the GPU parts cannot run here ("" when they can)."""
    import numpy as np
    import torch

    import polytrain
    from polytrain import get_backend

    backend = get_backend("torch")
    env: dict[str, Any] = {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "polytrain_from": str(Path(polytrain.__file__).resolve().parent),
        "site_packages_read": not sys.flags.no_site,
        "host": platform.node(),
        "device": device,
        "device_reason": "",
    }
    if device.startswith("cpu"):
        env["device_reason"] = ""  # a dry run of the parts' code on the CPU
        return env
    if backend.gpu_count() == 0:
        build = "a CPU-only build" if torch.version.cuda is None else f"CUDA {torch.version.cuda}"
        env["device_reason"] = f"{NO_DEVICE} (torch {torch.__version__}, {build})"
        return env
    props = torch.cuda.get_device_properties(0)
    env.update(
        gpu=props.name,
        gpu_count=backend.gpu_count(),
        gpu_memory_gib=round(props.total_memory / 2**30, 1),
        compute_capability=f"{props.major}.{props.minor}",
        cudnn=torch.backends.cudnn.version(),
        tf32_cudnn=torch.backends.cudnn.allow_tf32,
        tf32_matmul=torch.backends.cuda.matmul.allow_tf32,
        **peak_bf16(props.name),
    )
    return env


#: Dense bf16 tensor-core peaks (TFLOP/s) from NVIDIA's datasheets (their headline figures
#: are with 2:4 sparsity, twice these). First match of the device name wins.
BF16_PEAKS = (
    ("H200 NVL", 835.5, "H200 NVL"),
    ("H200", 989.4, "H200 SXM"),
    ("H100 NVL", 835.5, "H100 NVL"),
    ("H100 PCIe", 756.5, "H100 PCIe"),
    ("H100", 989.4, "H100 SXM"),
    ("A100", 312.0, "A100"),
    ("L40S", 362.1, "L40S"),
)


def peak_bf16(name: str) -> dict[str, Any]:
    for key, tflops, model in BF16_PEAKS:
        if key.lower() in name.lower():
            return {
                "peak_bf16_tflops": tflops,
                "peak_source": f"NVIDIA datasheet, {model}, dense bf16",
            }
    return {"peak_bf16_tflops": None, "peak_source": f"{name!r} is not in the peak table"}


# -- running the parts ------------------------------------------------------------------------


def run_parts(
    parts: list[Part], config: dict[str, Any], no_device: str, budget: float
) -> list[PartResult]:
    """Each part in its own process, killed at its time box (or the budget left)."""
    results = []
    deadline = time.monotonic() + budget
    for part in parts:
        if no_device:
            results.append(PartResult(part.number, part.name, "skip", no_device))
            continue
        left = deadline - time.monotonic()
        if left < 5:
            results.append(PartResult(part.number, part.name, "skip", "no time left in --budget"))
            continue
        print(f"-- part {part.number} {part.name}: {part.what} ...", file=sys.stderr, flush=True)
        result = run_one(part, config, min(part.box, left) if not config["quick"] else left)
        print(f"   {result.status} in {result.seconds:.0f} s: {result.summary}", file=sys.stderr)
        results.append(result)
    return results


def run_one(part: Part, config: dict[str, Any], box: float) -> PartResult:
    cmd = [sys.executable, "-m", "benchmarks.gpu_check", "--run-part", str(part.number)]
    cmd += ["--config", json.dumps(config)]
    start = time.monotonic()
    log = Path(config["work_dir"]) / f"part{part.number}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w+", encoding="utf-8") as fh:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
        try:
            code = proc.wait(timeout=box)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the part and whatever it started
            proc.wait()
            code = None
        fh.seek(0)
        output = fh.read()
    seconds = time.monotonic() - start
    found = [line for line in output.splitlines() if line.startswith(RESULT_MARK)]
    if code is None:
        return PartResult(part.number, part.name, "fail", f"time box of {box:.0f} s exceeded",
                          seconds, detail=tail(output))  # fmt: skip
    if not found:
        return PartResult(part.number, part.name, "fail", f"the part's process exited with {code}",
                          seconds, detail=tail(output))  # fmt: skip
    result = PartResult(**json.loads(found[-1][len(RESULT_MARK) :]))
    result.seconds = seconds
    if result.status == "fail" and not result.detail:
        result.detail = tail(output)
    return result


def tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def print_table(env: dict[str, Any], results: list[PartResult]) -> None:
    gpu = env.get("gpu") or env.get("device_reason") or env["device"]
    print(f"polytrain gpu-check: {gpu}; Python {env['python']}, numpy {env['numpy']}, "
          f"torch {env['torch']}; polytrain from {env['polytrain_from']}")  # fmt: skip
    print(f"{'part':4} {'name':12} {'status':6} {'s':>5}  summary")
    for r in results:
        print(f"{r.number:<4} {r.name:12} {r.status:6} {r.seconds:5.0f}  {r.summary}")
        if r.status == "fail" and r.detail:
            print("       " + r.detail.splitlines()[-1][:200])


if __name__ == "__main__":
    sys.exit(main())
