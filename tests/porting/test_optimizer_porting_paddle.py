"""Every Paddle optimizer that PyTorch also has, ported with its state and schedule.

A Paddle run (3 Linears, written here) takes 10 steps, saves ``.pdparams`` + ``.pdopt``
and goes on for 10 more; the files are converted with ``--optimizer`` and a PyTorch twin
goes on from them over the same 10 batches: losses and final weights within 1e-5. The
optimizers whose state cannot tell their kind or settings are refused in one line.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from optimizer_helpers import (
    HID,
    IN,
    OUT,
    SAVED,
    Run,
    batches,
    check_continuation,
    gap,
    torch_continue,
)

from polytrain.errors import PolytrainError
from polytrain.io.optimizer_state import convert_with_optimizer

paddle = pytest.importorskip("paddle")
torch = pytest.importorskip("torch")
P = paddle.optimizer


def paddle_run(make_opt: Callable[[Any], Any], out: Path) -> Run:
    """10 steps, save net.pdparams / net.pdopt, 10 more steps (a scheduler stepped
    after each): the continuation."""
    paddle.set_device("cpu")
    paddle.seed(0)

    class Net(paddle.nn.Layer):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.fc1 = paddle.nn.Linear(IN, HID)
            self.fc2 = paddle.nn.Linear(HID, HID)
            self.head = paddle.nn.Linear(HID, OUT)

        def forward(self, x: Any) -> Any:
            return self.head(paddle.tanh(self.fc2(paddle.tanh(self.fc1(x)))))

    net = Net()
    opt = make_opt(net.parameters())
    data = batches()

    def step(x: np.ndarray, y: np.ndarray) -> float:
        loss = paddle.nn.functional.cross_entropy(net(paddle.to_tensor(x)), paddle.to_tensor(y))
        loss.backward()
        opt.step()
        opt.clear_grad()
        if isinstance(opt._learning_rate, P.lr.LRScheduler):
            opt._learning_rate.step()
        return float(loss)

    for x, y in data[:SAVED]:
        step(x, y)
    paddle.save(net.state_dict(), str(out / "net.pdparams"))
    paddle.save(opt.state_dict(), str(out / "net.pdopt"))
    losses = [step(x, y) for x, y in data[SAVED:]]
    weights = {k: v.numpy().T if v.ndim == 2 else v.numpy() for k, v in net.state_dict().items()}
    return Run(losses, weights)


def convert(tmp_path: Path, settings: list[str], to: str = "torch") -> str:
    report = convert_with_optimizer(
        tmp_path / "net.pdparams", tmp_path / ("net.pt" if to == "torch" else "ck"), to,
        optimizer=tmp_path / "net.pdopt", settings=settings,
    )  # fmt: skip
    return report.format()


# (id, Paddle optimizer, the settings a .pdopt does not record, the torch optimizer)
CASES: list[tuple[str, Callable[[Any], Any], list[str], Callable[[Any], Any]]] = [
    ("Momentum", lambda ps: P.Momentum(0.1, 0.8, parameters=ps, weight_decay=0.01),
     ["lr=0.1", "momentum=0.8", "nesterov=false", "weight_decay=0.01"],
     lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.8, weight_decay=0.01)),
    ("Momentum-nesterov", lambda ps: P.Momentum(0.1, 0.8, parameters=ps, use_nesterov=True),
     ["lr=0.1", "momentum=0.8", "nesterov=true"],
     lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.8, nesterov=True)),
    ("Adam", lambda ps: P.Adam(0.01, 0.8, 0.99, 1e-7, parameters=ps),
     ["optimizer=adam", "lr=0.01", "betas=0.8,0.99", "eps=1e-7"],
     lambda ps: torch.optim.Adam(ps, lr=0.01, betas=(0.8, 0.99), eps=1e-7)),
    ("AdamW", lambda ps: P.AdamW(0.01, parameters=ps, weight_decay=0.05),
     ["optimizer=adamw", "lr=0.01", "weight_decay=0.05"],
     lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.05)),
    ("Adamax", lambda ps: P.Adamax(0.01, parameters=ps),
     ["lr=0.01"],
     lambda ps: polytrain_optimizers().AdamaxEpsOnNorm(ps, lr=0.01)),
    ("Adagrad", lambda ps: P.Adagrad(0.1, parameters=ps, initial_accumulator_value=0.1),
     ["lr=0.1"],
     lambda ps: torch.optim.Adagrad(ps, lr=0.1, eps=1e-6, initial_accumulator_value=0.1)),
    ("Adadelta", lambda ps: P.Adadelta(0.5, rho=0.9, parameters=ps),
     ["lr=0.5", "rho=0.9"],
     lambda ps: torch.optim.Adadelta(ps, lr=0.5, rho=0.9, eps=1e-6)),
    ("RMSProp", lambda ps: P.RMSProp(0.01, parameters=ps),
     ["lr=0.01"],
     lambda ps: polytrain_optimizers().RMSpropEpsInSqrt(ps, lr=0.01)),
    ("RMSProp-centered", lambda ps: P.RMSProp(0.01, 0.9, momentum=0.5, centered=True,
                                              parameters=ps),
     ["lr=0.01", "rho=0.9", "momentum=0.5"],
     lambda ps: polytrain_optimizers().RMSpropEpsInSqrt(ps, lr=0.01, rho=0.9, momentum=0.5,
                                                        centered=True)),
]  # fmt: skip


def polytrain_optimizers() -> Any:
    import polytrain_torch.optimizers

    return polytrain_torch.optimizers


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_paddle_optimizer_continues_on_torch(case: Any, tmp_path: Path) -> None:
    name, make, settings, torch_opt = case
    reference = paddle_run(make, tmp_path)
    report = convert(tmp_path, settings)
    ported = torch_continue(tmp_path / "net.pt", torch_opt, tmp_path / "net.optimizer.pt")
    fresh = torch_continue(tmp_path / "net.pt", torch_opt, None)
    check_continuation(f"Paddle {name}", reference, ported, fresh)
    assert "load the optimizer state into" in report


SCHEDULES: list[tuple[str, Callable[[], Any], str, Callable[[Any], Any]]] = [
    ("Cosine", lambda: P.lr.CosineAnnealingDecay(0.1, T_max=15),
     "CosineAnnealingDecay(learning_rate=0.1, T_max=15)",
     lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=15)),
    ("Step", lambda: P.lr.StepDecay(0.1, step_size=4, gamma=0.5),
     "paddle.optimizer.lr.StepDecay(0.1, 4, gamma=0.5)",
     lambda o: torch.optim.lr_scheduler.StepLR(o, 4, gamma=0.5)),
    ("MultiStep", lambda: P.lr.MultiStepDecay(0.1, [8, 12, 15], gamma=0.5),
     "MultiStepDecay(0.1, milestones=[8, 12, 15], gamma=0.5)",
     lambda o: torch.optim.lr_scheduler.MultiStepLR(o, [8, 12, 15], gamma=0.5)),
    ("Exponential", lambda: P.lr.ExponentialDecay(0.1, gamma=0.9),
     "ExponentialDecay(0.1, 0.9)",
     lambda o: torch.optim.lr_scheduler.ExponentialLR(o, gamma=0.9)),
    ("Piecewise", lambda: P.lr.PiecewiseDecay([6, 12], [0.1, 0.05, 0.025]),
     "PiecewiseDecay(boundaries=[6, 12], values=[0.1, 0.05, 0.025])",
     lambda o: torch.optim.lr_scheduler.MultiStepLR(o, [6, 12], gamma=0.5)),
    ("Polynomial", lambda: P.lr.PolynomialDecay(0.1, 30, end_lr=0.0, power=2.0),
     "PolynomialDecay(0.1, decay_steps=30, end_lr=0.0, power=2.0)",
     lambda o: torch.optim.lr_scheduler.PolynomialLR(o, total_iters=30, power=2.0)),
    ("Warmup-then-cosine", lambda: P.lr.LinearWarmup(P.lr.CosineAnnealingDecay(0.1, 12),
                                                    4, 0.0, 0.1),
     "LinearWarmup(CosineAnnealingDecay(0.1, 12), warmup_steps=4, start_lr=0.0, end_lr=0.1)",
     lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=12)),
]  # fmt: skip


def test_paddle_sgd_continues_on_torch(tmp_path: Path) -> None:
    """SGD has no accumulators: its .pdopt holds only a scheduler's state (without one,
    paddle.save writes no file: there is nothing to port)."""
    make = lambda ps: P.SGD(P.lr.ExponentialDecay(0.1, 0.9), parameters=ps, weight_decay=0.01)  # noqa: E731
    reference = paddle_run(make, tmp_path)
    spec = "scheduler=ExponentialDecay(learning_rate=0.1, gamma=0.9)"
    with pytest.raises(PolytrainError, match="optimizer=sgd"):
        convert(tmp_path, [spec])
    convert(tmp_path, ["optimizer=sgd", "weight_decay=0.01", spec])

    def make_opt(ps: Any) -> Any:
        return torch.optim.SGD(ps, lr=0.1, weight_decay=0.01)

    def make_sched(o: Any) -> Any:
        return torch.optim.lr_scheduler.ExponentialLR(o, 0.9)

    ported = torch_continue(tmp_path / "net.pt", make_opt, tmp_path / "net.optimizer.pt",
                            make_sched, tmp_path / "net.scheduler.pt")  # fmt: skip
    check_continuation("Paddle SGD + Exponential", reference, ported, None)


@pytest.mark.parametrize("case", SCHEDULES, ids=[c[0] for c in SCHEDULES])
def test_paddle_schedule_continues_on_torch(case: Any, tmp_path: Path) -> None:
    """Momentum under a Paddle LR scheduler: the schedule goes on in torch's scheduler.
    A warm-up that has ended goes on as the schedule after it."""
    name, make_sched, spec, torch_sched = case
    reference = paddle_run(lambda ps: P.Momentum(make_sched(), 0.8, parameters=ps), tmp_path)
    settings = ["momentum=0.8", "nesterov=false"]
    with pytest.raises(PolytrainError, match="scheduler=constant"):  # its kind is not in the file
        convert(tmp_path, settings)
    report = convert(tmp_path, [*settings, f"scheduler={spec}"])
    assert "net.scheduler.pt" in report

    def make_opt(ps: Any) -> Any:
        return torch.optim.SGD(ps, lr=0.1, momentum=0.8)

    ported = torch_continue(tmp_path / "net.pt", make_opt, tmp_path / "net.optimizer.pt",
                            torch_sched, tmp_path / "net.scheduler.pt")  # fmt: skip
    constant = torch_continue(tmp_path / "net.pt", make_opt, tmp_path / "net.optimizer.pt")
    check_continuation(f"Paddle Momentum + {name}", reference, ported, None)
    if name in ("Cosine", "Exponential"):  # the schedule matters over these 10 steps
        assert gap(constant, reference)[0] > 1e-4


def test_paddle_schedule_must_match_the_file(tmp_path: Path) -> None:
    paddle_run(lambda ps: P.Momentum(P.lr.CosineAnnealingDecay(0.1, 15), parameters=ps),
               tmp_path)  # fmt: skip
    settings = ["nesterov=false"]
    with pytest.raises(PolytrainError, match=r"gives lr .* the file's LR_Scheduler"):
        convert(tmp_path, [*settings, "scheduler=CosineAnnealingDecay(0.1, T_max=20)"])
    with pytest.raises(PolytrainError, match="not a scheduler polytrain ports"):
        convert(tmp_path, [*settings, "scheduler=OneCycleLR(0.1, 20)"])
    with pytest.raises(PolytrainError, match="not a literal"):  # nothing of it runs
        convert(tmp_path, [*settings, "scheduler=StepDecay(base_lr, 3)"])
    with pytest.raises(PolytrainError, match="'getcwd' is not a scheduler"):
        convert(tmp_path, [*settings, "scheduler=StepDecay(__import__('os').getcwd(), 3)"])
    with pytest.raises(PolytrainError, match="--to torch"):  # a neutral checkpoint has none
        convert(tmp_path, [*settings, "scheduler=CosineAnnealingDecay(0.1, 15)"], to="neutral")
    report = convert(tmp_path, [*settings, "scheduler=constant"])
    assert "constant lr" in report and not (tmp_path / "net.scheduler.pt").exists()


def test_cli_writes_the_scheduler_where_told(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--scheduler-out`` (one line on a bad schedule; never over an input)."""
    from polytrain.cli.main import main

    paddle_run(lambda ps: P.Momentum(P.lr.StepDecay(0.1, 4), parameters=ps), tmp_path)
    pdopt = tmp_path / "net.pdopt"
    argv = ["convert", str(tmp_path / "net.pdparams"), str(tmp_path / "o.pt"), "--to", "torch",
            "--optimizer", str(pdopt), "--optimizer-setting", "nesterov=false",
            "--optimizer-setting", "scheduler=StepDecay(0.1, 4)"]  # fmt: skip
    before = pdopt.read_bytes()
    assert main([*argv, "--scheduler-out", str(pdopt)]) == 2
    assert "given to --optimizer" in capsys.readouterr().err and pdopt.read_bytes() == before
    assert main([*argv, "--scheduler-out", str(tmp_path / "s.pt")]) == 0
    assert "lr schedule: step, step 10" in capsys.readouterr().out
    state = torch.load(tmp_path / "s.pt", weights_only=True)
    assert state["last_epoch"] == SAVED and state["step_size"] == 4
    assert main([*argv[:-1], "scheduler=StepDecay(0.1, 3)"]) == 2  # not the run's
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


