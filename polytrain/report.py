"""The comparison report: a terminal table, a JSON file and a PNG (matplotlib, headless)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .fileio import atomic_path, atomic_write_text

if TYPE_CHECKING:
    from .compare import Comparison


def write_json(result: Comparison, path: Path) -> None:
    atomic_write_text(path, json.dumps(result.to_dict(), indent=2, sort_keys=True))


def _deviation(result: Comparison, backend: str) -> float | None:
    if backend == result.reference:
        return None
    for p in result.pairs:
        if {p.a, p.b} == {backend, result.reference}:
            return p.max_step_loss_diff
    return None


def table(result: Comparison) -> Any:
    """A rich table: one row per backend."""
    from rich.table import Table

    r = result.recipe
    title = (
        f"{r['model']} on {r['dataset']}: {r['epochs']} epoch(s), batch {r['batch_size']}, "
        f"{r['optimizer']} lr {r['lr']}, seed {r['seed']}"
    )
    t = Table(title=title)
    for col in (
        "backend", "version", "devices", "final train loss", "test acc %", "samples/s",
        "s/epoch", "peak MiB", f"max |Δloss| vs {result.reference}",
    ):  # fmt: skip
        t.add_column(col, justify="left" if col in ("backend", "version", "devices") else "right")
    for run in result.runs:
        f = run.final
        dev = _deviation(result, run.backend)
        t.add_row(
            run.backend,
            run.framework_version,
            ",".join(run.devices),
            f"{f['train_loss']:.6f}" if f else "-",
            f"{100 * f['test_accuracy']:.2f}" if f.get("test_accuracy") is not None else "-",
            f"{run.samples_per_second:.0f}",
            f"{run.seconds_per_epoch:.1f}",
            f"{run.peak_rss_mb:.0f}" if run.peak_rss_mb else "-",
            "(reference)" if dev is None else f"{dev:.2e}",
        )
    return t


def pairs_table(result: Comparison) -> Any:
    from rich.table import Table

    tol = result.tolerances
    t = Table(title="pairwise differences")
    for col in ("pair", f"max |Δloss|, first {tol.parity_steps} steps", "at step",
                "Δ test acc (points)", "Δ final train loss"):  # fmt: skip
        t.add_column(col, justify="right")
    for p in result.pairs:
        acc = p.test_accuracy_diff_points
        t.add_row(
            f"{p.a} vs {p.b}",
            f"{p.max_step_loss_diff:.2e}",
            str(p.max_step_loss_diff_at),
            "-" if acc is None else f"{acc:.2f}",
            "-" if p.final_train_loss_diff is None else f"{p.final_train_loss_diff:.2e}",
        )
    return t


def write_plot(result: Comparison, path: Path) -> None:
    """Loss curves overlaid, deviation from the reference, test accuracy, throughput."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(13, 9))
    (ax_loss, ax_dev), (ax_acc, ax_speed) = axes
    ref = next(r for r in result.runs if r.backend == result.reference)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, run in enumerate(result.runs):
        c = colors[i % len(colors)]
        steps = np.arange(1, len(run.step_losses) + 1)
        ax_loss.plot(
            steps,
            run.step_losses,
            color=c,
            lw=1.2,
            alpha=0.8,
            ls="-" if i == 0 else "--",
            label=f"{run.backend} {run.framework_version}",
        )
        if run is not ref:
            n = min(len(run.step_losses), len(ref.step_losses))
            diff = np.abs(np.subtract(run.step_losses[:n], ref.step_losses[:n]))
            ax_dev.semilogy(steps[:n], np.maximum(diff, 1e-12), color=c, lw=1, label=run.backend)
        epochs = [e["epoch"] + 1 for e in run.epochs]
        accs = [100 * (e["test_accuracy"] or 0) for e in run.epochs]
        ax_acc.plot(
            epochs, accs, marker="o", color=c, ls="-" if i == 0 else "--", label=run.backend
        )
    ax_loss.set(title="training loss per step", xlabel="step", ylabel="mean cross-entropy")
    ax_loss.legend()
    tol = result.tolerances
    ax_dev.axhline(tol.step_loss, color="red", ls=":", label=f"tolerance {tol.step_loss:.0e}")
    ax_dev.axvline(tol.parity_steps, color="grey", ls=":", lw=0.8)
    ax_dev.set(
        title=f"|loss - {result.reference} loss| per step",
        xlabel="step",
        ylabel="absolute difference",
    )
    ax_dev.legend()
    ax_acc.set(title="test accuracy", xlabel="epoch", ylabel="%")
    ax_acc.legend()
    names = [r.backend for r in result.runs]
    rates = [r.samples_per_second for r in result.runs]
    bars = ax_speed.bar(names, rates, color=colors[: len(names)])
    ax_speed.bar_label(bars, fmt="%.0f")
    ax_speed.set(title="training throughput (median over epochs)", ylabel="samples/s")
    verdict = "within tolerances" if result.ok else "TOLERANCE BROKEN"
    fig.suptitle(
        f"polytrain compare: {result.recipe['model']} on {result.recipe['dataset']} ({verdict})"
    )
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)
