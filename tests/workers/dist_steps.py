"""Worker for the multi-process tests: a few LeNet steps on this rank's slice of each global
batch, through the engine the launcher set up; writes this rank's parameters to OUT/rank<R>.npz.

Usage: python dist_steps.py BACKEND OUT_DIR [STEPS [PRECISION]]
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from polytrain import OptimizerConfig, get_backend, get_model_spec
from polytrain.backend.precision import param_dtype
from polytrain.distributed.cluster import resolve
from polytrain.neutral.sharding import shard_bounds
from polytrain.plugins.registry import cluster_environments
from polytrain.testing import batch
from polytrain.training.step import StepRunner

GLOBAL_BATCH = 30


def main() -> None:
    name, out = sys.argv[1], Path(sys.argv[2])
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    precision = sys.argv[4] if len(sys.argv) > 4 else "fp32"
    info = resolve(environments=cluster_environments())
    backend = get_backend(name, threads=1)
    spec = get_model_spec("lenet")
    devices = backend.devices("cpu")
    backend.init_distributed(info, devices, timeout=60)
    model = backend.build_model(spec, devices, dtype=param_dtype(precision))
    backend.set_params(model, spec.init_params(seed=0))
    opt = backend.make_optimizer(model, OptimizerConfig("momentum", lr=0.05))
    runner = StepRunner(backend, model, opt, precision=precision)
    losses = []
    for i in range(steps):
        x, y = batch(spec, GLOBAL_BATCH, seed=i)
        lo, hi = shard_bounds(GLOBAL_BATCH, backend.world_size, what="ranks")[backend.rank]
        result = runner.train_step(x[lo:hi], y[lo:hi], global_count=GLOBAL_BATCH)
        losses.append(result.loss_sum / result.samples)
    params = backend.get_params(model)
    np.savez(out / f"rank{backend.rank}.npz", losses=np.array(losses), **params)
    backend.shutdown_distributed()


if __name__ == "__main__":
    main()
