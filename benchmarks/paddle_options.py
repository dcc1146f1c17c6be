"""What Paddle offers for CPU training speed, measured against Paddle's own default:
``python -m benchmarks.paddle_options [--model lenet|resnet18] [--rounds N]``.

One training step (forward, loss, backward, optimizer step, clear) of LeNet (batch 256,
1x28x28) or the zoo's ResNet-18 shape (d2l variant, batch 32, 3x32x32) is timed under each
option in a fresh process (Paddle reads its ``FLAGS_*`` environment variables and the thread
variables at import). The figure is process CPU time per step (``time.process_time``, all
threads): the machine is shared, so wall time is reported beside it but not compared. The
options run in one order in even rounds and in the reverse order in odd rounds (ABBA), so a
drift of the machine hits every option alike; the 1-minute load is recorded per run.
Models are written here with ``paddle.nn`` layers so that the channel order can change.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any, Literal, cast

from .stats import cpu_model, load_average

# name -> what it changes: env (read at import), flags (paddle.set_flags after import),
# data_format (channel order of conv/BN/pool), static (paddle.jit.to_static, full graph),
# threads (OMP/MKL variables and paddle's setter).
OPTIONS: dict[str, dict[str, Any]] = {
    "default": {},
    "FLAGS_use_mkldnn=1 (env)": {"env": {"FLAGS_use_mkldnn": "1"}},
    "FLAGS_use_mkldnn (set_flags)": {"flags": {"FLAGS_use_mkldnn": True}},
    "FLAGS_use_onednn=1 (env)": {"env": {"FLAGS_use_onednn": "1"}},
    "FLAGS_use_onednn (set_flags)": {"flags": {"FLAGS_use_onednn": True}},
    "NHWC": {"data_format": "NHWC"},
    "NHWC + oneDNN": {"data_format": "NHWC", "env": {"FLAGS_use_onednn": "1"}},
    "to_static": {"static": True},
    "to_static, PIR off": {"static": True, "env": {"FLAGS_enable_pir_api": "0"}},
    "to_static, PIR executor off": {
        "static": True,
        "env": {"FLAGS_enable_pir_in_executor": "0"},
    },
    "to_static + oneDNN": {"static": True, "env": {"FLAGS_use_onednn": "1"}},
    "to_static + oneDNN (set_flags)": {"static": True, "flags": {"FLAGS_use_onednn": True}},
    "to_static + oneDNN + NHWC": {
        "static": True,
        "data_format": "NHWC",
        "env": {"FLAGS_use_onednn": "1"},
    },
    "to_static, 2 threads": {"static": True, "threads": 2},
    "2 threads": {"threads": 2},
    "FLAGS_inner_op_parallelism=2": {"env": {"FLAGS_inner_op_parallelism": "2"}},
    "allocator naive_best_fit": {"env": {"FLAGS_allocator_strategy": "naive_best_fit"}},
    "FLAGS_use_stride_kernel=0": {"env": {"FLAGS_use_stride_kernel": "0"}},
}

Layout = Literal["NCHW", "NHWC"]  # channel order of conv, BatchNorm and pool

SHAPES = {"lenet": (256, (1, 28, 28)), "resnet18": (32, (3, 32, 32))}
STEPS = {"lenet": (3, 12), "resnet18": (2, 4)}  # (warm-up, timed) steps per process


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.paddle_options")
    parser.add_argument("--model", choices=sorted(SHAPES), default="lenet")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--options", default=None, help="semicolon-separated subset of names")
    parser.add_argument("--json", default=None)
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(json.loads(args.worker))
    names = list(OPTIONS) if args.options is None else args.options.split(";")
    rows: list[dict[str, Any]] = []
    print(f"# {cpu_model()}, {os.cpu_count()} CPUs, model {args.model}", flush=True)
    for r in range(args.rounds):
        for name in names if r % 2 == 0 else list(reversed(names)):
            row = run_option(args.model, name)
            row["round"] = r
            print(json.dumps(row), file=sys.stderr, flush=True)
            rows.append(row)
    table(rows, names)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=2)
    return 0


def run_option(model: str, name: str) -> dict[str, Any]:
    """One fresh process for one option; its result line, or the error's last lines."""
    option = OPTIONS[name]
    threads = int(option.get("threads", 1))
    env = {**os.environ, **option.get("env", {})}
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[var] = str(threads)
    job = {"model": model, "name": name, "threads": threads}
    cmd = [sys.executable, "-m", "benchmarks.paddle_options", "--worker", json.dumps(job)]
    load = load_average()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("{"):
            return {**json.loads(line), "load": load}
    lines = proc.stderr.strip().splitlines()
    hints = [s for s in lines if "Error" in s or "Hint" in s or "Fatal" in s] or lines[-2:]
    return {"name": name, "error": f"exit {proc.returncode}: {hints[-1][-300:]}", "load": load}


