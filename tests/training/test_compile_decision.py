"""The automatic compile mode: the pure decision, the run header's reason, and torch's
persistent compile cache going from cold to warm (docs/performance.md, "Fast execution
modes")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from polytrain.backend.identity import CompileProfile
from polytrain.neutral.models import get_model_spec, lenet
from polytrain.neutral.work import forward_multiply_adds
from polytrain.plugins.records import RunInfo
from polytrain.testing import backends_under_test
from polytrain.training.builtin_plugins import ProgressBar
from polytrain.training.compile_decision import (
    RunPlan,
    break_even_steps,
    decide_compile,
    model_fingerprint,
    model_work,
)
from polytrain.training.recipe import Recipe
from polytrain.training.trainer import Trainer, load_datasets

# LeNet-like figures: eager 0.5 ms/sample, 2x steady, 40 s cold, 4 s warm; at batch 256 a
# compiled step saves 64 ms: 625 steps repay a cold compile, 63 a warm one
PROFILE = CompileProfile("torch.compile", speedup=2.0, cold_s=40.0, warm_s=4.0,
                         eager_sample_s=0.0005)  # fmt: skip
DEFAULT_RUN = RunPlan(planned_steps=470, batch_per_process=256)
JAX_LIKE = CompileProfile("jax.jit", speedup=1.4, cold_s=2.0, warm_s=2.0,
                          eager_sample_s=0.0026, eager_compiles=True)  # fmt: skip


def decide(plan: RunPlan = DEFAULT_RUN, **kw: Any) -> tuple[bool, str]:
    args: dict[str, Any] = dict(fast_default=False, profile=PROFILE, warm=False) | kw
    requested = args.pop("requested", None)
    choice = decide_compile(requested, plan=plan, **args)
    return choice.fast, choice.reason


def test_break_even_is_the_compile_over_the_seconds_a_step_saves() -> None:
    assert break_even_steps(PROFILE, 256, warm=False) == 625
    assert break_even_steps(PROFILE, 256, warm=True) == 63
    assert break_even_steps(PROFILE, 16, warm=False) == 10_000  # small steps save little


def test_a_short_run_stays_eager_on_a_cold_cache_and_compiles_on_a_warm_one() -> None:
    assert decide() == (
        False,
        "470 planned steps < 625 to repay torch.compile with a cold cache (~40 s)",
    )
    assert decide(warm=True) == (
        True,
        "470 planned steps >= 63 to repay torch.compile with a warm cache (~4 s)",
    )


def test_a_tool_without_a_cache_names_none_and_its_sub_second_cost() -> None:
    # Paddle's static graph: one build per process, 0.15 s cold or warm
    once = CompileProfile("Paddle's static graph", speedup=3.0, cold_s=0.15, warm_s=0.15,
                          eager_sample_s=8e-4)  # fmt: skip
    for warm in (False, True):
        assert decide(RunPlan(10, 32), profile=once, warm=warm) == (
            True,
            "10 planned steps >= 9 to repay Paddle's static graph (~0.1 s)",
        )


def test_a_long_run_compiles_even_on_a_cold_cache() -> None:
    fast, reason = decide(RunPlan(planned_steps=625, batch_per_process=256))
    assert fast and reason.startswith("625 planned steps >= 625")
    assert decide(RunPlan(planned_steps=62, batch_per_process=256), warm=True)[0] is False


@pytest.mark.parametrize(
    ("plan", "why"),
    [
        (RunPlan(10_000, 256, precision="fp64"), "--precision fp64"),
        (RunPlan(10_000, 128, processes=2), "2 processes"),
        (RunPlan(10_000, 256, inspect=True), "--inspect"),
        (RunPlan(10_000, 256, pipeline=True), "--pipeline-split"),
    ],
)
def test_parity_and_several_processes_stay_eager_however_long(plan: RunPlan, why: str) -> None:
    fast, reason = decide(plan, warm=True)
    assert not fast and reason.startswith(why)


def test_several_processes_compile_where_eager_compiles_each_op_too() -> None:
    """jax: op by op compiles every op on first use, so each process compiles either way."""
    fast, reason = decide(RunPlan(10_000, 128, processes=2), profile=JAX_LIKE)
    assert fast and "planned steps" in reason


def test_an_unmodelled_model_compiles_where_eager_compiles_each_op_too() -> None:
    """jax ran the ViT op by op, at half the jitted hand-written loop's speed."""
    vit = RunPlan(470, 256, **model_work(get_model_spec("vit-tiny")))
    fast, reason = decide(vit, profile=JAX_LIKE)
    assert fast and reason.startswith("this model's step time is not modelled; op by op")
    assert decide(vit)[0] is False  # torch-like: eager ops need no compile


def test_explicit_fast_and_no_fast_win_over_the_automatic_choice() -> None:
    fp64_long = RunPlan(10_000, 256, precision="fp64")
    assert decide(fp64_long, requested=True) == (True, "--fast")
    assert decide(RunPlan(10_000, 256), warm=True, requested=False) == (False, "--no-fast")
    assert decide(requested=True, profile=None) == (True, "--fast")


