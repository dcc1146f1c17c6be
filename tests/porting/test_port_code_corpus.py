"""The port-code corpus (issue 36): its manifest, the extraction of notebook and d2l cells,
and, where the corpus has been gathered (``python -m benchmarks.port_code_corpus --gather``),
every file converted without a crash into code that compiles."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import tarfile
import zipfile
from pathlib import Path

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


@pytest.mark.slow  # ~2 s a file
@pytest.mark.skipif(not GATHERED, reason="corpus not gathered (--gather MIRRORS)")
@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: f"{e['group']}/{e['name']}")
def test_corpus_file_converts_without_a_crash_into_code_that_compiles(entry: dict) -> None:
    row = corpus.measure(corpus.corpus_path(entry), entry["group"])
    assert not row.crashed, row.crashed
    assert row.compiles


# ---- the registry corpus: files of packages on the index, the one CI reaches -----------------

REGISTRY = corpus.registry_manifest()
REQUIRE_REGISTRY = "POLYTRAIN_REQUIRE_REGISTRY_CORPUS"  # scripts/test sets it: CI fails, not skips


def test_registry_manifest_pins_each_file_to_an_archive_of_a_package() -> None:
    archives = corpus.registry_archives()
    assert len(REGISTRY) >= 30
    assert {e["group"] for e in REGISTRY} == set(corpus.REGISTRY_GROUPS)
    assert len({(e["group"], e["name"]) for e in REGISTRY}) == len(REGISTRY)
    for e in REGISTRY:
        archive = archives[e["archive"]]
        assert (e["package"], e["version"]) == (archive["package"], archive["version"]), e["name"]
        assert e["licence"] == archive["licence"] and e["licence"] in ALLOWED | {"MIT-0"}
        assert re.fullmatch(r"[0-9a-f]{64}", e["sha256"]) and e["path"], e["name"]
    assert all(re.fullmatch(r"[0-9a-f]{64}", a["sha256"]) for a in archives.values())


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _registry(tmp_path: Path, wheel_text: str, pinned_text: str) -> tuple[Path, Path]:
    """A registry manifest (in ``root``) of a wheel's and an sdist's file, the archives in
    ``wheels``; the wheel's file pinned to the sha256 of ``pinned_text``."""
    root, wheels = tmp_path / "corpus", tmp_path / "wheels"
    root.mkdir()
    wheels.mkdir()
    with zipfile.ZipFile(wheels / "pkg-1.0-py3-none-any.whl", "w") as zipped:
        zipped.writestr("pkg/model.py", wheel_text)
    sdist_text = b"import mxnet as mx\n"
    member = tarfile.TarInfo("pkg2-1.0/src/pkg2/net.py")
    member.size = len(sdist_text)
    with tarfile.open(wheels / "pkg2-1.0.tar.gz", "w:gz") as tarred:
        tarred.addfile(member, io.BytesIO(sdist_text))
    rows = [("pkg", "pkg-1.0-py3-none-any.whl", "pkg/model.py", pinned_text.encode()),
            ("pkg2", "pkg2-1.0.tar.gz", "pkg2-1.0/src/pkg2/net.py", sdist_text)]  # fmt: skip
    toml = ""
    for package, archive, path, text in rows:
        toml += (f'[[archive]]\npackage = "{package}"\nversion = "1.0"\narchive = "{archive}"\n'
                 f'sha256 = "{_sha((wheels / archive).read_bytes())}"\nlicence = "MIT"\n'
                 f'[[file]]\ngroup = "registry-paddle"\nname = "{package}.py"\n'
                 f'package = "{package}"\nversion = "1.0"\narchive = "{archive}"\n'
                 f'path = "{path}"\nlicence = "MIT"\nsha256 = "{_sha(text)}"\n')  # fmt: skip
    (root / "registry.toml").write_text(toml, encoding="utf-8")
    return root, wheels


def test_gather_registry_reads_wheel_and_sdist_as_data_once(tmp_path: Path) -> None:
    root, wheels = _registry(tmp_path, "import paddle\n", "import paddle\n")
    written = corpus.gather_registry(wheels, root, tmp_path / "cache")
    assert [p.name for p in written] == ["pkg.py", "pkg2.py"]
    assert (root / "registry-paddle" / "pkg2.py").read_text() == "import mxnet as mx\n"
    for archive in wheels.iterdir():
        archive.unlink()  # gathered: nothing is read again (scripts/setup's second run)
    assert corpus.gather_registry(wheels, root, tmp_path / "cache") == []