def worker(job: dict[str, Any]) -> int:
    import warnings

    warnings.simplefilter("ignore")
    import numpy as np
    import paddle

    option = OPTIONS[job["name"]]
    if option.get("flags"):
        paddle.set_flags(option["flags"])
    paddle.base.core.set_num_threads(job["threads"])
    paddle.seed(0)
    batch, shape = SHAPES[job["model"]]
    fmt = cast(Layout, option.get("data_format", "NCHW"))
    net = lenet(fmt) if job["model"] == "lenet" else resnet18(fmt, shape[0])
    model = paddle.jit.to_static(net, full_graph=True) if option.get("static") else net
    opt = paddle.optimizer.Momentum(0.01, momentum=0.9, parameters=net.parameters())
    loss_fn = paddle.nn.CrossEntropyLoss()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, *shape)).astype("float32")
    if fmt == "NHWC":
        x = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    images = paddle.to_tensor(x)
    labels = paddle.to_tensor(rng.integers(0, 10, batch).astype("int64"))
    model.train()

    def step() -> float:
        loss = loss_fn(model(images), labels)
        loss.backward()
        opt.step()
        opt.clear_grad()
        return float(loss)  # waits for the step

    warmup, timed = STEPS[job["model"]]
    t0 = time.perf_counter()
    step()
    first = time.perf_counter() - t0
    for _ in range(warmup - 1):
        step()
    c0, w0 = time.process_time(), time.perf_counter()
    for _ in range(timed):
        loss = step()
    cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    flags = paddle.get_flags(["FLAGS_use_mkldnn", "FLAGS_use_onednn", "FLAGS_enable_pir_api"])
    result = {
        "name": job["name"],
        "cpu_ms": 1000 * cpu / timed,
        "wall_ms": 1000 * wall / timed,
        "first_s": first,
        "loss": loss,
        "flags": {k.removeprefix("FLAGS_"): v for k, v in flags.items()},
    }
    print(json.dumps(result), flush=True)
    return 0


def lenet(fmt: Layout) -> Any:
    from paddle import nn

    return nn.Sequential(
        nn.Conv2D(1, 20, 3, data_format=fmt), nn.ReLU(), nn.AvgPool2D(2, 2, data_format=fmt),
        nn.Conv2D(20, 50, 5, data_format=fmt), nn.ReLU(), nn.AvgPool2D(2, 2, data_format=fmt),
        nn.Flatten(), nn.Linear(800, 128), nn.ReLU(), nn.Linear(128, 10),
    )  # fmt: skip


def resnet18(fmt: Layout, in_channels: int) -> Any:
    """The zoo's ResNet-18 shape (d2l: 3x3 stem, no max-pool, 64/128/256/512 stages of two
    residual blocks, 1x1 shortcut where the shape changes, global average pool, dense)."""
    import paddle
    from paddle import nn

    class Block(nn.Layer):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.conv1 = nn.Conv2D(cin, cout, 3, stride, 1, data_format=fmt)
            self.bn1 = nn.BatchNorm2D(cout, data_format=fmt)
            self.conv2 = nn.Conv2D(cout, cout, 3, 1, 1, data_format=fmt)
            self.bn2 = nn.BatchNorm2D(cout, data_format=fmt)
            self.short = (
                nn.Conv2D(cin, cout, 1, stride, data_format=fmt)
                if stride != 1 or cin != cout
                else None
            )

        def forward(self, x: Any) -> Any:
            y = self.bn2(self.conv2(paddle.nn.functional.relu(self.bn1(self.conv1(x)))))
            return paddle.nn.functional.relu(y + (x if self.short is None else self.short(x)))

    layers: list[Any] = [
        nn.Conv2D(in_channels, 64, 3, 1, 1, data_format=fmt),
        nn.BatchNorm2D(64, data_format=fmt),
        nn.ReLU(),
    ]
    cin = 64
    for i, cout in enumerate((64, 128, 256, 512)):
        layers += [Block(cin, cout, 1 if i == 0 else 2), Block(cout, cout, 1)]
        cin = cout
    layers += [nn.AdaptiveAvgPool2D(1, data_format=fmt), nn.Flatten(), nn.Linear(512, 10)]
    return nn.Sequential(*layers)


def table(rows: list[dict[str, Any]], names: list[str]) -> None:
    """Median CPU ms per step per option, its ratio to the default's median, and the
    per-round ratios (an option 'wins' only if every round says so)."""
    ok = [r for r in rows if "error" not in r]
    by: dict[str, list[dict[str, Any]]] = {n: [r for r in ok if r["name"] == n] for n in names}
    base = {r["round"]: r["cpu_ms"] for r in by.get("default", [])}
    base_med = statistics.median(base.values()) if base else float("nan")
    loads = [r["load"] for r in rows if r.get("load") is not None]
    print(f"load (1 min) during the runs: {min(loads, default=0):.1f}-{max(loads, default=0):.1f}")
    print(f"{'option':32} {'cpu ms':>8} {'wall ms':>8} {'ratio':>6}  per-round ratios  loss")
    for n in names:
        rs = by[n]
        if not rs:
            err = next((r["error"] for r in rows if r["name"] == n and "error" in r), "?")
            print(f"{n:32} ERROR {err}")
            continue
        cpu = statistics.median(r["cpu_ms"] for r in rs)
        wall = statistics.median(r["wall_ms"] for r in rs)
        per = ", ".join(f"{r['cpu_ms'] / base[r['round']]:.2f}" for r in rs if r["round"] in base)
        print(f"{n:32} {cpu:8.1f} {wall:8.1f} {cpu / base_med:6.2f}  {per:16}  {rs[0]['loss']:.5f}")


if __name__ == "__main__":
    sys.exit(main())