def test_a_backend_without_a_profile_stays_eager_and_a_compiled_default_stays_on() -> None:
    assert decide(RunPlan(10**6, 256), profile=None) == (
        False,
        "no compiled mode that pays on this backend",
    )
    slower = CompileProfile("to_static", speedup=0.95, cold_s=1, warm_s=1, eager_sample_s=1)
    assert decide(RunPlan(10**6, 256), profile=slower) == (
        False,
        "to_static measured no faster than eager (0.95x)",
    )
    # MXNet's hybridize: nothing to repay, on even for one step and in fp64
    assert decide(RunPlan(1, 256, precision="fp64"), fast_default=True, profile=None) == (
        True,
        "the backend's default, nothing to repay",
    )


def test_the_fingerprint_changes_with_model_dtype_and_batch() -> None:
    base = model_fingerprint({"name": "mlp"}, "float32", (16, 1, 28, 28))
    assert base == model_fingerprint({"name": "mlp"}, "float32", (16, 1, 28, 28))
    assert base != model_fingerprint({"name": "lenet"}, "float32", (16, 1, 28, 28))
    assert base != model_fingerprint({"name": "mlp"}, "float64", (16, 1, 28, 28))
    assert base != model_fingerprint({"name": "mlp"}, "float32", (8, 1, 28, 28))


def test_the_run_header_says_which_mode_and_why(capsys: pytest.CaptureFixture[str]) -> None:
    why = "470 planned steps < 625 ..."
    run = RunInfo("torch", "2.13", "lenet", "fashion-mnist", ["cpu"], 2, 235, 256, 256,
                  recipe={"precision": "fp32"}, fast_reason=why)  # fmt: skip
    ProgressBar(enabled=True, bar=False).polytrain_train_start(run)
    assert "| eager (470 planned steps < 625 ...) fp32" in capsys.readouterr().err


# 100 samples, batch 16: 7 steps (the last of 4 samples), far too few to repay a compile
TINY: dict[str, Any] = dict(model="mlp", train_samples=100, test_samples=32, batch_size=16,
                            optimizer="sgd", lr=0.1, epochs=1)  # fmt: skip


@pytest.mark.slow
@pytest.mark.skipif("torch" not in backends_under_test(), reason="needs the torch backend")
def test_torch_compiles_into_the_users_cache_and_the_next_run_sees_it_warm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from polytrain_torch import _compile
    from torch._dynamo.utils import counters

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)  # restored after the test
    monkeypatch.setattr(_compile, "USER_CACHE_DIR", None)
    recipe, data = Recipe(**TINY), load_datasets(Recipe(**TINY))

    def trainer(fast: bool | None) -> Trainer:
        return Trainer(recipe, "torch", fast=fast, datasets=data, progress=False)

    cold = trainer(None)
    assert not cold.backend.fast
    assert not _compile.is_warm(cold.compile_choice.fingerprint or "")
    first = trainer(True)  # --fast: compiles cold, then marks the cache warm for this model
    assert first.run_info().fast_reason == "--fast"
    graphs = counters["stats"]["unique_graphs"]
    first.fit()
    # one graph: the smaller last batch and the evaluation run eager (no recompile)
    assert counters["stats"]["unique_graphs"] - graphs == 1
    cache = tmp_path / "polytrain" / "torch-compile"
    assert any(cache.glob("fxgraph/**/*")), "inductor did not write into the user's cache"
    assert _compile.is_warm(first.compile_choice.fingerprint or "")
    second = trainer(None)
    assert second.compile_choice.fingerprint == first.compile_choice.fingerprint
    assert second.backend.compile_cache_warm(second.compile_choice.fingerprint or "")


def test_the_model_work_counts_lenets_multiply_adds_by_hand() -> None:
    # conv 1->20 k3 on 28x28: 20*26*26*9; conv 20->50 k5 on 13x13: 50*9*9*20*25; fc 800x128, 128x10
    assert forward_multiply_adds(lenet()) == 121_680 + 2_025_000 + 102_400 + 1_280
    assert model_work(lenet()) == {"work": 1.0, "layers": 1.0}
    assert forward_multiply_adds(get_model_spec("vit-tiny")) is None  # attention: not modelled


def test_the_break_even_scales_with_the_models_work_and_layers() -> None:
    tiny = RunPlan(20_000, 256, **model_work(get_model_spec("mlp")))  # ~1 % of LeNet's work
    fast, reason = decide(tiny)
    assert not fast and reason.startswith("20000 planned steps < ")
    big = RunPlan(200, 256, **model_work(get_model_spec("resnet18")))  # ~200x LeNet's work
    assert decide(big)[0] is True  # its compile is longer, but each step saves far more
    assert decide(RunPlan(200, 256, work=1.0))[0] is False
    unmodelled = RunPlan(10**6, 256, **model_work(get_model_spec("vit-tiny")))
    fast, reason = decide(unmodelled, warm=True)
    assert not fast and reason.startswith("this model's step time is not modelled")


@pytest.mark.slow
def test_fast_on_a_backend_without_a_compiled_mode_says_it_runs_eager() -> None:
    """The run header said "fast (compiled)" on numpy, which has no compiled mode."""
    from polytrain.training.builtin_plugins import compile_label
    from polytrain.training.recipe import Recipe
    from polytrain.training.trainer import Trainer

    recipe = Recipe(train_samples=64, test_samples=32, batch_size=32)
    info = Trainer(recipe, "numpy", fast=True, progress=False).run_info()
    assert not info.fast
    assert compile_label(info) == "eager (--fast asked, but numpy has no compiled mode)"
