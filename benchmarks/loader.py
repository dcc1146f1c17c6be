"""Does the input pipeline keep up? ``python -m benchmarks.loader [--quick]``.

1. The numpy loader alone (contract-9 batches of 256 from the 60,000 Fashion-MNIST
   training images, gathered with ``np.take``), with and without the prefetch thread:
   samples/s it can deliver.
2. Training through polytrain on each backend with the loader's ``__next__`` timed: the
   share of the step time the loop waited for a batch. Near 0 means the loader never
   starves training (the prefetch thread had the next batch ready).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

from .run import BACKENDS, ROOT


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.loader", description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    from .common import Workload

    work = Workload(steps=15 if args.quick else 60, warmup=3 if args.quick else 10)
    if args.worker:
        return worker(args.worker, work)

    print("loader alone (numpy, batch 256, one epoch of 60,000 samples):")
    for prefetch in (0, 2):
        rate = loader_alone(prefetch, epochs=1 if args.quick else 3)
        print(f"  prefetch {prefetch}: {rate:12,.0f} samples/s")
    print("training through polytrain, loader timed (prefetch 2, the Trainer's setting):")
    print(f"  {'backend':8} {'train samples/s':>16} {'waiting for data':>17}")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    for name in [b.strip() for b in args.backends.split(",") if b.strip()]:
        cmd = [sys.executable, "-m", "benchmarks.loader", "--worker", name]
        cmd += ["--quick"] if args.quick else []
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, check=False)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
        if not lines:
            print(f"  {name:8} ERROR {' '.join(proc.stderr.strip().splitlines()[-2:])}")
            continue
        r = json.loads(lines[-1])
        print(f"  {name:8} {r['samples_per_second']:16,.0f} {100 * r['waiting_share']:16.2f}%")
    return 0


def loader_alone(prefetch: int, epochs: int) -> float:
    """Samples/s of iterating whole epochs of the loader, doing nothing with the batches."""
    from polytrain.data import BatchLoader, load_dataset

    data = load_dataset("fashion-mnist", "train")
    _ = data.x  # convert to float once, outside the timing (the Trainer does it before step 1)
    loader = BatchLoader(data, 256, seed=0, prefetch=prefetch)
    start = time.perf_counter()
    for e in range(epochs):
        with loader.epoch(e) as batches:
            for _x, _y in batches:
                pass
    return epochs * len(data) / (time.perf_counter() - start)


def worker(name: str, work: Any) -> int:
    from polytrain.data import loader as loader_module

    from . import through_polytrain
    from .common import load_train

    waited = [0.0]
    original = loader_module.EpochIterator.__next__

    def timed_next(self: Any) -> Any:
        t = time.perf_counter()
        try:
            return original(self)
        finally:
            waited[0] += time.perf_counter() - t

    x, y = load_train(work.train_samples)
    through_polytrain.run(name, work, x, y)  # warm-up run
    loader_module.EpochIterator.__next__ = timed_next  # type: ignore[method-assign]
    start = time.perf_counter()
    m = through_polytrain.run(name, work, x, y)
    total = time.perf_counter() - start
    print(
        json.dumps(
            {
                "backend": name,
                "samples_per_second": m.samples_per_second,
                "waiting_share": waited[0] / total,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
