"""Launchers are what plugins declare: ``polytrain launch`` and ``polytrain env`` use a
launcher registered by a plugin the core has never heard of, and a backend that runs in
one process says so in one line. No framework process is started here."""

from __future__ import annotations

import importlib.util
import signal
import socket
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
from launch_helpers import POLYTRAIN, REPO, clean_env

from polytrain import BackendInfo, hookimpl
from polytrain.cli.compare import first_in_order
from polytrain.cli.main import main
from polytrain.distributed.launch import launch
from polytrain.distributed.launcher import Launcher, LaunchSpec
from polytrain.distributed.network import free_port
from polytrain.distributed.supervisor import _reap_group
from polytrain.errors import ConfigError
from polytrain.plugins import registry

PLUGIN = '''
"""A third-party plugin: backend "echo" whose launcher runs the command once, as rank 0
of 1, in its own variables ECHO_RANK and ECHO_WORLD."""

import subprocess

from polytrain import BackendInfo, hookimpl
from polytrain.distributed.cluster import ClusterEnvironment
from polytrain.distributed.launcher import Launcher
from polytrain.distributed.supervisor import python_command


class EchoEnvironment(ClusterEnvironment):
    name = "echo"
    variables = ("ECHO_RANK",)
    labels = "ECHO_RANK ECHO_WORLD - - - -"

    def read_info(self, r):
        world = r.integer("ECHO_WORLD", minimum=1)
        rank = r.integer("ECHO_RANK")
        return r.info(rank, world, rank, world, 0, 1, (None, None))


class EchoLauncher(Launcher):
    backend = "echo"
    name = "echo-run"
    environment = EchoEnvironment()

    def launch(self, spec, env, address):
        env = {**env, "ECHO_RANK": "0", "ECHO_WORLD": str(spec.world_size)}
        return subprocess.run(python_command(spec.command), env=env, check=False).returncode


@hookimpl
def polytrain_register_backends(register):
    register(BackendInfo("echo", "json", "polytrain", lambda options: None, order=1))


@hookimpl
def polytrain_register_launchers(register):
    register(EchoLauncher())
'''


def _with_plugin(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "echo_plugin.py").write_text(textwrap.dedent(PLUGIN))
    return {**clean_env(), "PYTHONPATH": str(tmp_path), "POLYTRAIN_PLUGINS": "echo_plugin"}


@pytest.mark.slow
def test_a_plugins_launcher_and_environment_are_used(tmp_path: Path) -> None:
    env = _with_plugin(tmp_path)
    cmd = [*POLYTRAIN, "launch", "--backend", "echo", "--master", f"127.0.0.1:{free_port()}",
           "--", "polytrain", "env"]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    # the worker was started by the plugin's launcher and read its variables
    assert proc.stdout.strip() == "rank 0 of 1 (local 0 of 1), source echo", proc.stdout


def test_a_plugins_launcher_returns_the_workers_exit_code(tmp_path: Path) -> None:
    env = _with_plugin(tmp_path)
    cmd = [*POLYTRAIN, "launch", "--backend", "echo", "--master", f"127.0.0.1:{free_port()}",
           "--", "python", "-c", "raise SystemExit(7)"]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 7, proc.stderr


