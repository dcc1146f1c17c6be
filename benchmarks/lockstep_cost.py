"""What `polytrain compare`'s lockstep costs per step against each backend's own step
(docs/performance.md, "The lockstep's cost").

    python -m benchmarks.lockstep_cost --backends numpy,torch --steps 20

Own step: one process per backend (threads fixed before the framework is imported, as a
free run is) takes the recipe's steps with the lockstep's own step object
(:class:`polytrain.training.step.StepRunner`), nothing else. Lockstep step: one process runs
:func:`polytrain.parity.lockstep.lockstep` on all the backends, as ``compare`` does, and
reports per backend the seconds of each step from the given state (the state's loads and
reads included) and the seconds spent computing the differences. Both: the median of the
steps after ``--warmup`` discarded ones (first calls: kernels, caches, jit). Wall time:
run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from typing import Any

from polytrain.training.recipe import Recipe

BACKENDS = "numpy,torch,paddle,mxnet,jax"


def recipe_of(args: argparse.Namespace) -> Recipe:
    """The default recipe cut to the steps measured."""
    samples = args.batch_size * (args.warmup + args.steps)
    return Recipe(batch_size=args.batch_size, train_samples=samples, test_samples=32)


def own_steps(args: argparse.Namespace) -> dict[str, Any]:
    """Seconds of each training step of one backend, on the lockstep's batches."""
    from polytrain.data import BatchLoader
    from polytrain.neutral.spec_file import resolve_model_spec
    from polytrain.parity.lockstep import _Runner
    from polytrain.plugins.registry import get_backend
    from polytrain.training.trainer import load_datasets

    recipe = recipe_of(args)
    train = load_datasets(recipe).train
    runner = _Runner(get_backend(args.backends, threads=args.threads), recipe)
    runner.backend.set_params(
        runner.model, resolve_model_spec(recipe.model).init_params(recipe.seed)
    )
    wall, cpu = [], []
    for x, y in BatchLoader(train, recipe.batch_size, seed=recipe.seed).epoch(0):
        started, cpu_started = time.perf_counter(), time.process_time()
        runner.runner.train_step(x, y)
        runner.backend.synchronize()
        wall.append(time.perf_counter() - started)
        cpu.append(time.process_time() - cpu_started)
    name, skip = args.backends, args.warmup
    return {
        "wall": {name: statistics.median(wall[skip:])},
        "cpu": {name: statistics.median(cpu[skip:])},
    }


def lockstep_steps(args: argparse.Namespace) -> dict[str, Any]:
    """Median seconds per lockstep step of each backend, and of comparing; ``--worker
    before``: with the frameworks' default OpenMP waiting, as before the lockstep set
    ``OMP_WAIT_POLICY`` (docs/performance.md, "The lockstep's cost")."""
    from polytrain.parity import lockstep as module
    from polytrain.training.trainer import load_datasets

    if args.worker == "before":
        module.quiet_openmp_pools = lambda frameworks: "the frameworks' default"
    recipe = recipe_of(args)
    train = load_datasets(recipe).train
    steps = args.warmup + args.steps
    names = args.backends.split(",")
    result = module.lockstep(names, recipe, steps, train=train, threads=args.threads)
    skip = args.warmup
    return {
        "wall": {b: statistics.median(s[skip:]) for b, s in result.step_seconds.items()},
        "cpu": {b: statistics.median(s[skip:]) for b, s in result.step_cpu_seconds.items()},
        "comparing": result.compare_seconds / steps,
    }


def worker(kind: str, args: argparse.Namespace, backends: str) -> dict[str, Any]:
    """Run ``--worker kind`` for ``backends`` in a fresh process; its JSON answer."""
    cmd = [sys.executable, "-m", "benchmarks.lockstep_cost", "--worker", kind,
           "--backends", backends, "--steps", str(args.steps), "--warmup", str(args.warmup),
           "--batch-size", str(args.batch_size)]  # fmt: skip
    if args.threads is not None:
        cmd += ["--threads", str(args.threads)]
    done = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def one_round(args: argparse.Namespace, kinds: list[str]) -> dict[str, dict[str, Any]]:
    """Own steps of each backend, then each lockstep kind: ms per step by clock."""
    names = args.backends.split(",")
    own: dict[str, Any] = {"wall": {}, "cpu": {}}
    for name in names:
        answer = worker("own", args, name)
        for clock in own:
            own[clock].update(answer[clock])
    return {"own": own, **{kind: worker(kind, args, args.backends) for kind in kinds}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.lockstep_cost", description=__doc__)
    parser.add_argument("--backends", default=BACKENDS)
    parser.add_argument("--steps", type=int, default=20, help="timed steps")
    parser.add_argument("--warmup", type=int, default=3, help="discarded first steps")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=1, help="rounds; medians are shown")
    before = "also the lockstep with the frameworks' default OpenMP waiting"
    parser.add_argument("--before", action="store_true", help=before)
    parser.add_argument("--worker", choices=("own", "lockstep", "before"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        answer = own_steps(args) if args.worker == "own" else lockstep_steps(args)
        print(json.dumps(answer))
        return 0
    rounds = []
    for r in range(args.repeats):
        kinds = ["lockstep", "before"] if args.before else ["lockstep"]
        rounds.append(one_round(args, kinds if r % 2 == 0 else kinds[::-1]))
        print(f"round {r + 1}: {json.dumps(rounds[-1])}", file=sys.stderr, flush=True)
    print_tables(args, rounds)
    return 0


def print_tables(args: argparse.Namespace, rounds: list[dict[str, dict[str, Any]]]) -> None:
    """Per clock and backend: the medians over rounds of own and lockstep ms per step."""
    names = args.backends.split(",")
    kinds = [k for k in rounds[0] if k != "own"]
    print(f"LeNet, batch {args.batch_size}; per round the median of {args.steps} steps after "
          f"{args.warmup}; medians of {len(rounds)} rounds; ms per step")  # fmt: skip
    for clock in ("wall", "cpu"):

        def ms(kind: str, name: str, clock: str = clock) -> float:
            if name == "all":
                return sum(ms(kind, n) for n in names)
            return statistics.median(r[kind][clock][name] for r in rounds) * 1e3

        head = "".join(f" {k:>9} {'ratio':>6}" for k in kinds)
        print(f"{clock:4} {'backend':8} {'own':>9}{head}")
        for name in [*names, "all"]:
            cells = "".join(f" {ms(k, name):9.1f} {ms(k, name) / ms('own', name):6.2f}"
                            for k in kinds)  # fmt: skip
            print(f"     {name:8} {ms('own', name):9.1f}{cells}")
    comparing = statistics.median(r["lockstep"]["comparing"] for r in rounds) * 1e3
    print(f"(the lockstep's comparing, {comparing:.1f} ms per step, is not in these rows)")


if __name__ == "__main__":
    raise SystemExit(main())
