"""A user's own Paddle or Gluon run, continued on PyTorch with its optimizer state: the
files' layout, what they must be given, Gluon's parameter order, the neutral checkpoint
and ``--resume``. Every optimizer's continuation: test_optimizer_porting_paddle.py and
test_optimizer_porting_gluon.py.

The models are written here, on both sides (not polytrain's): a Paddle run takes 5 steps,
saves ``.pdparams`` + ``.pdopt`` (Gluon: ``save_parameters`` + ``Trainer.save_states``) and
goes on for 10 more; the files are converted with ``--optimizer`` and a PyTorch twin goes
on from them over the same 10 batches. A test also shows that the same continuation with
a fresh optimizer is far off, so it cannot pass without the ported state.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from polytrain.errors import PolytrainError
from polytrain.io.checkpoint import load_checkpoint
from polytrain.io.optimizer_state import convert_with_optimizer

IN, HID, OUT, BATCH = 8, 16, 3, 16  # fc2 is square: a transposed Linear state would pass shapes
SAVED, CONTINUED = 5, 10
TOL = 1e-5


def batches(n: int = SAVED + CONTINUED, features: int = IN) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(0)
    return [
        (rng.standard_normal((BATCH, features)).astype(np.float32), rng.integers(0, OUT, BATCH))
        for _ in range(n)
    ]


# -- Paddle ---------------------------------------------------------------------------------------


def paddle_run(make_opt: Callable[[Any], Any], out: Path) -> list[float]:
    """5 steps, save net.pdparams / net.pdopt, 10 more steps: their losses."""
    paddle = pytest.importorskip("paddle")
    paddle.set_device("cpu")
    paddle.seed(0)

    class Net(paddle.nn.Layer):  # type: ignore[name-defined]
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
        if isinstance(opt._learning_rate, paddle.optimizer.lr.LRScheduler):
            opt._learning_rate.step()
        return float(loss)

    for x, y in data[:SAVED]:
        step(x, y)
    paddle.save(net.state_dict(), str(out / "net.pdparams"))
    paddle.save(opt.state_dict(), str(out / "net.pdopt"))
    return [step(x, y) for x, y in data[SAVED:]]


def torch_continue(
    weights: Path, make_opt: Callable[[Any], Any], state: Path | None, features: int = IN
) -> list[float]:
    """The PyTorch twin from ``weights`` (and optimizer ``state``): the 10 continued losses."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)

    class Net(torch.nn.Module):  # type: ignore[name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.fc1 = torch.nn.Linear(features, HID)
            self.fc2 = torch.nn.Linear(HID, HID)
            self.head = torch.nn.Linear(HID, OUT)

        def forward(self, x: Any) -> Any:
            return self.head(torch.tanh(self.fc2(torch.tanh(self.fc1(x)))))

    net = Net()
    net.load_state_dict(torch.load(weights), strict=True)
    opt = make_opt(net.parameters())
    if state is not None:
        opt.load_state_dict(torch.load(state))
    losses = []
    for x, y in batches(features=features)[SAVED:]:
        loss = torch.nn.functional.cross_entropy(net(torch.from_numpy(x)), torch.from_numpy(y))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


def port_and_compare(
    tmp_path: Path,
    reference: list[float],
    source: str,
    state: str,
    torch_opt: Callable[[Any], Any],
    settings: list[str],
) -> None:
    report = convert_with_optimizer(
        tmp_path / source, tmp_path / "net.pt", "torch", optimizer=tmp_path / state,
        settings=settings,
    )  # fmt: skip
    assert (tmp_path / "net.optimizer.pt").is_file(), report.format()
    ported = torch_continue(tmp_path / "net.pt", torch_opt, tmp_path / "net.optimizer.pt")
    fresh = torch_continue(tmp_path / "net.pt", torch_opt, None)
    diff = max(abs(a - b) for a, b in zip(ported, reference, strict=True))
    fresh_diff = max(abs(a - b) for a, b in zip(fresh, reference, strict=True))
    print(f"CONTINUE {state} {settings}: {len(reference)} steps, max |loss diff| {diff:.1e} "
          f"(a fresh optimizer: {fresh_diff:.1e})")  # fmt: skip
    assert diff <= TOL, (ported, reference)
    assert fresh_diff > 100 * TOL


