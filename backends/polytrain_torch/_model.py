"""What the torch backend keeps about a model it built."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from polytrain.backend.model import Model


@dataclass(kw_only=True)
class TorchModel(Model):
    """``names``: trainable parameter names in model order; ``training[i]``: the mode
    replica ``i`` was last set to (None: not yet); ``run[i]``: what runs replica ``i``
    (the module, or its torch.compile wrapper under --fast)."""

    names: list[str] = field(default_factory=list)
    training: list[bool | None] = field(default_factory=list)
    run: list[Any] = field(default_factory=list)
    #: --fast: the one batch shape each replica's compiled graph was traced for; training
    #: batches of another shape (an epoch's smaller last batch) and evaluation run eager,
    #: so one graph is compiled, never a dynamic-shape one
    compiled_shape: list[tuple[int, ...] | None] = field(default_factory=list)
    #: the fingerprint to mark warm once the compiled graph ran forward and backward
    warm_marker: str | None = None
    compiled_steps: int = 0
    #: weights and 4-d inputs kept channels-last (polytrain_torch._layout)
    channels_last: bool = False
