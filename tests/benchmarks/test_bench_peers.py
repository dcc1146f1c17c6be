"""benchmarks.peers without Keras (the project's venv never has it): its arguments, the
figures and ratios on fixed numbers, the Keras layouts of the initial weights, and one tiny
real run of the polytrain and native rows. No timing is asserted."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from benchmarks import peers
from benchmarks.common import Workload, initial_weights
from benchmarks.peers_layouts import keras_weights, ordered


def test_defaults_are_lenet_sgd_lr_0_1_on_torch_and_jax() -> None:
    args = peers.parse_args([])
    work = peers.workload(args)
    assert args.frameworks == ["torch", "jax"]
    assert (work.optimizer, work.lr, work.momentum, work.batch_size) == ("sgd", 0.1, 0.0, 256)
    assert (work.steps, work.warmup, work.model) == (100, 10, "lenet")
    quick = peers.workload(peers.parse_args(["--quick", "--optimizer", "momentum"]))
    assert (quick.steps, quick.warmup, quick.momentum) == (12, 3, 0.9)


def test_an_unknown_framework_is_one_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        peers.parse_args(["--frameworks", "torch,keras"])
    assert exc.value.code == 2
    assert "unknown framework(s) keras" in capsys.readouterr().err


def _m(speed: float, cpu: float = 1.0, loss: float = 0.5, **extra: object) -> dict:
    return {"samples_per_second": speed, "samples": 1000, "last_loss": loss,
            "extra": {"cpu_seconds": cpu, **extra}}  # fmt: skip


def test_ratio_is_the_median_of_per_round_ratios_with_its_interval() -> None:
    ours = [_m(s) for s in (300, 330, 360, 390, 420, 450)]
    theirs = [_m(s) for s in (100, 100, 120, 130, 100, 150)]
    q = peers.ratio(ours, theirs)
    assert q["rounds"] == [3.0, 3.3, 3.0, 3.0, 4.2, 3.0]
    # six rounds: the 95 % interval is [min, max]; the median of 3,3,3,3,3.3,4.2 is 3
    assert (q["median"], q["lo"], q["hi"]) == (3.0, 3.0, 4.2)
    figures = peers.loop_figures(theirs)
    assert figures["median"] == 110.0
    assert figures["spread"] == pytest.approx(50 / 110)
    assert figures["cpu_us_per_sample"] == 1000.0  # 1 s of CPU over 1000 samples


def _result() -> dict:
    measured = {
        "polytrain": [_m(s, fast=False) for s in (200, 210, 220)],
        "native": [_m(s) for s in (100, 100, 100)],
        "keras_channels_first": [_m(s, jit_compile=True) for s in (400, 420, 440)],
    }
    side = {"version": "1.0", "threads": {"intra_op": 2}, "native_fast": False}
    return {"framework": "jax", "project": side, "keras": {**side, "version": "3.15.1"},
            "measured": measured, "loads": [0.5, 1.25]}  # fmt: skip


def test_the_table_has_one_row_per_loop_and_polytrain_over_each() -> None:
    info = {"date": "2026-11-28", "load_start": 0.5, "load_end": 1.0,
            "machine": {"cpu": "CPU X", "cpus": 2, "usable_cpus": 2, "python": "3.11",
                        "numpy": "1.23"}}  # fmt: skip
    lines = peers.report([_result()], Workload(optimizer="sgd", lr=0.1), 3, info)
    text = "\n".join(lines)
    assert "jax 1.0, keras 3.15.1" in lines[0]
    assert "max 1.25" in lines[1] and "SGD lr 0.1" in lines[2]
    rows = {line[10:31].strip(): line for line in lines[5:]}  # by the loop's label
    assert rows["polytrain"].endswith(" -")
    assert rows["native (by hand)"].endswith("2.100 [2.00, 2.20]")  # compiled: jax jits
    assert "compiled" in rows["native (by hand)"]
    assert rows["Keras channels_first"].endswith("0.500 [0.50, 0.50]")
    assert "jit_compile on" in rows["Keras channels_first"]
    assert "Keras rows skipped" not in text
    skipped = peers.report([_result()], Workload(), 3, info, keras_skipped="--no-keras")
    assert "Keras rows skipped: --no-keras" in skipped


def test_keras_weights_compute_the_same_layers() -> None:
    canonical = initial_weights(0)
    first = keras_weights(0, "channels_first")
    assert first[0].shape == (3, 3, 1, 20) and first[2].shape == (5, 5, 20, 50)
    np.testing.assert_array_equal(first[0][1, 2, 0, 7], canonical[0][7, 0, 1, 2])
    np.testing.assert_array_equal(first[4], canonical[4].T)
    # channels_last flattens H,W,C: the permuted fc1 gives the same outputs
    act = np.random.default_rng(0).standard_normal((3, 50, 4, 4)).astype(np.float32)
    last = keras_weights(0, "channels_last")
    nchw = act.reshape(3, -1) @ first[4]
    nhwc = act.transpose(0, 2, 3, 1).reshape(3, -1) @ last[4]
    np.testing.assert_allclose(nhwc, nchw, rtol=1e-5, atol=1e-5)


def test_keras_sees_the_batches_in_the_native_loops_order() -> None:
    x = np.arange(64 * 28 * 28, dtype=np.float32).reshape(64, 1, 28, 28)
    y = np.arange(64) % 10
    work = Workload(batch_size=16, seed=3)
    xs, ys = ordered(x, y, work, "channels_first")
    order = np.random.default_rng([3, 0]).permutation(64)  # BatchLoader.order(0)
    np.testing.assert_array_equal(xs, x[order])
    assert ys.dtype == np.int32 and list(ys) == list(y[order])
    xl, _ = ordered(x, y, work, "channels_last")
    np.testing.assert_array_equal(xl, x[order].transpose(0, 2, 3, 1))


@pytest.mark.slow
def test_polytrain_and_native_rows_without_keras(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Real worker processes, one step of batch 32 each: the rows, the same last loss."""
    tiny = ["--steps", "1", "--warmup", "1", "--repeats", "1", "--batch-size", "32"]
    argv = [
        "--quick",
        "--no-keras",
        "--frameworks",
        "torch",
        *tiny,
        "--json",
        str(tmp_path / "r.json"),
    ]
    assert peers.main(argv) == 0
    out = capsys.readouterr().out
    assert "Keras rows skipped: --no-keras" in out
    rows = [line[10:31].strip() for line in out.splitlines() if line.startswith("torch ")]
    assert rows == ["polytrain", "native (by hand)"]
    measured = json.loads((tmp_path / "r.json").read_text())["results"][0]["measured"]
    assert sorted(measured) == ["native", "polytrain"]
    losses = [measured[loop][-1]["last_loss"] for loop in ("polytrain", "native")]
    assert losses[0] == pytest.approx(losses[1], abs=1e-4)  # the same work
