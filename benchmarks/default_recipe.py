"""Before/after figures of a default-recipe change: ``python -m benchmarks.default_recipe``.

Reads two ``polytrain compare`` output folders (one ``<backend>/metrics.jsonl`` per
backend), prints per backend the first loss, the largest loss after step 1 (and its step),
the final test accuracy, and per pair of backends the first step where the float32 free
runs part (per-step loss difference above 1e-4); writes every step's loss of both runs as
one CSV (docs/figures/default-recipe-curves.csv). Reproduce (docs/default-recipe.md)::

    polytrain compare --optimizer momentum --lr 0.05 --out runs/before
    polytrain compare --out runs/after
    python -m benchmarks.default_recipe runs/before runs/after
"""

from __future__ import annotations

import argparse
import csv
import itertools
from pathlib import Path

from polytrain.io.run_dir import METRICS_FILE
from polytrain.parity.compare import diff_pair, parse_run
from polytrain.parity.results import BackendRun, Tolerances
from polytrain.plugins.registry import registered_backends
from polytrain.training.builtin_plugins import read_metrics

DEFAULT_CSV = Path(__file__).resolve().parent.parent / "docs/figures/default-recipe-curves.csv"


def load_runs(folder: Path) -> list[BackendRun]:
    """The free runs of one compare folder, in the plugins' backend order."""
    rank = {name: i for i, name in enumerate(registered_backends())}
    paths = sorted(folder.glob(f"*/{METRICS_FILE}"), key=lambda p: (rank.get(p.parent.name, 99), p))
    return [parse_run(p.parent.name, read_metrics(p)) for p in paths]


def describe(label: str, runs: list[BackendRun]) -> None:
    """Print one line per backend and one per pair."""
    for run in runs:
        losses = run.step_losses
        worst = max(range(1, len(losses)), key=losses.__getitem__)
        accuracy = run.final.get("test_metric")
        acc = f"{100 * accuracy:.2f} %" if accuracy is not None else "-"
        print(f"{label:7} {run.backend:7} first {losses[0]:.3f}  max after step 1 "
              f"{losses[worst]:.3f} (step {worst + 1})  test accuracy {acc}")  # fmt: skip
    tol = Tolerances()
    for a, b in itertools.combinations(runs, 2):
        pair = diff_pair(a, b, tol)
        at = pair.diverged_at_step if pair.diverged_at_step is not None else "never"
        print(f"{label:7} {a.backend}-{b.backend}: free runs part (> {tol.diverged_at:g}) at "
              f"step {at}; max |dloss| over the first {pair.steps_compared} steps "
              f"{pair.max_step_loss_diff:.3f} (step {pair.max_step_loss_diff_at})")  # fmt: skip


def write_curves(before: list[BackendRun], after: list[BackendRun], path: Path) -> None:
    """Every step's loss of both runs, one column per run and backend (4 decimals)."""
    columns = {f"before_{r.backend}": r.step_losses for r in before}
    columns.update({f"after_{r.backend}": r.step_losses for r in after})
    steps = max(len(v) for v in columns.values())
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as fh:
        out = csv.writer(fh)
        out.writerow(["step", *columns])
        for i in range(steps):
            row = [f"{v[i]:.4f}" if i < len(v) else "" for v in columns.values()]
            out.writerow([i + 1, *row])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("before", type=Path, help="compare --out folder of the old recipe")
    p.add_argument("after", type=Path, help="compare --out folder of the new recipe")
    p.add_argument("--csv", type=Path, default=DEFAULT_CSV, help="where the curves go")
    args = p.parse_args(argv)
    before, after = load_runs(args.before), load_runs(args.after)
    describe("before", before)
    describe("after", after)
    write_curves(before, after, args.csv)
    print(f"wrote {args.csv}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