def test_a_backend_without_a_launcher_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    class NoLauncher:
        @hookimpl
        def polytrain_register_backends(self, register):  # type: ignore[no-untyped-def]
            register(BackendInfo("bare", "json", "polytrain", lambda options: None))

    pm = registry.make_plugin_manager(autoload=False)
    pm.register(NoLauncher())
    monkeypatch.setattr(registry, "default_plugin_manager", lambda: pm)
    assert main(["launch", "--backend", "bare", "--", "true"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("polytrain launch: error: Backend 'bare' registers no launcher")


# -- numpy: one process only -----------------------------------------------------------------


def _numpy_launcher() -> type[Launcher]:
    """The numpy plugin's launcher, also before that plugin is installed (from its file)."""
    try:
        from polytrain_numpy._launcher import NumpyLauncher
    except ImportError:
        path = REPO / "backends" / "polytrain_numpy" / "_launcher.py"
        spec = importlib.util.spec_from_file_location("numpy_launcher_under_test", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        NumpyLauncher = module.NumpyLauncher
    return NumpyLauncher  # type: ignore[no-any-return]


def test_numpy_launcher_refuses_before_anything_starts() -> None:
    launcher = _numpy_launcher()()
    assert launcher.environment is None
    with socket.socket() as busy:  # not "port in use": the reason comes first
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        master = f"127.0.0.1:{busy.getsockname()[1]}"
        with pytest.raises(ConfigError) as caught:
            launch(LaunchSpec("numpy", ["true"], nproc_per_node=2, master=master), launcher)
    message = str(caught.value)
    assert "\n" not in message
    assert "runs in one process" in message and "--devices cpu:N" in message


def test_polytrain_launch_numpy_fails_with_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pm = registry.make_plugin_manager()
    if "numpy" not in registry.registered_backends(pm):  # the numpy plugin is not installed:
        pm.register(_NumpyStandIn(_numpy_launcher()))  # its launcher, with a stand-in backend
    monkeypatch.setattr(registry, "default_plugin_manager", lambda: pm)
    code = main(["launch", "--backend", "numpy", "--nproc-per-node", "2", "--", "true"])
    (line,) = capsys.readouterr().err.splitlines()
    assert code == 2
    assert line.startswith("polytrain launch: error: The numpy backend runs in one process"), line


class _NumpyStandIn:
    def __init__(self, launcher: Callable[[], Launcher]) -> None:
        self.launcher = launcher

    @hookimpl
    def polytrain_register_backends(self, register):  # type: ignore[no-untyped-def]
        register(BackendInfo("numpy", "numpy", "numpy", lambda options: None))

    @hookimpl
    def polytrain_register_launchers(self, register):  # type: ignore[no-untyped-def]
        register(self.launcher())


# -- compare's order ---------------------------------------------------------------------------


def test_compare_reference_is_the_first_backend_in_the_plugins_order() -> None:
    order = list(registry.registered_backends())
    assert order[:3] == ["torch", "paddle", "mxnet"]  # BackendInfo.order 10, 20, 30
    assert first_in_order(["mxnet", "paddle", "torch"], order) == "torch"
    assert first_in_order(["mxnet", "paddle"], order) == "paddle"
    assert first_in_order(["mine", "mxnet"], order) == "mxnet"  # unregistered names last
    assert first_in_order([], order) is None


def test_cluster_environments_follow_the_backends_order() -> None:
    names = [e.name for e in registry.cluster_environments()]
    assert names[:3] == ["torchrun", "paddle", "dmlc"]


def test_the_launchers_import_no_framework() -> None:
    code = (
        "import sys; from polytrain.plugins.registry import registered_launchers, "
        "cluster_environments; registered_launchers(); cluster_environments(); "
        "print(sorted(m for m in ('torch', 'paddle', 'mxnet') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=clean_env(), check=True)  # fmt: skip
    assert out.stdout.strip() == "[]"


# -- the worker wrapper ------------------------------------------------------------------------


@pytest.mark.slow
def test_worker_wrapper_reads_the_rank_from_the_variable_it_is_given(tmp_path: Path) -> None:
    from polytrain.distributed.worker_log import read_statuses

    wrapper = [sys.executable, "-m", "polytrain.distributed.worker_log", "--rank-var", "MY_RANK",
               "--status-dir", str(tmp_path), "--", sys.executable, "-c", "pass"]  # fmt: skip
    env = {**clean_env(), "MY_RANK": "2", "RANK": "5"}
    subprocess.run(wrapper, env=env, check=True, timeout=60)
    (record,) = read_statuses(tmp_path)
    assert record["rank"] == 2
    del env["MY_RANK"]
    proc = subprocess.run(wrapper, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines() == [
        "polytrain worker_log: MY_RANK is not set; the engine's launcher sets it for every "
        "worker: run this through polytrain launch."
    ]


def test_a_stopped_engine_launcher_is_reaped() -> None:
    """Its group stopped, the launcher that died after the last look stayed a zombie:
    doctor's hung-probe test failed on "subprocess ... is still running" under load."""
    leaders = [subprocess.Popen(["sleep", "30"], start_new_session=True) for _ in range(3)]
    for leader in leaders:
        _reap_group(leader)
    assert [leader.returncode for leader in leaders] == [-signal.SIGTERM] * 3
