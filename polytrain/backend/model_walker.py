"""A framework's model objects, walked and traced for ``polytrain port``.

A backend plugin registers one :class:`ModelWalker` through the
``polytrain_register_model_walkers`` hook. It lists a model's leaf layers that hold
tensors, in registration order, each with its kind (``Linear``, ``Conv2d``, ``BatchNorm``,
``Embedding``, ``LayerNorm`` or the class name) and its tensors by canonical role
(``weight``, ``bias``, ``running_mean``, ``running_var``) with the transpose that brings
each to the canonical (PyTorch) layout: the layer object is the evidence for the layout.
It also runs a model in eval mode with forward hooks on those layers. Everything crosses
the boundary as numpy; the framework is imported only inside the methods.

An attention layer is walked as one layer of kind ``MultiheadAttention`` with PyTorch's
roles (``in_proj_weight`` [3E, E] packed from the query, key and value projections,
``in_proj_bias``, ``out_proj.weight``, ``out_proj.bias``; see :func:`attention_tensors`),
whatever its framework stores: a packed tensor lists its native parts. Options that no
tensor shows (a transformer layer's norm placement, its activation, the number of heads)
are the :meth:`ModelWalker.blocks`' settings, compared by ``polytrain port``.

A walker never reads a file: a weights file a user gives (``port --weights``) is data,
read by polytrain's own reader of its format (:func:`polytrain.io.native.read_native`,
which never runs code from a file), and only its tensors reach :meth:`ModelWalker.load_saved`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

KINDS = ("Linear", "Conv1d", "Conv2d", "Conv3d", "BatchNorm", "Embedding", "LayerNorm")
ATTENTION = "MultiheadAttention"  # the kind of an attention layer (PyTorch's roles)
QKV = "QKVProjection"
"""the query, key and value projections of a self-attention without its output projection
(GluonNLP's ``DotProductSelfAttentionCell``): ``in_proj_weight``/``in_proj_bias`` packed as
in :data:`ATTENTION`, traced at the attention's output (the heads joined, not projected)"""
BARE = "Parameter"
"""a bare parameter of a block that has child layers too (GluonNLP's ``position_weight``,
an embedding table the encoder looks up itself; a ViT's ``cls_token``): role ``weight``,
paired by its name, a hint or in order, and not traced (no layer of its own runs it); the
layers after it check it"""
PACKED = {  # role of a packed attention tensor -> its parts' roles in a Linear (q, k, v)
    "in_proj_weight": "weight",
    "in_proj_bias": "bias",
}
SEPARATE = ("q_proj_weight", "k_proj_weight", "v_proj_weight")  # kdim/vdim != embed_dim


@dataclass(frozen=True)
class LayerTensor:
    """One tensor of a layer: its name in the model's state (the key its framework saves it
    under), its value as stored, and whether the canonical layout is its transpose."""

    native: str
    value: np.ndarray
    transpose: bool = False
    parts: tuple[LayerTensor, ...] = ()
    """a packed tensor: the native tensors whose canonical rows it joins, in order (the
    query, key and value projections of ``in_proj_weight``); ``value`` is the joined one"""

    @property
    def canonical(self) -> np.ndarray:
        return np.ascontiguousarray(self.value.T if self.transpose else self.value)

    @property
    def natives(self) -> tuple[str, ...]:
        """The native names it is stored under (one, or its parts')."""
        return tuple(p.native for p in self.parts) or (self.native,)


def packed(parts: tuple[LayerTensor, ...]) -> LayerTensor:
    """One canonical tensor joining the canonical rows of ``parts`` (equal row counts)."""
    rows = {p.canonical.shape[0] for p in parts}
    if len(rows) != 1:
        raise ValueError(f"packed parts differ in rows: {sorted(rows)}")
    value = np.concatenate([p.canonical for p in parts])
    return LayerTensor("+".join(p.native for p in parts), value, parts=parts)


def unpack(value: np.ndarray, count: int) -> list[np.ndarray]:
    """A packed canonical tensor's ``count`` parts (equal row counts, in order)."""
    return [np.ascontiguousarray(part) for part in np.split(np.asarray(value), count)]


def bare_layers(owner: str, tensors: Mapping[str, LayerTensor]) -> list[WalkedLayer]:
    """Each own tensor of a block with child layers (of class ``owner``) as a :data:`BARE`
    layer named by its state key: its class is no kind that says anything of them."""
    return [
        WalkedLayer(t.native, BARE, f"{owner}.{key}", {"weight": t}) for key, t in tensors.items()
    ]


def attention_tensors(q: Mapping[str, LayerTensor], k: Mapping[str, LayerTensor],
                      v: Mapping[str, LayerTensor],
                      out: Mapping[str, LayerTensor]) -> dict[str, LayerTensor]:  # fmt: skip
    """PyTorch ``nn.MultiheadAttention``'s roles from the tensors of four Linear layers (by
    role, canonical [out, in]): ``in_proj_weight`` packs the q/k/v weights when their
    inputs are all ``embed_dim`` wide, else ``q_proj_weight``/``k_proj_weight``/
    ``v_proj_weight`` (torch's kdim/vdim form); ``in_proj_bias`` always packs the biases."""
    e = q["weight"].canonical.shape[0]
    same = all(t["weight"].canonical.shape == (e, e) for t in (q, k, v))
    found = {}
    if same:
        found["in_proj_weight"] = packed((q["weight"], k["weight"], v["weight"]))
    else:
        found |= dict(zip(SEPARATE, (q["weight"], k["weight"], v["weight"]), strict=True))
    if all("bias" in t for t in (q, k, v)):
        found["in_proj_bias"] = packed((q["bias"], k["bias"], v["bias"]))
    found |= {f"out_proj.{role}": t for role, t in out.items()}
    return found


@dataclass(frozen=True)
class WalkedLayer:
    """A leaf layer with tensors: its path in the model, kind, class name and tensors by role."""

    name: str
    kind: str
    type_name: str
    tensors: Mapping[str, LayerTensor] = field(default_factory=dict)
    groups: int = 1  # grouped (depthwise) convolutions: their group count
    output: str = ""
    """the traced layer whose output is this one's, when it is not itself (a group of
    Linears paired with an attention layer ends at its output projection)"""

    @property
    def traced(self) -> str:
        return self.output or self.name

    def describe(self) -> str:
        shapes = ", ".join(
            f"{role} {list(t.canonical.shape)}" for role, t in sorted(self.tensors.items())
        )
        return f"{self.name} ({self.type_name}: {shapes})"


@dataclass(frozen=True)
class Setting:
    """An option of a block that no tensor shows: its value, comparable across frameworks
    (``True``, ``"gelu"``, ``2``), and how its framework spells it (``normalize_before=True``)."""

    value: Any
    native: str


@dataclass(frozen=True)
class WalkedBlock:
    """A block whose options decide what its tensors compute (a transformer layer, an
    attention layer): its path, kind (PyTorch's class name) and settings by canonical key
    (PyTorch's argument name: ``norm_first``, ``activation``, ``num_heads``, ...)."""

    name: str
    kind: str
    type_name: str
    settings: Mapping[str, Setting] = field(default_factory=dict)

    def describe(self) -> str:
        return f"{self.name or '(the model)'} ({self.type_name})"


@dataclass
class Trace:
    """A model's output and each traced layer's first output, in call order."""

    output: np.ndarray
    layers: dict[str, np.ndarray]


class ModelWalker(ABC):
    """Walks and traces the model objects of one framework."""

    framework: str
    """the framework's name, which is also the name of its registered native format"""

    @abstractmethod
    def owns(self, model: Any) -> bool:
        """Whether ``model`` is a model object of this framework (without importing it
        when it is not imported yet: then the object cannot be one)."""

    @abstractmethod
    def layers(self, model: Any) -> list[WalkedLayer]:
        """The leaf layers holding tensors, in registration order."""

    @abstractmethod
    def state(self, model: Any) -> dict[str, np.ndarray]:
        """The model's whole state as its framework saves it (native names and layout)."""

    @abstractmethod
    def load_state(
        self, model: Any, tensors: Mapping[str, np.ndarray], what: str = "the ported state"
    ) -> None:
        """Load a whole state (native names and layout) into ``model``, strictly; a name
        mismatch is a CheckpointError about ``what``."""

    def load_saved(self, model: Any, tensors: Mapping[str, np.ndarray], source: str) -> None:
        """Load the tensors of a weights file its framework saved for this model, as
        polytrain's own reader read them from ``source`` (never the file itself), names
        checked as :meth:`load_state` checks them. By default they are the model's state;
        a walker whose framework saves names differently from its state maps them."""
        self.load_state(model, tensors, source)

    def blocks(self, model: Any) -> list[WalkedBlock]:
        """The blocks with settings that no tensor shows (transformer and attention
        layers, a LayerNorm's epsilon), in registration order; none by default."""
        return []

    def notes(self, model: Any) -> list[str]:
        """What the target must reproduce that no tensor shows (e.g. a dropout layer that
        scales in eval), one line each; none by default."""
        return []

    @abstractmethod
    def trace(self, model: Any, inputs: np.ndarray) -> Trace:
        """Run ``model`` in eval mode on ``inputs`` (no gradients) with forward hooks on the
        layers of :meth:`layers`; the model is left in eval mode. For a model whose shapes
        are set on its first call, this is what sets them."""
