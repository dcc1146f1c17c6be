"""``polytrain doctor``: what works here, checked by doing it.

For each registered backend, a subprocess (so a framework is imported only for its own
check, and a crash stays contained) reports: import, version, devices, threads, the
precisions a tiny training step accepts, and, through ``polytrain launch``, whether a
two-process allreduce on loopback works. The claims come from the same code paths as
``polytrain train`` and ``polytrain launch``.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np

from polytrain.backend.precision import PRECISIONS, param_dtype
from polytrain.distributed.worker_log import die_with_parent

PROBE_TIMEOUT = 120.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def probe_backend(name: str) -> dict[str, Any]:
    """Runs inside the probe subprocess: import, devices, threads, precisions."""
    from polytrain.errors import PolytrainError
    from polytrain.neutral.models import get_model_spec
    from polytrain.neutral.optim import OptimizerConfig
    from polytrain.plugins.registry import get_backend
    from polytrain.training.step import StepRunner

    report: dict[str, Any] = {"backend": name}
    t0 = time.perf_counter()
    try:
        backend = get_backend(name)
    except PolytrainError as exc:
        return {**report, "importable": False, "error": str(exc)}
    report["import_seconds"] = round(time.perf_counter() - t0, 2)
    report.update(importable=True, version=backend.version(), threads=backend.threads())
    report["gpus"] = backend.gpu_count()
    report["devices"] = [backend.device_name(d) for d in backend.try_all_gpus()]
    report["emulated_devices"] = [backend.device_name(d) for d in backend.devices("cpu:2")]
    spec = get_model_spec("lenet")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 1, 28, 28)).astype(np.float32)
    y = rng.integers(0, 10, 8).astype(np.int64)
    precisions: dict[str, dict[str, Any]] = {}
    for precision in PRECISIONS:
        try:
            model = backend.build_model(spec, dtype=param_dtype(precision))
            backend.set_params(model, spec.init_params(0))
            opt = backend.make_optimizer(model, OptimizerConfig("sgd", lr=0.01))
            result = StepRunner(backend, model, opt, precision=precision).train_step(x, y)
            if not np.isfinite(result.loss_sum):
                raise PolytrainError(f"the loss was {result.loss_sum}")
            precisions[precision] = {"ok": True}
        except Exception as exc:  # report any failure as "does not work here"
            precisions[precision] = {"ok": False, "why": f"{type(exc).__name__}: {exc}"}
    report["precisions"] = precisions
    return report


def probe_collective(name: str, timeout: float | None = None) -> dict[str, Any]:
    """A two-process allreduce on loopback through ``polytrain launch``, with the launcher
    the backend's plugin registers; its ``collectives`` name the engine in the report. The
    workers must start within ``timeout`` seconds (default :data:`PROBE_TIMEOUT`)."""
    from polytrain.distributed.launch import launch
    from polytrain.distributed.launcher import LaunchSpec
    from polytrain.plugins.registry import registered_backends, registered_launchers

    info = registered_backends().get(name)
    launcher = registered_launchers().get(name)
    if launcher is None:
        return {"ok": False, "why": f"the plugin of {name!r} registers no launcher"}
    if launcher.unsupported:
        return {"ok": False, "why": launcher.unsupported}
    port = free_port()
    cmd = [sys.executable, "-m", "polytrain.cli.doctor", "--allreduce-worker", name]
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="polytrain-doctor-") as logs:
        spec = LaunchSpec(backend=name, command=cmd, nproc_per_node=2,
                          master=f"127.0.0.1:{port}", log_dir=logs,
                          timeout=timeout or PROBE_TIMEOUT)  # fmt: skip
        try:
            code = _quietly(lambda: launch(spec, launcher))
        except Exception as exc:  # reported, not raised
            return {"ok": False, "why": f"{type(exc).__name__}: {exc}"}
    seconds = round(time.perf_counter() - t0, 1)
    if code == 0:
        engine = (info.collectives if info else "") or launcher.name
        return {"ok": True, "seconds": seconds, "engine": engine}
    return {"ok": False, "why": f"the 2-process allreduce exited with code {code}",
            "seconds": seconds}  # fmt: skip


def _quietly(fn: Any) -> int:
    """Run ``fn`` with the process's stdout/stderr sent to /dev/null (launchers are chatty)."""
    import os

    saved = os.dup(1), os.dup(2)
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 1)
        os.dup2(null, 2)
        return int(fn())
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, null):
            os.close(fd)


