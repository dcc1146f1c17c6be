"""Learning-rate schedules against PyTorch's lr_scheduler numbers; resume follows the global
step; early stopping on the validation accuracy."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from polytrain import ConfigError, hookimpl
from polytrain.cli.main import main
from polytrain.plugins.records import EpochRecord
from polytrain.training.early_stopping import early_stop_reason
from polytrain.training.recipe import Recipe
from polytrain.training.schedules import Schedule
from polytrain.training.trainer import Datasets, Trainer, load_datasets

TINY: dict[str, Any] = dict(model="mlp", train_samples=96, test_samples=32, batch_size=16, epochs=2)


def torch_lrs(make: Callable[[Any], Any], lr: float, steps: int) -> list[float]:
    """The lr each of ``steps`` optimizer steps uses under a torch scheduler."""
    torch = pytest.importorskip("torch")
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    scheduler = make(opt)
    out = []
    for _ in range(steps):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        scheduler.step()
    return out


def ours(text: str, lr: float, steps: int, total: int | None = None) -> list[float]:
    schedule = Schedule.parse(text).resolve(total)
    return [schedule.lr_at(k, lr) for k in range(steps)]


def sched() -> Any:
    return pytest.importorskip("torch").optim.lr_scheduler


CASES: dict[str, tuple[str, Callable[[Any], Any], int]] = {
    "step": ("step:step_size=3,gamma=0.5", lambda o: sched().StepLR(o, 3, gamma=0.5), 12),
    "multistep": (
        "multistep:milestones=2/5/6,gamma=0.3",
        lambda o: sched().MultiStepLR(o, [2, 5, 6], gamma=0.3),
        10,
    ),
    "cosine": (
        "cosine:total=10,min_lr=0.001",
        lambda o: sched().CosineAnnealingLR(o, T_max=10, eta_min=0.001),
        10,
    ),
    "cosine-warmup": (
        "cosine:total=12,min_lr=0.002,warmup=4",
        lambda o: sched().SequentialLR(
            o,
            [
                sched().LinearLR(o, start_factor=1 / 4, end_factor=1.0, total_iters=3),
                sched().CosineAnnealingLR(o, T_max=8, eta_min=0.002),
            ],
            milestones=[4],
        ),
        12,
    ),
    "onecycle": (
        "onecycle:total=20",
        lambda o: sched().OneCycleLR(o, max_lr=0.1, total_steps=20),
        20,
    ),
    "onecycle-params": (
        "onecycle:total=17,max_lr=0.3,pct_start=0.25,div_factor=10,final_div_factor=100",
        lambda o: sched().OneCycleLR(
            o, max_lr=0.3, total_steps=17, pct_start=0.25, div_factor=10, final_div_factor=100
        ),
        17,
    ),
    "warmup": (
        "constant:warmup=5",
        lambda o: sched().LinearLR(o, start_factor=1 / 5, end_factor=1.0, total_iters=4),
        9,
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_schedule_matches_pytorch(case: str) -> None:
    """Each schedule's closed form gives PyTorch's lr_scheduler numbers step by step."""
    text, make, steps = CASES[case]
    want = torch_lrs(make, 0.1, steps)
    assert ours(text, 0.1, steps) == pytest.approx(want, rel=1e-12, abs=1e-15)


def test_schedules_hold_after_their_end() -> None:
    """After total steps, cosine and onecycle stay at their last lr (PyTorch would rise
    again or raise)."""
    assert ours("cosine:total=4,min_lr=0.01", 0.1, 7)[4:] == [0.01] * 3
    tail = ours("onecycle:total=10", 0.1, 13)[9:]
    assert tail == [pytest.approx(0.1 / 25 / 1e4)] * 4


def test_schedule_text_round_trips() -> None:
    for text, _, _ in CASES.values():
        parsed = Schedule.parse(text)
        assert Schedule.parse(str(parsed)) == parsed
    assert (
        str(Schedule.parse(" cosine : warmup=3 , min_lr=1e-3 ")) == "cosine:min_lr=0.001,warmup=3"
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("linear", "Unknown --schedule 'linear'; use one of constant, step, multistep"),
        ("step", "step needs step_size=..."),
        ("step:step_size=0", "step_size='0': give an integer >= 1"),
        ("step:step_size=2,gamma=0", "gamma must be > 0"),
        ("multistep:milestones=5/3", "give increasing steps >= 1 separated by '/'"),
        ("cosine:warm=3", "'warm=3' is not KEY=VALUE with KEY one of total, min_lr, warmup"),
        ("cosine:total=5,warmup=5", "warmup (5) must be below total (5)"),
        ("cosine:min_lr=nan", "min_lr='nan': give a finite number >= 0"),
        ("onecycle:warmup=3", "KEY one of total, max_lr, pct_start"),
        ("onecycle:pct_start=1.5", "pct_start must be in (0, 1)"),
        ("onecycle:total=3,pct_start=0.2", "pct_start * total must be in (1, total)"),
    ],
)
def test_bad_schedules_stop_with_one_line(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        Recipe(schedule=text)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_warmup_steps_is_the_schedules_warmup() -> None:
    """``warmup_steps`` keeps working alone and becomes any schedule's warm-up."""
    assert [Recipe(lr=1.0, warmup_steps=2).lr_at(k) for k in range(3)] == [0.5, 1.0, 1.0]
    both = Recipe(lr=0.1, warmup_steps=4, schedule="cosine:min_lr=0.002")
    assert [both.lr_at(k, 12) for k in range(12)] == ours(
        "cosine:total=12,min_lr=0.002,warmup=4", 0.1, 12
    )
    with pytest.raises(ConfigError, match=r"--warmup-steps 3 and --schedule .* disagree"):
        Recipe(warmup_steps=3, schedule="cosine:warmup=2")
    with pytest.raises(ConfigError, match="does not combine with --schedule onecycle"):
        Recipe(warmup_steps=3, schedule="onecycle")
    with pytest.raises(ConfigError, match="needs the run's total steps"):
        Recipe(schedule="cosine").lr_at(0)
    with pytest.raises(ConfigError, match="min_lr must be <= --lr"):
        Recipe(lr=0.01, schedule="cosine:min_lr=0.1")


