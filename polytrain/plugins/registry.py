"""Plugin manager, entry-point discovery and backend lookup.

Backends are pluggy plugins found through the ``polytrain`` entry-point group; the
built-in torch, paddle and mxnet backends are registered exactly like a third-party
one. Nothing is loaded at import time: :func:`make_plugin_manager` builds a manager
on demand, and a backend's framework is imported only when that backend is built.

Environment:

* ``POLYTRAIN_DISABLE_PLUGIN_AUTOLOAD=1`` skips entry-point discovery;
* ``POLYTRAIN_PLUGINS=mod1,mod2`` imports and registers those modules explicitly;
* ``POLYTRAIN_BACKEND=name`` picks the backend when none is named.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import importlib.util
import os
from functools import cache
from typing import TYPE_CHECKING, Any

import pluggy

from polytrain.backend.model_walker import ModelWalker
from polytrain.backend.native_format import NativeFormat
from polytrain.distributed.cluster import ClusterEnvironment
from polytrain.distributed.launcher import Launcher
from polytrain.errors import BackendError
from polytrain.plugins import hookspecs
from polytrain.plugins.info import BackendInfo

if TYPE_CHECKING:
    from polytrain.backend.base import Backend

ENTRY_POINT_GROUP = "polytrain"
_TRUE = {"1", "true", "yes", "on"}


class PluginManager(pluggy.PluginManager):
    """pluggy's manager, but one broken plugin does not break the others: its import
    error is kept in :attr:`broken` and shown by ``polytrain backends``."""

    def __init__(self, project_name: str) -> None:
        super().__init__(project_name)
        self.broken: dict[str, str] = {}

    def load_entry_points(self, group: str) -> None:
        for ep in importlib.metadata.entry_points(group=group):
            if self.get_plugin(ep.name) is not None or self.is_blocked(ep.name):
                continue
            try:
                plugin = ep.load()
            except Exception as exc:  # a plugin's own bug must not hide the others
                self.broken[ep.name] = f"{type(exc).__name__}: {exc}"
                continue
            self.register(plugin, name=ep.name)


def make_plugin_manager(*, autoload: bool | None = None) -> PluginManager:
    """A new plugin manager with the hookspecs and the discovered plugins registered."""
    pm = PluginManager("polytrain")
    pm.add_hookspecs(hookspecs)
    if autoload is None:
        autoload = os.environ.get("POLYTRAIN_DISABLE_PLUGIN_AUTOLOAD", "").lower() not in _TRUE
    if autoload:
        pm.load_entry_points(ENTRY_POINT_GROUP)
    for module_name in filter(None, os.environ.get("POLYTRAIN_PLUGINS", "").split(",")):
        module_name = module_name.strip()
        if pm.get_plugin(module_name) is None:
            try:
                module = importlib.import_module(module_name)
            except ImportError as exc:
                raise BackendError(
                    f"POLYTRAIN_PLUGINS names {module_name!r}, which cannot be imported: {exc}. "
                    "Fix the module name or unset POLYTRAIN_PLUGINS."
                ) from exc
            pm.register(module, name=module_name)
    return pm


@cache
def default_plugin_manager() -> PluginManager:
    """The process-wide plugin manager, built on first use."""
    return make_plugin_manager()


def registered_backends(pm: pluggy.PluginManager | None = None) -> dict[str, BackendInfo]:
    """Every backend the plugins register, by name (sorted)."""
    pm = pm or default_plugin_manager()
    found: dict[str, BackendInfo] = {}
    owners: dict[str, str] = {}

    def register(info: BackendInfo) -> None:
        if not isinstance(info, BackendInfo):
            raise BackendError(
                f"A plugin registered {info!r}; register(...) takes a polytrain.BackendInfo."
            )
        if info.name in found:
            raise BackendError(
                f"Two plugins register a backend named {info.name!r} (frameworks "
                f"{owners[info.name]!r} and {info.framework!r}). Uninstall one of them."
            )
        found[info.name] = info
        owners[info.name] = info.framework

    pm.hook.polytrain_register_backends(register=register)
    return dict(sorted(found.items(), key=lambda kv: (kv[1].order, kv[0])))


def registered_formats(pm: pluggy.PluginManager | None = None) -> dict[str, NativeFormat]:
    """Every native weight format the plugins register, by name, in their ``order``."""
    found: dict[str, NativeFormat] = {}
    for fmt in _collect(pm, "polytrain_register_formats", NativeFormat, "name"):
        found[fmt.name] = fmt
    return dict(sorted(found.items(), key=lambda kv: (kv[1].order, kv[0])))


def registered_launchers(pm: pluggy.PluginManager | None = None) -> dict[str, Launcher]:
    """Every launcher the plugins register, by backend name."""
    return {
        lc.backend: lc for lc in _collect(pm, "polytrain_register_launchers", Launcher, "backend")
    }


def registered_model_walkers(pm: pluggy.PluginManager | None = None) -> dict[str, ModelWalker]:
    """Every model walker the plugins register (``polytrain port``), by framework."""
    return {
        w.framework: w
        for w in _collect(pm, "polytrain_register_model_walkers", ModelWalker, "framework")
    }


def cluster_environments(pm: pluggy.PluginManager | None = None) -> list[ClusterEnvironment]:
    """How a worker reads the variables of each registered launcher, for
    :func:`polytrain.distributed.cluster.resolve`: in the backends' ``order``, each once."""
    launchers = registered_launchers(pm)
    order = {name: i for i, name in enumerate(registered_backends(pm))}
    found: dict[str, ClusterEnvironment] = {}
    for backend in sorted(launchers, key=lambda name: (order.get(name, len(order)), name)):
        environment = launchers[backend].environment
        if environment is not None:
            found.setdefault(environment.name, environment)
    return list(found.values())


