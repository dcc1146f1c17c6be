"""A plain Paddle training script (model, weights, Adam state) continued on PyTorch with the
same losses (docs/porting.md, worked example).

1. ``paddle_script``: a Paddle 3.x script as a user writes it (no polytrain inside): a small
   CNN (``paddle_net``: Conv2D, BatchNorm2D, Linear), ``paddle.optimizer.Adam``, a few steps
   on Fashion-MNIST, then ``paddle.save`` of ``net.state_dict()`` and ``opt.state_dict()``
   (``net.pdparams``, ``net.pdopt``); it goes on for the steps to compare (the reference).
2. Port both files: ``polytrain convert net.pdparams net.pt --to torch --optimizer
   net.pdopt --optimizer-setting optimizer=adam --optimizer-setting lr=...`` (read without
   Paddle) writes ``net.pt`` and ``net.optimizer.pt``.
3. ``torch_continue``: the PyTorch twin (``torch_net``, written as a PyTorch user would)
   loads them with ``load_state_dict`` into the model and a ``torch.optim.Adam`` and trains
   on the same batches in plain PyTorch. Both loss columns are printed; the exit status is 1
   when they differ by more than ``--tolerance`` (1e-5; float32 throughout).

    python examples/port_paddle_script.py --out runs/port-script

``--fresh-optimizer`` continues with a new ``torch.optim.Adam`` instead of the ported state,
to see what the state is worth. Needs Paddle and PyTorch. The images come from polytrain's
data loader (``--dataset mnist`` where MNIST's files exist); the training loops only see
numpy batches, the same ones on both sides.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

from polytrain.cli.main import main as polytrain_cli
from polytrain.data import load_dataset

Batches = list[tuple[np.ndarray, np.ndarray]]


def paddle_net() -> Any:
    """The user's Paddle model."""
    import paddle
    import paddle.nn.functional as F
    from paddle import nn

    class Net(nn.Layer):
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = nn.Conv2D(1, 8, 3, padding=1, bias_attr=False)  # BatchNorm follows
            self.bn1 = nn.BatchNorm2D(8)
            self.conv2 = nn.Conv2D(8, 16, 3, padding=1, bias_attr=False)
            self.bn2 = nn.BatchNorm2D(16)
            self.fc1 = nn.Linear(16 * 7 * 7, 64)  # Paddle stores Linear weights [in, out]
            self.fc2 = nn.Linear(64, 10)

        def forward(self, x: Any) -> Any:
            x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
            x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
            return self.fc2(F.relu(self.fc1(paddle.flatten(x, 1))))

    return Net()


def torch_net() -> Any:
    """Its PyTorch twin: the same attribute names, the parameters in the same order."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(1, 8, 3, padding=1, bias=False)
            self.bn1 = nn.BatchNorm2d(8)
            self.conv2 = nn.Conv2d(8, 16, 3, padding=1, bias=False)
            self.bn2 = nn.BatchNorm2d(16)
            self.fc1 = nn.Linear(16 * 7 * 7, 64)
            self.fc2 = nn.Linear(64, 10)

        def forward(self, x: Any) -> Any:
            x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
            x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
            return self.fc2(F.relu(self.fc1(torch.flatten(x, 1))))

    return Net()


def paddle_script(
    batches: Batches, out: Path, save_after: int, lr: float
) -> tuple[list[float], Any]:
    """The user's Paddle training loop: save net.pdparams / net.pdopt after ``save_after``
    steps, go on to the end of ``batches``. Returns every step's loss and the model."""
    import paddle
    import paddle.nn.functional as F

    paddle.set_device("cpu")
    paddle.seed(0)
    net = paddle_net()
    opt = paddle.optimizer.Adam(learning_rate=lr, parameters=net.parameters())
    losses = []
    for step, (x, y) in enumerate(batches, start=1):
        loss = F.cross_entropy(net(paddle.to_tensor(x)), paddle.to_tensor(y))
        loss.backward()
        opt.step()
        opt.clear_grad()
        losses.append(float(loss))
        if step == save_after:
            paddle.save(net.state_dict(), str(out / "net.pdparams"))
            paddle.save(opt.state_dict(), str(out / "net.pdopt"))
    return losses, net


def torch_continue(
    batches: Batches, out: Path, lr: float, fresh_optimizer: bool
) -> tuple[list[float], Any]:
    """The PyTorch twin from the converted files, trained on ``batches`` in plain PyTorch.
    Returns the losses and the model."""
    import torch
    import torch.nn.functional as F

    net = torch_net()
    net.load_state_dict(torch.load(out / "net.pt", weights_only=True))
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    if not fresh_optimizer:
        opt.load_state_dict(torch.load(out / "net.optimizer.pt", weights_only=True))
    losses = []
    for x, y in batches:
        loss = F.cross_entropy(net(torch.from_numpy(x)), torch.from_numpy(y))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, net