# -- in a run ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def data() -> Datasets:
    return load_datasets(Recipe(**TINY, val_split=0.25))


class Lrs:
    """Records each step's lr; sends SIGINT to this process after step ``stop_at``."""

    def __init__(self, stop_at: int | None = None) -> None:
        self.values: list[float] = []
        self.stop_at = stop_at

    @hookimpl
    def polytrain_step_end(self, run, step):  # type: ignore[no-untyped-def]
        self.values.append(step.lr)
        if step.global_step == self.stop_at:
            os.kill(os.getpid(), signal.SIGINT)  # the trainer saves and stops after this step


@pytest.mark.slow
def test_run_follows_the_schedule_over_its_length(data: Datasets) -> None:
    """Without total=, cosine spans the run (epochs x steps per epoch, --max-steps caps)."""
    recipe = Recipe(**TINY, max_steps=3, schedule="cosine:min_lr=0.001")
    lrs = Lrs()
    Trainer(recipe, "numpy", plugins=[lrs], progress=False, datasets=data).fit()
    assert lrs.values == ours("cosine:total=6,min_lr=0.001", recipe.lr, 6)


@pytest.mark.slow
def test_resumed_run_has_the_uninterrupted_lr_sequence(data: Datasets, tmp_path: Path) -> None:
    """The schedule is a function of the global step, which the checkpoint holds: a run
    stopped by SIGINT mid-epoch and resumed uses the uninterrupted run's lr at every step."""
    recipe = Recipe(**TINY, schedule="cosine:warmup=2,min_lr=0.001")
    full = Lrs()
    Trainer(recipe, "numpy", plugins=[full], progress=False, datasets=data).fit()
    first = Lrs(stop_at=5)
    summary = Trainer(
        recipe, "numpy", out_dir=tmp_path, plugins=[first], progress=False, datasets=data
    ).fit()
    assert summary.interrupted and summary.final_step == 5
    rest = Lrs()
    Trainer(
        recipe, "numpy", out_dir=tmp_path, resume=tmp_path, plugins=[rest], progress=False,
        datasets=data,
    ).fit()  # fmt: skip
    assert len(full.values) == 12 and len(set(full.values)) > 6
    assert first.values + rest.values == full.values


# -- early stopping ---------------------------------------------------------------------------


def epochs(*val: float) -> list[EpochRecord]:
    return [
        EpochRecord(epoch=i, train_loss=1.0, train_metric=0.5, test_metric=None,
                    val_metric=v, seconds=1.0, samples_per_second=1.0, steps=1)
        for i, v in enumerate(val)
    ]  # fmt: skip


def test_early_stop_counts_epochs_without_improvement() -> None:
    assert early_stop_reason(epochs(0.5, 0.6, 0.6), 2) is None  # equal is no improvement: 1
    reason = early_stop_reason(epochs(0.5, 0.6, 0.6, 0.55), 2)
    assert reason is not None and reason.startswith(
        "early stop: validation accuracy has not improved for 2 epochs (best 0.6000 at epoch 2"
    )
    assert early_stop_reason(epochs(0.5, 0.4, 0.7), 2) is None
    assert early_stop_reason(epochs(0.5, 0.4), None) is None


def test_early_stop_ends_the_run(data: Datasets) -> None:
    """lr 0 never improves the validation accuracy: patience 1 stops after epoch 2 of 5."""
    recipe = Recipe(**{**TINY, "epochs": 5}, val_split=0.25, early_stop=1, optimizer="sgd",
                    schedule="step:step_size=1,gamma=1e-30")  # fmt: skip
    summary = Trainer(recipe, "numpy", progress=False, datasets=data).fit()
    assert len(summary.epochs) == 2
    assert summary.stop_reason.startswith("early stop: validation accuracy has not improved")
    assert not summary.interrupted


def test_early_stop_needs_a_validation_split(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--backend", "numpy", "--early-stop", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("add --val-split (e.g. 0.1) to hold out a validation set.")
    assert len(err.splitlines()) == 1
    assert main(["train", "--backend", "numpy", "--schedule", "cosine:warmup=x"]) == 2
    assert "warmup='x': give an integer >= 1" in capsys.readouterr().err


def test_early_stop_on_an_error_metric_waits_for_it_to_fall() -> None:
    assert early_stop_reason(epochs(0.5, 0.4, 0.3), 1, lower_is_better=True) is None
    reason = early_stop_reason(epochs(0.5, 0.4, 0.45), 1, lower_is_better=True, label="mse")
    assert (
        reason is not None and "validation mse has not improved for 1 epoch (best 0.4000" in reason
    )
