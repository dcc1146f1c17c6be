"""``polytrain port-code`` end to end on Gluon: two MXNet Gluon 1.x training scripts
(tests/fixtures/port_code/e2e/: an MLP whose first Dense flattens a 3-D input, trained
with gluon.Trainer sgd + momentum + weight decay; a CNN with Conv2D, BatchNorm, max and
average pooling and a flattening Dense) are converted by the command, every line; the
original trains 20 steps on MXNet from saved ``.params``, the converted script 20 steps on
PyTorch from the same file converted by ``polytrain convert`` (BatchNorm gamma/beta
renamed; each flattening Dense, a ``Sequential(Flatten(), Linear)`` in PyTorch, mapped by
one prefix entry), in the same data order; per-step losses agree in float64 (1e-10)."""

from __future__ import annotations

import json
import runpy
from pathlib import Path

import pytest

from polytrain.cli.main import main

mx = pytest.importorskip("mxnet")
torch = pytest.importorskip("torch")

E2E = Path(__file__).parents[1] / "fixtures" / "port_code" / "e2e"
SCRIPTS = {
    "gluon_mlp.py": {"0.1.": {"native": "0."}},  # Dense(16, activation="relu"): Flatten first
    "gluon_cnn.py": {"fc.1.": {"native": "fc."}},
}
STEPS = 20
FP64 = 1e-10


@pytest.mark.filterwarnings("ignore:Lazy modules are a new feature:UserWarning")
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_converted_gluon_script_trains_with_the_same_losses(
    script: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src, out = E2E / script, tmp_path / f"torch_{script}"
    init_mx, init_pt = tmp_path / "init.params", tmp_path / "init.pt"
    name_map = tmp_path / "map.json"
    name_map.write_text(json.dumps(SCRIPTS[script]), encoding="utf-8")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        original = runpy.run_path(str(src), run_name="gluon_original")
        mx.random.seed(0)
        original["build"]().save_parameters(str(init_mx))
        assert main(["convert", str(init_mx), str(init_pt), "--to", "torch",
                     "--dtype", "float64", "--map", str(name_map)]) == 0  # fmt: skip
        assert main(["port-code", str(src), "-o", str(out)]) == 0  # every use converted
        assert "100%" in capsys.readouterr().out
        text = out.read_text(encoding="utf-8")
        assert "mxnet" not in text and "trainer.zero_grad()" in text
        gluon_losses = original["train"](str(init_mx))
        converted = runpy.run_path(str(out), run_name="torch_converted")
        torch_losses = converted["train"](str(init_pt))
    finally:
        torch.set_num_threads(threads)
    assert len(gluon_losses) == len(torch_losses) == STEPS
    assert len(set(gluon_losses)) == STEPS  # it trains: every step's loss is another
    diffs = [abs(float(a) - b) for a, b in zip(gluon_losses, torch_losses, strict=True)]
    worst = max(range(STEPS), key=lambda i: diffs[i])
    print(f"{script}: largest per-step loss difference {diffs[worst]:.2g} (step {worst + 1})")
    assert diffs[worst] <= FP64, (
        f"step {worst + 1}: Gluon {gluon_losses[worst]!r}, PyTorch {torch_losses[worst]!r}"
    )
