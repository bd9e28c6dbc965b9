"""The binarized cache: ids round-trip exactly through memmaps, the key decides reuse, and no
failure ever leaves a half-written cache (or a temporary directory) behind."""

from __future__ import annotations

import pickle
import socket
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from transformer_mt.data import binarized
from transformer_mt.data.binarized import (
    BinarizedPair,
    build_binarized,
    cache_key,
    dtype_for_vocab,
    load_binarized,
)
from transformer_mt.data.corpus import CleanConfig, iter_clean_pairs
from transformer_mt.errors import MTError

VOCAB = 1000


def _pairs(n: int, seed: int = 0, vocab: int = VOCAB) -> list[tuple[list[int], list[int]]]:
    rng = np.random.default_rng(seed)
    return [
        (
            rng.integers(0, vocab, rng.integers(0, 12)).tolist(),
            rng.integers(0, vocab, rng.integers(1, 12)).tolist(),
        )
        for _ in range(n)
    ]


def _leftovers(parent: Path) -> list[str]:
    """Temporary or set-aside directories a build may have left."""
    return sorted(p.name for p in parent.iterdir() if ".tmp-" in p.name or ".old-" in p.name)


def _assert_same(cache: BinarizedPair, pairs: list[tuple[list[int], list[int]]]) -> None:
    assert len(cache) == len(pairs)
    for i, (src, trg) in enumerate(pairs):
        got_src, got_trg = cache[i]
        assert got_src.tolist() == src and got_trg.tolist() == trg
    assert cache.src_lengths.tolist() == [len(s) for s, _ in pairs]
    assert cache.trg_lengths.tolist() == [len(t) for _, t in pairs]


def test_build_then_load_gives_identical_ids(tmp_path: Path) -> None:
    pairs = _pairs(200)
    out = tmp_path / "train"
    built = build_binarized(out, "k1", iter(pairs), VOCAB)
    _assert_same(built, pairs)
    loaded = load_binarized(out, "k1")
    assert loaded is not None
    _assert_same(loaded, pairs)
    assert loaded[-1][0].tolist() == pairs[-1][0]
    with pytest.raises(IndexError):
        loaded[200]
    assert sorted(p.name for p in out.iterdir()) == [
        "meta.json",
        "src_offsets.npy",
        "src_tokens.bin",
        "trg_offsets.npy",
        "trg_tokens.bin",
    ]
    assert _leftovers(tmp_path) == []


def test_ids_are_read_through_memmaps(tmp_path: Path) -> None:
    pairs = _pairs(20)
    build_binarized(tmp_path / "c", "k", pairs, VOCAB)
    cache = load_binarized(tmp_path / "c", "k")
    assert cache is not None
    assert isinstance(cache._src_tokens, np.memmap) and isinstance(cache._trg_tokens, np.memmap)
    assert isinstance(cache._src_offsets, np.memmap)
    src, trg = cache[3]
    assert isinstance(src, np.memmap) and isinstance(trg, np.memmap)
    assert not src.flags.writeable


def test_small_chunks_stream_across_many_writes(tmp_path: Path, monkeypatch) -> None:
    # A tiny chunk forces many flushes, as a corpus larger than RAM would.
    monkeypatch.setattr(binarized, "CHUNK_TOKENS", 7)
    pairs = _pairs(300, seed=3)
    _assert_same(build_binarized(tmp_path / "c", "k", pairs, VOCAB), pairs)


def test_dtype_follows_vocab_size(tmp_path: Path) -> None:
    assert dtype_for_vocab(65_536) == np.uint16
    assert dtype_for_vocab(65_537) == np.int32
    big = [([70_000, 0], [65_536]), ([1], [99_999])]
    cache = build_binarized(tmp_path / "big", "k", big, 100_000)
    assert cache.dtype == np.int32
    _assert_same(cache, big)
    assert build_binarized(tmp_path / "small", "k", _pairs(3), VOCAB).dtype == np.uint16


def test_other_key_or_missing_cache_loads_none(tmp_path: Path) -> None:
    assert load_binarized(tmp_path / "absent", "k") is None
    build_binarized(tmp_path / "c", "k1", _pairs(5), VOCAB)
    assert load_binarized(tmp_path / "c", "k2") is None
    assert load_binarized(tmp_path / "c", "k1") is not None


def test_damaged_cache_loads_none(tmp_path: Path) -> None:
    build_binarized(tmp_path / "c", "k", _pairs(50), VOCAB)
    tokens = tmp_path / "c" / "trg_tokens.bin"
    tokens.write_bytes(tokens.read_bytes()[:-2])
    assert load_binarized(tmp_path / "c", "k") is None
    build_binarized(tmp_path / "d", "k", _pairs(5), VOCAB)
    (tmp_path / "d" / "meta.json").write_text("{not json")
    assert load_binarized(tmp_path / "d", "k") is None


def test_rebuild_replaces_the_old_cache(tmp_path: Path) -> None:
    out = tmp_path / "c"
    build_binarized(out, "old", _pairs(10, seed=1), VOCAB)
    new_pairs = _pairs(7, seed=2)
    build_binarized(out, "new", new_pairs, VOCAB)
    assert load_binarized(out, "old") is None
    new = load_binarized(out, "new")
    assert new is not None
    _assert_same(new, new_pairs)
    assert _leftovers(tmp_path) == []


