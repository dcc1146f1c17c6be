"""The Paddle 1.x MNIST tutorial's multi-GPU function (a seed program) converted by
``polytrain port-code``, run in two processes under torchrun (gloo, CPU), against fluid
1.8's data-parallel semantics worked out from its source (python/paddle/fluid/dygraph/
parallel.py, contrib/reader/distributed_reader.py; Paddle 3 has no fluid to run):
``scale_loss`` divides the loss by the number of trainers, ``apply_collective_grads`` sums
the gradients over them (so each step uses the mean gradient of one batch per trainer),
``distributed_batch_reader`` gives trainer r the batch at position r of each group of n
consecutive batches and drops a shorter last group, ``Env()`` reads the launcher's
variables. Also the numeric test of each ``check = "distributed"`` table entry."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from launch_helpers import clean_env
from port_code_helpers import assert_close
from test_port_code_seeds import _tiny_mnist

from polytrain.cli.main import main
from polytrain.porting.code import convert_source
from polytrain.porting.code.table import all_entries

torch = pytest.importorskip("torch")
FIXTURES = Path(__file__).parents[1] / "fixtures" / "port_code"
WORKER = Path(__file__).parents[1] / "workers" / "fluid_multi.py"
HEADER = "import paddle\nimport paddle.fluid as fluid\n"
DISTRIBUTED = [e for e in all_entries() if e.check == "distributed"]
TRAIN_IMAGES = 250  # batches of 100, 100 and 50 per epoch: two ranks drop the 50
EPOCHS = 5


def torchrun(args: list[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Two processes of the worker under torchrun; the whole process group killed on a
    timeout (a rank waiting in a collective would otherwise outlive the test)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           "2", str(WORKER), *args]  # fmt: skip
    proc = subprocess.Popen(cmd, env=clean_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)  # fmt: skip
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"torchrun {args[0]} did not finish in {timeout} s:\n{out[-3000:]}")
    assert proc.returncode == 0, out[-3000:]
    return subprocess.CompletedProcess(cmd, proc.returncode, out, "")


def converted(code: str, what: str) -> str:
    """The tool's PyTorch code of a fluid example; no use may be left marked."""
    result = convert_source(HEADER + code, what)
    left = [u for u in result.report.uses if not u.converted]
    assert not left, f"{what}: left unconverted: {left}\n{result.code}"
    assert "paddle" not in result.code, result.code
    return result.code


def fluid_distributed_batch_reader(
    batch_reader: Callable[[], Iterator[Any]], trainers_num: int, trainer_id: int
) -> Callable[[], Iterator[Any]]:
    """Paddle 1.8's distributed_batch_reader, its loop as written there (the reference)."""

    def decorate_for_multi_process() -> Iterator[Any]:
        train_data, idx = None, 1
        for data in batch_reader():
            if trainers_num > 1:
                if idx < trainers_num:
                    if idx == trainer_id + 1:
                        train_data = data
                    idx += 1
                else:
                    if idx == trainer_id + 1:
                        train_data = data
                    assert train_data is not None
                    yield train_data
                    train_data, idx = None, 1
            else:
                yield data

    return decorate_for_multi_process


# ---- the distributed table entries ----------------------------------------------------


def _fluid_net(rank: int) -> tuple[Any, Any]:
    sys.path.insert(0, str(WORKER.parent))
    try:
        from fluid_multi import entry_inputs  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(WORKER.parent))
    ns = entry_inputs(rank)
    return ns["net"], ns["x"]


def _scaled_grads(ranks: list[int]) -> tuple[dict[int, float], dict[str, Any]]:
    """Fluid's scale_loss per rank (mean(net(x_r)) / 2) and the sum over ``ranks`` of its
    gradients (apply_collective_grads' all-reduce; one rank: that rank's own)."""
    losses, grads = {}, {}
    for r in ranks:
        net, x = _fluid_net(r)
        loss = torch.mean(net(x)) / 2
        loss.backward()
        losses[r] = loss.item()
        for name, p in net.named_parameters():
            grads[name] = grads.get(name, 0) + p.grad.numpy()
    return losses, {k: v.tolist() for k, v in grads.items()}