def _collect(pm: pluggy.PluginManager | None, hook: str, kind: type[Any], key: str) -> list[Any]:
    """What the plugins ``register(...)`` through ``hook``: instances of ``kind``, one per
    ``key`` value (two plugins declaring the same one is an error)."""
    pm = pm or default_plugin_manager()
    found: list[Any] = []

    def register(item: Any) -> None:
        if not isinstance(item, kind):
            raise BackendError(
                f"A plugin registered {item!r} through {hook}; it takes a {kind.__name__}."
            )
        if any(getattr(other, key) == getattr(item, key) for other in found):
            raise BackendError(
                f"Two plugins register a {kind.__name__} for {getattr(item, key)!r}: "
                "uninstall one of them."
            )
        found.append(item)

    getattr(pm.hook, hook)(register=register)
    return found


def installed_backends(pm: pluggy.PluginManager | None = None) -> list[str]:
    """Names of registered backends whose framework is installed."""
    return [name for name, info in registered_backends(pm).items() if info.available()]


def resolve_backend_name(name: str | None, pm: pluggy.PluginManager | None = None) -> BackendInfo:
    """Explicit name, then ``$POLYTRAIN_BACKEND``, then the only installed backend
    (leaving out those registered with ``auto_select=False`` when another is installed)."""
    backends = registered_backends(pm)
    installed = [n for n, info in backends.items() if info.available()]
    shown = ", ".join(installed) or "none"
    if name is None:
        name = os.environ.get("POLYTRAIN_BACKEND") or None
    if name is None:
        # a backend registered with auto_select=False is picked only when it is the only one
        candidates = [n for n in installed if backends[n].auto_select] or installed
        if len(candidates) == 1:
            return backends[candidates[0]]
        if not installed:
            raise BackendError(
                "No backend is installed. Install one with: pip install 'polytrain[torch]' "
                "(or [paddle], [mxnet], [all])."
            )
        raise BackendError(
            f"Several backends are installed ({shown}); name one: get_backend('{installed[0]}'), "
            "--backend NAME, or POLYTRAIN_BACKEND=NAME."
        )
    broken = getattr(pm or default_plugin_manager(), "broken", {})
    if name not in backends and name in broken:
        raise BackendError(
            f"The plugin providing backend {name!r} failed to load: {broken[name]}. "
            "Reinstall the package that provides it (one of polytrain's own: "
            f"pip install --force-reinstall 'polytrain[{name}]')."
        )
    if name not in backends:
        close = difflib.get_close_matches(name, list(backends), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise BackendError(
            f"Unknown backend {name!r}.{hint} Installed: {shown}. "
            "Install another with: pip install 'polytrain[NAME]' (torch, paddle, mxnet)."
        )
    info = backends[name]
    if not info.available():
        raise BackendError(
            f"Backend {name!r} is registered but its framework {info.framework!r} is not "
            f"installed. Installed: {shown}. Install it with: {info.install_hint}"
        )
    return info


def get_backend(
    name: str | None = None, *, pm: pluggy.PluginManager | None = None, **options: Any
) -> Backend:
    """Build a backend object: ``get_backend("torch", threads=2)``.

    Resolution: the explicit ``name``, then ``$POLYTRAIN_BACKEND``, then the only
    installed backend. Options go to the backend's constructor (see
    :class:`polytrain.backend.base.BackendOptions`).
    """
    from polytrain.backend.base import Backend, BackendOptions

    info = resolve_backend_name(name, pm)
    opts = options.pop("options", None) or BackendOptions(**options)
    try:
        backend = info.factory(opts)
    except ImportError as exc:
        raise BackendError(
            f"Backend {info.name!r}: importing {info.framework!r} failed: {exc}. "
            f"Reinstall it with: {info.install_hint}"
        ) from exc
    if not isinstance(backend, Backend):
        raise BackendError(
            f"Backend {info.name!r}: its factory returned {type(backend).__name__}, "
            "not a polytrain.Backend."
        )
    return backend
