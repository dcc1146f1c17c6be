"""torch.compile for the automatic mode (docs/performance.md, "Fast execution modes"):
its measured profile, a persistent inductor cache in the user's cache folder, and a marker
per model fingerprint once that model compiled there (then the cache is warm for it)."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
from pathlib import Path

import torch

from polytrain.backend.identity import CompileProfile
from polytrain.data.locate import user_cache_dir

CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"  # inductor's FX graph and AOT autograd caches live here
#: what the user set before polytrain ran (torch sets the variable itself at its first compile)
USER_CACHE_DIR = os.environ.get(CACHE_ENV) or None

#: LeNet, batch 256, fp32, 2 threads, channels-last (polytrain_torch._layout), glibc's
#: thresholds set (polytrain_torch._malloc), in-place ReLUs and Flatten's channels-last
#: gradient (polytrain_torch._layers), 2-vCPU AMD EPYC (docs/performance.md, "The automatic
#: mode"): eager 0.13 ms per sample; compiled/eager 0.918 (6 ABBA rounds of polytrain's
#: Trainer in one process; ResNet-18 batch 32: 1.003): 0.92, so the automatic mode stays
#: eager (--fast still compiles); the first compiled step ~18-20 s cold, ~3 s warm.
PROFILE = CompileProfile(
    tool="torch.compile", speedup=0.92, cold_s=20.0, warm_s=3.0, eager_sample_s=0.00013
)


def profile() -> CompileProfile | None:
    """The profile, or None where inductor cannot compile for the CPU (no C++ compiler)."""
    compiler = os.environ.get("CXX") or "c++"
    return PROFILE if shutil.which(compiler) or shutil.which("g++") else None


def cache_dir() -> Path:
    """``$TORCHINDUCTOR_CACHE_DIR`` as the user set it, else the user's cache folder."""
    return Path(USER_CACHE_DIR) if USER_CACHE_DIR else user_cache_dir("torch-compile")


def use_cache_dir() -> Path:
    """Point inductor's caches at :func:`cache_dir` (before compiling: read per compile)."""
    path = cache_dir()
    os.environ[CACHE_ENV] = str(path)
    return path


def marker(fingerprint: str) -> Path:
    """The file that says this model compiled into the cache with this torch version."""
    key = hashlib.sha256(f"{fingerprint} torch {torch.__version__}".encode()).hexdigest()
    return cache_dir() / "polytrain-compiled" / key[:32]


def is_warm(fingerprint: str) -> bool:
    return marker(fingerprint).is_file()


def mark_warm(fingerprint: str) -> None:
    """Write the marker (best effort: a read-only cache only costs the next run's speed)."""
    path = marker(fingerprint)
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"torch {torch.__version__}\n")
