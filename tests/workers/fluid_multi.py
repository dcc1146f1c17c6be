"""Worker for tests/porting/test_port_code_fluid_multi.py: runs code that ``polytrain port-code``
converted from Paddle 1.x fluid's data-parallel calls, one process per rank (torchrun
sets RANK, WORLD_SIZE, LOCAL_RANK and the master address, which the converted code reads).

Usage:
  fluid_multi.py entries OUT CODE_JSON  each entry's converted example, in order; writes
                                        OUT/rank<R>.json (its ``out``, the net's gradients)
  fluid_multi.py mnist OUT SRC          the converted seed's train_multi_gpu() in OUT/rank<R>
                                        (SRC: the converted seed folder); prints to log.txt
  fluid_multi.py reference OUT SRC      one process, in OUT/ref: the converted single-GPU
                                        seed's model and reader, the gradients of each pair
                                        of batches summed (fluid's semantics by hand)
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

SEED = 0
EPOCHS = 5  # the seed's EPOCH_NUM in train_multi_gpu
RANKS = 2  # the reference's number of trainers


def entry_inputs(rank: int) -> dict[str, Any]:
    """What the entries' examples use: a float64 Linear(3, 2) made alike on every rank, this
    rank's input, and a batch reader of five "batches" (0..4)."""
    torch.manual_seed(SEED)
    net = torch.nn.Linear(3, 2).double()
    x = torch.tensor(np.random.default_rng(rank).standard_normal((4, 3)))
    return {"net": net, "x": x, "strategy": None, "batches": lambda: iter(range(5))}


def plain(value: Any) -> Any:
    """``value`` as JSON: tensors as nested lists."""
    if isinstance(value, torch.Tensor):
        return value.detach().tolist()
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def run_entries(out: Path, codes: dict[str, str]) -> None:
    rank = int(os.environ["RANK"])
    results = {}
    for source, code in codes.items():
        ns = entry_inputs(rank)
        exec(code, ns)
        net = ns["net"]
        grads = {n: plain(p.grad) for n, p in net.named_parameters() if p.grad is not None}
        group = torch.distributed.is_initialized()
        joined = [group, *((torch.distributed.get_rank(), torch.distributed.get_world_size())
                           if group else ())]  # fmt: skip
        results[source] = {"out": plain(ns.get("out")), "grads": grads, "group": joined}
    (out / f"rank{rank}.json").write_text(json.dumps(results), encoding="utf-8")
    torch.distributed.destroy_process_group()


def run_mnist(out: Path, src: Path) -> None:
    """The converted multi-GPU function as a user runs it under torchrun; importing it
    imports (and so runs) the converted single-GPU program first, as the tutorial's does."""
    here = out / f"rank{os.environ['RANK']}"
    os.chdir(here)
    sys.path.insert(0, str(src))
    with open("single.txt", "w", encoding="utf-8") as log, contextlib.redirect_stdout(log):
        import paddle_mnist_multi  # type: ignore[import-not-found]
    with open("log.txt", "w", encoding="utf-8") as log, contextlib.redirect_stdout(log):
        random.seed(SEED)  # the same shuffles and initial weights on every rank
        torch.manual_seed(SEED)
        paddle_mnist_multi.train_multi_gpu()
    torch.distributed.destroy_process_group()


def run_reference(out: Path, src: Path) -> None:
    """Fluid 1.x's data parallelism by hand in one process: each step takes a group of
    RANKS consecutive batches (a shorter last group is dropped, distributed_reader.py),
    each batch's loss divided by RANKS (scale_loss) and their gradients summed
    (apply_collective_grads); the losses are the scaled ones train_multi_gpu prints."""
    os.chdir(out / "ref")
    sys.path.insert(0, str(src))
    with open("log.txt", "w", encoding="utf-8") as log, contextlib.redirect_stdout(log):
        import paddle_mnist_single  # type: ignore[import-not-found]

        random.seed(SEED)
        torch.manual_seed(SEED)
        model = paddle_mnist_single.MNIST()
        model.train()
        reader = paddle_mnist_single.load_data("train")
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        losses: list[list[float]] = []
        for _ in range(EPOCHS):
            batches = list(reader())
            for start in range(0, len(batches) - RANKS + 1, RANKS):
                step = []
                for image_data, label_data in batches[start : start + RANKS]:
                    predict = model(torch.tensor(image_data))
                    label = torch.tensor(label_data)
                    loss = torch.nn.functional.nll_loss(
                        torch.log(predict), label.reshape(-1), reduction="none"
                    ).unsqueeze(-1)
                    scaled = torch.mean(loss) / RANKS
                    scaled.backward()
                    step.append(scaled.item())
                optimizer.step()
                model.zero_grad()
                losses.append(step)
    Path("losses.json").write_text(json.dumps(losses), encoding="utf-8")
    torch.save(model.state_dict(), "reference.pt")


def main() -> None:
    torch.set_num_threads(1)
    mode, out = sys.argv[1], Path(sys.argv[2])
    if mode == "entries":
        run_entries(out, json.loads(Path(sys.argv[3]).read_text(encoding="utf-8")))
    elif mode == "mnist":
        run_mnist(out, Path(sys.argv[3]))
    else:
        run_reference(out, Path(sys.argv[3]))


if __name__ == "__main__":
    main()