def allreduce_worker(name: str) -> int:
    """One rank of the collective probe: sum rank+1 over two processes."""
    from polytrain.backend.collectives import Collectives
    from polytrain.distributed.cluster import resolve
    from polytrain.plugins.registry import cluster_environments, get_backend

    backend = get_backend(name, threads=1)
    collectives = Collectives.required(backend, "the collective probe")
    info = resolve(environments=cluster_environments())
    collectives.init_distributed(info, backend.devices("cpu"), timeout=60)
    total = collectives.allreduce_numbers([backend.rank + 1.0])[0]
    collectives.shutdown_distributed()
    return 0 if total == 3.0 else 1


def run_doctor(
    names: list[str], collectives: bool = True, progress: bool = False
) -> list[dict[str, Any]]:
    """One report per backend (each probe in its own subprocess); ``progress``: a line on
    stderr as each probe starts and ends (an import of Paddle alone takes seconds)."""
    reports = []
    for i, name in enumerate(names, start=1):
        start = time.monotonic()
        say = _progress(progress, f"[{i}/{len(names)}] {name}")
        say("imports, devices, threads, precisions ...")
        cmd = [sys.executable, "-m", "polytrain.cli.doctor", "--probe", name]
        try:  # the probe ends with doctor, however doctor ends (SIGKILL included)
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=PROBE_TIMEOUT,
                                 check=False, preexec_fn=die_with_parent)  # fmt: skip
            report = json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else {
                "backend": name, "importable": False,
                "error": (out.stderr.strip().splitlines() or ["probe failed"])[-1],
            }  # fmt: skip
        except subprocess.TimeoutExpired:
            why = f"the probe did not end within {PROBE_TIMEOUT:g} s; stopped"
            report = {"backend": name, "importable": False, "error": why}
        if collectives and report.get("importable"):
            say("2-process allreduce ...")
            report["collective"] = probe_collective(name)
        say(f"done ({time.monotonic() - start:.0f} s)")
        reports.append(report)
    return reports


def _progress(enabled: bool, prefix: str) -> Any:
    """A function printing ``doctor PREFIX: TEXT`` on stderr (or nothing)."""

    def say(text: str) -> None:
        if enabled:
            print(f"doctor {prefix}: {text}", file=sys.stderr, flush=True)

    return say


def main(argv: list[str]) -> int:
    if argv[:1] == ["--probe"]:
        print(json.dumps(probe_backend(argv[1])))
        return 0
    if argv[:1] == ["--allreduce-worker"]:
        return allreduce_worker(argv[1])
    print("usage: python -m polytrain.cli.doctor --probe NAME | --allreduce-worker NAME",
          file=sys.stderr)  # fmt: skip
    return 2


def summary_rows(reports: list[dict[str, Any]]) -> list[list[str]]:
    """Table rows: backend, version, devices, threads, precisions, collective."""
    rows = []
    for r in reports:
        if not r.get("importable"):
            rows.append([r["backend"], "not importable", "-", "-", "-", r.get("error", "")[:80]])
            continue
        precisions = ", ".join(p if v["ok"] else f"no {p}" for p, v in r["precisions"].items())
        coll = r.get("collective")
        collective = "not checked" if coll is None else (
            f"yes: {coll['engine']}, {coll['seconds']} s" if coll["ok"] else f"no: {coll['why']}"
        )  # fmt: skip
        threads = ", ".join(f"{k}={v}" for k, v in r["threads"].items())
        devices = ",".join(r["devices"]) + f" (+ emulated {','.join(r['emulated_devices'])})"
        rows.append([r["backend"], r["version"], devices, threads, precisions, collective])
    return rows


def why_not(reports: list[dict[str, Any]]) -> list[str]:
    """One line per thing that does not work, with the reason."""
    lines = []
    for r in reports:
        if not r.get("importable"):
            lines.append(f"{r['backend']}: {r.get('error')}")
            continue
        for p, v in r["precisions"].items():
            if not v["ok"]:
                lines.append(f"{r['backend']} {p}: {v['why']}")
        coll = r.get("collective")
        if coll is not None and not coll["ok"]:
            lines.append(f"{r['backend']} collectives: {coll['why']}")
    return lines


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
