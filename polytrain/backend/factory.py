"""The ``BackendInfo.factory`` a plugin registers: threads fixed before its framework
loads, and the stop signals held while it loads."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from polytrain.backend.identity import BackendOptions
from polytrain.utils.signals import stop_signals_deferred
from polytrain.utils.threads import export_thread_env, resolve_threads

if TYPE_CHECKING:
    from polytrain.backend.base import Backend


def backend_factory(
    load: Callable[[], type[Backend]], *, reserve_threads: int | Callable[[], int] = 0
) -> Callable[[BackendOptions], Backend]:
    """A factory that resolves the thread count and exports it to the OpenMP/BLAS
    variables *before* ``load()`` imports the framework (which reads them then; paddle
    even sets ``OMP_NUM_THREADS=1`` when it is unset), builds the backend class ``load``
    returns, and applies the count through the framework's own setter.
    SIGTERM and SIGINT wait until ``load()`` is over (their handlers then reclaimed from
    any C++ handler the framework installed): a handler that raises inside a framework's
    C++ module init turns into an ImportError with a traceback, not polytrain's line.
    ``reserve_threads``: cores left to threads the framework runs besides its pool, or a
    function that sets the plugin's other before-import variables and returns that count."""

    def factory(options: BackendOptions) -> Backend:
        reserve = reserve_threads() if callable(reserve_threads) else reserve_threads
        threads = resolve_threads(options.threads, reserve=reserve)
        export_thread_env(threads)
        with stop_signals_deferred():
            backend_class = load()
        backend = backend_class(options)
        backend.set_threads(threads)
        return backend

    return factory