# -- refused in one line -----------------------------------------------------------------------


def test_paddle_lamb_is_refused(tmp_path: Path) -> None:
    """Lamb keeps Adam's accumulators: the user must say which, and Lamb is refused
    (torch has no Lamb), never continued as AdamW."""
    paddle_run(lambda ps: P.Lamb(0.01, parameters=ps), tmp_path)
    with pytest.raises(PolytrainError, match="optimizer=adam, optimizer=adamw or optimizer=lamb"):
        convert(tmp_path, ["lr=0.01"])
    with pytest.raises(PolytrainError, match="torch has no Lamb"):
        convert(tmp_path, ["optimizer=lamb", "lr=0.01"])
    assert not (tmp_path / "net.pt").exists()


@pytest.mark.parametrize(
    "make, setting, found",
    [
        (lambda ps: P.RMSProp(0.01, parameters=ps), "optimizer=adamw", "rmsprop"),
        (lambda ps: P.Adamax(0.01, parameters=ps), "optimizer=adam", "adamax"),
        (lambda ps: P.Adam(0.01, parameters=ps), "optimizer=momentum", "adam or adamw or lamb"),
        (lambda ps: P.Momentum(0.1, parameters=ps), "optimizer=sgd", "momentum"),
    ],
    ids=["rmsprop-as-adamw", "adamax-as-adam", "adam-as-momentum", "momentum-as-sgd"],
)
def test_a_setting_contradicting_the_accumulators_is_refused(
    make: Any, setting: str, found: str, tmp_path: Path
) -> None:
    paddle_run(make, tmp_path)
    with pytest.raises(PolytrainError, match=f"holds the state of Paddle {found} .*not "):
        convert(tmp_path, [setting, "lr=0.01", "nesterov=false"])


