"""The character-level LM recipe: the fortunes corpus, sequence data of the user's own, and
the char-lm-fortunes preset's fp64 parity across frameworks (a few windows, a few steps)."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest

from polytrain.data import load_dataset
from polytrain.data.registry import FORTUNES, get_dataset
from polytrain.data.text import TextWindows, windows
from polytrain.errors import ConfigError, DataError
from polytrain.io.checkpoint import find_checkpoint, read_manifest
from polytrain.neutral.models import Embedding, Linear, ModelSpec, get_model_spec, seq
from polytrain.testing import backends_under_test
from polytrain.testing.recorders import StepLosses
from polytrain.training.presets import preset_recipe
from polytrain.training.trainer import Trainer

BACKENDS = backends_under_test()
FORTUNE_FILES = Path(FORTUNES.system_dir)
needs_corpus = pytest.mark.skipif(
    not (FORTUNE_FILES / "literature").is_file(), reason="apt-get install fortunes-min"
)
# the preset on 24 windows, 3 steps of 8: seconds per backend
TINY = dict(precision="fp64", train_samples=24, test_samples=8, batch_size=8, epochs=1,
            schedule="cosine:warmup=1")  # fmt: skip


def test_windows_are_next_character_pairs() -> None:
    x, y = windows(np.arange(10), window=4, stride=3)
    assert x.tolist() == [[0, 1, 2, 3], [3, 4, 5, 6]]
    assert y.tolist() == [[1, 2, 3, 4], [4, 5, 6, 7]]


@needs_corpus
def test_fortunes_splits_vocabulary_and_origin() -> None:
    train, test = load_dataset("fortunes", "train"), load_dataset("fortunes", "test")
    assert isinstance(train, TextWindows) and isinstance(test, TextWindows)
    assert train.x.shape == (1383, 64) and test.x.shape == (153, 64)  # 90 % / 10 % of 98,399
    assert train.x.dtype == np.int64 and train.y.shape == train.x.shape
    np.testing.assert_array_equal(train.x[:, 1:], train.y[:, :-1])  # y is x shifted by one
    vocabulary = train.origin["vocabulary"]
    assert vocabulary == test.origin["vocabulary"] == "".join(sorted(vocabulary))
    assert len(vocabulary) == 88 == get_model_spec("char-transformer").num_classes
    text = "".join(vocabulary[i] for i in train.x[0])
    assert text.startswith("A day for firm decisions!!!!!")
    assert train.origin["characters"] == "0..88559 of 98399"


@needs_corpus
def test_fortunes_missing_or_corrupt_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"apt-get install fortunes-min`, or --data-dir") as err:
        load_dataset("fortunes", "train", data_dir=tmp_path)
    assert "\n" not in str(err.value)
    for name, _ in FORTUNES.files:
        shutil.copy(FORTUNE_FILES / name, tmp_path / name)
    assert load_dataset("fortunes", "test", data_dir=tmp_path).x.shape == (153, 64)
    with open(tmp_path / "riddles", "ab") as fh:
        fh.write(b"!")
    with pytest.raises(DataError, match=r"riddles: checksum mismatch.*fortunes-min"):
        load_dataset("fortunes", "test", data_dir=tmp_path)


def test_dataset_names_include_the_corpus() -> None:
    with pytest.raises(ConfigError, match="known datasets: fashion-mnist, mnist, fortunes"):
        get_dataset("fortune")
    with pytest.raises(ConfigError, match="'fortunes' is a text corpus"):  # `polytrain data`
        get_dataset("fortunes")


def _token_model() -> ModelSpec:
    net = seq(("embed", Embedding(6, 4)), ("head", Linear(4, 6)))
    return ModelSpec("tokens", net, input_shape=(5,), num_classes=6)


@pytest.mark.slow
def test_user_sequence_npz_trains_with_perplexity(backend_name: str, tmp_path: Path) -> None:
    """--data file.npz with int ids x [N, T] and next-id targets y [N, T] (uint8 ids are
    ids, not pixels); the run reports the test perplexity, exp of the mean token loss."""
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 6, (12, 6)).astype(np.uint8)
    npz = tmp_path / "seq.npz"
    np.savez(npz, x_train=ids[:8, :5], y_train=ids[:8, 1:], x_test=ids[8:, :5], y_test=ids[8:, 1:])
    model = "tests.training.test_char_lm:_token_model"
    recipe = preset_recipe(
        "char-lm-fortunes",
        {"model": model, "data": str(npz), "schedule": "constant", "batch_size": 8},
    )
    trainer = Trainer(recipe, backend_name, progress=False)
    assert trainer.data.train.x.dtype == np.int64 and trainer.data.train.x.max() >= 1
    test = trainer.data.test
    assert test is not None
    record = trainer.fit().final
    assert record is not None and record.test_perplexity is not None
    assert record.tokens_per_second is not None and record.train_perplexity is not None
    logits = trainer.runner.predict(test.x).astype(np.float64)
    shifted = logits - logits.max(axis=-1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    y = test.y
    token_loss = -np.take_along_axis(logp, y[..., None], axis=-1).mean()
    assert record.test_perplexity == pytest.approx(math.exp(token_loss), rel=1e-5)
    hits = (logits.argmax(axis=-1) == y).mean()
    assert record.test_metric == pytest.approx(hits, rel=1e-6)


def test_token_inputs_are_checked_in_one_line(tmp_path: Path) -> None:
    npz = tmp_path / "bad.npz"
    np.savez(npz, x_train=np.full((4, 5), 6), y_train=np.zeros((4, 5), np.int64))
    recipe = preset_recipe("char-lm-fortunes", {"model": "tests.training.test_char_lm:_token_model",
                                                "data": str(npz)})  # fmt: skip
    with pytest.raises(DataError, match=r"input ids range over 6\.\.6, but the model's Embedding"):
        Trainer(recipe, "numpy", progress=False)
    np.savez(npz, x_train=np.zeros((4, 5), np.float32), y_train=np.zeros((4, 5), np.int64))
    with pytest.raises(DataError, match=r"inputs must be integer ids, got float32"):
        Trainer(recipe, "numpy", progress=False)


@pytest.mark.slow
@needs_corpus
def test_char_lm_preset_fp64_runs_agree_across_frameworks(tmp_path: Path) -> None:
    """The preset's model and data on every backend from the same start: per-step losses
    and the test perplexity within 1e-10 (docs/recipes.md's parity figures, tiny)."""
    runs: dict[str, list[float]] = {}
    perplexities: dict[str, float] = {}
    for name in BACKENDS:
        losses = StepLosses()
        out = tmp_path / name if name == BACKENDS[0] else None
        recipe = preset_recipe("char-lm-fortunes", TINY)
        summary = Trainer(recipe, name, out_dir=out, plugins=[losses], progress=False).fit()
        runs[name] = losses.values
        assert summary.final is not None and summary.final.test_perplexity is not None
        perplexities[name] = summary.final.test_perplexity
    reference = runs[BACKENDS[0]]
    assert len(reference) == 3 and 4.0 < reference[0] < 5.0  # ~log(88) at the start
    for name, values in runs.items():
        np.testing.assert_allclose(values, reference, rtol=0, atol=1e-10, err_msg=name)
        assert perplexities[name] == pytest.approx(perplexities[BACKENDS[0]], rel=1e-10)
    # the run's records and checkpoint carry the vocabulary that maps ids to characters
    lines = (tmp_path / BACKENDS[0] / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    start = next(r for r in records if r.get("event") == "start")
    assert len(start["data"]["train"]["vocabulary"]) == 88
    epoch = next(r for r in records if r.get("event") == "epoch")
    assert epoch["test_perplexity"] == pytest.approx(perplexities[BACKENDS[0]])
    manifest = read_manifest(find_checkpoint(tmp_path / BACKENDS[0]))
    assert manifest["extra"]["data"]["test"]["vocabulary"] == start["data"]["train"]["vocabulary"]
