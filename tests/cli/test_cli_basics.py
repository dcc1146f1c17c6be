"""What a new user meets first: --version, --help with defaults, a closed pipe."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from polytrain import __version__
from polytrain.cli.main import main


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"polytrain {__version__}"


def test_help_shows_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    assert "--batch-size BATCH_SIZE global batch size (default: 256)" in text
    assert "(default: None)" not in text and "(default: False)" not in text


def test_closed_pipe_is_not_an_error() -> None:
    """``polytrain backends --json | head -0``: the reader is gone before the first write."""
    cmd = [sys.executable, "-m", "polytrain", "backends", "--json"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    with proc.stderr:
        err = proc.stderr.read().decode()
    assert proc.wait() == 128 + signal.SIGPIPE
    assert err == ""


def test_the_torch_install_advice_names_the_cpu_wheels() -> None:
    """A bare `pip install 'polytrain[torch]'` downloads the multi-GB CUDA build: the hint
    `polytrain backends` prints for a missing torch gives PyTorch's CPU index first."""
    from polytrain.plugins.registry import registered_backends

    hint = registered_backends()["torch"].install_hint
    assert hint.startswith("pip install torch --index-url https://download.pytorch.org/whl/cpu")
    assert "'polytrain[torch]'" in hint
