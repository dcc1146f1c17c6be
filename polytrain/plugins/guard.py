"""A user plugin that raises ends the run with one line: which plugin, which hook, the
error, and what the run kept (the trainer says that part). Its traceback is printed only
with ``--debug`` (the CLI prints the error's cause). Built-in plugins (registered under a
``polytrain.`` name, or defined in a ``polytrain`` module) raise as they are."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import pluggy

from polytrain.errors import PluginError
from polytrain.utils.user_code import traceback_hint


def plugin_name(plugin: object) -> str:
    """``module:Class`` of a plugin object, ``module:function`` of a callable, or a
    module's name."""
    if hasattr(plugin, "__qualname__") and hasattr(plugin, "__module__"):
        return f"{plugin.__module__}:{plugin.__qualname__}"
    if isinstance(plugin, type(sys)):
        return plugin.__name__
    kind = type(plugin)
    return f"{kind.__module__}:{kind.__qualname__}"


def _is_builtin(impl: Any) -> bool:
    name = plugin_name(impl.plugin)
    return str(impl.plugin_name).startswith("polytrain.") or name.startswith("polytrain.")


def culprit(hook: Any, exc: BaseException) -> Any | None:
    """The hook implementation whose code raised ``exc`` (the first of its traceback's
    frames that runs one), or None."""
    codes = {id(getattr(impl.function, "__code__", None)): impl for impl in hook.get_hookimpls()}
    tb = exc.__traceback__
    while tb is not None:
        if (impl := codes.get(id(tb.tb_frame.f_code))) is not None:
            return impl
        tb = tb.tb_next
    return None


class GuardedHooks:
    """``pm.hook`` whose calls turn a user plugin's exception into a :class:`PluginError`
    of one line: the plugin, the error, the hook and ``where()`` the run was (e.g. "at
    global step 3"), then ``kept()``: the checkpoint the run kept and how to resume it."""

    def __init__(
        self, pm: pluggy.PluginManager, where: Callable[[], str], kept: Callable[[], str]
    ) -> None:
        self._pm = pm
        self._where = where
        self._kept = kept

    def __getattr__(self, name: str) -> Callable[..., Any]:
        hook = getattr(self._pm.hook, name)

        def call(**kwargs: Any) -> Any:
            try:
                return hook(**kwargs)
            except Exception as exc:
                impl = culprit(hook, exc)
                if impl is None or _is_builtin(impl):
                    raise
                raise self._error(name, impl, exc) from exc

        setattr(self, name, call)  # made once: later calls skip __getattr__
        return call

    def _error(self, hook_name: str, impl: Any, exc: Exception) -> PluginError:
        why = f"{type(exc).__name__}: {exc}".replace("\n", " ")
        shown = "; --debug shows its traceback" if traceback_hint() else ""
        return PluginError(
            f"plugin {plugin_name(impl.plugin)} raised {why} (in {hook_name} "
            f"{self._where()}{shown}). {self._kept()}"
        )
