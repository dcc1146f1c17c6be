"""`--data-dir` means that folder, every split comes from one folder, the run records the
folder read, and gzip decompression is bounded by the size the IDX header declares."""

from __future__ import annotations

import gzip
import json
import tracemalloc
import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_data import (  # noqa: F401 - the fixtures are used by name
    TINY,
    isolated_env,
    mirrors,
    server,
    tiny_bytes,
    tiny_spec,
    write_tiny,
)

from polytrain.cli.main import main
from polytrain.data import fetch_dataset, load_dataset, locate_dataset, read_idx
from polytrain.data.idx import INFLATE_MARGIN, encode_idx
from polytrain.errors import ConfigError, DataError

# --------------------------------------------------------------------------- --data-dir


@pytest.mark.parametrize("state", ["missing", "empty", "other-files"])
def test_data_dir_never_falls_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, state: str
) -> None:
    """A complete copy elsewhere ($POLYTRAIN_DATA, cache, system) is never read instead."""
    spec = tiny_spec()
    for where in ("env", "system"):
        write_tiny(tmp_path / where / TINY)
    write_tiny(tmp_path / "xdg-cache" / "polytrain" / TINY)
    monkeypatch.setenv("POLYTRAIN_DATA", str(tmp_path / "env"))
    named = tmp_path / "named"
    if state != "missing":
        named.mkdir()
    if state == "other-files":
        (named / "notes.txt").write_text("not a dataset")
    with pytest.raises(DataError) as info:
        load_dataset(spec, "train", data_dir=named, system_dirs=[tmp_path / "system"])
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"--data-dir {named}: ")
    assert {"missing": "no such folder", "empty": "the folder is empty"}.get(state, "") in message
    assert f"{named / TINY} and {named}" in message
    assert "train-images-idx3-ubyte.gz and train-labels-idx1-ubyte.gz" in message
    assert f"polytrain data --download {TINY} --data-dir {named}" in message
    assert "drop --data-dir" in message
    assert named.exists() is (state != "missing")  # nothing created, nothing downloaded


def test_empty_data_dir_string_is_refused() -> None:
    with pytest.raises(ConfigError, match="--data-dir is empty"):
        locate_dataset(tiny_spec(), "")


def test_data_dir_splits_come_from_one_folder(tmp_path: Path) -> None:
    """train in DIR/<name>/ and test only in DIR/ is refused, naming both folders."""
    spec = tiny_spec()
    named = tmp_path / "named"
    write_tiny(named)
    for path in write_tiny(named / TINY).glob("t10k-*"):
        path.unlink()
    assert len(load_dataset(spec, "train", data_dir=named)) == 40
    with pytest.raises(DataError) as info:
        load_dataset(spec, "test", data_dir=named)
    message = str(info.value)
    assert "\n" not in message
    assert f"no {TINY} test split in {named / TINY}, the folder every split is read from" in message
    assert f"{named} has them, but all splits must come from one folder" in message


def test_splits_never_mixed_without_data_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """$POLYTRAIN_DATA holding only train does not get its test split from the cache."""
    spec = tiny_spec()
    env_dir = tmp_path / "env"
    for path in write_tiny(env_dir).glob("t10k-*"):
        path.unlink()
    cache = write_tiny(tmp_path / "xdg-cache" / "polytrain" / TINY)
    monkeypatch.setenv("POLYTRAIN_DATA", str(env_dir))
    report = locate_dataset(spec, system_dirs=[])
    assert report.folder is not None and report.folder.path == env_dir
    assert report.location("train").directory == env_dir
    assert not report.location("test").found
    assert report.download_dir is None  # polytrain does not write into $POLYTRAIN_DATA
    with pytest.raises(DataError) as info:
        load_dataset(spec, "test", system_dirs=[])
    message = str(info.value)
    assert "\n" not in message
    assert f"split 'test' is missing in {env_dir} ($POLYTRAIN_DATA)" in message
    assert f"{cache} holds every split: pass `--data-dir {cache}`" in message
    with pytest.raises(DataError, match=f"missing in {env_dir}"):
        fetch_dataset(spec, system_dirs=[])
    monkeypatch.delenv("POLYTRAIN_DATA")
    assert locate_dataset(spec, system_dirs=[]).location("test").directory == cache


