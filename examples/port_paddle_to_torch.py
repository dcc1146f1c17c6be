"""Port a Paddle training run and its weights to PyTorch (docs/porting.md, worked example).

1. Train the Paddle tutorial's CNN on Paddle (polytrain's Trainer: a neutral checkpoint
   per epoch) and save the model as Paddle does (``mnist.pdparams``, the file of the
   tutorial's ``fluid.save_dygraph``).
2. Continue the *same run* on PyTorch from the neutral checkpoint: optimizer state, epoch
   and data position carry over (``polytrain train --backend torch --resume DIR``).
3. Convert the Paddle file to a PyTorch state dict (``polytrain convert mnist.pdparams
   mnist.pt --to torch``), load it into a plain ``torch.nn.Module`` written the way a
   PyTorch user would write the tutorial's network, check its logits against Paddle's,
   and keep training it in plain PyTorch.

    python examples/port_paddle_to_torch.py --out runs/port

Needs Paddle and PyTorch. The default data is Fashion-MNIST (MNIST's training files are
not on every machine); ``--dataset mnist`` where they exist.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np

from polytrain import get_backend, get_model_spec
from polytrain.io.convert import convert
from polytrain.training.recipe import Recipe
from polytrain.training.trainer import Trainer, load_datasets


def torch_mnist() -> Any:
    """The tutorial's MNIST network as a PyTorch user writes it (no polytrain inside)."""
    import torch.nn.functional as F
    from torch import nn

    class MNIST(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(1, 20, 5, stride=1, padding=2)
            self.conv2 = nn.Conv2d(20, 20, 5, stride=1, padding=2)
            self.fc = nn.Linear(980, 10)  # Paddle stores this weight [980, 10]; torch [10, 980]

        def forward(self, x: Any) -> Any:
            x = F.max_pool2d(F.relu(self.conv1(x)), 2, 2)
            x = F.max_pool2d(F.relu(self.conv2(x)), 2, 2)
            return self.fc(x.flatten(1))  # logits: the tutorial's softmax is in the loss

    return MNIST()


def main(argv: list[str] | None = None) -> dict[str, float]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", default="runs/port", help="directory for runs and files")
    p.add_argument("--dataset", default="fashion-mnist")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--train-samples", type=int, default=2000)
    p.add_argument("--test-samples", type=int, default=1000)
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args(argv)
    out = Path(args.out)
    recipe = Recipe(model="paddle-mnist", dataset=args.dataset, data_dir=args.data_dir,
                    epochs=1, batch_size=100, optimizer="momentum", lr=0.05,
                    train_samples=args.train_samples, test_samples=args.test_samples)  # fmt: skip
    data = load_datasets(recipe)
    result: dict[str, float] = {}

    print("1. train on Paddle")
    paddle_b = get_backend("paddle", threads=args.threads)
    # overwrite: this example owns its folders and replaces them on every run
    trainer = Trainer(
        recipe, paddle_b, out_dir=out / "paddle", progress=False, datasets=data, overwrite=True
    )
    epoch = trainer.fit().epochs[-1]
    print(f"   epoch 1: loss {epoch.train_loss:.4f}, test accuracy {epoch.test_accuracy:.3f}")
    pdparams = out / "mnist.pdparams"
    paddle_b.save_native(trainer.model, str(pdparams))  # = fluid.save_dygraph(state_dict)
    print(f"   neutral checkpoint in {out / 'paddle'}, Paddle file {pdparams}")

    print("2. continue the same run on PyTorch (polytrain train --resume)")
    torch_b = get_backend("torch", threads=args.threads)
    more = Recipe(**{**recipe.to_dict(), "epochs": 2})
    resumed = Trainer(more, torch_b, out_dir=out / "torch", resume=out / "paddle",
                      progress=False, datasets=data, overwrite=True)  # fmt: skip
    epoch = resumed.fit().epochs[-1]
    result["resumed_test_accuracy"] = float(epoch.test_accuracy or 0.0)
    print(f"   epoch 2 on torch: loss {epoch.train_loss:.4f}, "
          f"test accuracy {epoch.test_accuracy:.3f}")  # fmt: skip

    print("3. convert mnist.pdparams -> mnist.pt and load it into plain PyTorch")
    report = convert(pdparams, out / "mnist.pt", "torch")
    print("   " + report.format().replace("\n", "\n   "))
    import torch

    net = torch_mnist()
    net.load_state_dict(torch.load(out / "mnist.pt", weights_only=True))
    assert data.test is not None
    x, y = data.test.x, data.test.y
    with torch.no_grad():
        torch_logits = net(torch.from_numpy(x)).numpy()
    paddle_logits = paddle_b.to_numpy(paddle_b.forward(trainer.model, paddle_b.to_tensor(x)))
    result["logit_max_diff"] = float(np.abs(torch_logits - paddle_logits).max())
    print(f"   logits on {len(x)} test images, PyTorch vs Paddle: max difference "
          f"{result['logit_max_diff']:.1e}")  # fmt: skip

    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    train = data.train
    for i in range(0, 500, 100):  # plain PyTorch from here on
        loss = torch.nn.functional.cross_entropy(
            net(torch.from_numpy(train.x[i : i + 100])), torch.from_numpy(train.y[i : i + 100])
        )
        opt.zero_grad()
        loss.backward()
        opt.step()
    result["torch_loss"] = loss.item()
    with torch.no_grad():
        accuracy = float((net(torch.from_numpy(x)).argmax(1).numpy() == y).mean())
    print(f"   5 more steps in plain PyTorch: loss {result['torch_loss']:.4f}, "
          f"test accuracy {accuracy:.3f}")  # fmt: skip
    spec = get_model_spec("paddle-mnist")
    assert [n for n, _ in net.named_parameters()] == spec.trainable_names()
    return result


if __name__ == "__main__":
    main()
