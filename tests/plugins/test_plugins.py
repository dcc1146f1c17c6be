"""Plugin layer: discovery, resolution errors, a plugin registered inside a test,
training-event hooks, and the core importing no framework."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import polytrain
from polytrain import BackendError, BackendInfo, hookimpl
from polytrain.plugins.hookspecs import polytrain_register_backends
from polytrain.plugins.registry import (
    get_backend,
    make_plugin_manager,
    registered_backends,
    resolve_backend_name,
)

FRAMEWORKS = ("torch", "paddle", "mxnet", "jax")


def run_python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        check=False,
    )


@pytest.mark.slow
def test_core_imports_no_framework() -> None:
    code = (
        "import importlib, pkgutil, sys, polytrain; "
        "[importlib.import_module(m.name) for m in "
        "pkgutil.walk_packages(polytrain.__path__, 'polytrain.') "
        "if not m.name.endswith('__main__')]; "
        "polytrain.installed_backends(); polytrain.registered_backends(); "
        f"print([m for m in {FRAMEWORKS!r} if m in sys.modules])"
    )
    out = run_python(code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_builtin_backends_register_through_entry_points() -> None:
    names = set(registered_backends(make_plugin_manager()))
    assert {"torch", "paddle", "mxnet"} <= names


def test_disable_autoload_leaves_no_backends(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POLYTRAIN_DISABLE_PLUGIN_AUTOLOAD", "1")
    pm = make_plugin_manager()
    assert registered_backends(pm) == {}
    with pytest.raises(BackendError, match="No backend is installed"):
        resolve_backend_name(None, pm)


def test_explicit_plugin_list_loads_only_those(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POLYTRAIN_DISABLE_PLUGIN_AUTOLOAD", "1")
    monkeypatch.setenv("POLYTRAIN_PLUGINS", "polytrain_torch")
    assert list(registered_backends(make_plugin_manager())) == ["torch"]
    monkeypatch.setenv("POLYTRAIN_PLUGINS", "no_such_plugin_module")
    with pytest.raises(BackendError, match="no_such_plugin_module"):
        make_plugin_manager()


class FakeFramework:
    """A plugin registered inside the test: its 'framework' is the json module."""

    def __init__(self, name: str = "fake", framework: str = "json", **info: str | None) -> None:
        self.name, self.framework = name, framework
        self.info = {"extra": "fake", **info}

    @hookimpl
    def polytrain_register_backends(self, register):  # type: ignore[no-untyped-def]
        from polytrain_torch._backend import TorchBackend

        def factory(options):  # type: ignore[no-untyped-def]
            return TorchBackend(options)

        register(BackendInfo(self.name, self.framework, "pytest", factory, **self.info))


def test_plugin_registered_in_test_is_resolved() -> None:
    pm = make_plugin_manager(autoload=False)
    pm.register(FakeFramework())
    assert resolve_backend_name(None, pm).name == "fake"  # the only installed one
    backend = get_backend("fake", pm=pm)
    assert backend.name == "torch"


def test_missing_framework_error_names_install_command() -> None:
    pm = make_plugin_manager(autoload=False)
    pm.register(FakeFramework("ghost", "no_such_framework_xyz"))
    with pytest.raises(BackendError) as err:
        get_backend("ghost", pm=pm)
    assert "pip install 'polytrain[fake]'" in str(err.value)
    assert "not installed" in str(err.value)


@pytest.mark.parametrize(
    ("info", "hint"),
    [
        ({"extra": None}, "pip install 'pytest'"),  # no polytrain[ghost] extra exists
        ({"extra": None, "install": "pip install ghost-plugin[gpu]"}, "ghost-plugin[gpu]"),
    ],
)
def test_install_hint_comes_from_the_plugin(info: dict[str, str | None], hint: str) -> None:
    pm = make_plugin_manager(autoload=False)
    pm.register(FakeFramework("ghost", "no_such_framework_xyz", **info))
    with pytest.raises(BackendError) as err:
        get_backend("ghost", pm=pm)
    assert hint in str(err.value) and "polytrain[" not in str(err.value)


def test_backends_json_says_how_to_install_a_missing_framework(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import polytrain.plugins.registry as registry
    from polytrain.cli.main import main

    pm = make_plugin_manager(autoload=False)
    pm.register(FakeFramework("ghost", "no_such_framework_xyz", extra=None))
    monkeypatch.setattr(registry, "default_plugin_manager", lambda: pm)
    assert main(["backends", "--json"]) == 0
    (entry,) = json.loads(capsys.readouterr().out)
    assert entry["installed"] is False and entry["install"] == "pip install 'pytest'"


def test_duplicate_backend_names_are_an_error() -> None:
    pm = make_plugin_manager(autoload=False)
    pm.register(FakeFramework())
    pm.register(FakeFramework(), name="second")
    with pytest.raises(BackendError, match="Two plugins register a backend named 'fake'"):
        registered_backends(pm)


def test_unknown_backend_message_lists_installed_and_fix() -> None:
    out = run_python("import polytrain; polytrain.get_backend('nope')")
    assert out.returncode != 0
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("polytrain.errors.BackendError: Unknown backend 'nope'.")
    installed = ", ".join(polytrain.installed_backends())
    assert f"Installed: {installed}." in last
    assert "pip install 'polytrain[" in last


def test_close_name_is_suggested() -> None:
    with pytest.raises(BackendError, match="Did you mean 'mxnet'"):
        resolve_backend_name("mxnt")


def test_environment_variable_picks_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POLYTRAIN_BACKEND", "torch")
    assert resolve_backend_name(None).name == "torch"
    monkeypatch.delenv("POLYTRAIN_BACKEND")
    if len(polytrain.installed_backends()) > 1:
        with pytest.raises(BackendError, match="Several backends are installed"):
            resolve_backend_name(None)


def test_broken_plugin_does_not_hide_others(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    dist = tmp_path / "broken_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[polytrain]\nbroken = broken_plugin_module_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    pm = make_plugin_manager()
    assert "broken" in pm.broken
    assert "torch" in registered_backends(pm)
    with pytest.raises(BackendError, match="failed to load"):
        resolve_backend_name("broken", pm)


def test_every_hookspec_is_documented_and_prefixed() -> None:
    from polytrain.plugins import hookspecs

    specs = [n for n in dir(hookspecs) if n.startswith("polytrain_")]
    assert set(specs) == {
        "polytrain_register_backends",
        "polytrain_register_formats",
        "polytrain_register_launchers",
        "polytrain_register_model_walkers",
        "polytrain_train_start",
        "polytrain_step_end",
        "polytrain_epoch_end",
        "polytrain_train_end",
        "polytrain_checkpoint_saved",
    }
    for name in specs:
        assert (getattr(hookspecs, name).__doc__ or "").strip(), name
    assert polytrain_register_backends.__doc__


def test_cli_backends_does_not_import_frameworks() -> None:
    code = (
        "import sys; from polytrain.cli.main import main; main(['backends', '--json']); "
        f"print(json.dumps([m for m in {FRAMEWORKS!r} if m in sys.modules]))"
    )
    out = run_python("import json; " + code)
    assert out.returncode == 0, out.stderr
    report, imported = out.stdout.rsplit("\n", 2)[0], out.stdout.strip().splitlines()[-1]
    assert json.loads(imported) == []
    assert '"name": "torch"' in report