def test_download_goes_into_the_folder_of_the_other_splits(
    tmp_path: Path,
    mirrors: dict[str, str],  # noqa: F811 - the fixture imported above
) -> None:
    """`polytrain data --download --data-dir DIR` completes DIR itself when DIR holds train."""
    spec = tiny_spec(mirrors=(mirrors["good"],))
    named = tmp_path / "named"
    for path in write_tiny(named).glob("t10k-*"):
        path.unlink()
    with pytest.raises(DataError, match="no tiny-mnist test split"):
        load_dataset(spec, "test", data_dir=named)  # a named folder is not filled unasked
    report = fetch_dataset(spec, named)
    assert report.complete
    assert {report.location(s).directory for s in ("train", "test")} == {named}
    assert not (named / TINY).exists()
    fresh = tmp_path / "fresh"
    assert fetch_dataset(spec, fresh).location("test").directory == fresh / TINY
    assert len(load_dataset(spec, "test", data_dir=fresh, verify=True)) == 20


def test_polytrain_data_reports_the_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    named = tmp_path / "named"
    write_tiny(named / "mnist")
    assert main(["data", "mnist", "--data-dir", str(named), "--json"]) == 0
    (report,) = json.loads(capsys.readouterr().out)
    assert report["folder"] == str(named / "mnist") and report["rule"] == "--data-dir"
    assert report["searched"] == [
        {"rule": "--data-dir", "path": str(named / "mnist")},
        {"rule": "--data-dir", "path": str(named)},
    ]


TRAIN_ARGS = ["--backend", "numpy", "--dataset", "mnist", "--model", "mlp", "--epochs", "1",
              "--batch-size", "4", "--train-samples", "8", "--test-samples", "4",
              "--quiet"]  # fmt: skip