def _failing(pairs: list[tuple[list[int], list[int]]], after: int) -> Iterator:
    for i, pair in enumerate(pairs):
        if i == after:
            raise RuntimeError("boom in the middle")
        yield pair


def test_failed_build_leaves_nothing(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(binarized, "CHUNK_TOKENS", 5)  # so files were really being written
    with pytest.raises(RuntimeError, match="boom"):
        build_binarized(tmp_path / "c", "k", _failing(_pairs(50), after=30), VOCAB)
    assert list(tmp_path.iterdir()) == []


def test_failed_rebuild_keeps_the_old_cache(tmp_path: Path) -> None:
    old_pairs = _pairs(10, seed=1)
    build_binarized(tmp_path / "c", "old", old_pairs, VOCAB)
    with pytest.raises(RuntimeError):
        build_binarized(tmp_path / "c", "new", _failing(_pairs(50), after=30), VOCAB)
    assert load_binarized(tmp_path / "c", "new") is None
    old = load_binarized(tmp_path / "c", "old")
    assert old is not None
    _assert_same(old, old_pairs)
    assert _leftovers(tmp_path) == []


def test_out_of_vocabulary_id_fails_without_a_cache(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="outside the vocabulary"):
        build_binarized(tmp_path / "c", "k", [([1, 2], [3]), ([VOCAB], [0])], VOCAB)
    assert list(tmp_path.iterdir()) == []


def test_empty_corpus_round_trips(tmp_path: Path) -> None:
    cache = build_binarized(tmp_path / "c", "k", [], VOCAB)
    assert len(cache) == 0 and cache.src_lengths.size == 0


def test_pickle_reopens_the_memmaps(tmp_path: Path) -> None:
    pairs = _pairs(30)
    cache = build_binarized(tmp_path / "c", "k", pairs, VOCAB)
    data = pickle.dumps(cache)
    assert len(data) < 1000  # the path and key, not the ids
    again = pickle.loads(data)
    _assert_same(again, pairs)
    assert isinstance(again[0][0], np.memmap)


def test_cache_key_hashes_contents_and_settings(tmp_path: Path) -> None:
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_bytes(b"hello\n" * 100_000)  # several hash chunks
    b.write_bytes(b"hello\n" * 100_000)
    settings = {"vocab_size": 8000, "model_type": "unigram"}
    key = cache_key(a, settings)
    assert len(key) == 64
    assert cache_key(b, dict(reversed(settings.items()))) == key  # same bytes, same settings
    assert cache_key(a, {**settings, "vocab_size": 8001}) != key
    b.write_bytes(b"hello\n" * 99_999 + b"hellO\n")
    assert cache_key(b, settings) != key
    assert cache_key("ab", "c") != cache_key("a", "bc")
    assert cache_key("x", "y") != cache_key("y", "x")
    assert cache_key("x") != cache_key(b"x")
    with pytest.raises(MTError, match=r"missing\.txt: file not found"):
        cache_key(tmp_path / "missing.txt")


def _prepare(src: Path, trg: Path, out: Path, cfg: CleanConfig | None = None) -> BinarizedPair:
    """Clean -> encode (a toy byte-level encoder) -> binarize, streaming, as preparation does."""
    key = cache_key(src, trg, {"clean": "default"})
    encoded = (
        (list(s.encode("utf-8")), list(t.encode("utf-8")))
        for s, t in iter_clean_pairs(src, trg, cfg)
    )
    return build_binarized(out, key, encoded, 256)


@pytest.mark.parametrize(
    ("src_bytes", "trg_bytes", "message"),
    [
        (b"a\nb\nc\n", b"A\nB\n", r"c\.de:3: line has no partner"),
        (b"a\nb\nc\xff\n", b"A\nB\nC\n", r"c\.de:3: invalid UTF-8"),
        (b"a\nb\nc\n", b"A\n\xc3(\nC\n", r"c\.en:2: invalid UTF-8"),
    ],
)
def test_preparation_errors_leave_no_cache(
    tmp_path: Path, src_bytes: bytes, trg_bytes: bytes, message: str
) -> None:
    src, trg = tmp_path / "c.de", tmp_path / "c.en"
    src.write_bytes(src_bytes)
    trg.write_bytes(trg_bytes)
    cache_dir = tmp_path / "cache"
    cache_dir.mkdir()
    # The bad line comes after good pairs were already written to the temporary directory.
    with pytest.raises(MTError, match=message):
        _prepare(src, trg, cache_dir / "train")
    assert list(cache_dir.iterdir()) == []


def test_preparation_then_reuse(tmp_path: Path) -> None:
    src, trg = tmp_path / "c.de", tmp_path / "c.en"
    src.write_bytes("Hund\r\n\nüber\n".encode())
    trg.write_bytes(b"dog\nnothing\nover\n")
    cache = _prepare(src, trg, tmp_path / "train")
    assert [bytes(cache[i][0].tolist()).decode() for i in range(len(cache))] == ["Hund", "über"]
    key = cache_key(src, trg, {"clean": "default"})
    assert load_binarized(tmp_path / "train", key) is not None
    trg.write_bytes(b"dog\nnothing\nacross\n")  # any change to an input: a new key, a rebuild
    assert load_binarized(tmp_path / "train", cache_key(src, trg, {"clean": "default"})) is None


# --- offsets without a memory map, full disks, builds left by killed runs ------------------------


def test_offsets_are_the_npy_file_numpy_writes(tmp_path: Path, monkeypatch) -> None:
    """The offsets are written a chunk at a time with plain writes (a mapped write on a full disk
    is SIGBUS); the file is byte for byte what np.save writes, whatever the chunk size."""
    import io

    pairs = _pairs(500, seed=3)
    monkeypatch.setattr(binarized, "CHUNK_TOKENS", 7)  # many chunks, one partial
    data = build_binarized(tmp_path / "c", "k", pairs, VOCAB)
    for side, lengths in (("src", data.src_lengths), ("trg", data.trg_lengths)):
        expected = io.BytesIO()
        np.save(expected, np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64))
        assert (tmp_path / "c" / f"{side}_offsets.npy").read_bytes() == expected.getvalue()
    empty = build_binarized(tmp_path / "e", "k", [], VOCAB)
    assert len(empty) == 0 and np.load(tmp_path / "e" / "src_offsets.npy").tolist() == [0]


