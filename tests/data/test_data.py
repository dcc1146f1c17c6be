"""The data package: IDX files, registry, discovery, verified download, the loader."""

from __future__ import annotations

import functools
import gzip
import hashlib
import http.server
import itertools
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from polytrain.data import (
    ArrayDataset,
    BatchLoader,
    Checksums,
    DatasetSpec,
    dataset_names,
    download_file,
    get_dataset,
    load_dataset,
    locate,
    locate_dataset,
    read_idx,
    write_idx,
)
from polytrain.data.registry import FileSpec, SplitSpec
from polytrain.errors import ConfigError, DataError

FIXTURES = Path(__file__).parents[1] / "fixtures"
DEBIAN_FASHION = Path("/usr/share/datasets/fashion-mnist")
TINY = "tiny-mnist"


def md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def leftovers(directory: Path) -> list[str]:
    """Temp files a download or atomic write may have left behind."""
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("."))


@pytest.fixture(autouse=True)
def isolated_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No real cache, no POLYTRAIN_DATA, no proxies for the loopback server."""
    for key in list(os.environ):
        if key.startswith("POLYTRAIN_MIRROR_") or key.lower().endswith("_proxy"):
            monkeypatch.delenv(key)
    monkeypatch.delenv("POLYTRAIN_DATA", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")


# --------------------------------------------------------------------------- tiny dataset


def tiny_arrays(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
    labels = rng.integers(0, 10, size=n, dtype=np.uint8)
    return images, labels


def tiny_bytes() -> dict[str, bytes]:
    """Uncompressed IDX content of a 40/20-sample dataset in MNIST file naming."""
    from polytrain.data.idx import encode_idx

    out = {}
    for prefix, n, seed in (("train", 40, 1), ("t10k", 20, 2)):
        images, labels = tiny_arrays(n, seed)
        out[f"{prefix}-images-idx3-ubyte"] = encode_idx(images)
        out[f"{prefix}-labels-idx1-ubyte"] = encode_idx(labels)
    return out


def tiny_spec(mirrors: tuple[str, ...] = (), name: str = TINY) -> DatasetSpec:
    """A registry entry for the tiny dataset: the checksum table is a parameter."""
    content = tiny_bytes()

    def split(split: str, prefix: str, n: int) -> SplitSpec:
        files = [
            FileSpec(f"{prefix}-{kind}.gz", Checksums(md5=md5(content[f"{prefix}-{kind}"])))
            for kind in ("images-idx3-ubyte", "labels-idx1-ubyte")
        ]
        return SplitSpec(split, files[0], files[1], n)

    return DatasetSpec(
        name=name,
        title="tiny test set",
        splits={"train": split("train", "train", 40), "test": split("test", "t10k", 20)},
        mirrors=mirrors,
        classes=tuple(str(i) for i in range(10)),
    )


def write_tiny(directory: Path, *, compress: bool = True) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for raw_name, data in tiny_bytes().items():
        if compress:
            (directory / f"{raw_name}.gz").write_bytes(gzip.compress(data, mtime=0))
        else:
            (directory / raw_name).write_bytes(data)
    return directory


# --------------------------------------------------------------------------- IDX


@pytest.mark.parametrize("compress", [False, True])
@pytest.mark.parametrize("dtype", ["uint8", "int8", "int16", "int32", "float32", "float64"])
def test_idx_round_trip(tmp_path: Path, dtype: str, compress: bool) -> None:
    array = (np.arange(2 * 3 * 5) - 7).astype(dtype).reshape(2, 3, 5)
    if dtype == "uint8":
        array = np.arange(30, dtype=np.uint8).reshape(2, 3, 5)
    path = tmp_path / "a.idx"
    write_idx(path, array, compress=compress)
    assert (path.read_bytes()[:2] == b"\x1f\x8b") is compress
    back = read_idx(path)
    assert back.dtype == np.dtype(dtype) and back.dtype.isnative
    np.testing.assert_array_equal(back, array)
    assert back.flags.writeable
    assert leftovers(tmp_path) == []


def test_idx_gzip_detected_by_magic_not_suffix(tmp_path: Path) -> None:
    labels = np.arange(10, dtype=np.uint8)
    write_idx(tmp_path / "labels.gz", labels, compress=False)  # raw despite the suffix
    write_idx(tmp_path / "labels-raw", labels, compress=True)  # gzip without the suffix
    np.testing.assert_array_equal(read_idx(tmp_path / "labels.gz"), labels)
    np.testing.assert_array_equal(read_idx(tmp_path / "labels-raw"), labels)


def test_write_idx_rejects_unsupported_dtype(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="int64"):
        write_idx(tmp_path / "x", np.zeros(3, dtype=np.int64))


def _header(code: int, *dims: int) -> bytes:
    return bytes([0, 0, code, len(dims)]) + b"".join(d.to_bytes(4, "big") for d in dims)


BAD_IDX = {
    "wrong-magic": (b"\x01\x02\x08\x01" + (3).to_bytes(4, "big") + b"abc", "expected 0x00 0x00"),
    "unknown-type": (_header(0x0A, 3) + b"abc", "unknown IDX type code 0x0a"),
    "too-short": (b"\x00\x00", "too short"),
    "truncated-header": (_header(0x08, 3, 4)[:10], "truncated IDX header"),
    "truncated": (_header(0x08, 10, 28, 28) + bytes(7000), "7840 payload bytes, but only 7000"),
    "trailing": (_header(0x08, 3) + b"abcde", "2 unexpected trailing bytes"),
}


@pytest.mark.parametrize("compress", [False, True])
@pytest.mark.parametrize("case", sorted(BAD_IDX))
def test_idx_bad_input_names_the_file(tmp_path: Path, case: str, compress: bool) -> None:
    data, expected = BAD_IDX[case]
    path = tmp_path / f"{case}-idx-ubyte"
    path.write_bytes(gzip.compress(data) if compress else data)
    with pytest.raises(DataError, match=expected) as info:
        read_idx(path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize("damage", ["truncated", "flipped", "garbage-after-magic"])
def test_idx_corrupt_gzip_is_a_data_error(tmp_path: Path, damage: str) -> None:
    good = gzip.compress(_header(0x08, 4000) + bytes(range(250)) * 16, mtime=0)
    if damage == "truncated":
        bad = good[: len(good) // 2]
    elif damage == "flipped":
        bad = good[:20] + bytes(b ^ 0xFF for b in good[20:40]) + good[40:]
    else:
        bad = b"\x1f\x8b" + b"not a gzip stream at all"
    path = tmp_path / "images-idx3-ubyte.gz"
    path.write_bytes(bad)
    with pytest.raises(DataError, match="corrupt gzip") as info:
        read_idx(path)
    assert str(path) in str(info.value)


def test_idx_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no such file"):
        read_idx(tmp_path / "nope.gz")


# --------------------------------------------------------------------------- ArrayDataset


def test_array_dataset_converts_once() -> None:
    images, labels = tiny_arrays(6)
    ds = ArrayDataset(images, labels, num_classes=10)
    assert ArrayDataset(images, labels).num_classes == int(labels.max()) + 1
    assert len(ds) == 6 and ds.num_classes == 10 and ds.image_shape == (1, 28, 28)
    assert ds.x is ds.x
    assert ds.x.dtype == np.float32 and ds.x.shape == (6, 1, 28, 28) and ds.x.flags.c_contiguous
    np.testing.assert_array_equal(ds.x[:, 0], images.astype(np.float32) / np.float32(255))
    assert ds.y.dtype == np.int64
    floats = np.random.default_rng(0).random((4, 3, 8, 8))
    fds = ArrayDataset(floats, np.arange(4), num_classes=5)
    np.testing.assert_array_equal(fds.x, floats.astype(np.float32))


def test_array_dataset_count_mismatch_names_the_source() -> None:
    images, labels = tiny_arrays(6)
    with pytest.raises(DataError, match="6 images but 5 labels") as info:
        ArrayDataset(images, labels[:5], source="t10k-labels-idx1-ubyte.gz")
    assert "t10k-labels-idx1-ubyte.gz" in str(info.value)


def test_array_dataset_rejects_bad_labels() -> None:
    images, _ = tiny_arrays(3)
    with pytest.raises(DataError, match=r"0\.\.9"):
        ArrayDataset(images, np.array([0, 10, 2]), num_classes=10)
    with pytest.raises(DataError, match="integer"):
        ArrayDataset(images, np.array([0.0, 1.0, 2.0]))
    with pytest.raises(DataError, match="uint8"):
        ArrayDataset(np.zeros((3, 4), np.uint8), np.arange(3))


def test_load_dataset_count_mismatch_names_the_files(tmp_path: Path) -> None:
    directory = write_tiny(tmp_path / "data")
    write_idx(directory / "t10k-labels-idx1-ubyte.gz", np.zeros(19, np.uint8), compress=True)
    with pytest.raises(DataError, match="20 images but 19 labels") as info:
        load_dataset(tiny_spec(), "test", directory, download=False)
    assert "t10k-labels-idx1-ubyte.gz" in str(info.value)
    with pytest.raises(DataError, match="checksum mismatch") as info:
        load_dataset(tiny_spec(), "test", directory, download=False, verify=True)
    assert "t10k-labels-idx1-ubyte.gz" in str(info.value)


def test_subset_and_split() -> None:
    images, labels = tiny_arrays(50)
    ds = ArrayDataset(images, labels)
    np.testing.assert_array_equal(ds.subset(7).y, labels[:7])
    train, val = ds.split(0.2, seed=3)
    assert (len(train), len(val)) == (40, 10)
    again_train, again_val = ds.split(0.2, seed=3)
    np.testing.assert_array_equal(train.x, again_train.x)
    np.testing.assert_array_equal(val.y, again_val.y)
    both = np.concatenate([train.x, val.x]).reshape(50, -1)
    assert len({row.tobytes() for row in both}) == 50  # disjoint and covering
    assert not np.array_equal(ds.split(0.2, seed=4)[1].x, val.x)
    with pytest.raises(ConfigError):
        ds.split(1.0)


# --------------------------------------------------------------------------- registry


def test_registry() -> None:
    assert dataset_names() == ["fashion-mnist", "mnist"]
    fashion = get_dataset("fashion-mnist")
    assert fashion.classes[0] == "T-shirt/top" and fashion.classes[-1] == "Ankle boot"
    assert get_dataset("MNIST").classes == tuple("0123456789")
    assert fashion.split("train").images.filename == "train-images-idx3-ubyte.gz"
    assert locate.mirror_env_var(fashion) == "POLYTRAIN_MIRROR_FASHION_MNIST"
    with pytest.raises(ConfigError, match="fashion-mnist, mnist"):
        get_dataset("cifar10")
    with pytest.raises(ConfigError, match="fashion-mnist, mnist"):
        load_dataset("cifar10", "train")
    with pytest.raises(ConfigError, match="train, test"):
        load_dataset("mnist", "validation")


def test_mirror_env_override(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = get_dataset("fashion-mnist")
    assert locate.mirror_urls(spec)[0].startswith("http://fashion-mnist.s3")
    monkeypatch.setenv("POLYTRAIN_MIRROR_FASHION_MNIST", "http://a/x/, http://b/")
    assert locate.file_urls(spec, "f.gz") == ["http://a/x/f.gz", "http://b/f.gz"]


def test_importing_the_package_is_cheap() -> None:
    code = (
        "import sys, polytrain.data, polytrain.data.locate; "
        "assert 'polytrain.data.download' not in sys.modules; "
        "assert 'polytrain.data.loader' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# --------------------------------------------------------------------------- download


class _Handler(http.server.SimpleHTTPRequestHandler):
    """Static files, plus /short/* (declares more bytes than sent) and /slow/*."""

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        if self.path.startswith("/slow/"):
            time.sleep(1.0)
        if self.path.startswith("/short/"):
            body = b"\x1f\x8b partial"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body) + 1000))
            self.end_headers()
            self.wfile.write(body)
            return
        super().do_GET()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """An HTTP server on 127.0.0.1 serving ``root``: (base URL, root)."""
    root = tmp_path / "www"
    root.mkdir()

    httpd = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(_Handler, directory=str(root))
    )
    httpd.block_on_close = False  # the /slow/ handler may outlive the test
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", root
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)


@pytest.fixture
def mirrors(server: tuple[str, Path]) -> dict[str, str]:
    """Base URLs: ``good`` (the tiny dataset), ``corrupt`` (damaged), ``empty`` (404s)."""
    base, root = server
    write_tiny(root / "good")
    corrupt = write_tiny(root / "corrupt")
    for path in corrupt.iterdir():
        data = bytearray(gzip.decompress(path.read_bytes()))
        data[-1] ^= 0xFF
        path.write_bytes(gzip.compress(bytes(data)))
    (root / "empty").mkdir()
    return {name: f"{base}/{name}/" for name in ("good", "corrupt", "empty", "short", "slow")}


def _labels_checks() -> tuple[str, Checksums]:
    spec = tiny_spec()
    file = spec.split("test").labels
    return file.filename, file.checks


@pytest.mark.parametrize("check", ["content", "gz"])
def test_download_success(tmp_path: Path, mirrors: dict[str, str], check: str) -> None:
    filename, checks = _labels_checks()
    if check == "gz":
        gz_bytes = gzip.compress(tiny_bytes()["t10k-labels-idx1-ubyte"], mtime=0)
        checks = Checksums(gz_md5=md5(gz_bytes))
    dest = tmp_path / "dl" / filename
    assert download_file([mirrors["good"] + filename], dest, checks, timeout=10) == dest
    assert read_idx(dest).shape == (20,)
    assert leftovers(dest.parent) == []


def test_download_corrupt_payload_leaves_nothing(tmp_path: Path, mirrors: dict[str, str]) -> None:
    filename, checks = _labels_checks()
    dest = tmp_path / "dl" / filename
    url = mirrors["corrupt"] + filename
    with pytest.raises(DataError, match="checksum mismatch") as info:
        download_file([url], dest, checks, timeout=10)
    assert url in str(info.value) and str(checks.md5) in str(info.value)
    assert not dest.exists() and leftovers(dest.parent) == []


def test_download_falls_back_to_second_mirror(tmp_path: Path, mirrors: dict[str, str]) -> None:
    filename, checks = _labels_checks()
    dest = tmp_path / filename
    download_file([mirrors["empty"] + filename, mirrors["good"] + filename], dest, checks, 10)
    assert read_idx(dest).shape == (20,)


def test_download_all_mirrors_bad(tmp_path: Path, mirrors: dict[str, str]) -> None:
    filename, checks = _labels_checks()
    dest = tmp_path / filename
    urls = [mirrors[m] + filename for m in ("empty", "corrupt", "short", "slow")]
    urls.append("http://127.0.0.1:9/" + filename)  # nothing listens on the discard port
    with pytest.raises(DataError) as info:
        download_file(urls, dest, checks, timeout=0.3)
    message = str(info.value)
    lines = {url: next(line for line in message.splitlines() if url in line) for url in urls}
    assert "HTTP error 404" in lines[urls[0]]
    assert "checksum mismatch" in lines[urls[1]]
    assert "closed early" in lines[urls[2]]
    assert "timed out" in lines[urls[3]]
    assert "cannot connect" in lines[urls[4]]
    assert not dest.exists() and leftovers(tmp_path) == []


def test_download_interrupted_leaves_nothing(
    tmp_path: Path, mirrors: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    filename, checks = _labels_checks()

    def interrupt(fd: int) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fsync", interrupt)
    dest = tmp_path / "dl" / filename
    with pytest.raises(KeyboardInterrupt):
        download_file([mirrors["good"] + filename], dest, checks, 10)
    assert list(dest.parent.iterdir()) == []


def test_load_dataset_downloads_into_cache(
    tmp_path: Path, mirrors: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = tiny_spec()
    with pytest.raises(DataError, match=f"polytrain data --download {TINY}"):
        load_dataset(spec, "train", download=False)
    monkeypatch.setenv("POLYTRAIN_MIRROR_TINY_MNIST", f"{mirrors['empty']},{mirrors['good']}")
    ds = load_dataset(spec, "train", verify=True)
    assert len(ds) == 40
    report = locate_dataset(spec)
    assert report.location("train").rule == "user cache"
    assert report.location("train").directory == tmp_path / "xdg-cache" / "polytrain" / TINY
    assert not report.location("test").found
    monkeypatch.delenv("POLYTRAIN_MIRROR_TINY_MNIST")
    assert len(load_dataset(spec, "train", download=False)) == 40


def test_load_dataset_download_failure_says_how_to_fix(
    tmp_path: Path, mirrors: dict[str, str]
) -> None:
    spec = tiny_spec(mirrors=(mirrors["corrupt"],))
    with pytest.raises(DataError, match=r"(?s)checksum mismatch.*drop --data-dir") as info:
        load_dataset(spec, "test", data_dir=tmp_path / "d", download=True)
    assert mirrors["corrupt"] in str(info.value)
    assert leftovers(tmp_path / "d" / TINY) == []


# --------------------------------------------------------------------------- locate


def test_locate_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = tiny_spec()
    explicit = write_tiny(tmp_path / "explicit")
    env_dir = tmp_path / "env"
    write_tiny(env_dir / TINY)
    home = tmp_path / "home"
    write_tiny(home / ".cache" / "polytrain" / TINY)
    monkeypatch.setenv("POLYTRAIN_DATA", str(env_dir))
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(home))

    def where(data_dir: Path | None) -> tuple[str | None, Path | None]:
        loc = locate_dataset(spec, data_dir, system_dirs=[]).location("train")
        return loc.rule, loc.directory

    assert where(explicit) == ("--data-dir", explicit)
    assert where(None) == ("$POLYTRAIN_DATA", env_dir / TINY)
    monkeypatch.delenv("POLYTRAIN_DATA")
    assert where(None) == ("user cache", home / ".cache" / "polytrain" / TINY)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "elsewhere"))
    assert where(None) == (None, None)
    assert where(tmp_path / "nowhere") == (None, None)
    write_tiny(tmp_path / "elsewhere" / "polytrain" / TINY, compress=False)  # raw names
    assert where(None) == ("user cache", tmp_path / "elsewhere" / "polytrain" / TINY)


def test_locate_name_subdir_first_and_pairs_only(tmp_path: Path) -> None:
    spec = tiny_spec()
    root = write_tiny(tmp_path / "root")
    write_tiny(root / TINY)
    loc = locate_dataset(spec, root, system_dirs=[]).location("test")
    assert loc.directory == root / TINY
    # A lone images file does not make a split, and the pair in root/ is not read instead:
    # every split comes from root/TINY/, the first folder holding the dataset's files.
    (root / TINY / "t10k-labels-idx1-ubyte.gz").unlink()
    report = locate_dataset(spec, root, system_dirs=[])
    loc = report.location("test")
    assert not loc.found and loc.lone_files == (root / TINY / "t10k-images-idx3-ubyte.gz",)
    assert report.location("train").directory == root / TINY
    with pytest.raises(DataError) as info:
        load_dataset(spec, "test", data_dir=root)
    message = str(info.value)
    assert "\n" not in message and f"no {TINY} test split in {root / TINY}" in message
    assert "without its partner" in message and f"{root} has them" in message


def test_report_for_the_cli(tmp_path: Path) -> None:
    report = locate_dataset("fashion-mnist", system_dirs=[tmp_path / "none"])
    assert not report.complete
    text = report.format()
    assert "apt-get install dataset-fashion-mnist" in text
    assert "polytrain data --download fashion-mnist" in text
    assert "--data-dir DIR" in text and "train-images-idx3-ubyte.gz" in text
    as_dict = report.as_dict()
    assert as_dict["complete"] is False and as_dict["name"] == "fashion-mnist"
    with pytest.raises(DataError, match="apt-get install dataset-fashion-mnist"):
        load_dataset("fashion-mnist", "test", download=False, system_dirs=[])


# --------------------------------------------------------------------------- loader


def _loader_data(n: int = 23) -> ArrayDataset:
    images, labels = tiny_arrays(n, seed=5)
    images[:, 0, 0] = np.arange(n)  # sample id in the first pixel
    return ArrayDataset(images, labels)


def _ids(x: np.ndarray) -> list[int]:
    return [round(v) for v in x[:, 0, 0, 0] * 255]


def test_loader_order_is_contract_9() -> None:
    ds = _loader_data()
    loader = BatchLoader(ds, 8, seed=11)
    assert len(loader) == 3 and loader.global_batch_sizes(0) == [8, 8, 7]
    for epoch in (0, 1):
        batches = list(loader.epoch(epoch))
        ids = [i for x, _ in batches for i in _ids(x)]
        assert ids == list(np.random.default_rng([11, epoch]).permutation(23))
        for x, y in batches:
            assert x.dtype == np.float32 and y.dtype == np.int64
            assert x.shape == (len(y), 1, 28, 28)
            assert x.flags.c_contiguous and y.flags.c_contiguous
            np.testing.assert_array_equal(y, ds.y[_ids(x)])
    first = [_ids(x) for x, _ in BatchLoader(ds, 8, seed=11).epoch(0)]
    assert first == [_ids(x) for x, _ in loader.epoch(0)]
    assert first != [_ids(x) for x, _ in loader.epoch(1)]
    x, _ = next(BatchLoader(ds, 8, shuffle=False).epoch(3))
    assert _ids(x) == list(range(8))


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_rank_slices_make_the_global_batch(world_size: int) -> None:
    ds = _loader_data()
    reference = [_ids(x) for x, _ in BatchLoader(ds, 8, seed=2).epoch(4)]
    per_rank = [
        [_ids(x) for x, _ in BatchLoader(ds, 8, seed=2, rank=r, world_size=world_size).epoch(4)]
        for r in range(world_size)
    ]
    for step, batch in enumerate(reference):
        assert [i for rank in per_rank for i in rank[step]] == batch
    loader = BatchLoader(ds, 8, seed=2, rank=0, world_size=world_size)
    assert loader.global_batch_sizes(4) == [8, 8, 7]
    assert sum(loader.local_batch_sizes()) == len([i for b in per_rank[0] for i in b])


def test_drop_last_and_small_last_batch() -> None:
    ds = _loader_data(22)  # last global batch of 6
    loader = BatchLoader(ds, 8, drop_last=True)
    assert len(loader) == 2 and loader.global_batch_sizes(0) == [8, 8]
    assert sum(len(y) for _, y in loader.epoch(0)) == 16
    with pytest.raises(ConfigError, match=r"last global batch has 6 samples.*world_size 7"):
        BatchLoader(ds, 8, rank=0, world_size=7)
    assert len(BatchLoader(ds, 8, rank=6, world_size=7, drop_last=True)) == 2
    with pytest.raises(ConfigError, match="batch_size 2 is smaller than world_size 3"):
        BatchLoader(ds, 2, world_size=3)
    with pytest.raises(ConfigError, match="rank"):
        BatchLoader(ds, 8, rank=2, world_size=2)


def test_start_step_and_epoch_iteration() -> None:
    ds = _loader_data()
    loader = BatchLoader(ds, 4, seed=1, start_epoch=5)
    full = [_ids(x) for x, _ in loader.epoch(5)]
    resumed = loader.epoch(5, start_step=2)
    assert resumed.step == 2
    assert [_ids(x) for x, _ in resumed] == full[2:]
    assert list(loader.epoch(5, start_step=len(loader))) == []
    with pytest.raises(ConfigError):
        loader.epoch(5, start_step=len(loader) + 1)
    assert [_ids(x) for x, _ in loader] == full  # iterating the loader runs start_epoch ...
    assert [_ids(x) for x, _ in loader] == [_ids(x) for x, _ in loader.epoch(6)]  # ... then 6


def _prefetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("polytrain-prefetch")]


def test_prefetch_is_bitwise_identical_and_stops_cleanly() -> None:
    ds = _loader_data(101)
    plain = list(BatchLoader(ds, 8, seed=9, rank=1, world_size=3).epoch(2, start_step=1))
    fetched = list(BatchLoader(ds, 8, seed=9, rank=1, world_size=3, prefetch=3).epoch(2, 1))
    assert len(plain) == len(fetched) == 12
    for (x0, y0), (x1, y1) in zip(plain, fetched, strict=True):
        assert x0.tobytes() == x1.tobytes() and y0.tobytes() == y1.tobytes()
    arrays = [a for batch in fetched for a in batch] + [ds.x, ds.y]
    assert not any(np.shares_memory(a, b) for a, b in itertools.combinations(arrays, 2))
    assert _prefetch_threads() == []

    loader = BatchLoader(ds, 4, prefetch=2)
    for _ in loader.epoch(0):
        break  # the iterator is collected here; its thread must stop
    assert _prefetch_threads() == []
    iterator = loader.epoch(1)
    next(iterator)
    assert len(_prefetch_threads()) == 1
    iterator.close()
    assert _prefetch_threads() == []
    with loader.epoch(2) as iterator:
        next(iterator)
    assert _prefetch_threads() == []


def test_prefetch_reraises_producer_errors() -> None:
    class Failing(BatchLoader):
        def indices(self, order: np.ndarray, step: int) -> np.ndarray:
            if step == 2:
                raise ValueError("boom at step 2")
            return super().indices(order, step)

    iterator = Failing(_loader_data(), 4, prefetch=2).epoch(0)
    assert len(list(zip(range(2), iterator, strict=False))) == 2
    with pytest.raises(ValueError, match="boom at step 2"):
        next(iterator)
    assert _prefetch_threads() == []


# --------------------------------------------------------------------------- real data


@pytest.mark.slow
@pytest.mark.skipif(
    not (DEBIAN_FASHION / "train-images-idx3-ubyte.gz").exists(),
    reason="Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)",
)
def test_fashion_mnist_from_debian_package() -> None:
    report = locate_dataset("fashion-mnist")
    assert report.complete and report.location("train").rule == "system datasets"
    train = load_dataset("fashion-mnist", "train", download=False, verify=True)
    test = load_dataset("fashion-mnist", "test", download=False, verify=True)
    assert (len(train), len(test)) == (60000, 10000)
    assert train.classes is not None and train.classes[9] == "Ankle boot"
    assert np.bincount(test.y).tolist() == [1000] * 10


def test_mnist_t10k_fixture() -> None:
    directory = FIXTURES / "mnist-t10k"
    for name, expected in (
        ("t10k-images-idx3-ubyte.gz", "2646ac647ad5339dbf082846283269ea"),
        ("t10k-labels-idx1-ubyte.gz", "27ae3e4e09519cfbb04c329615203637"),
    ):
        assert md5(gzip.decompress((directory / name).read_bytes())) == expected
    test = load_dataset("mnist", "test", data_dir=directory, download=False, verify=True)
    assert len(test) == 10000 and test.image_shape == (1, 28, 28)
    assert test.y[:10].tolist() == [7, 2, 1, 0, 4, 1, 4, 9, 5, 9]
    assert locate_dataset("mnist", directory).location("test").rule == "--data-dir"
