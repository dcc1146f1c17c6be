"""polytrain owns SIGTERM and SIGINT: no framework's C++ handler runs in a polytrain
process, a SIGTERM at any moment of ``polytrain train`` ends it with polytrain's one line
and exit 143, and waits on code outside polytrain are bounded or said.

The stress test sends one SIGTERM per real ``python -m polytrain train`` process, at a
uniformly random moment of its life (start-up, framework import, model build, steps,
checkpoint saves, evaluation, exit), per backend: ``POLYTRAIN_SIGNAL_TRIES`` processes
(6 by default, 50 in ``scripts/fuzz``), ``POLYTRAIN_SIGNAL_PARALLEL`` at a time,
``POLYTRAIN_SIGNAL_SEED`` to replay the delays. docs/reliability.md has the counts.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from marks import known_jaxlib_abort

from polytrain.cli.main import main
from polytrain.io.checkpoint import CheckpointManager, load_checkpoint
from polytrain.io.run_dir import LOCK_FILE
from polytrain.testing import backends_under_test
from polytrain.utils import user_import
from polytrain.utils.signals import stop_signals_deferred

TRIES = int(os.environ.get("POLYTRAIN_SIGNAL_TRIES", "6"))
PARALLEL = int(os.environ.get("POLYTRAIN_SIGNAL_PARALLEL", "2"))
SEED = int(os.environ.get("POLYTRAIN_SIGNAL_SEED") or random.randrange(2**32))
EPOCHS = 2
RUN = ["--train-samples", "128", "--test-samples", "64", "--batch-size", "32", "--epochs",
       str(EPOCHS), "--checkpoint-every", "2", "--quiet", "--json"]  # fmt: skip
# what a framework's own handler prints (Paddle: glog's failure handler and its summary;
# MXNet: its segfault logger) and what an exception escaping polytrain would print
DUMP_MARKERS = (
    "SignalInfo",
    "*** SIGTERM",
    "Stack trace",
    "Error Message Summary",
    "C++ Traceback",
    "Segmentation fault",
    "Traceback (most recent call last)",
)
HANG_SECONDS = 90.0  # after the signal; a step, a save and an exit take a few seconds
SIGTERM_EXIT = 128 + signal.SIGTERM
FRAMEWORK_LIBRARIES = {"torch": "libtorch", "paddle": "libpaddle", "mxnet": "libmxnet"}


@dataclass
class Outcome:
    """One process: when it was signalled and how it ended."""

    delay: float
    sent: bool  # still running when the delay was over
    handled: bool  # SIGTERM had a handler in the process at that moment
    framework_loaded: bool  # the framework's library was mapped at that moment
    started: bool  # the Trainer had claimed --out (its lock file existed) at that moment
    returncode: int | None  # None: it hung
    stdout: str
    stderr: str
    out: Path


def train_command(backend: str, out: Path) -> list[str]:
    return [sys.executable, "-m", "polytrain", "train", "--backend", backend, *RUN,
            "--out", str(out)]  # fmt: skip


def _status_mask(pid: int, field: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1], 16)
    except OSError:
        pass
    return 0


def _maps(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return ""


def signal_once(backend: str, out: Path, delay: float) -> Outcome:
    """Start one run, SIGTERM it after ``delay`` seconds (unless it ended), wait for it."""
    proc = subprocess.Popen(train_command(backend, out), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    sent = handled = loaded = started = False
    try:
        proc.wait(timeout=delay)
    except subprocess.TimeoutExpired:
        handled = bool(_status_mask(proc.pid, "SigCgt") >> (signal.SIGTERM - 1) & 1)
        library = FRAMEWORK_LIBRARIES.get(backend)
        loaded = library is not None and library in _maps(proc.pid)
        started = (out / LOCK_FILE).exists()
        proc.send_signal(signal.SIGTERM)
        sent = True
    try:
        stdout, stderr = proc.communicate(timeout=HANG_SECONDS)
        code: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        proc.kill()
        stdout, stderr = proc.communicate()
        code = None
    return Outcome(delay, sent, handled, loaded, started, code, stdout, stderr, out)


def _finished(outcome: Outcome) -> bool:
    """The run printed its complete summary (it finished before the signal counted)."""
    try:
        summary = json.loads(outcome.stdout)
    except ValueError:
        return False
    return summary.get("stop_reason") == "completed" and len(summary["epochs"]) == EPOCHS


def _checkpoint_problem(outcome: Outcome, complete: bool) -> str | None:
    latest = CheckpointManager(outcome.out).latest() if outcome.out.exists() else None
    if latest is None:
        return "finished without a checkpoint" if complete else None
    try:
        checkpoint = load_checkpoint(latest)
    except Exception as exc:  # any failure to load is the finding
        return f"checkpoint {latest.name} does not load: {type(exc).__name__}: {exc}"
    if complete and int(checkpoint.position["epoch"]) != EPOCHS:
        return f"finished, but the last checkpoint is at epoch {checkpoint.position['epoch']}"
    return None


def judge(outcome: Outcome, backend: str) -> tuple[str, list[str]]:
    """The outcome's label (for the counts) and what is wrong with it (nothing, ideally)."""
    printed = outcome.stdout + outcome.stderr  # Paddle's dump goes to stdout
    problems = [f"dump ({m!r})" for m in DUMP_MARKERS if m in printed][:1]
    code = outcome.returncode
    if code is None:
        return "hang", ["hang", *problems]
    label = f"exit {code}"
    complete = _finished(outcome)
    if known_jaxlib_abort(backend, code, outcome.stderr):
        label = "jaxlib 0.4.30's known abort (docs/distributed.md)"
    elif code == SIGTERM_EXIT:
        lines = [
            line for line in outcome.stderr.splitlines() if line.startswith("polytrain train:")
        ]
        if len(lines) != 1 or "interrupted by SIGTERM" not in lines[0]:
            problems.append("exit 143 without polytrain's one line")
    elif code == 0:
        if not complete:
            problems.append("exit 0 but the run is not complete")
    elif code == -signal.SIGTERM and outcome.stderr.strip() == "" and complete:
        label = "exit -15 after the run finished (interpreter exit)"
    elif code == -signal.SIGTERM and not (
        outcome.handled or outcome.framework_loaded or outcome.started
    ):
        label = "exit -15 before polytrain's handler (interpreter start-up)"
        if outcome.stderr.strip():
            problems.append("killed before polytrain's handler, yet something printed")
    else:
        where = "with a handler" if outcome.handled else "without a handler"
        where += ", --out claimed" if outcome.started else ""
        problems.append(
            f"exit {code} ({where}, framework {'' if outcome.framework_loaded else 'not '}loaded)"
        )
    problem = _checkpoint_problem(outcome, complete or code == 0)
    return label, [*problems, *([problem] if problem else [])]