def test_pdopt_layout_and_beta_powers(tmp_path: Path) -> None:
    """What paddle.save(opt.state_dict()) really holds: <param>_<acc>_0 keys, beta powers
    beta**(t+1) after t steps, LR_Scheduler with the next step's rate."""
    paddle = pytest.importorskip("paddle")
    from polytrain.utils import safe_pickle

    def make(ps: Any) -> Any:
        return paddle.optimizer.Adam(paddle.optimizer.lr.StepDecay(0.01, 3, 0.5), parameters=ps)

    paddle_run(make, tmp_path)  # 15 steps; the .pdopt after 5
    state = safe_pickle.load(tmp_path / "net.pdopt")
    table = safe_pickle.load(tmp_path / "net.pdparams")["StructuredToParameterName@@"]
    weight = table["fc2.weight"]
    assert {f"{weight}_{acc}_0" for acc in ("moment1", "moment2", "beta1_pow_acc")} <= set(state)
    np.testing.assert_allclose(state[f"{weight}_beta1_pow_acc_0"], [0.9 ** (SAVED + 1)], rtol=1e-6)
    np.testing.assert_allclose(
        state[f"{weight}_beta2_pow_acc_0"], [0.999 ** (SAVED + 1)], rtol=1e-6
    )
    assert state["LR_Scheduler"]["last_lr"] == pytest.approx(0.005)  # StepDecay after 5 epochs
    report = convert_with_optimizer(
        tmp_path / "net.pdparams", tmp_path / "ck", "neutral", optimizer=tmp_path / "net.pdopt",
        settings=["optimizer=adam", "scheduler=constant"],
    )  # fmt: skip
    ck = load_checkpoint(tmp_path / "ck")
    assert ck.optimizer_state is not None
    assert ck.optimizer_state["step"] == SAVED and ck.optimizer_state["lr"] == pytest.approx(0.005)
    slots = ck.optimizer_state["slots"]
    assert list(slots) == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "head.weight",
                           "head.bias"]  # fmt: skip
    # the square fc2 moment is transposed with its weight ([in, out] -> [out, in])
    np.testing.assert_array_equal(slots["fc2.weight"]["exp_avg"], state[f"{weight}_moment1_0"].T)
    assert "LR_Scheduler" in report.format()


def test_pdopt_needs_what_it_does_not_record(tmp_path: Path) -> None:
    paddle = pytest.importorskip("paddle")
    paddle_run(lambda ps: paddle.optimizer.Adam(0.01, parameters=ps), tmp_path)
    args = (tmp_path / "net.pdparams", tmp_path / "x.pt", "torch")
    with pytest.raises(PolytrainError, match="optimizer=adam, optimizer=adamw or optimizer=lamb"):
        convert_with_optimizer(*args, optimizer=tmp_path / "net.pdopt")
    with pytest.raises(PolytrainError, match="does not record the lr"):
        convert_with_optimizer(*args, optimizer=tmp_path / "net.pdopt", settings=["optimizer=adam"])
    with pytest.raises(PolytrainError, match="betas"):  # beta powers that are not these betas
        wrong = ["optimizer=adam", "lr=0.01", "betas=0.8,0.99"]
        convert_with_optimizer(*args, optimizer=tmp_path / "net.pdopt", settings=wrong)
    from polytrain.io.convert import convert

    with pytest.raises(PolytrainError, match="is an optimizer state"):  # not as weights
        convert(tmp_path / "net.pdopt", tmp_path / "x.pt", "torch")
    assert not (tmp_path / "x.pt").exists()


# -- Gluon ----------------------------------------------------------------------------------------


def gluon_run(out: Path) -> list[float]:
    """SGD with momentum: 5 steps, save_parameters / save_states, 10 more steps."""
    mx = pytest.importorskip("mxnet")
    from mxnet import autograd, gluon

    class Net(gluon.nn.Block):
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
    trainer = gluon.Trainer(
        net.collect_params(), "sgd", {"learning_rate": 0.1, "momentum": 0.9, "wd": 1e-3}
    )
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
    # the Trainer's order (Gluon names sorted), in save_parameters' names, as the docs say
    structured = {p.name: k for k, p in net._collect_params_with_prefix().items()}
    order = [structured[name] for name in sorted(net.collect_params().keys())]
    (out / "order.txt").write_text("\n".join(order) + "\n")
    net.collect_params().save(str(out / "net.gparams"))  # Gluon's own names: no order file
    (out / "names.json").write_text(json.dumps(structured))
    return [step(x, y) for x, y in data[SAVED:]]


def test_gluon_sgd_momentum_continues_on_torch(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    reference = gluon_run(tmp_path)
    with pytest.raises(PolytrainError, match="order=FILE"):  # save_parameters names only
        convert_with_optimizer(tmp_path / "net.params", tmp_path / "net.pt", "torch",
                               optimizer=tmp_path / "net.states")  # fmt: skip
    port_and_compare(
        tmp_path, reference, "net.params", "net.states",
        lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=1e-3),
        [f"order={tmp_path / 'order.txt'}"],
    )  # fmt: skip


