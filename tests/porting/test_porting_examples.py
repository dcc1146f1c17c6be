"""The seed programs' polytrain versions in examples/ run on every backend, on small slices,
and give the numbers they promise (the same losses everywhere, accumulation equal to the
whole batch, one process equal to two)."""

from __future__ import annotations

import importlib.util
import json
import socket
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from polytrain.io.convert import read_weights
from polytrain.neutral.optim import OPTIMIZERS
from polytrain.testing import backends_under_test

BACKENDS = backends_under_test()
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_paddle_mnist_same_losses_on_every_backend(
    optimizer: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = example("paddle_mnist").main
    losses = {}
    for backend in BACKENDS:
        out = tmp_path / backend
        result = run(["--backend", backend, "--optimizer", optimizer, "--train-samples", "300",
                      "--epochs", "1", "--print-every", "2", "--out", str(out)])  # fmt: skip
        losses[backend] = result["loss"]
        (saved,) = out.iterdir()
        assert read_weights(saved).spec.name == "paddle-mnist"  # type: ignore[union-attr]
    printed = capsys.readouterr().out
    assert "epoch: 0, batch: 2, loss is: [" in printed
    assert max(losses.values()) - min(losses.values()) <= 1e-5, losses


@pytest.mark.slow
def test_paddle_mnist_multi_as_one_process(backend_name: str, tmp_path: Path) -> None:
    losses = example("paddle_mnist_multi").main(
        ["--backend", backend_name, "--train-samples", "300", "--out", str(tmp_path)]
    )
    assert len(losses) == 3 and all(np.isfinite(losses))
    assert (tmp_path / "losses.json").exists()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
@pytest.mark.skipif("torch" not in BACKENDS, reason="the launched run uses torch")
def test_paddle_mnist_multi_two_processes_equal_one(tmp_path: Path) -> None:
    script = [str(EXAMPLES / "paddle_mnist_multi.py"), "--backend", "torch", "--train-samples",
              "400", "--print-every", "1"]  # fmt: skip
    one = example("paddle_mnist_multi").main([*script[1:], "--out", str(tmp_path / "one")])
    cmd = [sys.executable, "-m", "polytrain", "launch", "--backend", "torch", "--nproc-per-node",
           "2", "--master", f"127.0.0.1:{free_port()}", "--log-dir", str(tmp_path / "logs"),
           "--", sys.executable, *script, "--out", str(tmp_path / "two")]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    two = json.loads((tmp_path / "two" / "losses.json").read_text())
    assert two["world_size"] == 2
    np.testing.assert_allclose(two["losses"], one, rtol=0, atol=1e-6)
    assert "loss is:" in (tmp_path / "logs" / "workerlog.0").read_text()


def test_mxnet_async(backend_name: str, capsys: pytest.CaptureFixture[str]) -> None:
    result = example("mxnet_async").main(
        ["--backend", backend_name, "--size", "64", "--repeat", "5"]
    )
    assert result["finished"] >= result["returned"]
    assert result["value"] == pytest.approx(0.5**6)  # (0.5 I)^6
    assert "c = [[3. 3.]]" in capsys.readouterr().out


@pytest.mark.slow
def test_speed_tips(backend_name: str) -> None:
    result = example("speed_tips").main(["--backend", backend_name, "--train-samples", "256"])
    assert result["accumulate_max_diff"] <= 1e-6
    assert result["data_parallel_loss_diff"] <= 1e-6
    assert result["batch_16_samples_per_s"] > 0


@pytest.mark.slow
@pytest.mark.skipif(not {"paddle", "torch"} <= set(BACKENDS), reason="needs paddle and torch")
def test_port_paddle_to_torch(tmp_path: Path) -> None:
    result = example("port_paddle_to_torch").main(
        ["--out", str(tmp_path), "--train-samples", "600", "--test-samples", "300"]
    )
    assert result["logit_max_diff"] <= 1e-5
    assert np.isfinite(result["torch_loss"]) and result["resumed_test_accuracy"] > 0.3
    assert (tmp_path / "torch" / "checkpoints" / "latest").exists()


@pytest.mark.slow
@pytest.mark.skipif(not {"paddle", "torch"} <= set(BACKENDS), reason="needs paddle and torch")
@pytest.mark.filterwarnings("ignore:When training, we now always track:UserWarning")  # BatchNorm2D
def test_port_paddle_script_continues_on_torch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A plain Paddle Adam script's files, converted, continue in plain PyTorch with Paddle's
    own losses; the same continuation with a fresh Adam is far off (and exits 1)."""
    run = example("port_paddle_script").main
    quick = ["--steps", "5", "--continue-steps", "5", "--batch-size", "16", "--test-samples",
             "64"]  # fmt: skip
    ported = run([*quick, "--out", str(tmp_path / "ported")])
    assert ported["passed"] and ported["max_diff"] <= 1e-5, ported
    assert ported["saved_logit_max_diff"] <= 1e-4
    assert len(ported["torch_losses"]) == 5
    assert {"net.pdparams", "net.pdopt", "net.pt", "net.optimizer.pt"} <= {
        p.name for p in (tmp_path / "ported").iterdir()
    }
    assert "optimizer state: adam, step 5" in capsys.readouterr().out
    fresh = run([*quick, "--out", str(tmp_path / "fresh"), "--fresh-optimizer"])
    assert not fresh["passed"] and fresh["max_diff"] > 100 * 1e-5, fresh
