"""MXNet's execution engine, chosen before mxnet is imported (it reads the variable once).

MXNet's default, ``ThreadedEnginePerDevice``, queues each operator to a worker thread, so
the Python thread can run ahead; its OpenMP pool then gets one core less, since the worker
and Python share the machine. ``NaiveEngine`` runs each operator in the calling thread, so
OpenMP can take every core: for LeNet on 2 cores, 1.48x the samples/s of the default
engine with 1 thread and 1.21x with 2 (docs/performance.md, "MXNet's engine"). polytrain
picks it for one process; workers of a parameter-server launch (``DMLC_ROLE`` set) keep
the threaded engine, and a ``MXNET_ENGINE_TYPE`` the user set always wins.
"""

from __future__ import annotations

import os
import sys

ENGINE_VAR = "MXNET_ENGINE_TYPE"
NAIVE = "NaiveEngine"
THREADED = "ThreadedEnginePerDevice"  # MXNet's default
#: set beside ENGINE_VAR when polytrain (not the user) chose the engine, so a launcher
#: started from this process does not hand the choice to its parameter-server workers
CHOSEN_VAR = "POLYTRAIN_MXNET_ENGINE"


def engine() -> str:
    """The engine this process runs (or will run once mxnet is imported)."""
    return os.environ.get(ENGINE_VAR) or THREADED


def choose_engine() -> int:
    """Pick the engine for this process; return the cores to leave to its threads.

    NaiveEngine for one process unless the user chose an engine or mxnet is imported
    already (the engine is fixed then). NaiveEngine needs no core besides OpenMP's pool,
    the threaded engine one for its worker."""
    if (
        ENGINE_VAR not in os.environ
        and "DMLC_ROLE" not in os.environ
        and "mxnet" not in sys.modules
    ):
        os.environ[ENGINE_VAR] = NAIVE
        os.environ[CHOSEN_VAR] = NAIVE
    return 0 if engine() == NAIVE else 1


def launched_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` for a parameter-server process: without an engine polytrain chose for its
    own process (the workers choose their own)."""
    if env.get(CHOSEN_VAR) and env.get(ENGINE_VAR) == env[CHOSEN_VAR]:
        env = {k: v for k, v in env.items() if k not in (ENGINE_VAR, CHOSEN_VAR)}
    return env