def eval_logit_diff(paddle_model: Any, torch_model: Any, x: np.ndarray) -> float:
    """Max |difference| of the two models' eval-mode logits on ``x``."""
    import paddle
    import torch

    paddle_model.eval()
    torch_model.eval()
    with torch.no_grad():
        theirs = torch_model(torch.from_numpy(x)).numpy()
    return float(np.abs(paddle_model(paddle.to_tensor(x)).numpy() - theirs).max())


def saved_logit_diff(out: Path, x: np.ndarray) -> float:
    """The saved files, each loaded into its own framework's model: eval-mode logits."""
    import paddle
    import torch

    paddle_model = paddle_net()
    paddle_model.set_state_dict(paddle.load(str(out / "net.pdparams")))
    torch_model = torch_net()
    torch_model.load_state_dict(torch.load(out / "net.pt", weights_only=True))
    return eval_logit_diff(paddle_model, torch_model, x)


def fashion_batches(args: argparse.Namespace) -> Batches:
    """``--steps + --continue-steps`` batches of the training set, in the file's order."""
    n = (args.steps + args.continue_steps) * args.batch_size
    data = load_dataset(args.dataset, "train", data_dir=args.data_dir).subset(n)
    x, y = data.x, data.y.astype(np.int64)
    size = args.batch_size
    return [(x[i : i + size], y[i : i + size]) for i in range(0, n, size)]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", default="runs/port-script", help="directory for the files")
    p.add_argument("--dataset", default="fashion-mnist")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--steps", type=int, default=20, help="Paddle steps before saving")
    p.add_argument("--continue-steps", type=int, default=10, help="steps compared")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--tolerance", type=float, default=1e-5)
    p.add_argument("--test-samples", type=int, default=256, help="images for the eval check")
    p.add_argument("--fresh-optimizer", action="store_true",
                   help="continue on PyTorch with a new Adam, not the ported state")  # fmt: skip
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    batches = fashion_batches(args)
    test_x = load_dataset(args.dataset, "test", data_dir=args.data_dir).subset(args.test_samples).x

    print(f"1. plain Paddle script: Adam(lr={args.lr}), {args.steps} steps of {args.batch_size}, "
          f"save net.pdparams + net.pdopt, then {args.continue_steps} more")  # fmt: skip
    paddle_losses, paddle_model = paddle_script(batches, out, args.steps, args.lr)
    paddle_losses = paddle_losses[args.steps :]

    settings = ["--optimizer-setting", "optimizer=adam", "--optimizer-setting", f"lr={args.lr}"]
    print("2. polytrain convert net.pdparams net.pt --to torch --optimizer net.pdopt "
          + " ".join(settings))  # fmt: skip
    cli = ["convert", str(out / "net.pdparams"), str(out / "net.pt"), "--to", "torch",
           "--optimizer", str(out / "net.pdopt"), *settings]  # fmt: skip
    if polytrain_cli(cli) != 0:
        raise SystemExit("the conversion failed (see above)")
    saved = saved_logit_diff(out, test_x)
    print(f"   net.pt vs net.pdparams, eval mode on {len(test_x)} test images: "
          f"max |logit difference| {saved:.1e}")  # fmt: skip

    state = "a fresh Adam" if args.fresh_optimizer else "the ported Adam state"
    print(f"3. plain PyTorch from net.pt with {state}, the same {args.continue_steps} batches")
    torch_losses, torch_model = torch_continue(
        batches[args.steps :], out, args.lr, args.fresh_optimizer
    )
    diffs = np.abs(np.array(torch_losses) - np.array(paddle_losses))
    print("   step   Paddle loss   PyTorch loss   |diff|")
    for i, (a, b, d) in enumerate(zip(paddle_losses, torch_losses, diffs, strict=True)):
        print(f"   {args.steps + i + 1:4d}   {a:11.7f}   {b:12.7f}   {d:.1e}")
    max_diff = float(diffs.max())
    passed = max_diff <= args.tolerance
    verdict = "within" if passed else "BEYOND"
    print(f"   max |loss difference| {max_diff:.1e}: {verdict} the tolerance {args.tolerance:g}")
    after = eval_logit_diff(paddle_model, torch_model, test_x)
    print(f"   then eval mode: max |logit difference| {after:.1e} (Paddle's BatchNorm keeps "
          "the biased batch variance, PyTorch's the unbiased)")  # fmt: skip
    return {"paddle_losses": paddle_losses, "torch_losses": torch_losses, "max_diff": max_diff,
            "saved_logit_max_diff": saved, "continued_logit_max_diff": after,
            "passed": passed}  # fmt: skip


if __name__ == "__main__":
    sys.exit(0 if main()["passed"] else 1)
