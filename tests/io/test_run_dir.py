"""A run owns its output folder: one run per folder, no silent reuse, writable folders
checked before any work, a full disk named with the last good checkpoint, the umask kept."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from polytrain.cli.main import main
from polytrain.io.checkpoint import load_checkpoint
from polytrain.io.run_dir import LOCK_FILE, claim_run_dir
from polytrain.utils.fileio import atomic_write_text

TINY = ["--backend", "numpy", "--train-samples", "64", "--test-samples", "32",
        "--batch-size", "32", "--epochs", "1", "--quiet"]  # fmt: skip


def train(out: Path, *extra: str) -> int:
    return main(["train", *TINY, "--out", str(out), *extra])


def starts(out: Path) -> int:
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return sum(json.loads(line)["event"] == "start" for line in lines)


@contextlib.contextmanager
def mounted_tmpfs(where: Path, options: str) -> Iterator[Path]:
    """A tmpfs at ``where`` (root with mount rights only: skip elsewhere)."""
    where.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)],
                          capture_output=True, check=False)  # fmt: skip
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


@pytest.mark.slow
def test_a_held_folder_is_refused_naming_its_owner_and_a_dead_owner_releases_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from polytrain.io.run_dir import "
         f"claim_run_dir; held = claim_run_dir({str(out)!r}); print('held', flush=True); "
         "time.sleep(60)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        assert train(out) == 2
        err = capsys.readouterr().err.strip()
        assert f"is in use by another run: pid {holder.pid}" in err
        assert len(err.splitlines()) == 1
        assert not (out / "metrics.jsonl").exists()  # refused before any work
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        if holder.stdout is not None:
            holder.stdout.close()
    assert (out / LOCK_FILE).exists()  # a stale lock: its owner died without releasing it
    assert train(out) == 0


@pytest.mark.slow
def test_reusing_a_folder_needs_resume_or_overwrite(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    assert train(out) == 0
    before = sorted(p.name for p in (out / "checkpoints").iterdir())
    capsys.readouterr()
    assert train(out) == 2
    err = capsys.readouterr().err
    assert "holds another run" in err and "--resume" in err and "--overwrite" in err
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == before  # untouched

    assert train(out, "--overwrite") == 0
    assert starts(out) == 1  # the old run's metrics were replaced, not appended to
    assert train(out, "--epochs", "2", "--resume", str(out)) == 0
    assert starts(out) == 2  # the same run goes on


@pytest.mark.slow
def test_resuming_another_run_into_a_used_folder_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    assert train(first) == 0 and train(second) == 0
    capsys.readouterr()
    assert train(second, "--epochs", "2", "--resume", str(first)) == 2
    assert "--resume names another run" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["train", *TINY, "--out", "{file}"], "--out"),
        (["train", *TINY, "--tensorboard", "{file}"], "--tensorboard"),
        (["launch", "--backend", "torch", "--log-dir", "{file}", "--", "true"], "--log-dir"),
    ],
)
def test_an_output_folder_that_is_a_file_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], flag: str
) -> None:
    file = tmp_path / "taken"
    file.write_text("not a folder")
    assert main([a.replace("{file}", str(file)) for a in args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith(f"{flag} {file} is a file, not a folder; name a folder.")
    assert len(err.splitlines()) == 1
    assert file.read_text() == "not a folder"


def test_a_read_only_output_folder_is_refused_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with mounted_tmpfs(tmp_path / "ro", "ro,size=1m") as ro:
        assert train(ro / "run") == 2
        err = capsys.readouterr().err.strip()
        assert "is not writable" in err and "Read-only file system" in err
        assert len(err.splitlines()) == 1


@pytest.mark.slow
def test_a_full_disk_stops_with_one_line_naming_the_last_good_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with mounted_tmpfs(tmp_path / "small", "size=1400k") as small:
        out = small / "run"  # a LeNet checkpoint with momentum takes ~500 kB (Adam's: 1.5 MB)
        code = train(out, "--epochs", "4", "--checkpoint-every", "1", "--keep-checkpoints", "3",
                     "--optimizer", "momentum", "--lr", "0.05")  # fmt: skip
        err = capsys.readouterr().err.strip()
        assert code == 2, err
        assert len(err.splitlines()) == 1, err
        assert "No space left on device" in err
        named = err.split("the last good checkpoint is ")[1].split(":")[0]
        assert Path(named).parent == out / "checkpoints"
        assert load_checkpoint(named).position["global_step"] >= 1  # complete and loadable


@pytest.mark.slow
@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_written_files_and_folders_follow_the_umask(tmp_path: Path, umask: int) -> None:
    old = os.umask(umask)
    try:
        atomic_write_text(tmp_path / "note.txt", "x")
        assert train(tmp_path / "run") == 0
    finally:
        os.umask(old)
    checkpoint = next((tmp_path / "run" / "checkpoints").glob("step-*"))
    for path, default in [
        (tmp_path / "note.txt", 0o666),
        (tmp_path / "run" / "metrics.jsonl", 0o666),
        (checkpoint / "manifest.json", 0o666),
        (checkpoint, 0o777),
    ]:
        assert stat.S_IMODE(path.stat().st_mode) == default & ~umask, path


@pytest.mark.slow
def test_compare_refuses_a_folder_that_holds_a_training_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    assert train(out) == 0
    capsys.readouterr()
    code = main(["compare", "--backends", "numpy", "--out", str(out), "--parity-steps", "1"])
    assert code == 2
    assert "holds a training run" in capsys.readouterr().err


@pytest.mark.slow
def test_the_lock_is_released_when_the_run_ends(tmp_path: Path) -> None:
    assert train(tmp_path / "run") == 0
    claim_run_dir(tmp_path / "run", resume=tmp_path / "run").release()  # free again


def _refused(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """The one line of a refused ``train`` (``args``: its flags, --out first)."""
    capsys.readouterr()
    assert train(Path(args[0]), *args[1:]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


@pytest.mark.slow
def test_a_run_killed_in_its_first_save_is_not_a_trap(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    assert train(out) == 0
    # what SIGKILL during the first save leaves (polytrain.io.checkpoint): the files in a
    # hidden temporary folder, the manifest not yet written, no `latest`
    checkpoints = out / "checkpoints"
    partial = checkpoints / ".step-00000002.tmp-k1ll3d"
    (checkpoints / "step-00000002").rename(partial)
    (partial / "manifest.json").unlink()
    (checkpoints / "latest").unlink()
    err = _refused(capsys, str(out))
    assert "holds another run" in err and "with no checkpoint to resume" in err, err
    assert "the save was interrupted" in err and "--overwrite" in err and "--resume" not in err
    err = _refused(capsys, str(out), "--resume", str(out))
    assert "no checkpoint to resume" in err and "--overwrite instead of --resume" in err, err
    assert train(out, "--overwrite") == 0


@pytest.mark.slow
def test_a_run_whose_checkpoints_were_set_aside_says_how_to_go_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"  # the loss of step 2 exceeds 1.01 times its start: a stop
    strict = ["--optimizer", "sgd", "--lr", "1", "--checkpoint-every", "1",
              "--max-loss-growth", "1.01"]  # fmt: skip
    assert train(out, *strict) == 2
    aside = out / "checkpoints" / "diverged" / "step-00000001"
    assert aside.is_dir() and not (out / "checkpoints" / "latest").exists()
    for args in ([], ["--resume", str(out)]):
        err = _refused(capsys, str(out), *strict, *args)
        assert f"--resume {aside}" in err and "--overwrite" in err, err
    capsys.readouterr()
    assert train(out, "--resume", str(aside), "--max-loss-growth", "inf") == 0  # as named
    assert f"polytrain: warning: resuming from {aside}" in capsys.readouterr().err
    assert load_checkpoint(out).position["global_step"] == 2


@pytest.mark.slow
def test_a_run_whose_only_checkpoint_is_nan_is_told_to_start_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"  # one step whose update makes every weight NaN/Inf
    assert train(out, "--train-samples", "32", "--lr", "1e308") == 2
    assert (out / "checkpoints" / "diverged" / "step-00000001").is_dir()
    for args in ([], ["--resume", str(out)]):
        err = _refused(capsys, str(out), *args)
        assert "with NaN/Inf weights" in err and "--overwrite" in err, err
        assert "--resume /" not in err  # nothing to resume from
    assert train(out, "--train-samples", "32", "--overwrite") == 0


@pytest.mark.slow
def test_overwrite_never_deletes_an_input_of_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--data kept inside the checkpoints of the --out it overwrites: refused, kept."""
    import numpy as np

    out = tmp_path / "run"
    assert train(out) == 0
    data = out / "checkpoints" / "data.npz"
    np.savez(data, x_train=np.zeros((64, 1, 28, 28), np.float32), y_train=np.arange(64) % 10)
    capsys.readouterr()
    assert train(out, "--overwrite", "--data", str(data)) == 2
    err = capsys.readouterr().err
    assert "--overwrite would delete" in err and "input given to --data" in err, err
    assert data.exists() and (out / "metrics.jsonl").exists()