def test_paddle_momentum_needs_nesterov_said(tmp_path: Path) -> None:
    """A .pdopt does not record use_nesterov: never assumed."""
    paddle_run(lambda ps: P.Momentum(0.1, 0.8, parameters=ps, use_nesterov=True), tmp_path)
    with pytest.raises(PolytrainError, match=r"nesterov=true\|false"):
        convert(tmp_path, ["lr=0.1", "momentum=0.8"])
    with pytest.raises(PolytrainError, match=r"Nesterov .*--to torch"):
        convert(tmp_path, ["lr=0.1", "momentum=0.8", "nesterov=true"], to="neutral")


def test_rules_polytrain_train_lacks_do_not_go_to_neutral(tmp_path: Path) -> None:
    paddle_run(lambda ps: P.RMSProp(0.01, parameters=ps), tmp_path)
    with pytest.raises(PolytrainError, match=r"no rmsprop optimizer.*--to torch"):
        convert(tmp_path, ["lr=0.01"], to="neutral")
    assert not (tmp_path / "ck").exists()


def test_paddle_optimizers_polytrain_does_not_port_say_so(tmp_path: Path) -> None:
    paddle_run(lambda ps: P.NAdam(0.01, parameters=ps), tmp_path)
    with pytest.raises(PolytrainError, match="state of Paddle NAdam"):
        convert(tmp_path, ["lr=0.01"])


def test_a_setting_the_rule_does_not_use_is_refused(tmp_path: Path) -> None:
    paddle_run(lambda ps: P.Adagrad(0.1, parameters=ps), tmp_path)
    with pytest.raises(PolytrainError, match=r"nesterov .*adagrad"):
        convert(tmp_path, ["lr=0.1", "nesterov=true"])
