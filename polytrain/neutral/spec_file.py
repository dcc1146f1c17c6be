"""The user's own model spec: from Python (``pkg.module:factory``), a JSON or TOML file, or a
built-in name (:func:`resolve_model_spec`, what ``--model`` takes).

A spec file holds the fields of :class:`~polytrain.neutral.models.ModelSpec`; ``net`` is a
list of layers, each a table with ``name``, ``type`` (a layer class of
:mod:`polytrain.neutral.models`) and that layer's fields (``Sequential`` and ``Residual``
nest the same way). :func:`spec_to_dict` gives the same form back (``[name, layer]`` pairs),
which :func:`spec_from_dict` reads: a spec round-trips, as the checkpoints' manifests store it.
TOML is read with the standard library's ``tomllib``; files are written as JSON.
"""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path
from typing import Any, TypeGuard

from polytrain.errors import ConfigError
from polytrain.neutral import spec_check
from polytrain.neutral.models import MODELS, ModelSpec, get_model_spec
from polytrain.utils.user_code import call_user, traceback_hint
from polytrain.utils.user_files import TEXT_LIMIT, read_text
from polytrain.utils.user_import import import_user_module

SPEC_SUFFIXES = (".json", ".toml")


def spec_to_dict(spec: ModelSpec) -> dict[str, Any]:
    """The spec as plain data (JSON- and TOML-compatible)."""
    return spec.to_dict()


def spec_from_dict(data: dict[str, Any]) -> ModelSpec:
    """A spec from :func:`spec_to_dict`'s form or a spec file's."""
    if not isinstance(data, dict):
        raise ConfigError(f"A model spec must be an object/table, got {type(data).__name__}.")
    return ModelSpec.from_dict(data)


def spec_from_file(path: str | os.PathLike[str]) -> ModelSpec:
    """A spec from a ``.json`` or ``.toml`` file."""
    file = Path(path)
    if file.suffix not in SPEC_SUFFIXES:
        raise ConfigError(f"{file}: a model spec file ends in .json or .toml.")
    text = read_text(file, "model spec", TEXT_LIMIT)
    try:
        data = tomllib.loads(text) if file.suffix == ".toml" else json.loads(text)
    except ValueError as exc:  # json.JSONDecodeError and tomllib.TOMLDecodeError
        raise ConfigError(f"{file} is not valid {file.suffix[1:].upper()}: {exc}.") from None
    except RecursionError:
        raise ConfigError(
            f"{file} nests its brackets too deeply for a model spec (more than Python's "
            f"recursion limit); a spec nests at most {spec_check.MAX_DEPTH} layer levels."
        ) from None
    try:
        return spec_from_dict(data)
    except ConfigError as exc:
        raise ConfigError(f"{file}: {exc}") from None


def spec_to_file(spec: ModelSpec, path: str | os.PathLike[str]) -> Path:
    """Write the spec as JSON (readable by :func:`spec_from_file`)."""
    file = Path(path)
    file.write_text(json.dumps(spec_to_dict(spec), indent=2) + "\n", encoding="utf-8")
    return file


def factory_result(ref: str) -> Any:
    """``pkg.module:factory`` imported (the working directory is searched last) and called
    with no arguments: whatever it returns (a ModelSpec attribute is taken as is)."""
    module_name, _, attr = ref.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"--model {ref!r} is not pkg.module:factory (e.g. mymodels:small_cnn).")
    module = _import(module_name, ref)
    found: Any = module
    for part in attr.split("."):
        if not hasattr(found, part):
            raise ConfigError(f"{module_name} has no {attr!r} (from --model {ref!r}).")
        found = getattr(found, part)
    if callable(found) and not isinstance(found, ModelSpec):
        return call_user(found, f"--model {ref!r}")
    return found


def spec_from_factory(ref: str) -> ModelSpec:
    """``pkg.module:factory`` (:func:`factory_result`); it must return a ModelSpec."""
    spec = factory_result(ref)
    if not isinstance(spec, ModelSpec):
        raise ConfigError(
            f"--model {ref!r} gave a {type(spec).__name__}, not a polytrain ModelSpec "
            "(build one from the layers of polytrain.neutral.models; see docs/user-models.md)."
        )
    return spec


def _import(module_name: str, ref: str) -> Any:
    try:
        return import_user_module(module_name, f"--model {ref!r}")
    except ImportError as exc:
        raise ConfigError(str(exc)) from None
    except Exception as exc:  # an error inside the user's module, said in one line
        raise ConfigError(
            f"--model {ref!r}: importing {module_name!r} failed: {type(exc).__name__}: "
            f"{exc}{traceback_hint()}"
        ) from exc


def is_factory_reference(ref: object) -> TypeGuard[str]:
    """Whether ``ref`` is ``pkg.module:factory`` (not a built-in name or a spec file)."""
    return (
        isinstance(ref, str)
        and ref not in MODELS
        and ":" in ref
        and not ref.endswith(SPEC_SUFFIXES)
    )


def is_spec_reference(ref: str | ModelSpec) -> bool:
    """Whether ``ref`` is a user model (a spec, a factory or a file) rather than a built-in."""
    if isinstance(ref, ModelSpec):
        return True
    return ref not in MODELS and (":" in ref or ref.endswith(SPEC_SUFFIXES))


def resolve_model_spec(ref: str | ModelSpec) -> ModelSpec:
    """What ``--model`` takes: a built-in name, ``pkg.module:factory``, or a spec file; from
    Python, a :class:`ModelSpec` too (``Recipe(model=spec)``)."""
    if isinstance(ref, ModelSpec):
        return ref
    if ref in MODELS:
        return get_model_spec(ref)
    if ref.endswith(SPEC_SUFFIXES):
        return spec_from_file(ref)
    if ":" in ref:
        return spec_from_factory(ref)
    return get_model_spec(ref)  # the unknown-model line, listing the built-ins and the forms
