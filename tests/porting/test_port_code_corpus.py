"""The port-code corpus (issue 36): its manifest, the extraction of notebook and d2l cells,
and, where the corpus has been gathered (``python -m benchmarks.port_code_corpus --gather``),
every file converted without a crash into code that compiles."""

from __future__ import annotations

import json
import re

import pytest

from benchmarks import port_code_corpus as corpus
from polytrain.porting.code import convert_source

ENTRIES = corpus.manifest()
ALLOWED = {"Apache-2.0", "MIT", "BSD-3-Clause", "CC-BY-SA-4.0"}


def test_manifest_lists_forty_files_in_four_groups_with_their_origin() -> None:
    assert len(ENTRIES) >= 40
    assert {e["group"] for e in ENTRIES} == set(corpus.GROUPS)
    licences = corpus.licences()
    for e in ENTRIES:
        assert re.fullmatch(r"[0-9a-f]{40}", e["commit"]), e["name"]
        assert re.fullmatch(r"[0-9a-f]{64}", e["sha256"]), e["name"]
        assert licences[e["repo"]] in ALLOWED, e["repo"]
        assert e["path"] and e["extract"], e["name"]
    assert len({(e["group"], e["name"]) for e in ENTRIES}) == len(ENTRIES)


def test_notebook_code_cells_with_shell_and_magic_lines_commented_out() -> None:
    nb = {"cells": [
        {"cell_type": "markdown", "source": ["# title"]},
        {"cell_type": "code", "source": ["!pip install x\n", "%matplotlib inline\n", "a = 1\n"]},
        {"cell_type": "code", "source": "b = (a\n    % 2)"},
    ]}  # fmt: skip
    text = corpus.notebook_code(json.dumps(nb))
    assert text == "# !pip install x\n# %matplotlib inline\na = 1\n\nb = (a\n    % 2)\n"


CHAPTER = """text
```{.python .input}
x = nd.ones(2)
```

```{.python .input}
#@tab pytorch
x = torch.ones(2)
```

```{.python .input  n=3}
#@tab paddle, mxnet
y = 1
```

```{.python .input}
#@tab all
z = 2
```
"""


def test_markdown_cells_of_one_tab_and_of_all() -> None:
    assert (
        corpus.markdown_code(CHAPTER, "paddle")
        == "#@tab paddle, mxnet\ny = 1\n\n#@tab all\nz = 2\n"
    )
    mxnet = corpus.markdown_code(CHAPTER, "mxnet")
    assert mxnet.startswith("x = nd.ones(2)\n") and "torch" not in mxnet
    assert corpus.markdown_code(CHAPTER, None).count("\n\n") == 3


GATHERED = all(corpus.corpus_path(e).exists() for e in ENTRIES)


@pytest.mark.skipif(not GATHERED, reason="corpus not gathered (--gather MIRRORS)")
@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: f"{e['group']}/{e['name']}")
def test_corpus_file_converts_without_a_crash_into_code_that_compiles(entry: dict) -> None:
    row = corpus.measure(corpus.corpus_path(entry), entry["group"])
    assert not row.crashed, row.crashed
    assert row.compiles


HYBRID = """from mxnet.gluon import nn

def _masked_softmax(F, score, mask):
    return F.softmax(score, axis=-1) * mask

class Attention(nn.HybridBlock):
    def hybrid_forward(self, F, score, mask):
        weights = _masked_softmax(F, score, mask)
        return F.expand_dims(weights, axis=1) + score.softmax(axis=-1)
"""


def test_hybrid_forward_F_calls_stay_marked_not_read_as_tensor_methods() -> None:
    """gluonnlp's attention_cell.py and sequence_sampler.py: ``F.softmax(x, axis=-1)``, in
    ``hybrid_forward`` or a function it passes ``F`` to, was converted as the tensor method
    ``.softmax`` of ``F``: ``F.softmax(dim=x, dim=-1)``, a SyntaxError."""
    result = convert_source(HYBRID, "attention.py")
    compile(result.code, "attention.py", "exec")
    assert "return F.softmax(score, axis=-1) * mask" in result.code
    assert "F.expand_dims(weights, axis=1) + score.softmax(dim=-1)" in result.code
    assert result.report.unconverted == {"F.softmax": 1, "F.expand_dims": 1}
    assert "is the module mxnet.nd or mxnet.sym" in result.code
