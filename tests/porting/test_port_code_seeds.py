"""The Paddle 1.x MNIST tutorial (a seed program, `fluid` dygraph code) converted by
``polytrain port-code`` trains on PyTorch. Its original cannot run here: Paddle 3.x has no
``paddle.fluid`` (the first test pins that, so a Paddle that brings it back makes the
original-vs-converted comparison possible and this file due for it); the Paddle 3.x
scripts of tests/porting/test_port_code_e2e.py cover the same layers with the same numbers."""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from polytrain.cli.main import main

torch = pytest.importorskip("torch")
SEED = Path(__file__).parents[1] / "fixtures" / "port_code" / "paddle_mnist_single.py"


def test_paddle_3_has_no_fluid() -> None:
    pytest.importorskip("paddle")
    with pytest.raises(ModuleNotFoundError):
        __import__("paddle.fluid")


def _tiny_mnist(path: Path, seed: int = 0, train: int = 200) -> None:
    """The tutorial's ``mnist.json.gz`` layout: [train, valid, eval], each [images, labels]
    with flat 784-pixel images; ``train`` training images (200: 2 batches of 100 per
    epoch)."""
    rng = np.random.default_rng(seed)

    def part(n: int) -> list:
        return [rng.random((n, 784)).round(3).tolist(), rng.integers(0, 10, n).tolist()]

    path.parent.mkdir(parents=True)
    with gzip.open(path, "wt") as f:
        json.dump([part(train), part(20), part(20)], f)


@pytest.mark.slow
def test_mnist_seed_converted_trains_on_torch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "mnist_torch.py"
    assert main(["port-code", str(SEED), "-o", str(out)]) == 0
    assert "18/18 lines with framework calls converted (100%)" in capsys.readouterr().out
    text = out.read_text(encoding="utf-8")
    assert "fluid" not in re.sub(r"#.*", "", text)  # comments may name it
    # fluid's cross_entropy takes labels [N, 1] and gives losses [N, 1]
    assert "label.reshape(-1), reduction='none').unsqueeze(-1)" in text
    _tiny_mnist(tmp_path / "work" / "mnist.json.gz")
    run = subprocess.run(
        [sys.executable, str(out)], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-2000:]
    losses = [float(v) for v in re.findall(r"loss is: ([0-9.e+-]+)", run.stdout)]
    assert len(losses) == 2  # batch 0 of each of the 2 epochs
    assert all(abs(v - np.log(10)) < 0.1 for v in losses)  # a softmax of small logits
    state = torch.load(tmp_path / "mnist.pdparams", weights_only=True)
    assert set(state) == {"conv1.0.weight", "conv1.0.bias", "conv2.0.weight", "conv2.0.bias",
                          "fc.0.weight", "fc.0.bias"}  # fmt: skip
    assert tuple(state["fc.0.weight"].shape) == (10, 980)
