"""A binarized cache of token ids on disk, read through numpy memmaps.

One directory per dataset split holds both sides of the parallel corpus::

    <out_dir>/src_tokens.bin    every source sentence's ids, concatenated (raw uint16 or int32)
    <out_dir>/src_offsets.npy   int64, count + 1 entries: sentence i is tokens[off[i]:off[i+1]]
    <out_dir>/trg_tokens.bin    the same for the target side
    <out_dir>/trg_offsets.npy
    <out_dir>/meta.json         format, key, dtype, vocab_size, count, n_tokens per side

The ``key`` is a hash of the inputs and the settings (:func:`cache_key`): a cache whose key differs
is stale and :func:`load_binarized` returns None, so the caller rebuilds. A build is written in a
temporary directory beside ``out_dir``, with ``meta.json`` last, and renamed into place only when
complete: an error or Ctrl-C leaves the old cache (or nothing), never a half-written one. A full disk
is one :class:`MTError` naming the directory and the space, and the temporary directory is removed;
one left by a killed build (its process gone) is removed by the next build beside it.

Neither building nor reading holds the token ids in memory: the writer appends them to the
``.bin`` files in chunks, and the reader maps them (``np.memmap``, mode ``"r"``), so a corpus larger
than RAM works. Only the offsets (8 bytes a sentence) are needed in memory to batch by length.
The writer never writes through a memory map: on a full disk a mapped write kills the process
with SIGBUS, where a plain write raises ENOSPC.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import operator
import os
import re
import shutil
import socket
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from transformer_mt.errors import MTError
from transformer_mt.fileio import NO_SPACE, atomic_write

log = logging.getLogger(__name__)

# Bump when the layout changes: it is part of every key, so old caches are rebuilt, not misread.
FORMAT_VERSION = 1
META_FILE = "meta.json"
SIDES = ("src", "trg")
# Token ids buffered before a write to disk: 1 Mi ids is 2-4 MiB, small next to any model.
CHUNK_TOKENS = 1 << 20
HASH_CHUNK_BYTES = 1 << 20
REPORT_FILE = "clean_report.txt"
"""A text file a caller may keep in a cache directory beside the ids (data preparation's cleaning
report): it belongs to the cache, and goes with a leftover copy of it."""
# Every file a build writes in its directory, or its caller beside the ids: a leftover build
# directory is deleted only when it holds nothing else (the cache directory may be one the user
# shares with other files).
_BUILD_FILES = re.compile(
    r"(src|trg)_(tokens\.bin|lengths\.tmp|offsets\.npy)|meta\.json|"
    + re.escape(REPORT_FILE)
    + r"|\..*\.tmp"
)


def _hash_part(part: Any) -> bytes:
    """SHA-256 of one cache-key part, tagged with its kind so that ``"x"`` and ``b"x"`` differ."""
    sha = hashlib.sha256()
    if isinstance(part, Path):
        if not part.is_file():
            raise MTError(f"{part}: file not found; check the path in the config")
        sha.update(b"file\0")
        # Contents, not size and mtime: a copied or re-downloaded file keeps its cache, and an
        # edited file with a preserved mtime does not fool it. Streamed: files may exceed RAM.
        with part.open("rb") as f:
            while chunk := f.read(HASH_CHUNK_BYTES):
                sha.update(chunk)
    elif isinstance(part, bytes):
        sha.update(b"bytes\0" + part)
    elif isinstance(part, str):
        sha.update(b"str\0" + part.encode("utf-8"))
    else:
        # Settings: JSON with sorted keys, so dict order does not matter. Paths inside settings
        # hash by name; pass a file as its own Path part to hash its contents.
        sha.update(b"json\0" + json.dumps(part, sort_keys=True, default=str).encode("utf-8"))
    return sha.digest()


def cache_key(*parts: str | bytes | Path | dict[str, Any]) -> str:
    """A hex SHA-256 over files' contents and settings: equal exactly when every part is equal.

    Each part is hashed on its own and the digests are hashed in order, so the boundaries between
    parts count (``("ab", "c")`` and ``("a", "bc")`` differ) and so does their order.

    Args:
        parts: ``Path``: the file's bytes (streamed); ``str``/``bytes``: as given; ``dict`` (or
            any other JSON value): its JSON with sorted keys.

    Raises:
        MTError: a ``Path`` part is not an existing file.
    """
    sha = hashlib.sha256(f"transformer_mt.binarized/{FORMAT_VERSION}\0".encode())
    for part in parts:
        sha.update(_hash_part(part))
    return sha.hexdigest()


def dtype_for_vocab(vocab_size: int) -> np.dtype:
    """The smallest dtype for ids ``0 .. vocab_size - 1``: uint16 up to 65,536 ids, else int32."""
    if vocab_size < 1:
        raise ValueError(f"vocab_size must be positive, got {vocab_size}")
    return np.dtype(np.uint16 if vocab_size <= np.iinfo(np.uint16).max + 1 else np.int32)


class _SideWriter:
    """Appends one side's sentences to ``<side>_tokens.bin`` in chunks and records their lengths."""

    def __init__(self, directory: Path, side: str, dtype: np.dtype, vocab_size: int) -> None:
        self.directory, self.side, self.dtype, self.vocab_size = directory, side, dtype, vocab_size
        self.tokens_file: BinaryIO = (directory / f"{side}_tokens.bin").open("wb")
        # Lengths go to disk too, so that the writer's memory does not grow with the corpus.
        self.lengths_file: BinaryIO = (directory / f"{side}_lengths.tmp").open("wb")
        self.ids: list[int] = []
        self.lengths: list[int] = []
        self.count = 0
        self.n_tokens = 0

    def add(self, ids: Sequence[int] | np.ndarray) -> None:
        """Append one sentence's ids."""
        self.ids.extend(ids.tolist() if isinstance(ids, np.ndarray) else ids)
        self.lengths.append(len(ids))
        if len(self.ids) >= CHUNK_TOKENS:
            self.flush()

    def flush(self) -> None:
        """Write the buffered ids and lengths, checking that every id fits the vocabulary."""
        if self.ids:
            arr = np.asarray(self.ids, dtype=np.int64)
            # Out-of-range ids would wrap silently in uint16 and train on garbage: fail instead.
            lo, hi = int(arr.min()), int(arr.max())
            if lo < 0 or hi >= self.vocab_size:
                raise ValueError(
                    f"{self.side} token id {lo if lo < 0 else hi} outside the vocabulary "
                    f"[0, {self.vocab_size}) near sentence {self.count + len(self.lengths)}"
                )
            # file.write, not ndarray.tofile: tofile reports a full disk without its errno.
            self.tokens_file.write(arr.astype(self.dtype).tobytes())
            self.n_tokens += arr.size
        if self.lengths:
            self.lengths_file.write(np.asarray(self.lengths, dtype=np.int64).tobytes())
            self.count += len(self.lengths)
        self.ids, self.lengths = [], []

    def sizes(self) -> tuple[int, int]:
        """Bytes of (token ids, lengths) of the sentences added so far, written or buffered."""
        n_sentences = self.count + len(self.lengths)
        return (self.n_tokens + len(self.ids)) * self.dtype.itemsize, 8 * n_sentences

    def close(self) -> None:
        """Close both files (also after an error, so the temporary directory can be removed)."""
        self.tokens_file.close()
        self.lengths_file.close()

    def finish(self) -> None:
        """Flush, sync the ids to disk and turn the lengths into ``<side>_offsets.npy``."""
        self.flush()
        self.tokens_file.flush()
        os.fsync(self.tokens_file.fileno())
        self.close()
        lengths_path = self.directory / f"{self.side}_lengths.tmp"
        offsets_path = self.directory / f"{self.side}_offsets.npy"
        # The .npy file np.save would write, built a chunk of lengths at a time: the cumulative
        # sum carries over between chunks, so memory stays bounded whatever the corpus.
        descr = np.lib.format.dtype_to_descr(np.dtype(np.int64))
        header = {"descr": descr, "fortran_order": False, "shape": (self.count + 1,)}
        with offsets_path.open("wb") as out, lengths_path.open("rb") as lengths_file:
            np.lib.format.write_array_header_1_0(out, header)
            out.write(np.zeros(1, dtype=np.int64).tobytes())  # offsets[0]
            total = 0
            while chunk := lengths_file.read(CHUNK_TOKENS * 8):
                offsets = np.cumsum(np.frombuffer(chunk, dtype=np.int64)) + total
                out.write(offsets.tobytes())
                total = int(offsets[-1])
            out.flush()
            os.fsync(out.fileno())
        lengths_path.unlink()