def test_disk_full_is_one_line_and_leaves_nothing(tmp_path: Path, monkeypatch) -> None:
    """ENOSPC from a write (simulated here; tests/test_disk_full.py fills a real tmpfs)."""
    import errno

    build_binarized(tmp_path / "c", "old", _pairs(5), VOCAB)

    def full(self, *args):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(binarized._SideWriter, "finish", full)
    with pytest.raises(MTError) as err:
        build_binarized(tmp_path / "c", "new", _pairs(50), VOCAB)
    message = str(err.value)
    assert message.startswith(f"{tmp_path / 'c'}: no space left on device while writing")
    assert "it needs about " in message and " are free" in message and "\n" not in message
    assert _leftovers(tmp_path) == []
    assert load_binarized(tmp_path / "c", "old") is not None  # the old cache is kept


def _dead_pid() -> int:
    import subprocess
    import sys

    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], check=True,
                           capture_output=True, text=True)  # fmt: skip
    return int(child.stdout)


def test_builds_left_by_killed_runs_are_removed_by_the_next_build(tmp_path: Path) -> None:
    import os

    dead, here = _dead_pid(), socket.gethostname()
    left = {
        f"c.tmp-{here}-{dead}": ["src_tokens.bin", "src_lengths.tmp"],
        f"c.tmp-{dead}": ["src_tokens.bin"],  # an older version's name: no host, so this one
        # Set aside by a rebuild killed before it deleted the old cache: prepare's report too.
        f"other-train.old-{here}-{dead}": [
            "meta.json",
            "trg_offsets.npy",
            ".meta.json.x1.tmp",
            "clean_report.txt",
        ],
        f"c.tmp-{here}-{os.getppid()}": ["src_tokens.bin"],  # its process runs: in progress
        f"c.tmp-other-host.lan-{dead}": ["src_tokens.bin"],  # another host's: cannot tell
        f"mine.tmp-{here}-{dead}": ["notes.txt"],  # not a build's files: not ours to delete
        f"file.tmp-{here}-{dead}": None,  # a file, not a directory
        "c.lock": None,  # a lock file (data.locking): only the process holding it deletes it
    }
    for name, files in left.items():
        if files is None:
            (tmp_path / name).write_text("x")
            continue
        (tmp_path / name).mkdir()
        for f in files:
            (tmp_path / name / f).write_bytes(b"\0" * 8)
    build_binarized(tmp_path / "c", "k", _pairs(5), VOCAB)
    remaining = sorted(p.name for p in tmp_path.iterdir())
    assert remaining == sorted(
        [
            "c",
            f"c.tmp-{here}-{os.getppid()}",
            f"c.tmp-other-host.lan-{dead}",
            f"mine.tmp-{here}-{dead}",
            f"file.tmp-{here}-{dead}",
            "c.lock",
        ]
    )


_KILLED_BUILD = """
import sys, time
from pathlib import Path
from transformer_mt.data.binarized import build_binarized

def pairs():
    for i in range(10):
        yield [4, 5], [6]
    print("writing", flush=True)
    time.sleep(60)
    yield [4], [5]

build_binarized(Path(sys.argv[1]), "k", pairs(), 10)
"""


def test_a_build_killed_by_sigkill_is_cleaned_up_next_time(tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", _KILLED_BUILD, str(tmp_path / "c")],
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "writing\n"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stdout.close()  # type: ignore[union-attr]
    assert _leftovers(tmp_path) == [f"c.tmp-{socket.gethostname()}-{proc.pid}"]
    build_binarized(tmp_path / "c", "k", _pairs(5), VOCAB)
    assert _leftovers(tmp_path) == []