def fluid_result(source: str, rank: int) -> dict[str, Any]:
    """What fluid 1.8 gives for each entry's example on rank ``rank`` of 2 (under
    paddle.distributed.launch --selected_gpus=0,1: trainer r on GPU r)."""
    if source == "paddle.fluid.dygraph.parallel.Env":
        return {"out": [2, rank, rank], "grads": {}, "group": [False]}
    if source == "paddle.fluid.contrib.reader.distributed_batch_reader":
        reader = fluid_distributed_batch_reader(lambda: iter(range(5)), 2, rank)
        return {"out": list(reader()), "grads": {}, "group": [False]}
    if source == "paddle.fluid.dygraph.parallel.prepare_context":
        return {"out": None, "grads": {}, "group": [True, rank, 2]}
    if source == "paddle.fluid.dygraph.parallel.DataParallel":
        net, x = _fluid_net(rank)
        return {"out": [["bias", "weight"], net(x).tolist()], "grads": {},
                "group": [True, rank, 2]}  # fmt: skip
    losses, own = _scaled_grads([rank])
    if source == ".scale_loss":
        return {"out": losses[rank], "grads": own, "group": [True, rank, 2]}
    assert source == ".apply_collective_grads", f"{source}: no reference for this entry"
    losses, summed = _scaled_grads([0, 1])
    return {"out": losses[rank], "grads": summed, "group": [True, rank, 2]}


@pytest.mark.slow
def test_distributed_entries_compute_fluids_numbers_in_two_processes(tmp_path: Path) -> None:
    """Each converted example in both ranks of one torchrun job (the process group made by
    prepare_context's conversion), against fluid 1.8's results; float64, 1e-12."""
    order = ["paddle.fluid.dygraph.parallel.Env",
             "paddle.fluid.contrib.reader.distributed_batch_reader",
             "paddle.fluid.dygraph.parallel.prepare_context",
             "paddle.fluid.dygraph.parallel.DataParallel", ".scale_loss",
             ".apply_collective_grads"]  # fmt: skip
    assert sorted(order) == sorted(e.source for e in DISTRIBUTED), "an entry without a test"
    by_source = {e.source: e for e in DISTRIBUTED}
    codes = {s: converted(by_source[s].example, s) for s in order}
    (tmp_path / "codes.json").write_text(json.dumps(codes), encoding="utf-8")
    torchrun(["entries", str(tmp_path), str(tmp_path / "codes.json")])
    for rank in (0, 1):
        got = json.loads((tmp_path / f"rank{rank}.json").read_text(encoding="utf-8"))
        for source in order:
            want = fluid_result(source, rank)
            assert got[source]["group"] == want["group"], source
            assert_close(got[source]["grads"], want["grads"], 1e-12, f"{source} grads")
            if isinstance(want["out"], list) and want["out"] and isinstance(want["out"][0], list):
                assert got[source]["out"][0] == want["out"][0], source  # state_dict keys
                assert_close(got[source]["out"][1], want["out"][1], 1e-12, source)
            else:
                assert_close(got[source]["out"], want["out"], 1e-12, f"{source} out")


