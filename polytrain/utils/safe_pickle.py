"""Read pickled weight files without running arbitrary code.

A pickle can name any importable callable (``os.system``) and call it while loading.
Paddle's ``.pdparams`` is a pickle, but of plain data only: a dict of numpy arrays
(plus a dict of strings). This unpickler resolves only the few globals such a file
needs, so loading one can build arrays and dicts and nothing else. Imports no framework.
"""

from __future__ import annotations

import os
import pickle
from typing import IO, Any

from polytrain.errors import CheckpointError

# What numpy arrays and ordered dicts pickle to (numpy 1.x and 2.x module paths), and
# the helper protocol-2 pickles use for bytes. Nothing here runs code from the file.
SAFE_GLOBALS: frozenset[tuple[str, str]] = frozenset(
    {
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy.core.multiarray", "scalar"),
        ("numpy._core.multiarray", "scalar"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("collections", "OrderedDict"),
        ("_codecs", "encode"),
    }
)


class RestrictedUnpickler(pickle.Unpickler):
    """An Unpickler that refuses every global outside ``allowed`` and persistent ids."""

    def __init__(
        self, file: IO[bytes], source: str, allowed: frozenset[tuple[str, str]] = SAFE_GLOBALS
    ) -> None:
        super().__init__(file)
        self.source = source
        self.allowed = allowed

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in self.allowed:
            return super().find_class(module, name)
        raise CheckpointError(
            f"{self.source} refers to {module}.{name}, which polytrain will not unpickle: "
            "a weights file holds only arrays and dicts. If you trust the file, load it "
            "with its framework and re-save its state dict."
        )

    def persistent_load(self, pid: Any) -> Any:
        raise CheckpointError(
            f"{self.source} uses pickle persistent ids ({pid!r}); it is not a plain "
            "weights pickle (a .pt zip file must be read by the torch backend)."
        )


def load(path: str | os.PathLike[str]) -> Any:
    """Unpickle ``path`` allowing only numpy arrays, dtypes, scalars and (ordered) dicts."""
    source = os.fspath(path)
    try:
        with open(source, "rb") as fh:
            return RestrictedUnpickler(fh, source).load()
    except CheckpointError:
        raise
    except FileNotFoundError:
        raise CheckpointError(f"No such file: {source}.") from None
    except Exception as exc:  # truncated or not a pickle at all
        raise CheckpointError(f"Cannot read {source} as a pickle: {exc!r}") from exc