def test_gluon_order_from_gluon_names(tmp_path: Path) -> None:
    """Weights saved with Gluon's own names are in the Trainer's (sorted) order."""
    gluon_run(tmp_path)
    order = f"order={tmp_path / 'order.txt'}"
    convert_with_optimizer(tmp_path / "net.params", tmp_path / "a", "neutral",
                           optimizer=tmp_path / "net.states", settings=[order])  # fmt: skip
    convert_with_optimizer(tmp_path / "net.gparams", tmp_path / "b", "neutral",
                           optimizer=tmp_path / "net.states")  # fmt: skip
    a, b = (load_checkpoint(tmp_path / d).optimizer_state for d in "ab")
    assert a is not None and b is not None
    names = json.loads((tmp_path / "names.json").read_text())
    assert {names[k]: v for k, v in b["slots"].items()}.keys() == a["slots"].keys()
    for gluon_name, slots in b["slots"].items():
        np.testing.assert_array_equal(
            slots["momentum_buffer"], a["slots"][names[gluon_name]]["momentum_buffer"]
        )


def test_gluon_states_are_read_without_running_code(tmp_path: Path) -> None:
    """A states file naming anything but MXNet's data classes is refused."""
    import pickle

    gluon_run(tmp_path)
    evil = tmp_path / "evil.states"
    evil.write_bytes(pickle.dumps(({0: None}, subprocess.Popen)))
    with pytest.raises(PolytrainError, match="will not unpickle"):
        convert_with_optimizer(tmp_path / "net.params", tmp_path / "x.pt", "torch",
                               optimizer=evil)  # fmt: skip


# -- the neutral checkpoint and --resume ----------------------------------------------------------


@pytest.mark.slow
def test_resume_continues_a_paddle_adam_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A Paddle twin of the built-in mlp, converted with its .pdopt to a neutral
    checkpoint: a torch Trainer resumed from it matches Paddle's own continuation."""
    paddle = pytest.importorskip("paddle")
    pytest.importorskip("torch")
    from polytrain.data.loader import ArrayDataset
    from polytrain.training.recipe import Recipe
    from polytrain.training.trainer import Datasets, Trainer

    paddle.set_device("cpu")
    paddle.seed(0)
    net = paddle.nn.Sequential()  # named fc1/fc2 as the built-in mlp
    net.add_sublayer("fc1", paddle.nn.Linear(784, 32))
    net.add_sublayer("relu1", paddle.nn.ReLU())
    net.add_sublayer("fc2", paddle.nn.Linear(32, 10))
    opt = paddle.optimizer.Adam(0.01, parameters=net.parameters())
    rng = np.random.default_rng(1)
    data = [(rng.random((BATCH, 784), dtype=np.float32), rng.integers(0, 10, BATCH))
            for _ in range(SAVED + CONTINUED)]  # fmt: skip

    def step(x: np.ndarray, y: np.ndarray) -> float:
        loss = paddle.nn.functional.cross_entropy(net(paddle.to_tensor(x)), paddle.to_tensor(y))
        loss.backward()
        opt.step()
        opt.clear_grad()
        return float(loss)

    for x, y in data[:SAVED]:
        step(x, y)
    paddle.save(net.state_dict(), str(tmp_path / "mlp.pdparams"))
    paddle.save(opt.state_dict(), str(tmp_path / "mlp.pdopt"))
    reference = [step(x, y) for x, y in data[SAVED:]]
    cli = [sys.executable, "-m", "polytrain", "convert", str(tmp_path / "mlp.pdparams"),
           str(tmp_path / "ck"), "--to", "neutral", "--optimizer", str(tmp_path / "mlp.pdopt"),
           "--optimizer-setting", "optimizer=adam"]  # fmt: skip
    done = subprocess.run(cli, capture_output=True, text=True, check=False)
    assert done.returncode == 2 and "lr" in done.stderr  # the .pdopt has no lr
    done = subprocess.run([*cli, "--optimizer-setting", "lr=0.01"], capture_output=True,
                          text=True, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "model mlp" in done.stdout and "optimizer state: adam, step 5" in done.stdout

    def resumed(checkpoint: Path) -> list[float]:
        images = np.zeros((BATCH, 1, 28, 28), np.float32)
        recipe = Recipe(model="mlp", optimizer="adam", lr=0.01, batch_size=BATCH)
        datasets = Datasets(ArrayDataset(images, np.zeros(BATCH, np.int64)), None)
        trainer = Trainer(recipe, "torch", datasets=datasets, resume=checkpoint, progress=False)
        out = []
        for x, y in data[SAVED:]:
            out.append(trainer.runner.train_step(x.reshape(-1, 1, 28, 28), y).loss_sum / BATCH)
        return out

    capsys.readouterr()
    ported = resumed(tmp_path / "ck")
    assert "no optimizer state" not in capsys.readouterr().err
    assert max(abs(a - b) for a, b in zip(ported, reference, strict=True)) <= TOL
    # without the .pdopt: the resume says so in one line, and the losses are far off
    from polytrain.io.convert import convert

    convert(tmp_path / "mlp.pdparams", tmp_path / "bare", "neutral")
    fresh = resumed(tmp_path / "bare")
    err = capsys.readouterr().err
    assert "the checkpoint has no optimizer state: adam starts fresh" in err
    assert max(abs(a - b) for a, b in zip(fresh, reference, strict=True)) > 100 * TOL
