"""``polytrain compare``: one recipe on several backends, and the differences."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from polytrain.cli.output import escape, make_console
from polytrain.cli.recipe_args import recipe_from_args


def cmd_compare(args: argparse.Namespace) -> int:
    """Run one recipe on several backends and report the differences."""
    from polytrain.parity.compare import Tolerances, compare
    from polytrain.parity.report import lockstep_table, pairs_table, table
    from polytrain.plugins.registry import (
        installed_backends,
        registered_backends,
        resolve_backend_name,
    )

    if args.backends:
        backends = [b.strip() for b in args.backends.split(",") if b.strip()]
        for name in backends:  # every name known and installed before any run starts
            resolve_backend_name(name)
    else:  # in the plugins' BackendInfo.order
        backends = installed_backends()
    tol = Tolerances(args.tol_loss, args.parity_steps, args.tol_acc, grad=args.tol_grad)
    reference = args.reference or first_in_order(backends, list(registered_backends()))
    result = compare(
        backends,
        recipe_from_args(args),
        args.out,
        tolerances=tol,
        threads=args.threads,
        reference=reference,
        quiet=args.quiet,
        lockstep_steps=args.parity_steps,
    )
    console = make_console()
    console.print(table(result))
    if len(backends) < 2:
        console.print(
            f"nothing to compare: one backend ({escape(', '.join(backends))}) ran; its run is "
            f"in {escape(str(args.out))}. Name two or more with --backends."
        )
        return 1 if result.failures else 0
    if result.lockstep is not None:
        console.print(lockstep_table(result))
    console.print(pairs_table(result))
    out = escape(str(args.out))  # text, never markup: a path or message may hold [brackets]
    console.print(f"wrote {out}/comparison.json, {out}/comparison.png and {out}/comparison.html")
    if result.failures:
        for failure in result.failures:
            console.print(f"[red]FAIL[/red] {escape(failure)}")
        return 1
    acc = (
        f" and within {tol.test_accuracy_points} points of test accuracy"
        if tol.test_accuracy_points is not None
        else ""
    )
    ref = escape(reference or backends[0])
    free = min((p.steps_compared for p in result.pairs), default=0)
    locked = result.lockstep.steps if result.lockstep is not None else 0
    if result.recipe["precision"] == "fp64":
        console.print(
            f"[green]OK[/green] (fp64): free runs within {tol.step_loss:.0e} of {ref} on each "
            f"of the {free} steps compared, lockstep on each of {locked} steps, lockstep "
            f"gradients within {tol.grad_for('fp64'):.0e} (relative){acc}."
        )
        return 0
    grads = f"{tol.grad_for(result.recipe['precision']):.0e}"
    console.print(
        f"[green]OK[/green]: in lockstep every backend is within {tol.step_loss:.0e} of "
        f"{ref} (loss) and {grads} (relative, every parameter's gradient) on each of "
        f"{locked} steps{acc}. Free runs diverge once float32 "
        "rounding differences are amplified (--precision fp64 keeps them together); see "
        "docs/semantics.md."
    )
    return 0


def first_in_order(backends: Sequence[str], order: Sequence[str]) -> str | None:
    """The backend of ``backends`` that comes first in ``order`` (compare's reference);
    names not in ``order`` come after, as given."""
    rank = {name: i for i, name in enumerate(order)}
    ranked = sorted(enumerate(backends), key=lambda ib: (rank.get(ib[1], len(rank)), ib[0]))
    return ranked[0][1] if ranked else None
