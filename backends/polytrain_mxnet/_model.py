"""What the mxnet backend keeps about a model it built."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from polytrain.backend.model import Model


@dataclass(kw_only=True)
class MXNetModel(Model):
    """``params``: canonical name -> Gluon Parameter (one copy per context);
    ``structural``: the same parameters under Gluon's structural names (what .params
    files use); ``trainable``: canonical names of the parameters with gradients, in model
    order. Gradient sums over devices go through ``kvstore`` (several devices in one
    process) or, across processes, the ``dist_sync`` keys ``dist_keys``."""

    params: dict[str, Any] = field(default_factory=dict)
    structural: dict[str, Any] = field(default_factory=dict)
    trainable: list[str] = field(default_factory=list)
    kvstore: Any = None
    dist_keys: list[int] | None = None

    def trainable_params(self) -> list[Any]:
        return [self.params[n] for n in self.trainable]
