"""Whether MXNet 1.9.1 can run in this environment, told without importing mxnet.

MXNet 1.9.1 is the last release. ``import mxnet`` fails on numpy >= 1.24 (it uses the
removed ``np.bool`` alias: apache/mxnet#21165), and numpy < 1.24 has no build for
Python >= 3.12, so the ``mxnet`` extra installs nothing there (pyproject environment markers).
"""

from __future__ import annotations

import importlib.metadata
import platform
import re

MXNET_MAX_PYTHON = (3, 12)  # exclusive
MXNET_MAX_NUMPY = (1, 24)  # exclusive


def _major_minor(version: str) -> tuple[int, int]:
    """(major, minor) of a version string such as '2.4.6' or '1.26.0rc1'."""
    found = re.match(r"(\d+)\.(\d+)", version)
    return (int(found.group(1)), int(found.group(2))) if found else (0, 0)


def installed_numpy_version() -> str | None:
    """numpy's version from package metadata (numpy is not imported)."""
    try:
        return importlib.metadata.version("numpy")
    except importlib.metadata.PackageNotFoundError:
        return None


def mxnet_incompatibility(
    python_version: str | None = None, numpy_version: str | None = None
) -> str | None:
    """Why MXNet 1.9.1 cannot run with these versions (default: this environment's), or None."""
    python_version = python_version or platform.python_version()
    numpy_version = numpy_version or installed_numpy_version()
    too_new = []
    if _major_minor(python_version) >= MXNET_MAX_PYTHON:
        too_new.append(f"Python {python_version}")
    if numpy_version is not None and _major_minor(numpy_version) >= MXNET_MAX_NUMPY:
        too_new.append(f"numpy {numpy_version}")
    if not too_new:
        return None
    return (
        "MXNet 1.9.1 (its last release) needs Python < 3.12 and numpy < 1.24; this "
        f"environment has {' and '.join(too_new)}: use a Python 3.11 environment with "
        "pip install 'polytrain[mxnet]' (it installs numpy<1.24)"
    )
