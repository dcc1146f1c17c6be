"""Worker for tests/distributed/test_devices_dist.py: joins the job with ``--devices gpu`` (the CPU
here), recording whether the process group existed when the backend made its GPU
current; then 20 LeNet steps per gradient-sync path on this rank's slice of each
global batch. Writes OUT/rank<R>.npz: ``<path>/<name>`` parameters and ``group_at_set``.

Usage: python bucket_steps.py BACKEND OUT_DIR
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from polytrain import OptimizerConfig, get_backend, get_model_spec
from polytrain.distributed.cluster import resolve
from polytrain.neutral.sharding import shard_bounds
from polytrain.plugins.registry import cluster_environments
from polytrain.testing import batch
from polytrain.training.step import StepRunner

GLOBAL_BATCH = 30
STEPS = 20
PATHS = {"per_parameter": 0.0, "small_buckets": 0.01, "default": None}  # bucket_mb


def group_exists(name: str) -> bool:
    """Whether the framework's process group has been created."""
    if name == "torch":
        import torch.distributed

        return bool(torch.distributed.is_initialized())
    import paddle.distributed

    return bool(paddle.distributed.is_initialized())


def main() -> None:
    name, out = sys.argv[1], Path(sys.argv[2])
    info = resolve(environments=cluster_environments())
    backend = get_backend(name, threads=1)
    spec = get_model_spec("lenet")
    devices = backend.devices("gpu", cluster=info)  # no GPU here: the CPU
    seen: list[bool] = []
    use_device = backend.use_process_device

    def recorded(devs: Sequence[Any]) -> None:  # the real call, noting whether the group exists yet
        seen.append(group_exists(name))
        use_device(devs)

    backend.use_process_device = recorded  # type: ignore[method-assign,assignment]
    backend.init_distributed(info, devices, timeout=60)
    assert group_exists(name)
    results: dict[str, np.ndarray] = {"group_at_set": np.array(seen)}
    for path, mb in PATHS.items():
        backend.options.bucket_mb = mb
        model = backend.build_model(spec, devices)
        backend.set_params(model, spec.init_params(seed=0))
        runner = StepRunner(
            backend, model, backend.make_optimizer(model, OptimizerConfig("momentum", lr=0.05))
        )
        for i in range(STEPS):
            x, y = batch(spec, GLOBAL_BATCH, seed=i)
            lo, hi = shard_bounds(GLOBAL_BATCH, backend.world_size, what="ranks")[backend.rank]
            runner.train_step(x[lo:hi], y[lo:hi], global_count=GLOBAL_BATCH)
        results.update({f"{path}/{k}": v for k, v in backend.get_params(model).items()})
    np.savez(out / f"rank{backend.rank}.npz", **results)
    backend.shutdown_distributed()


if __name__ == "__main__":
    main()
