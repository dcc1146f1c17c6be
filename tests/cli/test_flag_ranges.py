"""Every numeric flag of every command refuses a value outside its range (NaN and inf
included) with one line naming the flag, and exit status 2, before any work starts."""

from __future__ import annotations

import re

import pytest

from polytrain.cli.main import main
from polytrain.cli.parser import build_parser
from polytrain.cli.recipe_args import recipe_from_args
from polytrain.distributed.launcher import LaunchSpec
from polytrain.errors import ConfigError
from polytrain.training.recipe import Recipe
from polytrain.utils.threads import max_threads, resolve_threads

TOO_MANY_THREADS = str(max_threads() + 1)
PORT = ["port", "a:b", "c:d", "out.pt"]
LAUNCH = ["launch", "--backend", "numpy"]
SECONDS = "argument --timeout: must be a finite number > 0 and <= 604800 (seconds)"

# (command line up to the flag, flag, bad value, fragment of the message)
CASES = [
    (["train"], "--epochs", "0", "--epochs must be an integer >= 1"),
    (["train"], "--batch-size", "-3", "--batch-size must be an integer >= 1"),
    (["train"], "--accumulate", "0", "--accumulate must be an integer >= 1"),
    (["train"], "--warmup-steps", "-1", "--warmup-steps must be an integer >= 0"),
    (["train"], "--train-samples", "0", "--train-samples must be >= 1"),
    (["train"], "--test-samples", "-1", "--test-samples must be >= 1"),
    (["train"], "--max-steps", "0", "--max-steps must be >= 1"),
    (["train"], "--pipeline-split", "0", "--pipeline-split must be >= 1"),
    (["train"], "--lr", "0", "--lr must be a finite number > 0, got 0.0"),
    (["train"], "--lr", "nan", "--lr must be a finite number > 0, got nan"),
    (["train"], "--lr", "inf", "--lr must be a finite number > 0, got inf"),
    (["train"], "--momentum", "1", "--momentum must be a finite number in [0, 1), got 1.0"),
    (["train", "--optimizer", "sgd"], "--momentum", "nan", "--momentum must be a finite"),
    (["train"], "--weight-decay", "-0.1", "--weight-decay must be a finite number >= 0"),
    (["train"], "--weight-decay", "inf", "--weight-decay must be a finite number >= 0"),
    (["train"], "--layer-weight-decay", "fc1=nan", "Weight decay of layer 'fc1' must be >= 0"),
    (["train"], "--val-split", "nan", "--val-split must be a finite number in [0, 1)"),
    (["train"], "--val-split", "1", "--val-split must be a finite number in [0, 1)"),
    (["train"], "--seed", "-1", "--seed must be in 0..4294967295 (numpy's seed range), got -1"),
    (["train"], "--seed", str(2**32), "--seed must be in 0..4294967295"),
    (["train"], "--threads", "0", f"argument --threads: must be an integer in 1..{max_threads()}"),
    (["train"], "--threads", TOO_MANY_THREADS, "4 per CPU; far more crashes PyTorch"),
    (["train"], "--timeout", "-1", SECONDS),
    (["train"], "--timeout", "nan", "argument --timeout: must be a finite number > 0"),
    (["train"], "--timeout", "inf", "argument --timeout: must be a finite number > 0"),
    (["train"], "--timeout", "1e300", "must be a finite number > 0 and <= 604800 (seconds)"),
    (["train"], "--checkpoint-every", "0", "argument --checkpoint-every: must be an integer >= 1"),
    (["train"], "--keep-checkpoints", "0", "argument --keep-checkpoints: must be an integer >= 1"),
    (["train"], "--max-skipped", "1.5", "--max-skipped must be a share in [0, 1]"),
    (["train"], "--max-skipped", "nan", "--max-skipped must be a share in [0, 1]"),
    (["train"], "--max-loss-growth", "nan", "--max-loss-growth must be > 1 (inf: no limit)"),
    (["train"], "--max-loss-growth", "0.5", "--max-loss-growth must be > 1 (inf: no limit)"),
    (["compare"], "--tol-grad", "0", "argument --tol-grad: must be a finite number > 0"),
    (["compare"], "--tol-grad", "inf", "argument --tol-grad: must be a finite number > 0"),
    (["compare"], "--parity-steps", "-5", "argument --parity-steps: must be an integer >= 1"),
    (["compare"], "--parity-steps", "0", "argument --parity-steps: must be an integer >= 1"),
    (["compare"], "--tol-loss", "0", "argument --tol-loss: must be a finite number > 0"),
    (["compare"], "--tol-loss", "nan", "argument --tol-loss: must be a finite number > 0"),
    (["compare"], "--tol-acc", "-1", "argument --tol-acc: must be a finite number >= 0"),
    (["compare"], "--tol-acc", "inf", "argument --tol-acc: must be a finite number >= 0"),
    (["compare"], "--seed", "-2", "--seed must be in 0..4294967295"),
    (["compare"], "--threads", TOO_MANY_THREADS, "argument --threads: must be an integer in 1.."),
    (LAUNCH, "--nproc-per-node", "0", "argument --nproc-per-node: must be an integer >= 1"),
    (LAUNCH, "--nnodes", "0", "argument --nnodes: must be an integer >= 1"),
    (LAUNCH, "--node-rank", "-1", "argument --node-rank: must be an integer >= 0"),
    ([*LAUNCH, "--nnodes", "2"], "--node-rank", "2", "--node-rank 2 must be in 0..1 (--nnodes 2)"),
    (LAUNCH, "--num-servers", "0", "argument --num-servers: must be an integer >= 1"),
    (LAUNCH, "--timeout", "0", SECONDS),
    (LAUNCH, "--timeout", "1e9", "argument --timeout: must be a finite number > 0 and <= 604800"),
    (LAUNCH, "--timeout", "nan", SECONDS),
    (PORT, "--tolerance", "0", "argument --tolerance: must be a finite number > 0"),
    (PORT, "--tolerance", "nan", "argument --tolerance: must be a finite number > 0"),
    (PORT, "--seed", "-1", "argument --seed: must be an integer in 0..4294967295"),
    (PORT, "--input-shape", "1,0,28", "--input-shape '1,0,28' is not like 1,3,224,224"),
]


