"""Optional capabilities of a backend, and how the core finds them.

A backend *is* each capability it has: its class lists the capability ABCs beside
:class:`~polytrain.backend.base.Backend` (``class TorchBackend(Backend, Collectives,
Precision, NativeIO, Inspection, Compilation)``), each a small ABC with its own abstract
verbs and the defaults written over them. The core asks with ``Collectives.of(backend)``
(the backend, typed as the capability, or None) or ``Collectives.required(backend,
"--devices cpu:2")`` (the same, or one :class:`MissingCapabilityError` line naming the
backend, what it lacks and what needed it), once, where a run is set up: never per step.

Not to be confused with :mod:`polytrain.backend.capabilities`, what a *plugin* declares
(layer types, dtypes) without importing its framework.
"""

from __future__ import annotations

from abc import ABC
from typing import ClassVar, Self

from polytrain.errors import BackendError


class Capability(ABC):
    """Base of the capability ABCs: what one needs to say it is missing."""

    #: what the capability is, in an error ("collectives", "mixed precision", ...)
    label: ClassVar[str]
    #: the verbs whose presence on a backend class written before capabilities existed
    #: (all of them) means it has this capability: see :func:`adopt_capabilities`
    marks: ClassVar[tuple[str, ...]]

    # what every capability's defaults may read: a capability lives on a Backend
    name: ClassVar[str]
    world_size: int
    rank: int

    @classmethod
    def of(cls, backend: object) -> Self | None:
        """``backend`` as this capability when it has it, else None."""
        return backend if isinstance(backend, cls) else None

    @classmethod
    def required(cls, backend: object, needed_for: str) -> Self:
        """``backend`` as this capability, or a :class:`MissingCapabilityError` saying
        that ``needed_for`` (e.g. "--devices cpu:2") needs it."""
        if isinstance(backend, cls):
            return backend
        name = getattr(backend, "name", type(backend).__name__)
        raise MissingCapabilityError(
            f"backend {name!r} has no {cls.label} (its class does not list "
            f"polytrain.backend.base.{cls.__name__}), which {needed_for} needs: run "
            "without it, or on a backend that has it."
        )


class MissingCapabilityError(BackendError):
    """A backend lacks a capability a run needs."""


_OWN = ("label", "marks")  # a capability's description, not a verb to adopt


def adopt_capabilities(cls: type, kinds: tuple[type[Capability], ...]) -> None:
    """Give ``cls`` (a backend class written before capabilities existed: one class with
    every verb) each capability in ``kinds`` whose :attr:`~Capability.marks` it defines
    itself: registered as that ABC, with the capability's defaults it does not
    override. So such a backend keeps working; a new one lists its capabilities."""
    own = {part for kind in kinds for part in kind.__mro__}  # the capabilities' classes
    for kind in kinds:
        if issubclass(cls, kind) or not all(_defines(cls, verb, own) for verb in kind.marks):
            continue
        parts = [k for k in kind.__mro__ if issubclass(k, Capability) and k is not Capability]
        for part in reversed(parts):
            for attr, value in vars(part).items():
                if not attr.startswith("_") and attr not in _OWN and not hasattr(cls, attr):
                    setattr(cls, attr, value)
        kind.register(cls)


def _defines(cls: type, attr: str, skipped: set[type]) -> bool:
    """Whether ``cls`` or a base of its own (not one in ``skipped``) sets ``attr``, not
    None."""
    return any(k not in skipped and vars(k).get(attr) is not None for k in cls.__mro__)
