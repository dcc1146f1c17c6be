"""Every Gluon optimizer that PyTorch also has, ported with its state and lr_scheduler.

A Gluon run (3 Dense, written here) takes 10 steps, saves ``save_parameters`` +
``Trainer.save_states`` and goes on for 10 more; the files are converted with
``--optimizer`` and a PyTorch twin goes on from them over the same 10 batches: losses and
final weights within 1e-5. The states file pickles the optimizer object, so its kind and
settings come from the file; what no torch optimizer continues is refused in one line.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from optimizer_helpers import HID, IN, OUT, SAVED, Run, batches, check_continuation, torch_continue

from polytrain.errors import PolytrainError
from polytrain.io.optimizer_state import convert_with_optimizer

mx = pytest.importorskip("mxnet")
torch = pytest.importorskip("torch")


def gluon_run(optimizer: str, params: dict[str, Any], out: Path) -> Run:
    """10 steps, save_parameters / save_states (and the Trainer's order), 10 more."""
    from mxnet import autograd, gluon

    class Net(gluon.nn.Block):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            with self.name_scope():
                self.fc1 = gluon.nn.Dense(HID, in_units=IN)
                self.fc2 = gluon.nn.Dense(HID, in_units=HID)
                self.head = gluon.nn.Dense(OUT, in_units=HID)

        def forward(self, x: Any) -> Any:
            return self.head(mx.nd.tanh(self.fc2(mx.nd.tanh(self.fc1(x)))))

    mx.random.seed(0)
    net = Net()
    net.initialize(mx.init.Xavier())
    trainer = gluon.Trainer(net.collect_params(), optimizer, params)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    data = batches()

    def step(x: np.ndarray, y: np.ndarray) -> float:
        with autograd.record():
            loss = loss_fn(net(mx.nd.array(x)), mx.nd.array(y)).mean()
        loss.backward()
        trainer.step(1)
        return float(loss.asscalar())

    for x, y in data[:SAVED]:
        step(x, y)
    net.save_parameters(str(out / "net.params"))
    trainer.save_states(str(out / "net.states"))
    structured = {p.name: k for k, p in net._collect_params_with_prefix().items()}
    order = [structured[name] for name in sorted(net.collect_params().keys())]
    (out / "order.txt").write_text("\n".join(order) + "\n")
    losses = [step(x, y) for x, y in data[SAVED:]]
    weights = {k: p.data().asnumpy() for k, p in net._collect_params_with_prefix().items()}
    return Run(losses, weights)


def convert(tmp_path: Path, settings: list[str] | None = None, to: str = "torch") -> str:
    report = convert_with_optimizer(
        tmp_path / "net.params", tmp_path / ("net.pt" if to == "torch" else "ck"), to,
        optimizer=tmp_path / "net.states",
        settings=[f"order={tmp_path / 'order.txt'}", *(settings or [])],
    )  # fmt: skip
    return report.format()


def ours() -> Any:
    import polytrain_torch.optimizers

    return polytrain_torch.optimizers


# (id, Gluon optimizer and its params, the torch optimizer that continues it)
CASES: list[tuple[str, str, dict[str, Any], Callable[[Any], Any]]] = [
    ("SGD", "sgd", {"learning_rate": 0.1, "momentum": 0.9, "wd": 1e-3},
     lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=1e-3)),
    ("NAG", "nag", {"learning_rate": 0.1, "momentum": 0.9},
     lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True)),
    ("Adam", "adam", {"learning_rate": 0.01, "wd": 1e-3},
     lambda ps: ours().AdamEpsUncorrected(ps, lr=0.01, weight_decay=1e-3)),
    ("RMSProp", "rmsprop", {"learning_rate": 0.01},
     lambda ps: ours().RMSpropEpsInSqrt(ps, lr=0.01, rho=0.9, eps=1e-8)),
    ("RMSProp-centered", "rmsprop", {"learning_rate": 0.01, "centered": True, "gamma2": 0.5},
     lambda ps: ours().RMSpropEpsInSqrt(ps, lr=0.01, rho=0.9, eps=1e-8, momentum=0.5,
                                        centered=True)),
    ("AdaGrad", "adagrad", {"learning_rate": 0.1},
     lambda ps: torch.optim.Adagrad(ps, lr=0.1, eps=0.0)),
    ("AdaDelta", "adadelta", {"rho": 0.9},
     lambda ps: torch.optim.Adadelta(ps, lr=1.0, rho=0.9, eps=1e-5)),
    ("Adamax", "adamax", {"learning_rate": 0.01, "wd": 1e-3},
     lambda ps: torch.optim.Adamax(ps, lr=0.01, eps=0.0, weight_decay=1e-3)),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_gluon_optimizer_continues_on_torch(case: Any, tmp_path: Path) -> None:
    name, optimizer, params, torch_opt = case
    reference = gluon_run(optimizer, params, tmp_path)
    report = convert(tmp_path)
    ported = torch_continue(tmp_path / "net.pt", torch_opt, tmp_path / "net.optimizer.pt")
    fresh = torch_continue(tmp_path / "net.pt", torch_opt, None)
    check_continuation(f"Gluon {name}", reference, ported, fresh)
    assert "load the optimizer state into" in report