def _log(backend: str, outcome: Outcome, label: str, problems: list[str]) -> None:
    """One JSON line per process in $POLYTRAIN_SIGNAL_LOG, when set (for the counts)."""
    path = os.environ.get("POLYTRAIN_SIGNAL_LOG")
    if path:
        record = {"backend": backend, "delay": round(outcome.delay, 3), "label": label,
                  "problems": problems, "handled": outcome.handled,
                  "framework_loaded": outcome.framework_loaded, "started": outcome.started,
                  "stderr_tail": outcome.stderr.strip().splitlines()[-3:],
                  "stdout_head": outcome.stdout.strip().splitlines()[:12]}  # fmt: skip
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record) + "\n")


def process_life(backend: str, tmp_path: Path) -> float:
    """Seconds a complete run takes here with PARALLEL of them at once (each must finish)."""
    start = time.monotonic()
    with ThreadPoolExecutor(PARALLEL) as pool:
        outs = [tmp_path / f"complete{i}" for i in range(PARALLEL)]
        runs = list(pool.map(lambda out: signal_once(backend, out, 600.0), outs))
    for run in runs:
        assert run.returncode == 0 and _finished(run), run.stderr
    return time.monotonic() - start


# -- the handlers a backend leaves -------------------------------------------------------

CAUGHT = """
import json, os, signal, sys
from polytrain.plugins.registry import get_backend

def caught():
    for line in open("/proc/self/status"):
        if line.startswith("SigCgt:"):
            mask = int(line.split()[1], 16)
    return [signal.Signals(n).name for n in range(1, 32) if mask >> (n - 1) & 1]

hits = []
signal.signal(signal.SIGTERM, lambda signum, frame: hits.append(signum))
before = caught()
get_backend(sys.argv[1])
after = caught()
os.kill(os.getpid(), signal.SIGTERM)
print(json.dumps({"before": before, "after": after, "hits": hits}))
"""


