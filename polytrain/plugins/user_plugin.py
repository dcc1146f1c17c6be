"""``polytrain train --plugin pkg.module:Class``: a user's training-event plugin by name."""

from __future__ import annotations

from typing import Any

from polytrain.errors import ConfigError
from polytrain.plugins import hookspecs
from polytrain.utils.user_code import call_user, traceback_hint
from polytrain.utils.user_import import import_user_module

#: every training-event hook (the hook specifications other than the registrations)
TRAINING_HOOKS = tuple(
    name
    for name in vars(hookspecs)
    if name.startswith("polytrain_") and not name.startswith("polytrain_register_")
)


def load_plugin(ref: str) -> object:
    """The plugin ``ref`` names: ``pkg.module:Name`` where ``Name`` is a class or factory
    (called with no arguments) or a plugin object. The module is imported from
    ``sys.path``, then from the current folder. Every problem is one ConfigError line."""
    module_name, _, attr = ref.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"--plugin {ref!r}: give pkg.module:Class (e.g. myplugins:StopAtLoss).")
    found: Any = _import(module_name, ref)
    for part in attr.split("."):
        if not hasattr(found, part):
            raise ConfigError(f"--plugin {ref!r}: module {module_name} has no {attr!r}.")
        found = getattr(found, part)
    if callable(found) and not _is_plugin(found):
        found = call_user(found, f"--plugin {ref!r}")
    if not _is_plugin(found):
        raise ConfigError(
            f"--plugin {ref!r} gave a {type(found).__name__} with none of the hooks "
            f"{', '.join(TRAINING_HOOKS)} (marked @polytrain.hookimpl)."
        )
    return found


def _is_plugin(obj: object) -> bool:
    return not isinstance(obj, type) and any(hasattr(obj, h) for h in TRAINING_HOOKS)


def _import(module_name: str, ref: str) -> Any:
    try:
        return import_user_module(module_name, f"--plugin {ref!r}")
    except ImportError as exc:
        raise ConfigError(str(exc)) from None
    except Exception as exc:  # an error inside the user's module, said in one line
        raise ConfigError(
            f"--plugin {ref!r}: importing {module_name!r} failed: {type(exc).__name__}: "
            f"{exc}{traceback_hint()}"
        ) from exc
