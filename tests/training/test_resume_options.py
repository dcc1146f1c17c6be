"""``train --resume RUN`` runs as the run did: the backend, checkpoint cadence and
trackers come from ``run-options.toml`` in its folder; the command line still wins,
plugins (code) are named, never loaded from the file, and a bad file is one line."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from polytrain import hookimpl
from polytrain.cli.main import main
from polytrain.plugins.records import RunInfo

RUN = ["--train-samples", "128", "--test-samples", "32", "--batch-size", "16", "--epochs",
       "1", "--quiet"]  # fmt: skip


class Built:
    """A plugin that counts the runs that loaded it."""

    count = 0

    def __init__(self) -> None:
        Built.count += 1

    @hookimpl
    def polytrain_train_start(self, run: RunInfo) -> None:
        pass


def checkpoints(run: Path) -> list[str]:
    return sorted(p.name for p in (run / "checkpoints").iterdir() if p.name.startswith("step-"))


def csv_steps(run: Path) -> list[int]:
    with open(run / "steps.csv", newline="") as fh:
        return [int(row["global_step"]) for row in csv.DictReader(fh)]


def train(*argv: str) -> int:
    return main(["train", *argv])


def test_a_resume_saves_and_logs_as_the_run_did(tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert train("--backend", "numpy", *RUN, "--checkpoint-every", "2",
                 "--keep-checkpoints", "3", "--log", "csv", "--out", str(run)) == 0  # fmt: skip
    assert checkpoints(run) == ["step-00000004", "step-00000006", "step-00000008"]
    assert train("--resume", str(run), "--epochs", "2", "--quiet") == 0  # no --backend either
    assert checkpoints(run) == ["step-00000012", "step-00000014", "step-00000016"]
    assert csv_steps(run) == list(range(1, 17))


def test_the_command_line_wins_over_the_run(tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert train("--backend", "numpy", *RUN, "--checkpoint-every", "2", "--out", str(run)) == 0
    assert train("--resume", str(run), "--epochs", "2", "--quiet",
                 "--checkpoint-every", "5", "--keep-checkpoints", "9") == 0  # fmt: skip
    assert checkpoints(run) == [f"step-{n:08d}" for n in (6, 8, 10, 15, 16)]
    assert "checkpoint_every = 5" in (run / "run-options.toml").read_text()


def test_a_resume_names_the_runs_plugins_and_board_and_does_not_take_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    plugin = "test_resume_options:Built"
    board = tmp_path / "board"
    assert train("--backend", "numpy", *RUN, "--plugin", plugin, "--tensorboard", str(board),
                 "--out", str(run)) == 0  # fmt: skip
    built, events = Built.count, sorted(board.iterdir())
    assert train("--resume", str(run), "--epochs", "2", "--quiet") == 0
    assert Built.count == built and sorted(board.iterdir()) == events
    err = capsys.readouterr().err
    assert f"the resumed run had --plugin {plugin}; plugins are code: give it again" in err
    assert f"had --tensorboard {board}; a folder to write outside the run is not" in err


@pytest.mark.parametrize(
    "line, says",
    [
        ("checkpoint_every = -2", "run-options.toml, line 2: checkpoint_every: "),
        ('model = "pkg.evil:make"', "line 2: model: not an option a resume carries"),
        ("log = [1]", "line 2: log: expected a string, got 1."),
        ("keep_best = ", "not valid TOML"),
    ],
)
def test_a_bad_run_options_file_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], line: str, says: str
) -> None:
    run = tmp_path / "run"
    assert train("--backend", "numpy", *RUN, "--out", str(run)) == 0
    capsys.readouterr()
    (run / "run-options.toml").write_text(f"# edited\n{line}\n")
    assert train("--resume", str(run), "--epochs", "2", "--quiet") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("polytrain train: error: ") and says in err[0]