@pytest.mark.slow
def test_a_backend_leaves_every_signal_to_python(backend_name: str) -> None:
    """Building a backend installs no C++ handler (Paddle's glog handler took SIGTERM,
    SIGSEGV, SIGFPE, SIGILL, SIGABRT, SIGBUS; MXNet's took SIGSEGV), and a Python
    SIGTERM handler set before still runs after."""
    done = subprocess.run([sys.executable, "-c", CAUGHT, backend_name], capture_output=True,
                          text=True, timeout=300, check=False)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["after"] == found["before"], found
    assert found["hits"] == [signal.SIGTERM], found


def test_a_stop_signal_waits_for_the_end_of_a_deferred_block() -> None:
    """Inside ``stop_signals_deferred`` (a framework's import) a SIGTERM is held; on
    leaving, the handler in place runs, once."""
    hits: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, _: hits.append(signum))
    try:
        with stop_signals_deferred():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
            assert hits == []
        assert hits == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, previous)


# -- SIGTERM at chosen moments of start-up ------------------------------------------------


def _wait_until(proc: subprocess.Popen[str], ready: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 300
    while not ready():
        assert proc.poll() is None, f"the run ended before {what}: {proc.communicate()}"
        assert time.monotonic() < deadline, f"no {what} within 300 s"
        time.sleep(0.005)


def _stopped_by_sigterm(proc: subprocess.Popen[str]) -> str:
    """SIGTERM ``proc``; it must end promptly with 143 and polytrain's one line."""
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=HANG_SECONDS)
    printed = stdout + stderr
    assert not [m for m in DUMP_MARKERS if m in printed], printed
    assert proc.returncode == SIGTERM_EXIT, printed
    lines = [line for line in stderr.splitlines() if line.startswith("polytrain train:")]
    assert len(lines) == 1 and "interrupted by SIGTERM" in lines[0], stderr
    return stderr


@pytest.mark.slow
@pytest.mark.parametrize("backend", [b for b in backends_under_test() if b in FRAMEWORK_LIBRARIES])
def test_sigterm_while_the_framework_loads(backend: str, tmp_path: Path) -> None:
    """The signal lands as soon as the framework's library is mapped, mid-import: held
    until the import is over, then polytrain's line and 143 (no C++ dump, no ImportError)."""
    proc = subprocess.Popen(train_command(backend, tmp_path / "run"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    library = FRAMEWORK_LIBRARIES[backend]
    _wait_until(proc, lambda: library in _maps(proc.pid), f"{library} loaded")
    _stopped_by_sigterm(proc)


SLOW_USER_CODE = """
import pathlib, time
from polytrain import hookimpl
from polytrain.neutral.models import get_model_spec

def factory():
    pathlib.Path(__file__).with_name("entered").write_text("yes")
    time.sleep(float(pathlib.Path(__file__).with_name("sleep").read_text()))
    return get_model_spec("lenet")

class Plugin:
    def __init__(self):
        time.sleep(float(pathlib.Path(__file__).with_name("sleep").read_text()))

    @hookimpl
    def polytrain_train_start(self, run):
        pass
"""


@pytest.fixture
def slow_user_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[float], Path]:
    """A user module ``slowcode`` (a model factory and a plugin class that sleep) in a
    folder on PYTHONPATH and sys.path; call with the seconds to sleep."""
    folder = tmp_path / "user"
    folder.mkdir()
    (folder / "slowcode.py").write_text(SLOW_USER_CODE)
    monkeypatch.syspath_prepend(str(folder))
    paths = [str(folder), *filter(None, [os.environ.get("PYTHONPATH")])]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(paths))

    def sleeping(seconds: float) -> Path:
        (folder / "sleep").write_text(str(seconds))
        return folder

    return sleeping