def _write_meta(path: Path, meta: dict[str, Any]) -> None:
    """Write ``meta.json`` durably (synced to disk): it is the mark of a complete cache."""
    with atomic_write(path, "w", durable=True) as f:
        json.dump(meta, f, indent=2, sort_keys=True)
        f.write("\n")


def _pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` runs on this machine (one of another user counts as running)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _build_tag() -> str:
    """``<host>-<pid>``: whose build a ``.tmp-`` / ``.old-`` directory is.

    The host matters on a cache directory that several machines share: a process id means something
    on its own host only."""
    return f"{socket.gethostname()}-{os.getpid()}"


def remove_stale_builds(parent: Path) -> list[Path]:
    """Delete the temporary build directories that a killed build of this host left.

    Delete the ``<name>.tmp-<host>-<pid>`` / ``<name>.old-<host>-<pid>`` directories in
    ``parent`` that a killed build of this host left (its process no longer runs, or it had this
    process's id); return them. Names without a host (``<name>.tmp-<pid>``, older versions) count
    as this host's.

    A directory is deleted only if it holds nothing but a build's files, so that a cache
    directory shared with other files loses nothing else. Another host's leftovers stay: whether
    their process still runs cannot be seen from here.
    """
    removed = []
    here = socket.gethostname()
    for path in parent.iterdir() if parent.is_dir() else []:
        match = re.fullmatch(r".+?\.(?:tmp|old)-(?:(.+)-)?(\d+)", path.name)
        if not match or not path.is_dir() or path.is_symlink():
            continue
        host, pid = match.group(1), int(match.group(2))
        if host not in (None, here):
            continue
        if pid != os.getpid() and _pid_alive(pid):
            continue
        with contextlib.suppress(OSError):
            if all(_BUILD_FILES.fullmatch(p.name) and p.is_file() for p in path.iterdir()):
                shutil.rmtree(path)
                removed.append(path)
    return removed


def _space_needed(writers: list[_SideWriter]) -> int:
    """The most disk space the build of the sentences added so far takes at once.

    It counts every side's ids and, while a side's offsets are written, that side's lengths too
    (the offsets' size plus one int64 and the .npy header), with the lengths of the sides not yet
    finished."""
    if not writers:
        return 0
    sizes = [w.sizes() for w in writers]
    tokens = sum(t for t, _ in sizes)
    offsets = [n + 8 + 128 for _, n in sizes]
    peak = max(  # finishing side i: the offsets of sides <= i, the lengths of sides >= i
        sum(offsets[: i + 1]) + sum(n for _, n in sizes[i:]) for i in range(len(sizes))
    )
    return tokens + peak


def _disk_full_error(out_dir: Path, needed: int, complete: bool, exc: OSError) -> MTError:
    """The one-line error for a disk that filled during a build.

    The one line for a full disk during a build: ``needed`` bytes for what it had read
    (``complete``: the whole corpus), against what is free once its files are removed."""
    try:
        free = shutil.disk_usage(out_dir.parent).free
    except OSError:  # pragma: no cover - the directory was there a moment ago
        free = 0
    need = f"about {_size(needed)}" if complete else f"more than {_size(needed)}"
    return MTError(
        f"{out_dir}: {os.strerror(exc.errno or errno.ENOSPC).lower()} while writing the binarized "
        f"cache: it needs {need} there and {_size(free)} are free; free space or set "
        "data.cache_dir to a larger disk"
    )


def _size(n_bytes: int) -> str:
    """A byte count for people: ``512 B``, ``1.5 MiB``."""
    size, unit = float(n_bytes), "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            break
        size /= 1024
    return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"


def _publish(tmp_dir: Path, out_dir: Path) -> None:
    """Move the finished ``tmp_dir`` to ``out_dir``, replacing an old cache there.

    rename() cannot replace a non-empty directory, so the old one is renamed aside first, the new
    one renamed in, and only then the old one deleted. Between the two renames ``out_dir`` is
    briefly missing, which a reader takes as "no cache" and which never exposes partial files.
    """
    if not out_dir.exists():
        os.replace(tmp_dir, out_dir)
        return
    old_dir = out_dir.parent / f"{out_dir.name}.old-{_build_tag()}"
    if old_dir.exists():
        shutil.rmtree(old_dir)
    os.replace(out_dir, old_dir)
    try:
        os.replace(tmp_dir, out_dir)
    except BaseException:
        os.replace(old_dir, out_dir)  # put the old cache back rather than leave none
        raise
    shutil.rmtree(old_dir, ignore_errors=True)


def build_binarized(
    out_dir: Path,
    key: str,
    pairs: Iterable[tuple[Sequence[int] | np.ndarray, Sequence[int] | np.ndarray]],
    vocab_size: int,
) -> BinarizedPair:
    """Stream ``pairs`` of (source ids, target ids) into a new cache at ``out_dir``; return it open.

    The files are written in ``<out_dir>.tmp-<host>-<pid>`` beside ``out_dir`` and renamed into place only
    after ``meta.json`` is written; an existing cache at ``out_dir`` is replaced. If anything
    raises (including the ``pairs`` iterator, e.g. a cleaning error found at the end of a file)
    the temporary directory is removed and ``out_dir`` is left as it was. Build directories that
    killed runs left beside ``out_dir`` are removed first (:func:`remove_stale_builds`).

    Build on one process at a time: processes that may build the same ``out_dir`` at once hold
    :func:`transformer_mt.data.locking.exclusive_lock` on its ``lock_path`` around the check for
    a cache and the build (data preparation does), so that the later ones find the cache built;
    two unlocked builders racing to replace the same ``out_dir`` may fail.

    Raises:
        MTError: the disk is full (naming ``out_dir`` and the space); nothing is left behind.
        ValueError: an id is outside ``[0, vocab_size)`` (a bug in the caller's encoding).
    """
    out_dir = Path(out_dir)
    dtype = dtype_for_vocab(vocab_size)
    tmp_dir = out_dir.parent / f"{out_dir.name}.tmp-{_build_tag()}"
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    for stale in remove_stale_builds(out_dir.parent):
        log.info(f"removed {stale}, left by a build that was killed")
    if tmp_dir.exists():
        shutil.rmtree(tmp_dir)  # left by a killed earlier run that had the same pid
    tmp_dir.mkdir()
    writers: list[_SideWriter] = []
    read_all = False  # whether every pair was read (the space needed is then known)
    try:
        writers = [_SideWriter(tmp_dir, side, dtype, vocab_size) for side in SIDES]
        src_writer, trg_writer = writers
        for src_ids, trg_ids in pairs:
            src_writer.add(src_ids)
            trg_writer.add(trg_ids)
        read_all = True
        for writer in writers:
            writer.finish()
        meta = {
            "format": FORMAT_VERSION,
            "key": key,
            "dtype": dtype.name,
            "vocab_size": vocab_size,
            "count": src_writer.count,
            **{f"{w.side}_tokens": w.n_tokens for w in writers},
        }
        _write_meta(tmp_dir / META_FILE, meta)  # last: its presence marks a complete build
        _publish(tmp_dir, out_dir)
    except BaseException as exc:
        # BaseException: Ctrl-C during a long build must not leave the temporary directory.
        for writer in writers:
            with contextlib.suppress(OSError):
                writer.close()
        shutil.rmtree(tmp_dir, ignore_errors=True)
        if isinstance(exc, OSError) and exc.errno in NO_SPACE:
            raise _disk_full_error(out_dir, _space_needed(writers), read_all, exc) from None
        raise
    loaded = load_binarized(out_dir, key)
    if loaded is None:  # pragma: no cover - only if another process replaced it meanwhile
        raise MTError(f"{out_dir}: cache changed while being built; run the command again")
    return loaded


def _open_side(
    directory: Path, side: str, dtype: np.dtype, count: int, n_tokens: int
) -> tuple[np.ndarray, np.ndarray] | None:
    """Map one side's tokens and offsets; None when the files disagree with ``meta.json``."""
    tokens_path = directory / f"{side}_tokens.bin"
    offsets_path = directory / f"{side}_offsets.npy"
    if tokens_path.stat().st_size != n_tokens * dtype.itemsize:
        return None
    offsets = np.load(offsets_path, mmap_mode="r")
    if offsets.shape != (count + 1,) or offsets.dtype != np.int64 or int(offsets[-1]) != n_tokens:
        return None
    # np.memmap cannot map an empty file; an empty side is an empty array.
    tokens = (
        np.memmap(tokens_path, dtype=dtype, mode="r", shape=(n_tokens,))
        if n_tokens
        else np.zeros(0, dtype=dtype)
    )
    return tokens, offsets


def load_binarized(out_dir: Path, key: str) -> BinarizedPair | None:
    """Open the cache at ``out_dir`` if it is complete and built with ``key``; else None.

    None covers: no directory, no ``meta.json`` (never finished), another key or format version,
    and files whose sizes disagree with ``meta.json`` (damaged). The caller then rebuilds.
    """
    out_dir = Path(out_dir)
    try:
        meta = json.loads((out_dir / META_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT_VERSION or meta.get("key") != key:
        return None
    try:
        dtype = np.dtype(meta["dtype"])
        count = int(meta["count"])
        sides = [_open_side(out_dir, s, dtype, count, int(meta[f"{s}_tokens"])) for s in SIDES]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    src, trg = sides
    if src is None or trg is None:
        return None
    (src_tokens, src_offsets), (trg_tokens, trg_offsets) = src, trg
    return BinarizedPair(out_dir, meta, src_tokens, src_offsets, trg_tokens, trg_offsets)


class BinarizedPair:
    """A parallel corpus of token ids, mapped from disk: ``pair[i]`` is ``(src_ids, trg_ids)``.

    The ids are read-only ``np.memmap`` slices in the cache's dtype (uint16 or int32); convert
    with ``.astype(np.int64)`` before ``torch.from_numpy``. Pickling stores only the directory
    and key and maps the files again on unpickling, so DataLoader workers do not copy the corpus.
    """

    def __init__(
        self,
        path: Path,
        meta: dict[str, Any],
        src_tokens: np.ndarray,
        src_offsets: np.ndarray,
        trg_tokens: np.ndarray,
        trg_offsets: np.ndarray,
    ) -> None:
        self.path = Path(path)
        self.meta = meta
        self.key: str = meta["key"]
        self.dtype = np.dtype(meta["dtype"])
        self.vocab_size: int = meta["vocab_size"]
        self._src_tokens, self._src_offsets = src_tokens, src_offsets
        self._trg_tokens, self._trg_offsets = trg_tokens, trg_offsets
        self._src_lengths: np.ndarray | None = None
        self._trg_lengths: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self._src_offsets) - 1

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        i, n_pairs = operator.index(i), len(self)
        if i < 0:
            i += n_pairs
        if not 0 <= i < n_pairs:
            raise IndexError(f"pair index {i} out of range for {n_pairs} pairs")
        src_start, src_end = self._src_offsets[i], self._src_offsets[i + 1]
        trg_start, trg_end = self._trg_offsets[i], self._trg_offsets[i + 1]
        return self._src_tokens[src_start:src_end], self._trg_tokens[trg_start:trg_end]

    @property
    def sides(self) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
        """The memory-mapped id and offset arrays of both sides.

        ((source ids, source offsets), (target ids, target offsets)): the memory-mapped
        arrays themselves, e.g. to hash what a model was trained on without a copy."""
        return (self._src_tokens, self._src_offsets), (self._trg_tokens, self._trg_offsets)

    @property
    def src_lengths(self) -> np.ndarray:
        """Source sentence lengths in tokens (int64, in memory: batching needs them all)."""
        if self._src_lengths is None:
            self._src_lengths = np.diff(self._src_offsets)
        return self._src_lengths

    @property
    def trg_lengths(self) -> np.ndarray:
        """Target sentence lengths in tokens (int64, in memory: batching needs them all)."""
        if self._trg_lengths is None:
            self._trg_lengths = np.diff(self._trg_offsets)
        return self._trg_lengths

    @property
    def n_tokens(self) -> tuple[int, int]:
        """Total (source, target) tokens."""
        return int(self._src_offsets[-1]), int(self._trg_offsets[-1])

    def __getstate__(self) -> dict[str, Any]:
        return {"path": str(self.path), "key": self.key}

    def __setstate__(self, state: dict[str, Any]) -> None:
        loaded = load_binarized(Path(state["path"]), state["key"])
        if loaded is None:
            raise MTError(f"{state['path']}: binarized cache is gone or was rebuilt; prepare again")
        self.__dict__.update(loaded.__dict__)

    def __repr__(self) -> str:
        return f"BinarizedPair({str(self.path)!r}, pairs={len(self)}, dtype={self.dtype.name})"
