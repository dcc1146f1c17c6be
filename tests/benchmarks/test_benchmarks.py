"""The parity probe of benchmarks/ runs, and its fp64 verdict holds on a small model; the
layout, Paddle conv-bias, torch layers and torch malloc benchmarks run."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import parity_steps
from polytrain.testing import backends_under_test


@pytest.mark.slow
def test_parity_steps_fp64_differences_are_tiny(capsys: pytest.CaptureFixture[str]) -> None:
    names = backends_under_test()
    argv = ["--backends", ",".join(names), "--model", "lenet", "--steps", "3",
            "--batch-size", "16", "--precision", "fp64"]  # fmt: skip
    assert parity_steps.main(argv) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.split()[:1] in ([n] for n in names)]
    assert [r[0] for r in rows] == names[1:]
    for row in rows:
        diffs = [float(v) for v in row[1:]]
        assert len(diffs) == 3 and max(diffs) < 1e-12, row
    assert re.search(r"lenet, fp64, 3 momentum steps of batch 16", out)


@pytest.mark.slow
def test_layout_benchmark_runs_both_orders(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    from benchmarks import layout

    assert layout.main(["--steps", "1", "--repeats", "2", "--threads", "1", "--no-compile"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"eager NCHW +ms/step median", out)
    assert re.search(r"eager channels-last +ms/step median .* speedup over NCHW \d", out)


@pytest.mark.slow
def test_paddle_conv_bias_benchmark_runs_both(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("paddle")
    from benchmarks import paddle_conv_bias

    assert paddle_conv_bias.main(["--steps", "1", "--repeats", "2"]) == 0
    out = capsys.readouterr().out
    losses = re.findall(r"last loss ([0-9.]+)", out)
    assert re.search(r"polytrain's _Conv2D +wall ms/step .* speedup \d", out)
    assert len(losses) == 2 and abs(float(losses[0]) - float(losses[1])) < 1e-4


@pytest.mark.slow
def test_torch_layers_benchmark_runs_both() -> None:
    pytest.importorskip("torch")
    from benchmarks.run import ROOT

    argv = ["--steps", "2", "--repeats", "2", "--threads", "1", "--batch-size", "16"]
    cmd = [sys.executable, "-m", "benchmarks.torch_layers", *argv]  # its own threads
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert re.search(r"plain +: +\d+\.\d+ ms per step", out)
    assert re.search(r"plain/polytrain time per step: \d\.\d+ \[", out)
    assert "(equal)" in out


@pytest.mark.slow
def test_mxnet_step_benchmark_runs_all_three() -> None:
    pytest.importorskip("mxnet")
    from benchmarks.run import ROOT

    argv = ["--steps", "2", "--warmup", "2", "--repeats", "2", "--threads", "1"]
    cmd = [sys.executable, "-m", "benchmarks.mxnet_step", *argv, "--batch-size", "16"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "'engine_workers': 0" in out  # NaiveEngine, as polytrain picks it
    assert re.search(r"op-by-op +: +\d+ samples/s", out)
    assert re.search(r"polytrain/op-by-op: samples/s \d\.\d+ \[", out)
    assert "(equal)" in out
    proc = subprocess.run(
        [*cmd, "--before", "plain-channels"], cwd=ROOT, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"polytrain/plain-channels: samples/s \d\.\d+ \[", proc.stdout)


@pytest.mark.slow
def test_torch_malloc_benchmark_runs_both(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    from benchmarks import torch_malloc

    argv = ["--steps", "2", "--repeats", "2", "--threads", "1", "--loop", "native"]
    assert torch_malloc.main(argv) == 0
    out = capsys.readouterr().out
    assert re.search(r"system +\(system: POLYTRAIN_TORCH_MALLOC=system\): .* page faults", out)
    assert re.search(r"reuse +\((reuse|system: [^)]*)\): .* page faults per step", out)
    assert re.search(r"reuse/system samples/s: median \d", out)


def test_peak_fractions_pair_each_round_with_its_own_probe() -> None:
    from benchmarks.common import Measurement, peak_fractions

    rounds = [Measurement("polytrain", 2.0, 1000, 0.5), Measurement("polytrain", 1.0, 1000, 0.5)]
    # 500 and 1000 samples/s at 1e8 FLOP each: 50 and 100 GFLOP/s against 200 and 400
    assert peak_fractions(rounds, [200.0, 400.0], 1e8) == [0.25, 0.25]
    with pytest.raises(ValueError):
        peak_fractions(rounds, [200.0], 1e8)


def test_flops_count_residual_blocks_and_batch_norm() -> None:
    from benchmarks.common import forward_flops, lenet, train_flops_per_sample
    from polytrain.neutral.models import get_model_spec
    from polytrain.neutral.work import forward_multiply_adds

    assert train_flops_per_sample(lenet()) == 13_401_658  # unchanged: 13.4 MFLOP
    spec = get_model_spec("resnet18")
    total, first = forward_flops(spec)
    assert first == 2 * 28 * 28 * 64 * 9 + 28 * 28 * 64  # the stem: multiply-adds and bias
    macs = forward_multiply_adds(spec)
    assert macs is not None and 2 * macs < total < 1.01 * 2 * macs  # BN, ReLU, sums: < 1 %
    assert train_flops_per_sample(spec) == 3 * total - first


@pytest.mark.slow
def test_run_benchmark_reports_the_round_peak(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from benchmarks.run import ROOT

    out_json = tmp_path / "run.json"
    argv = ["--backends", "torch", "--repeats", "2", "--steps", "2", "--warmup", "1",
            "--batch-size", "16", "--threads", "1", "--json", str(out_json)]  # fmt: skip
    cmd = [sys.executable, "-m", "benchmarks.run", *argv]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert re.search(r"% round peak \[95% CI\]", proc.stdout)
    (result,) = json.loads(out_json.read_text())["results"]
    probes = [max(r["matmul"].values()) for r in result["rounds"]]
    assert len(probes) == 2 and min(probes) > 0
    assert max(result["matmul_peak_gflops"].values()) == max(probes)  # the run's best
    gflops = [
        s * result["train_flops_per_sample"] / 1e9
        for s in result["polytrain"]["samples_per_second"]
    ]
    fractions = [g / p for g, p in zip(gflops, probes, strict=True)]
    assert result["round_peak_fraction"]["rounds"] == pytest.approx(fractions)
    assert min(fractions) <= result["round_peak_fraction"]["median"] <= max(fractions)


@pytest.mark.slow
def test_run_benchmark_times_paddle_against_its_static_graph_loop(tmp_path: Path) -> None:
    pytest.importorskip("paddle")
    from benchmarks.native_paddle_static import VARIANTS
    from benchmarks.run import ROOT

    out_json = tmp_path / "run.json"
    argv = ["--backends", "paddle", "--repeats", "2", "--steps", "2", "--warmup", "1",
            "--batch-size", "16", "--threads", "1", "--fast", "--json", str(out_json)]  # fmt: skip
    cmd = [sys.executable, "-m", "benchmarks.run", *argv]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert "polytrain vs the hand-written static-graph loop" in proc.stdout
    assert "paddle: polytrain fast (--fast)" in proc.stdout
    (result,) = json.loads(out_json.read_text())["results"]
    assert result["fast"] and result["static_variant"] in VARIANTS
    assert len(result["ratio_static"]["rounds"]) == 2
    losses = [result[loop]["last_loss"] for loop in ("polytrain", "native", "native_static")]
    assert max(losses) - min(losses) < 1e-4, losses  # the same weights and batches


# Paddle's own BatchNorm2D warns at every training forward (polytrain's does not)
@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:When training, we now always track:UserWarning")
def test_paddles_resnet18_loops_start_from_the_specs_weights() -> None:
    """The hand-written ResNet-18 loops (dygraph and static graph) load the spec's
    parameters and BatchNorm statistics in order: three steps give polytrain's loss."""
    pytest.importorskip("paddle")
    from benchmarks import native_paddle, native_paddle_static, through_polytrain
    from benchmarks.common import Workload, load_train

    work = Workload(steps=2, warmup=1, batch_size=4, threads=1, fast=False, model="resnet18")
    x, y = load_train(work.train_samples)
    want = through_polytrain.run("paddle", work, x, y).last_loss
    assert native_paddle.run(work, x, y).last_loss == pytest.approx(want, abs=1e-5)
    assert native_paddle_static.run(work, x, y).last_loss == pytest.approx(want, abs=1e-5)