def test_gather_registry_refuses_a_text_other_than_the_pinned_one(tmp_path: Path) -> None:
    root, wheels = _registry(tmp_path, "import paddle  # changed\n", "import paddle\n")
    with pytest.raises(corpus.GatherError, match=r"pkg\.py: sha256 [0-9a-f]{64} of pkg-1\.0"):
        corpus.gather_registry(wheels, root, tmp_path / "cache")
    assert not (root / "registry-paddle" / "pkg.py").exists()


def test_gather_registry_refuses_an_archive_other_than_the_pinned_one(tmp_path: Path) -> None:
    root, wheels = _registry(tmp_path, "import paddle\n", "import paddle\n")
    (wheels / "pkg2-1.0.tar.gz").write_bytes(b"not the sdist")
    with pytest.raises(corpus.GatherError, match=r"pkg2-1\.0\.tar\.gz: sha256 .* differs"):
        corpus.gather_registry(wheels, root, tmp_path / "cache")
    (wheels / "pkg2-1.0.tar.gz").unlink()
    with pytest.raises(corpus.GatherError, match="is absent: put the archive there"):
        corpus.gather_registry(wheels, root, tmp_path / "cache")


def test_gather_registry_error_is_one_line_and_exit_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    root, wheels = _registry(tmp_path, "import paddle  # changed\n", "import paddle\n")
    monkeypatch.setattr(corpus, "CORPUS", root)
    assert corpus.main(["--gather-registry", "--wheels", str(wheels)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("port_code_corpus: error: ")


def registry_file(entry: dict) -> Path:
    """The gathered file of ``entry``; where it is absent, the test skips, or fails where
    ``$POLYTRAIN_REQUIRE_REGISTRY_CORPUS`` is set (CI: scripts/test)."""
    path = corpus.registry_path(entry)
    if not path.exists():
        why = f"{path.name} not gathered: python -m benchmarks.port_code_corpus --gather-registry"
        if os.environ.get(REQUIRE_REGISTRY):
            pytest.fail(f"{REQUIRE_REGISTRY} is set and {why} (scripts/setup runs it)")
        pytest.skip(why)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == entry["sha256"], path
    return path


def test_registry_corpus_absent_fails_where_required(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(corpus, "CORPUS", tmp_path)
    entry = {"group": "registry-paddle", "name": "absent.py"}
    monkeypatch.delenv(REQUIRE_REGISTRY, raising=False)
    with pytest.raises(pytest.skip.Exception):
        registry_file(entry)
    monkeypatch.setenv(REQUIRE_REGISTRY, "1")
    with pytest.raises(pytest.fail.Exception, match=r"is set and absent\.py not gathered"):
        registry_file(entry)


@pytest.mark.slow  # ~80 s in all (the d2l library alone ~15 s): CI runs it, --quick not
@pytest.mark.parametrize("entry", REGISTRY, ids=lambda e: f"{e['group']}/{e['name']}")
def test_registry_file_converts_without_a_crash_into_code_that_compiles(entry: dict) -> None:
    row = corpus.measure(registry_file(entry), entry["group"])
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


def test_hybrid_forward_F_calls_are_module_functions_not_tensor_methods() -> None:
    """gluonnlp's attention_cell.py and sequence_sampler.py: ``F.softmax(x, axis=-1)``, in
    ``hybrid_forward`` or a function it passes ``F`` to, was converted as the tensor method
    ``.softmax`` of ``F``: ``F.softmax(dim=x, dim=-1)``, a SyntaxError. It is mxnet.nd's
    function (tests/porting/test_port_code_hybrid.py runs such blocks)."""
    result = convert_source(HYBRID, "attention.py")
    compile(result.code, "attention.py", "exec")
    assert "return torch.softmax(score, dim=-1) * mask" in result.code
    assert "torch.unsqueeze(weights, dim=1) + score.softmax(dim=-1)" in result.code
    assert result.report.unconverted == {}
