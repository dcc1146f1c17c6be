"""The project's own error types: every failure a user can cause raises one of these.

Each message says what was asked, what was found, and how to fix it.
"""

from __future__ import annotations


class PolytrainError(Exception):
    """Base of every error polytrain raises on purpose."""


class ConfigError(PolytrainError, ValueError):
    """A bad argument, option or combination of options."""


class BackendError(PolytrainError):
    """A backend is unknown, not installed, or cannot do what was asked."""


class DataError(PolytrainError):
    """A dataset file is missing, truncated, corrupt or fails its checksum."""


class CheckpointError(PolytrainError):
    """A checkpoint is missing, corrupt, or does not match the model it is loaded into."""


class ClusterError(PolytrainError):
    """The distributed environment is inconsistent or a collective failed."""


class NonFiniteLossError(PolytrainError):
    """Training produced a NaN or Inf loss."""


class OutputError(PolytrainError):
    """An output folder or file cannot be written, or belongs to another run."""


class DivergedError(PolytrainError):
    """Training diverged: the loss grew past its limit or too many steps were skipped."""


class ShapeError(PolytrainError, ValueError):
    """An input does not fit the model: the message names the layer and the shapes."""


class PluginError(PolytrainError):
    """A user's training-event plugin raised: the run stopped there."""