@pytest.mark.parametrize(
    ("head", "flag", "value", "message"),
    CASES,
    ids=[f"{c[0][0]}{c[1]}={c[2]}" for c in CASES],
)
def test_numeric_flag_out_of_range_is_one_line(
    head: list[str], flag: str, value: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [*head, flag, value]
    if head[0] == "launch":
        argv += ["--", "true"]
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse: usage, then the one error line
        code = int(exc.code or 0)
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err, "no message"
    assert err[-1].startswith(f"polytrain {head[0]}: error: ")
    assert message in err[-1]


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--seed", "0"), ("--seed", str(2**32 - 1)), ("--momentum", "0"), ("--val-split", "0"),
     ("--threads", "1"), ("--threads", str(max_threads())), ("--weight-decay", "0"),
     ("--timeout", "0.5"), ("--checkpoint-every", "1"), ("--keep-checkpoints", "1")],
)  # fmt: skip
def test_numeric_flag_at_its_bounds_is_accepted(flag: str, value: str) -> None:
    args = build_parser().parse_args(["train", flag, value])
    recipe_from_args(args)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [("seed", -1, "--seed must be in 0..4294967295"),
     ("seed", 2**32, "--seed must be in 0..4294967295"),
     ("seed", 1.5, "--seed must be an integer"),
     ("lr", float("nan"), "--lr must be a finite number > 0"),
     ("momentum", float("inf"), "--momentum must be a finite number in [0, 1)"),
     ("weight_decay", float("nan"), "--weight-decay must be a finite number >= 0"),
     ("val_split", float("nan"), "--val-split must be a finite number in [0, 1)")],
)  # fmt: skip
def test_recipe_api_checks_the_same_ranges(field: str, value: object, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        Recipe(**{field: value})  # type: ignore[arg-type]


def test_thread_count_from_the_api_or_environment_is_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(ConfigError, match=r"Thread count must be in 1\.\."):
        resolve_threads(100_000)
    monkeypatch.setenv("POLYTRAIN_THREADS", "100000")
    with pytest.raises(ConfigError, match="4 per CPU"):
        resolve_threads()


@pytest.mark.parametrize("timeout", [float("nan"), float("inf"), 0.0])
def test_launch_spec_api_refuses_non_finite_timeouts(timeout: float) -> None:
    with pytest.raises(ConfigError, match="--timeout must be a positive number of seconds"):
        LaunchSpec("numpy", ["true"], timeout=timeout)
