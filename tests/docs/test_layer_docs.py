"""docs/user-models.md's layer table is what polytrain.neutral.layer_docs generates from
the layer classes: a layer added, renamed or given another argument makes this fail until
`python -m polytrain.neutral.layer_docs docs/user-models.md` is run (issue 41, item 2)."""

from __future__ import annotations

from pathlib import Path

from polytrain.neutral.layer_docs import layer_table, with_table
from polytrain.neutral.models import LAYER_TYPES

PAGE = Path(__file__).resolve().parents[2] / "docs" / "user-models.md"


def test_the_page_holds_the_generated_table() -> None:
    page = PAGE.read_text(encoding="utf-8")
    assert with_table(page) == page, (
        "docs/user-models.md's layer table is stale: run "
        "python -m polytrain.neutral.layer_docs docs/user-models.md"
    )


def test_every_layer_type_has_a_row_with_its_parameters() -> None:
    rows = layer_table().splitlines()[2:]
    assert [row.split("`")[1] for row in rows] == list(LAYER_TYPES)
    linear = next(row for row in rows if row.startswith("| `Linear`"))
    assert "`weight` [10, 64], `bias` [10]" in linear and "`bias`: bool = `True`" in linear
    attention = next(row for row in rows if row.startswith("| `MultiHeadSelfAttention`"))
    assert "`in_proj_weight` [192, 64]" in attention
