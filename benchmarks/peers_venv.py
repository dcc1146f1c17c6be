"""The peers' own venv, ``.venv-peers/`` at the repository root: Keras lives there, never in
the project's venv.

A venv made by a venv's python has the *base* interpreter's site-packages as its "system"
ones (``--system-site-packages`` would not see the project's torch and jax). So the peers
venv is a plain venv plus one ``.pth`` line naming the project interpreter's
site-packages: Keras runs on the very torch, jax and numpy builds polytrain runs on (nothing
downloaded twice, no CUDA wheel), and pip installs only Keras and its small dependencies
(namex, optree, h5py, absl-py) into the peers venv, with a constraints file holding the
shared packages at the project's versions (pip fails rather than replace them).
"""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv-peers"
KERAS_VERSION = "3.15.1"  # the newest on the registry on 2026-11-28
SHARED = ("torch", "jax", "jaxlib", "numpy", "ml_dtypes", "rich", "packaging")
PTH = "project-site-packages.pth"


def venv_python(venv: Path = VENV) -> Path:
    return venv / "bin" / "python"


def project_site_dirs() -> list[str]:
    """Where this (the project's) interpreter keeps its packages."""
    paths = sysconfig.get_paths()
    return list(dict.fromkeys([paths["purelib"], paths["platlib"]]))


def constraints() -> str:
    """``name==version`` of every shared package installed here, one a line."""
    lines = []
    for name in SHARED:
        try:
            lines.append(f"{name}=={metadata.version(name)}")
        except metadata.PackageNotFoundError:
            continue
    return "\n".join(lines) + "\n"


def installed_keras(python: Path) -> str | None:
    """The Keras version ``python`` imports, or None."""
    if not python.exists():
        return None
    # its metadata: importing keras without KERAS_BACKEND would pick tensorflow
    probe = [str(python), "-c", "from importlib.metadata import version; print(version('keras'))"]
    proc = subprocess.run(probe, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        return None
    return proc.stdout.strip() or None


def ensure_keras(version: str, say: Callable[[str], None], venv: Path = VENV) -> Path | None:
    """The peers venv's python with ``keras==version`` importable (installed if needed), or
    None after one line saying why the Keras rows are skipped."""
    python = venv_python(venv)
    if python.exists() and installed_keras(python) == version:
        _link_project(venv)  # the project's interpreter may have moved
        return python
    say(f"peers: installing keras=={version} into {venv.name}/ (torch, jax and numpy: the "
        f"project's own, through {PTH}) ...")  # fmt: skip
    log = venv.parent / f"{venv.name}-install.log"
    try:
        if not python.exists():
            _run([sys.executable, "-m", "venv", str(venv)], log)
        _link_project(venv)
        pins = venv / "constraints.txt"
        pins.write_text(constraints(), encoding="utf-8")
        pip = [str(python), "-m", "pip", "install", "--disable-pip-version-check"]
        _run([*pip, "-c", str(pins), f"keras=={version}"], log)
    except (OSError, subprocess.CalledProcessError) as exc:
        say(f"peers: Keras rows skipped: installing keras=={version} failed ({_why(exc, log)})")
        return None
    found = installed_keras(python)
    if found != version:
        say(f"peers: Keras rows skipped: {venv.name}/ imports keras {found}, not {version}")
        return None
    return python


def _link_project(venv: Path) -> Path:
    """Write the ``.pth`` naming the project's site-packages into the venv's own."""
    lib = sorted((venv / "lib").glob("python3*/site-packages"))
    if not lib:
        raise OSError(f"{venv} has no lib/python3*/site-packages")
    pth = lib[0] / PTH
    text = "\n".join(project_site_dirs()) + "\n"
    if not pth.exists() or pth.read_text(encoding="utf-8") != text:
        pth.write_text(text, encoding="utf-8")
    return pth


def _run(cmd: list[str], log: Path) -> None:
    with open(log, "a", encoding="utf-8") as out:
        out.write("$ " + " ".join(cmd) + "\n")
        out.flush()
        subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, check=True)


def _why(exc: Exception, log: Path) -> str:
    if isinstance(exc, subprocess.CalledProcessError):
        text = log.read_text(encoding="utf-8") if log.exists() else ""
        tail = [ln.strip() for ln in text.splitlines() if ln.strip()]
        last = tail[-1][:160] if tail else ""
        return f"exit status {exc.returncode}: {last}; the whole output: {log.name}"
    return str(exc)
