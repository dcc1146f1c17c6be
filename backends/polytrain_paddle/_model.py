"""What the paddle backend keeps about a model it built."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from polytrain.backend.model import Model


@dataclass(kw_only=True)
class PaddleModel(Model):
    """``names``: native names of the trainable parameters in model order; ``layout``:
    native state-dict name -> (canonical name, stored transposed?) for every entry
    (``_layers.canonical_layout``); ``training[i]``: the mode replica ``i`` was last set
    to (None: not yet); ``static``: the static training step (``_static.StaticStep``) of a
    model built for the fast path, else None."""

    names: list[str] = field(default_factory=list)
    layout: dict[str, tuple[str, bool]] = field(default_factory=dict)
    training: list[bool | None] = field(default_factory=list)
    static: Any = None

    def transposed(self) -> set[str]:
        """Canonical names of the entries Paddle stores transposed (Linear weights)."""
        return {c for c, t in self.layout.values() if t}
