"""The options of transformer and attention blocks that no tensor shows (a layer's norm
placement, its activation, the number of heads), compared between the two models: the
blocks of each kind paired in order. An option that changes what the weights compute is
refused in one line naming it on each side; one that acts in training only is a note."""

from __future__ import annotations

from collections.abc import Sequence

from polytrain.backend.model_walker import Setting, WalkedBlock
from polytrain.errors import ConfigError

TRAINING_ONLY = {  # options that leave eval outputs alone, and what they change instead
    "dropout": "dropout acts in training only",
    "activation_dropout": "dropout acts in training only",
    "batch_first": "the layout of the attention's input; the outputs compared show its effect",
}


def check_blocks(source: Sequence[WalkedBlock], target: Sequence[WalkedBlock]) -> list[str]:
    """Notes on the options compared (dropout that differs, blocks without a counterpart);
    a ConfigError for the first option that differs and changes the outputs."""
    notes: list[str] = []
    differ: dict[tuple[str, str, str, str], list[str]] = {}
    kinds = list(dict.fromkeys(b.kind for b in [*source, *target]))
    for kind in kinds:
        s_blocks = [b for b in source if b.kind == kind]
        t_blocks = [b for b in target if b.kind == kind]
        if len(s_blocks) != len(t_blocks):
            notes.append(_unpaired(kind, s_blocks, t_blocks))
            continue
        for s, t in zip(s_blocks, t_blocks, strict=True):
            for key, a, b in _differences(s, t):
                if key not in TRAINING_ONLY:
                    raise ConfigError(
                        f"Options differ: source {s.describe()} has {a.native}, target "
                        f"{t.describe()} has {b.native}: no tensor shows {key}, and the "
                        f"outputs differ with it; build the target with the source's {key}."
                    )
                differ.setdefault((kind, key, a.native, b.native), []).append(t.name)
    for (kind, key, s_native, t_native), names in differ.items():
        where = ", ".join(names[:3]) + (" ..." if len(names) > 3 else "")
        notes.append(
            f"options differ in {len(names)} {kind} block(s) ({where}): source {s_native}, "
            f"target {t_native} ({TRAINING_ONLY[key]}; the ported weights are the same)"
        )
    return notes


def _differences(s: WalkedBlock, t: WalkedBlock) -> list[tuple[str, Setting, Setting]]:
    return [
        (key, s.settings[key], t.settings[key])
        for key in s.settings
        if key in t.settings and s.settings[key].value != t.settings[key].value
    ]


def _unpaired(kind: str, s_blocks: list[WalkedBlock], t_blocks: list[WalkedBlock]) -> str:
    keys = sorted({k for b in [*s_blocks, *t_blocks] for k in b.settings})
    return (
        f"the source has {len(s_blocks)} {kind} block(s), the target {len(t_blocks)}: their "
        f"options ({', '.join(keys)}) are not compared, only their outputs"
    )