@pytest.mark.slow
def test_jaxs_hand_written_vit_gives_polytrains_loss() -> None:
    """The hand-written ViT loop (pure functions, one jitted step) starts from vit-tiny's
    weights under the spec's names and computes what polytrain's jax model does: two steps
    on the same batches end at polytrain's loss (forward and gradients agree)."""
    pytest.importorskip("jax")
    from benchmarks import native_jax, through_polytrain
    from benchmarks.common import Workload, load_train

    work = Workload(steps=1, warmup=1, batch_size=8, threads=1, fast=True, model="vit-tiny")
    x, y = load_train(work.train_samples)
    want = through_polytrain.run("jax", work, x, y).last_loss
    assert native_jax.run(work, x, y).last_loss == pytest.approx(want, abs=1e-5)


def test_flops_count_a_vits_attention_blocks() -> None:
    """vit-tiny's FLOPs: the patch convolution, then per block the attention's
    projections and scores and the MLP on 16 tokens; the head on the pooled token."""
    from benchmarks.common import forward_flops
    from polytrain.neutral.models import get_model_spec

    total, first = forward_flops(get_model_spec("vit-tiny"))
    t, e, hidden = 16, 64, 128
    patch = 2 * e * t * 49 + e * t
    attention = 2 * t * e * 4 * e + 4 * t * e + 4 * t * t * e + 3 * 4 * t * t
    mlp = t * (2 * e * hidden + hidden + 2 * hidden * e + e) + t * hidden  # + GELU
    norms_and_sums = 2 * (2 * 5 * t * e + 2 * t * e)
    rest = t * e + 5 * t * e + t * e + 2 * e * 10 + 10  # positions, norm, mean, head
    assert first == patch
    assert total == patch + 2 * (attention + mlp) + norms_and_sums + rest
