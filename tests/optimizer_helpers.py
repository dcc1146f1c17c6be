"""Shared by the optimizer-porting tests: the batches, the PyTorch twin that continues a
run from converted files, and the comparison (losses and final weights, limit 1e-5)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

IN, HID, OUT, BATCH = 8, 16, 3, 16  # fc2 is square: a transposed Linear state would pass shapes
SAVED, CONTINUED = 10, 10
TOL = 1e-5


def batches(n: int = SAVED + CONTINUED) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(0)
    return [
        (rng.standard_normal((BATCH, IN)).astype(np.float32), rng.integers(0, OUT, BATCH))
        for _ in range(n)
    ]


@dataclass
class Run:
    """The source framework's own continuation: losses and final weights (torch layout)."""

    losses: list[float]
    weights: dict[str, np.ndarray]


def torch_continue(
    weights: Path,
    make_opt: Callable[[Any], Any],
    state: Path | None,
    make_sched: Callable[[Any], Any] | None = None,
    sched_state: Path | None = None,
) -> Run:
    """The PyTorch twin from ``weights``, its optimizer (and scheduler) built as a user
    would, then given the ported states: the continued steps' losses and weights."""
    import torch

    torch.manual_seed(0)

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1 = torch.nn.Linear(IN, HID)
            self.fc2 = torch.nn.Linear(HID, HID)
            self.head = torch.nn.Linear(HID, OUT)

        def forward(self, x: Any) -> Any:
            return self.head(torch.tanh(self.fc2(torch.tanh(self.fc1(x)))))

    net = Net()
    net.load_state_dict(torch.load(weights, weights_only=True), strict=True)
    opt = make_opt(net.parameters())
    sched = make_sched(opt) if make_sched else None  # built before the states are loaded
    if state is not None:
        opt.load_state_dict(torch.load(state, weights_only=True))
    if sched is not None and sched_state is not None:
        sched.load_state_dict(torch.load(sched_state, weights_only=True))
    losses = []
    for x, y in batches()[SAVED:]:
        loss = torch.nn.functional.cross_entropy(net(torch.from_numpy(x)), torch.from_numpy(y))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if sched is not None:
            sched.step()
        losses.append(float(loss.detach()))
    final = {k: v.detach().numpy().copy() for k, v in net.state_dict().items()}
    return Run(losses, final)


def gap(a: Run, b: Run) -> tuple[float, float]:
    """(largest loss difference, largest weight difference) of two continuations."""
    loss = max(abs(x - y) for x, y in zip(a.losses, b.losses, strict=True))
    weight = max(float(np.max(np.abs(a.weights[k] - b.weights[k]))) for k in a.weights)
    return loss, weight


def check_continuation(label: str, reference: Run, ported: Run, fresh: Run | None) -> None:
    """The ported continuation within TOL of the framework's (losses and weights), and,
    where the optimizer has state, a fresh optimizer's far off; one line for the docs."""
    loss, weight = gap(reference, ported)
    far = f", a fresh optimizer {gap(reference, fresh)[0]:.1e}" if fresh else ""
    print(f"CONTINUE {label}: {len(reference.losses)} steps, max |loss diff| {loss:.1e}, "
          f"max |weight diff| {weight:.1e}{far}")  # fmt: skip
    assert loss <= TOL and weight <= TOL, (label, loss, weight)
    if fresh is not None:
        assert gap(reference, fresh)[0] > 10 * TOL, label
