"""``polytrain port-code SRC --verify FACTORY``: the model a converted file defines, run
against the original's through ``polytrain port``'s per-layer check.

Both modules are imported (their top-level code runs: a script that trains at import needs
an ``if __name__ == "__main__":`` guard), ``FACTORY`` is called in each with no arguments,
and the original's weights are loaded into the converted model before both run on the
same batch. ``FACTORY`` names a function or class of the file (``build``, ``SmallCNN``), or
``pkg.module:FACTORY`` of a module inside a converted folder.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from polytrain.errors import ConfigError
from polytrain.porting.api import DEFAULT_TOLERANCE, PortResult, port
from polytrain.utils.user_code import call_user
from polytrain.utils.user_import import import_user_module


def verify_converted(
    src: Path,
    out: Path,
    ref: str,
    *,
    input_shape: Sequence[int] | None,
    tolerance: float = DEFAULT_TOLERANCE,
    seed: int = 0,
) -> PortResult:
    """Port the original model of ``ref`` into the converted one and verify it per layer."""
    if src.is_dir():
        module, sep, attr = ref.partition(":")
        if not sep or not module or not attr:
            raise ConfigError(
                f"--verify {ref!r}: for a folder, name pkg.module:FACTORY (the module of the "
                "folder that defines the model)."
            )
        roots, modules = (src, out), (module, module)
    else:
        attr = ref.rpartition(":")[2]
        roots, modules = (src.parent, out.parent), (src.stem, out.stem)
    source = _build(roots[0], modules[0], attr, f"--verify {ref!r} (the original)")
    target = _build(roots[1], modules[1], attr, f"--verify {ref!r} (the converted file)")
    return port(source, target, input_shape=input_shape, tolerance=tolerance, seed=seed)


def _build(root: Path, module_name: str, attr: str, what: str) -> Any:
    with _imports_from(root):
        module = _import(module_name, what)
        factory: Any = module
        for part in attr.split("."):
            if not hasattr(factory, part):
                raise ConfigError(f"{what}: {module_name} has no {attr!r}.")
            factory = getattr(factory, part)
        return call_user(factory, what) if callable(factory) else factory


def _import(module_name: str, what: str) -> Any:
    try:
        return import_user_module(module_name, what)
    except ImportError as exc:
        raise ConfigError(str(exc)) from None
    except Exception as exc:  # the module's own top-level code failed
        raise ConfigError(
            f"{what}: importing {module_name!r} failed: {type(exc).__name__}: {exc}"
        ) from exc


@contextlib.contextmanager
def _imports_from(root: Path) -> Iterator[None]:
    """``root`` first on ``sys.path``; the modules imported from it are forgotten after,
    so the original and the converted module of one name never meet."""
    root = root.resolve()
    before = set(sys.modules)
    sys.path.insert(0, str(root))
    try:
        yield
    finally:
        sys.path.remove(str(root))
        for name in set(sys.modules) - before:
            origin = getattr(sys.modules[name], "__file__", None) or ""
            if origin and root in Path(origin).resolve().parents:
                del sys.modules[name]
