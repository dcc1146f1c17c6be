"""One long-lived process of ``benchmarks.peers``: it fixes its threads before the framework
import, loads the data once, says ``ready`` and then runs one loop per request.

``python -m benchmarks.peers_worker SIDE FRAMEWORK WORK_JSON``: SIDE ``project`` (the
project's interpreter: polytrain's Trainer and the hand-written native loop) or ``keras``
(the peers venv's interpreter, ``KERAS_BACKEND`` set: Keras channels_first and
channels_last). Each stdin line names a loop; the answer is one stdout line
``PEERS {json}`` (the measurement, or ``{"error": ...}``); an empty line or EOF ends it.
The orchestrator drives several such workers in ABBA order, so each loop keeps its warm
process (imports, compile caches) and rounds interleave across processes.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from collections.abc import Callable
from dataclasses import replace
from typing import Any

PREFIX = "PEERS "
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "XLA_FLAGS")


def say(payload: dict[str, Any]) -> None:
    print(PREFIX + json.dumps(payload), flush=True)


def project_loops(framework: str, work: Any) -> tuple[dict[str, Callable[[], Any]], dict]:
    """polytrain's Trainer and the native loop, threads as ``benchmarks.run`` sets them."""
    import importlib

    from polytrain import get_backend
    from polytrain.utils.threads import export_thread_env

    if work.threads is not None:  # before any framework import
        export_thread_env(work.threads)
    backend = get_backend(framework, threads=work.threads)  # the framework's own setters
    work = replace(work, threads=backend.threads()["intra_op"])
    from . import through_polytrain
    from .common import load_train

    native = importlib.import_module(f"benchmarks.native_{backend.framework}")
    x, y = load_train(work.train_samples)
    native_work = replace(work, fast=bool(backend.fast if work.fast is None else work.fast))
    loops = {
        "polytrain": lambda: through_polytrain.run(framework, work, x, y),
        "native": lambda: native.run(native_work, x, y),
    }
    info = {
        "version": backend.version(),
        "threads": backend.threads(),
        "native_fast": native_work.fast,
        "env": {k: os.environ[k] for k in THREAD_ENV if k in os.environ},
    }
    return loops, info


def keras_loops(framework: str, work: Any) -> tuple[dict[str, Callable[[], Any]], dict]:
    """Keras on ``framework`` (``KERAS_BACKEND``), the threads the project side exported."""
    threads = int(os.environ.get("OMP_NUM_THREADS", "0")) or None
    if framework == "torch" and threads:
        import torch

        torch.set_num_threads(threads)
    import keras

    from . import peers_keras, peers_layouts
    from .common import load_train

    x, y = load_train(work.train_samples)
    loops = {
        f"keras_{fmt}": (lambda fmt=fmt: peers_keras.run(work, x, y, fmt))
        for fmt in peers_layouts.FORMATS
    }
    info = {"version": keras.__version__, "keras_backend": keras.backend.backend(),
            "threads": _keras_threads(framework, threads)}  # fmt: skip
    return loops, info


def _keras_threads(framework: str, exported: int | None) -> dict[str, int]:
    if framework == "torch":
        import torch

        return {"intra_op": torch.get_num_threads(), "inter_op": torch.get_num_interop_threads()}
    return {"intra_op": exported or 0}


def serve(loops: dict[str, Callable[[], Any]]) -> None:
    """Run the loop each stdin line names; answer with its measurement."""
    for line in sys.stdin:
        name = line.strip()
        if not name:
            return
        try:
            say(loops[name]().to_dict())
        except Exception as exc:  # the orchestrator reports it and stops this framework
            traceback.print_exc()
            say({"error": f"{name}: {type(exc).__name__}: {exc}"})


def main(argv: list[str]) -> int:
    side, framework, work_json = argv
    from .common import Workload

    work = Workload(**json.loads(work_json))
    build = project_loops if side == "project" else keras_loops
    try:
        loops, info = build(framework, work)
    except Exception as exc:
        traceback.print_exc()
        say({"error": f"{side} worker for {framework}: {type(exc).__name__}: {exc}"})
        return 1
    say({"ready": sorted(loops), **info})
    serve(loops)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