def test_sigterm_while_a_model_factory_runs(
    slow_user_code: Callable[[float], Path], tmp_path: Path
) -> None:
    """A user's ``--model pkg.module:factory`` that does not return: SIGTERM still ends the
    run at once with polytrain's line and 143 (before, the default action: killed)."""
    folder = slow_user_code(600)
    cmd = [*train_command("numpy", tmp_path / "run"), "--model", "slowcode:factory"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_until(proc, (folder / "entered").exists, "call of the factory")
    _stopped_by_sigterm(proc)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("flag", "ref", "said"),
    [
        ("--model", "slowcode:factory", "slowcode.factory() (--model 'slowcode:factory')"),
        ("--plugin", "slowcode:Plugin", "slowcode.Plugin() (--plugin 'slowcode:Plugin')"),
    ],
)
def test_a_wait_on_the_users_code_is_said(
    slow_user_code: Callable[[float], Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    flag: str,
    ref: str,
    said: str,
) -> None:
    """The user's callable running past NOTICE_SECONDS gets one line naming it; the run
    then goes on (here: the callable returns after a while)."""
    monkeypatch.setattr(user_import, "NOTICE_SECONDS", 0.2, raising=False)
    slow_user_code(1.0)
    argv = ["train", "--backend", "numpy", *RUN, "--epochs", "1", "--out", str(tmp_path / "run")]
    assert main([*argv, flag, ref]) == 0
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "still waiting on" in line]
    assert lines == [
        f"polytrain: still waiting on {said} after 0.2 s: that is your code running, not "
        "polytrain (SIGTERM or Ctrl-C stops it)"
    ], err


# -- SIGTERM at random moments ------------------------------------------------------------


@pytest.mark.slow
def test_sigterm_at_random_moments_ends_with_polytrains_line(
    backend_name: str, tmp_path: Path
) -> None:
    """TRIES processes, each SIGTERMed at a uniform random moment of its life: no framework
    dump, no hang, exit 143 with the one line (or 0: it finished first), checkpoints load."""
    life = process_life(backend_name, tmp_path)
    rng = random.Random(f"{SEED}-{backend_name}")
    delays = [rng.uniform(0.0, life) for _ in range(TRIES)]
    with ThreadPoolExecutor(PARALLEL) as pool:
        outcomes = list(
            pool.map(
                lambda i: signal_once(backend_name, tmp_path / f"try{i}", delays[i]), range(TRIES)
            )
        )
    labels: Counter[str] = Counter()
    found: Counter[str] = Counter()
    failures: list[str] = []
    for outcome in outcomes:
        label, problems = judge(outcome, backend_name)
        labels[label] += 1
        found.update(problem.split(" (")[0] for problem in problems)
        _log(backend_name, outcome, label, problems)
        if problems:
            shown = outcome.stderr.strip() or outcome.stdout.strip()
            tail = "\n    ".join(shown.splitlines()[-8:])
            failures.append(f"at {outcome.delay:.2f} s: {', '.join(problems)}\n    {tail}")
    counts = "; ".join(
        ", ".join(f"{k}: {v}" for k, v in sorted(c.items())) or "no problems"
        for c in (labels, found)
    )
    print(f"\n{backend_name}: {TRIES} SIGTERMs over {life:.1f} s (seed {SEED}): {counts}")
    assert not failures, f"{backend_name} (seed {SEED}; {counts}):\n" + "\n".join(failures)