SCHEDULES: list[tuple[str, Callable[[], Any], Callable[[Any], Any]]] = [
    ("Factor", lambda: mx.lr_scheduler.FactorScheduler(step=4, factor=0.5, base_lr=0.01),
     lambda o: torch.optim.lr_scheduler.StepLR(o, 4, gamma=0.5)),
    ("MultiFactor", lambda: mx.lr_scheduler.MultiFactorScheduler([8, 12, 15], 0.5, base_lr=0.01),
     lambda o: torch.optim.lr_scheduler.MultiStepLR(o, [8, 12, 15], gamma=0.5)),
    ("Cosine", lambda: mx.lr_scheduler.CosineScheduler(30, base_lr=0.01),
     lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=30)),
    ("Poly", lambda: mx.lr_scheduler.PolyScheduler(25, base_lr=0.01, pwr=2),
     lambda o: torch.optim.lr_scheduler.PolynomialLR(o, total_iters=25, power=2)),
]  # fmt: skip


@pytest.mark.parametrize("case", SCHEDULES, ids=[c[0] for c in SCHEDULES])
def test_gluon_schedule_continues_on_torch(case: Any, tmp_path: Path) -> None:
    """Adam under an MXNet lr_scheduler (pickled whole in the states file): the schedule
    goes on in torch's scheduler."""
    name, make_sched, torch_sched = case
    params = {"learning_rate": 0.01, "lr_scheduler": make_sched()}
    reference = gluon_run("adam", params, tmp_path)
    report = convert(tmp_path)
    assert "net.scheduler.pt" in report

    def make_opt(ps: Any) -> Any:
        return ours().AdamEpsUncorrected(ps, lr=0.01)

    ported = torch_continue(tmp_path / "net.pt", make_opt, tmp_path / "net.optimizer.pt",
                            torch_sched, tmp_path / "net.scheduler.pt")  # fmt: skip
    check_continuation(f"Gluon Adam + {name}", reference, ported, None)


# -- refused in one line -----------------------------------------------------------------------


def test_gluon_lamb_is_refused(tmp_path: Path) -> None:
    gluon_run("lamb", {"learning_rate": 0.01}, tmp_path)
    with pytest.raises(PolytrainError, match="'LAMB', which polytrain does not port"):
        convert(tmp_path, ["optimizer=adamw"])
    assert not (tmp_path / "net.pt").exists()


@pytest.mark.parametrize(
    "optimizer, setting, message",
    [
        ("adam", "optimizer=adamw", "MXNet Adam \\(adam\\), not adamw"),
        ("nag", "nesterov=false", "records nesterov=True"),
        ("sgd", "momentum=0.5", "records momentum=0.9"),
        ("rmsprop", "centered=true", "records centered=False"),
    ],
)
def test_a_setting_contradicting_the_file_is_refused(
    optimizer: str, setting: str, message: str, tmp_path: Path
) -> None:
    gluon_run(optimizer, {"learning_rate": 0.01, "momentum": 0.9}
              if optimizer in ("sgd", "nag") else {"learning_rate": 0.01}, tmp_path)  # fmt: skip
    with pytest.raises(PolytrainError, match=message):
        convert(tmp_path, [setting])


def test_what_torch_cannot_continue_is_refused(tmp_path: Path) -> None:
    """SGD keeps lr inside its momentum (a changing schedule parts from torch's); AdaGrad
    decays weights outside its adaptive step; NAG decays its momentum by the weight it
    has just updated."""
    sched = mx.lr_scheduler.FactorScheduler(step=4, factor=0.5, base_lr=0.1)
    gluon_run("sgd", {"learning_rate": 0.1, "momentum": 0.9, "lr_scheduler": sched}, tmp_path)
    with pytest.raises(PolytrainError, match="inside its momentum"):
        convert(tmp_path)
    report = convert(tmp_path, ["scheduler=constant", "lr=0.05"])
    assert "constant lr" in report
    gluon_run("adagrad", {"learning_rate": 0.1, "wd": 1e-3}, tmp_path)
    with pytest.raises(PolytrainError, match="AdaGrad applies its weight decay"):
        convert(tmp_path)
    gluon_run("nag", {"learning_rate": 0.1, "momentum": 0.9, "wd": 1e-3}, tmp_path)
    with pytest.raises(PolytrainError, match="NAG applies its weight decay"):
        convert(tmp_path)


def test_gluon_rules_polytrain_train_lacks_do_not_go_to_neutral(tmp_path: Path) -> None:
    gluon_run("adam", {"learning_rate": 0.01}, tmp_path)
    with pytest.raises(PolytrainError, match="--to torch"):
        convert(tmp_path, to="neutral")