@pytest.mark.parametrize("trainers", [1, 2, 3])
def test_converted_reader_is_fluids_on_every_length(
    trainers: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The converted reader against fluid's loop for 0 to 7 batches: each trainer's share
    (torchrun's WORLD_SIZE and RANK read where fluid reads PADDLE_TRAINERS_NUM and
    PADDLE_TRAINER_ID); a naive ``i % n == rank`` differs on every uneven length."""
    entry = next(e for e in DISTRIBUTED if "distributed_batch_reader" in e.source)
    code = converted(entry.example, entry.source)
    monkeypatch.setenv("WORLD_SIZE", str(trainers))
    for length in range(8):
        for rank in range(trainers):
            monkeypatch.setenv("RANK", str(rank))
            ns: dict[str, Any] = {"batches": lambda n=length: iter(range(n))}
            exec(code, ns)
            fluid = fluid_distributed_batch_reader(ns["batches"], trainers, rank)
            assert ns["out"] == list(fluid()), (trainers, rank, length)
            naive = [i for i in range(length) if i % trainers == rank]
            if trainers > 1 and length % trainers > rank:
                assert naive != ns["out"]


def test_methods_on_a_model_not_made_by_data_parallel_stay_marked() -> None:
    code = "def step(model, loss):\n    loss = model.scale_loss(loss)\n"
    code += "    model.apply_collective_grads()\n"
    result = convert_source(HEADER + code, "x")
    assert [u.api for u in result.report.uses if not u.converted] == [
        ".scale_loss", ".apply_collective_grads"]  # fmt: skip
    code_only = re.sub(r"#.*", "", result.code)
    assert "model.scale_loss(loss)" in code_only and "all_reduce" not in code_only


# ---- the seed program ---------------------------------------------------------------


def test_multi_seed_converts_every_call(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = FIXTURES / "paddle_mnist_multi.py"
    out = tmp_path / "multi.py"
    assert main(["port-code", str(src), "-o", str(out), "--show-unsupported"]) == 0
    printed = capsys.readouterr().out
    assert "18/18 lines with framework calls converted (100%), 0 use(s) left marked" in printed
    text = out.read_text(encoding="utf-8")
    # the MNIST reader reads Paddle's cache files (issue 36), paddle.batch around it
    assert "valid_loader = batched_reader(mnist_reader('test'), batch_size=16, " in text
    assert "fluid" not in re.sub(r"#.*", "", text)


@pytest.mark.slow
def test_converted_multi_seed_in_two_processes_equals_fluids_steps(tmp_path: Path) -> None:
    """train_multi_gpu() converted, under torchrun with 2 CPU processes, 5 epochs of 250
    images (batches 100, 100, 50): each step's printed (scaled) loss on each rank and the
    saved weights of both ranks equal, bit for bit, one process that takes the batches in
    pairs, drops the 50, divides each loss by 2 and sums the two gradients (fluid's steps;
    a sum of two is the same in either order); the model and reader are the converted
    single-GPU seed's."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("paddle_mnist_single.py", "paddle_mnist_multi.py"):
        shutil.copy(FIXTURES / name, src / name)
    conv = tmp_path / "conv"
    assert main(["port-code", str(src), "-o", str(conv)]) == 0
    for where in ("rank0", "rank1", "ref"):
        _tiny_mnist(tmp_path / where / "work" / "mnist.json.gz", train=TRAIN_IMAGES)
    torchrun(["mnist", str(tmp_path), str(conv)])
    ref = subprocess.run([sys.executable, str(WORKER), "reference", str(tmp_path), str(conv)],
                         env=clean_env(), capture_output=True, text=True, timeout=120)  # fmt: skip
    assert ref.returncode == 0, ref.stderr[-3000:]
    want = json.loads((tmp_path / "ref" / "losses.json").read_text(encoding="utf-8"))
    assert len(want) == EPOCHS and all(len(step) == 2 for step in want)
    want_state = torch.load(tmp_path / "ref" / "reference.pt", weights_only=True)
    for rank in (0, 1):
        log = (tmp_path / f"rank{rank}" / "log.txt").read_text(encoding="utf-8")
        printed = re.findall(r"epoch: (\d+), batch: (\d+), loss is: ([0-9.e+-]+)", log)
        # one batch per rank and epoch (the 50 dropped): batch 0 of each epoch printed
        assert [(int(e), int(b)) for e, b, _ in printed] == [(e, 0) for e in range(EPOCHS)]
        losses = np.array([float(v) for _, _, v in printed], dtype=np.float32)
        np.testing.assert_array_equal(losses, np.array([s[rank] for s in want], np.float32))
        state = torch.load(tmp_path / f"rank{rank}" / "mnist.pdparams", weights_only=True)
        assert set(state) == set(want_state)  # no `module.` prefix: fluid's keys
        for key, value in want_state.items():
            torch.testing.assert_close(state[key], value, rtol=0, atol=0)  # bit for bit
