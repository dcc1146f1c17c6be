"""``polytrain port-code`` end to end: realistic Paddle 3.x training scripts
(tests/fixtures/port_code/e2e/: a CNN fed by ``paddle.io.DataLoader``, an MLP with a
``paddle.optimizer.lr`` schedule and ``paddle.amp``, a transformer block) are converted by
the command, every line; the original trains 20 steps on Paddle from saved weights, the
converted script 20 steps on PyTorch from the same weights converted by ``polytrain
convert`` (its layout rules: Linear weights transposed, BatchNorm statistics renamed) and
the same data order, and the per-step losses agree in float64 (1e-10)."""

from __future__ import annotations

import contextlib
import runpy
from collections.abc import Iterator
from pathlib import Path

import pytest

from polytrain.cli.main import main

paddle = pytest.importorskip("paddle")
torch = pytest.importorskip("torch")

E2E = Path(__file__).parents[1] / "fixtures" / "port_code" / "e2e"
SCRIPTS = ["paddle_cnn.py", "paddle_mlp_amp.py", "paddle_transformer.py"]
STEPS = 20
FP64 = 1e-10


@contextlib.contextmanager
def _framework_state() -> Iterator[None]:
    """The scripts set float64 as both frameworks' default: restored afterwards. PyTorch
    runs these tiny models on one thread (two threads on a busy 2-core machine: 40x
    slower)."""
    old, old_torch = paddle.get_default_dtype(), torch.get_default_dtype()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        paddle.set_default_dtype(old)
        torch.set_default_dtype(old_torch)
        torch.set_num_threads(threads)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:When training, we now always track:UserWarning")
@pytest.mark.filterwarnings("ignore:amp_guard can only be enabled:UserWarning")
@pytest.mark.filterwarnings("ignore:AmpScaler can only be enabled:UserWarning")
@pytest.mark.filterwarnings("ignore:CUDA is not available:UserWarning")
@pytest.mark.filterwarnings("ignore:torch.cuda.amp.GradScaler is enabled:UserWarning")
@pytest.mark.parametrize("script", SCRIPTS)
def test_converted_script_trains_with_the_same_losses(
    script: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src, out = E2E / script, tmp_path / f"torch_{script}"
    init_pd, init_pt = tmp_path / "init.pdparams", tmp_path / "init.pt"
    with _framework_state():
        original = runpy.run_path(str(src), run_name="paddle_original")
        paddle.seed(0)
        paddle.save(original["build"]().state_dict(), str(init_pd))
        assert main(["convert", str(init_pd), str(init_pt), "--to", "torch",
                     "--dtype", "float64"]) == 0  # fmt: skip
        assert main(["port-code", str(src), "-o", str(out)]) == 0  # every use converted
        assert "100%" in capsys.readouterr().out
        assert "import paddle" not in out.read_text(encoding="utf-8")
        paddle_losses = original["train"](str(init_pd))
        converted = runpy.run_path(str(out), run_name="torch_converted")
        torch_losses = converted["train"](str(init_pt))
    assert len(paddle_losses) == len(torch_losses) == STEPS
    assert len(set(paddle_losses)) == STEPS  # it trains: every step's loss is another
    diffs = [abs(a - b) for a, b in zip(paddle_losses, torch_losses, strict=True)]
    worst = max(range(STEPS), key=lambda i: diffs[i])
    assert diffs[worst] <= FP64, (
        f"step {worst + 1}: Paddle {paddle_losses[worst]!r}, PyTorch {torch_losses[worst]!r}"
    )
