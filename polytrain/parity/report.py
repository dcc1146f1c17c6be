"""The comparison report: a terminal table, a JSON file and a PNG (matplotlib, headless)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from polytrain.utils.fileio import atomic_path, atomic_write_text

if TYPE_CHECKING:
    from polytrain.parity.results import Comparison


def write_json(result: Comparison, path: Path) -> None:
    atomic_write_text(path, json.dumps(result.to_dict(), indent=2, sort_keys=True))


def _pair(result: Comparison, backend: str) -> Any:
    for p in result.pairs:
        if {p.a, p.b} == {backend, result.reference}:
            return p
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
    lock = result.lockstep
    for col in (
        "backend", "version", "devices", "final train loss", "test acc %", "samples/s",
        "s/epoch", "peak MiB", f"lockstep max |Δloss| vs {result.reference}",
        "free run diverges at step",
    ):  # fmt: skip
        t.add_column(col, justify="left" if col in ("backend", "version", "devices") else "right")
    for run in result.runs:
        f = run.final
        pair = _pair(result, run.backend)
        if run.backend == result.reference:
            dev, diverged = "(reference)", "-"
        else:
            dev = f"{lock.worst(run.backend)['loss']:.2e}" if lock else "-"
            diverged = (
                "never"
                if pair is None or pair.diverged_at_step is None
                else str(pair.diverged_at_step)
            )
        t.add_row(
            run.backend,
            run.framework_version,
            ",".join(run.devices),
            f"{f['train_loss']:.6f}" if f else "-",
            f"{100 * f['test_metric']:.2f}" if f.get("test_metric") is not None else "-",
            f"{run.samples_per_second:.0f}",
            f"{run.seconds_per_epoch:.1f}",
            f"{run.peak_rss_mb:.0f}" if run.peak_rss_mb else "-",
            dev,
            diverged,
        )
    return t


def pairs_table(result: Comparison) -> Any:
    from rich.table import Table

    tol = result.tolerances
    t = Table(
        title=f"free runs, pairwise (diverged = first step with |Δloss| > {tol.diverged_at:.0e})"
    )
    for col in ("pair", "diverged at step", f"max |Δloss|, first {tol.parity_steps} steps",
                "Δ test acc (points)", "Δ final train loss"):  # fmt: skip
        t.add_column(col, justify="right")
    for p in result.pairs:
        acc = p.test_accuracy_diff_points
        t.add_row(
            f"{p.a} vs {p.b}",
            "never" if p.diverged_at_step is None else str(p.diverged_at_step),
            f"{p.max_step_loss_diff:.2e}",
            "-" if acc is None else f"{acc:.2f}",
            "-" if p.final_train_loss_diff is None else f"{p.final_train_loss_diff:.2e}",
        )
    return t


def lockstep_table(result: Comparison) -> Any:
    """Worst lockstep differences per backend (None when no lockstep ran)."""
    from rich.table import Table

    lock = result.lockstep
    if lock is None:
        return None
    seconds = ", ".join(f"{b} {sum(s):.1f}" for b, s in lock.step_seconds.items())
    t = Table(
        title=f"lockstep: {lock.steps} steps, each from {lock.reference}'s exact state",
        caption=f"lockstep seconds: {seconds}; comparing {lock.compare_seconds:.1f}",
    )
    for col in ("backend", "max |Δloss|", "max rel. Δ grad (parameter, step)",
                "max rel. Δ grad norm", "max |Δ updated params|",
                "max |Δ eval logits|"):  # fmt: skip
        t.add_column(col, justify="right")
    for name in lock.loss_diff:
        w = lock.worst(name)
        grad = "-"
        if lock.grad_diff.get(name):
            step, param, diff = lock.worst_grad_step(name)
            grad = f"{diff:.2e} ({param}, {step})"
        t.add_row(name, f"{w['loss']:.2e}", grad, f"{w['grad_norm_rel']:.2e}",
                  f"{w['params']:.2e}", f"{w['eval_logits']:.2e}")  # fmt: skip
    return t


def zero_floor(result: Comparison) -> float:
    """Where a zero difference is drawn on the log axis: a decade below the smallest
    non-zero difference (float32 runs: ~1e-8; fp64 runs: ~1e-16), at most 1e-10."""
    ref = next(r for r in result.runs if r.backend == result.reference)
    values = [
        abs(a - b)
        for r in result.runs
        for a, b in zip(r.step_losses, ref.step_losses, strict=False)  # runs may be cut short
    ]
    if result.lockstep is not None:
        values += [v for diffs in result.lockstep.loss_diff.values() for v in diffs]
    positive = [v for v in values if v > 0]
    smallest = min(positive, default=1e-9)
    return float(min(1e-10, 10 ** (np.floor(np.log10(smallest)) - 1)))


def write_plot(result: Comparison, path: Path) -> None:
    """Loss curves overlaid, deviation from the reference, test accuracy, throughput."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(13, 9))
    (ax_loss, ax_dev), (ax_acc, ax_speed) = axes
    ref = next(r for r in result.runs if r.backend == result.reference)
    floor = zero_floor(result)
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
            ax_dev.semilogy(steps[:n], np.maximum(diff, floor), color=c, lw=0.8, alpha=0.45,
                            label=f"{run.backend}, free run")  # fmt: skip
            if result.lockstep is not None and run.backend in result.lockstep.loss_diff:
                locked = np.asarray(result.lockstep.loss_diff[run.backend])
                # points, not a line: bit-equal steps (0, drawn at the floor) alternate with
                # 1-ulp ones, and a joined line would paint a solid block between them
                ax_dev.semilogy(np.arange(1, len(locked) + 1), np.maximum(locked, floor),
                                color=c, ls="none", marker=".", ms=3,
                                label=f"{run.backend}, lockstep")  # fmt: skip
        # equal accuracies would hide each other's markers: each backend's sit a little
        # to the side of its epoch (at most 0.2 of an epoch in all)
        shift = 0.2 * (i - (len(result.runs) - 1) / 2) / max(len(result.runs) - 1, 1)
        epochs = [e["epoch"] + 1 + shift for e in run.epochs]
        accs = [100 * (e["test_metric"] or 0) for e in run.epochs]
        ax_acc.plot(
            epochs, accs, marker="o", color=c, ls="-" if i == 0 else "--", label=run.backend
        )
    ax_loss.set(title="training loss per step", xlabel="step", ylabel="mean cross-entropy")
    for ax in (ax_loss, ax_dev):  # whole steps, also on a short run
        ax.xaxis.get_major_locator().set_params(integer=True)
    ax_loss.legend()
    tol = result.tolerances
    ax_dev.axhline(tol.step_loss, color="red", ls=":", label=f"tolerance {tol.step_loss:.0e}")
    ax_dev.axvline(tol.parity_steps, color="grey", ls=":", lw=0.8)
    ax_dev.set(
        title=f"|loss - {result.reference} loss| per step",
        xlabel="step",
        ylabel=f"absolute difference (0 drawn at {floor:.0e})",
    )
    ax_dev.legend()
    ax_acc.set(title="test accuracy", xlabel="epoch", ylabel="%")
    ax_acc.xaxis.get_major_locator().set_params(integer=True)
    ax_acc.legend()
    names = [r.backend for r in result.runs]
    rates = [r.samples_per_second for r in result.runs]
    bars = ax_speed.bar(names, rates, color=colors[: len(names)])
    ax_speed.bar_label(bars, fmt="%.0f")
    ax_speed.set(title="training throughput (median over epochs)", ylabel="samples/s")
    verdict = "within tolerances" if result.ok else "TOLERANCE BROKEN"
    r = result.recipe
    fig.suptitle(
        f"polytrain compare: {r['model']} on {r['dataset']}, {r['optimizer']} lr {r['lr']}, "
        f"{r.get('precision', 'fp32')} ({verdict})"
    )
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)