def test_train_with_an_empty_data_dir_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The issue's case: `train --data-dir EMPTY` used to train on another copy."""
    write_tiny(tmp_path / "env" / "mnist")
    monkeypatch.setenv("POLYTRAIN_DATA", str(tmp_path / "env"))
    empty = tmp_path / "empty"
    empty.mkdir()
    code = main(["train", *TRAIN_ARGS, "--data-dir", str(empty), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert err.count("\n") == 0 and f"--data-dir {empty}: the folder is empty" in err


def test_metrics_record_the_folder_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    named = tmp_path / "named"
    write_tiny(named / "mnist", compress=False)
    write_tiny(tmp_path / "env" / "mnist")  # another copy, not read
    monkeypatch.setenv("POLYTRAIN_DATA", str(tmp_path / "env"))
    out = tmp_path / "run"
    assert main(["train", *TRAIN_ARGS, "--data-dir", str(named), "--out", str(out)]) == 0
    lines = (out / "metrics.jsonl").read_text().splitlines()
    start = json.loads(lines[0])
    assert start["event"] == "start"
    folder = named / "mnist"
    assert start["data"]["train"] == {
        "dataset": "mnist",
        "split": "train",
        "directory": str(folder),
        "rule": "--data-dir",
        "images": str(folder / "train-images-idx3-ubyte"),
        "labels": str(folder / "train-labels-idx1-ubyte"),
    }
    assert start["data"]["test"]["directory"] == str(folder)
    assert start["data"]["test"]["images"] == str(folder / "t10k-images-idx3-ubyte")


# --------------------------------------------------------------------------- bounded gzip


def _gzip_bomb(path: Path, header: bytes, zeros: int) -> int:
    """Write a gzip of ``header`` plus ``zeros`` zero bytes, compressed in pieces."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    parts = [packer.compress(header)]
    piece = bytes(1 << 20)
    for start in range(0, zeros, len(piece)):
        parts.append(packer.compress(piece[: min(len(piece), zeros - start)]))
    parts.append(packer.flush())
    data = b"".join(parts)
    path.write_bytes(data)
    return len(data)


def test_gzip_bomb_is_refused_before_it_inflates(tmp_path: Path) -> None:
    """A 64 MiB stream behind a header declaring 16 bytes: refused, memory stays small."""
    header = bytes([0, 0, 0x08, 1]) + (16).to_bytes(4, "big")
    path = tmp_path / "train-labels-idx1-ubyte.gz"
    size = _gzip_bomb(path, header, 64 << 20)
    assert size < 200_000
    tracemalloc.start()
    try:
        with pytest.raises(DataError) as info:
            read_idx(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    message = str(info.value)
    assert "\n" not in message and str(path) in message
    assert "the IDX header declares 24 bytes, but the gzip stream holds more" in message
    assert peak < 2 * size + 4 * INFLATE_MARGIN + (1 << 20), peak


def test_gzip_within_the_margin_is_reported_exactly(tmp_path: Path) -> None:
    """A few extra bytes after a valid payload: the exact count, as for a raw file."""
    path = tmp_path / "x-idx1-ubyte.gz"
    path.write_bytes(gzip.compress(encode_idx(np.arange(5, dtype=np.uint8)) + bytes(100)))
    with pytest.raises(DataError, match="100 unexpected trailing bytes"):
        read_idx(path)


def test_truncated_gzip_is_one_line(tmp_path: Path) -> None:
    data = tiny_bytes()["train-images-idx3-ubyte"]
    packed = gzip.compress(data, mtime=0)
    path = tmp_path / "train-images-idx3-ubyte.gz"
    path.write_bytes(packed[: len(packed) * 2 // 3])
    with pytest.raises(DataError) as info:
        read_idx(path)
    message = str(info.value)
    assert "\n" not in message and str(path) in message
    assert "corrupt gzip data (the stream ends early (truncated)" in message


def test_gzip_members_and_zero_padding_are_one_content(tmp_path: Path) -> None:
    """Concatenated gzip members and trailing zero padding, as gzip(1) accepts them."""
    data = encode_idx(np.arange(300, dtype=np.int16).reshape(3, 100))
    path = tmp_path / "x-idx2-ubyte.gz"
    path.write_bytes(gzip.compress(data[:7]) + gzip.compress(data[7:]) + bytes(16))
    np.testing.assert_array_equal(read_idx(path), np.arange(300).reshape(3, 100))
    path.write_bytes(gzip.compress(data) + b"junk")
    with pytest.raises(DataError, match="4 bytes after the gzip stream are not gzip data"):
        read_idx(path)


VALID_GZIP = gzip.compress(encode_idx(np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)))


@given(
    st.lists(
        st.tuples(st.sampled_from(["flip", "cut", "append"]), st.integers(0, 10**6), st.binary()),
        max_size=3,
    )
)
def test_bounded_gzip_reader_fuzz(
    tmp_path_factory: pytest.TempPathFactory, edits: list[tuple[str, int, bytes]]
) -> None:
    """Damaged gzip IDX files give an array or polytrain's DataError, nothing else."""
    data = bytearray(VALID_GZIP)
    for kind, where, extra in edits:
        at = where % (len(data) + 1)
        if kind == "flip" and at < len(data):
            data[at] ^= 0xFF
        elif kind == "cut":
            del data[at:]
        else:
            data += extra
    path = tmp_path_factory.mktemp("fuzz") / "x-idx3-ubyte.gz"
    path.write_bytes(bytes(data))
    try:
        array = read_idx(path)
    except DataError as exc:
        assert "\n" not in str(exc)
        return
    assert array.size == int(np.prod(array.shape))
