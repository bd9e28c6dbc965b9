"""Reading and cleaning parallel text: one sentence per line, the two files aligned line by line.

Cleaning streams: :func:`iter_clean_pairs` reads both files a line at a time and yields the kept
pairs, so a corpus larger than RAM can be cleaned, encoded and binarized in one pass.
:func:`clean_parallel` is the same thing collected into lists, for corpora that fit in memory.

Rules, in the order they are applied to each pair (a pair counts in exactly one report bucket):

1. Each line is decoded as strict UTF-8. A line that is not valid UTF-8 stops with an error
   naming the file and line, unless ``skip_bad_lines`` is set: then the pair is skipped and counted.
2. Line endings: lines are split on ``\\n`` only (never on other Unicode line separators, which
   would silently shift one file against the other). A trailing ``\\r`` (CRLF files) is removed and
   a stray ``\\r`` inside a line (old Mac files pasted together) becomes a space; such lines are
   counted. A UTF-8 byte-order mark at the start of a file is removed.
3. Surrounding whitespace is stripped; nothing inside the line is collapsed or rewritten.
4. A pair with either side empty is dropped.
5. A pair with either side longer than ``max_words`` whitespace-separated words is dropped.
6. A pair whose longer side has more than ``ratio_min_words`` words and is more than ``max_ratio``
   times longer than the other side is dropped (misaligned pairs look like this).

Files with different numbers of lines are always an error, whatever ``skip_bad_lines`` says: a
missing line shifts every later pair, so no count of skipped lines could make the rest right.
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import zlib
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePath
from typing import Any, BinaryIO

from transformer_mt.data.limits import DEFAULT_LIMITS, bounded_lines
from transformer_mt.errors import MTError
from transformer_mt.fileio import UTF8_BOM

GZIP_MAGIC = b"\x1f\x8b"
XZ_MAGIC = b"\xfd7zXZ\x00"
# "BZh", the block size ("1".."9"), then the magic of the first block (or of the end of an empty
# stream): text that happens to start with "BZh" is not taken for bzip2.
_BZIP2_BLOCKS = (b"\x31\x41\x59\x26\x53\x59", b"\x17\x72\x45\x38\x50\x90")
COMPRESSION_SUFFIXES = {".gz": "gzip", ".xz": "xz", ".bz2": "bzip2"}
MAGIC_BYTES = 10
"""How many leading bytes :func:`compression_of` needs to recognise a compressed stream."""
DECOMPRESSION_ERRORS = (OSError, EOFError, zlib.error, lzma.LZMAError)
"""What a damaged or truncated gzip, xz or bzip2 stream raises part-way through (bz2: OSError)."""
# Each returns a binary stream (a GzipFile, LZMAFile or BZ2File: typeshed types them as
# io.BufferedIOBase, which has typing.BinaryIO's methods but is not declared one).
_OPENERS: dict[str, Callable[..., Any]] = {"gzip": gzip.open, "xz": lzma.open, "bzip2": bz2.open}


def compression_of(name: str, head: bytes) -> str | None:
    """The compression of a file called ``name`` that starts with ``head``.

    One of "gzip", "xz", "bzip2" or None, by the name's suffix (``.gz``, ``.xz``, ``.bz2``) or
    else by magic bytes."""
    suffix = PurePath(name).suffix.lower()
    if suffix in COMPRESSION_SUFFIXES:
        return COMPRESSION_SUFFIXES[suffix]
    if head.startswith(GZIP_MAGIC):
        return "gzip"
    if head.startswith(XZ_MAGIC):
        return "xz"
    if head[:3] == b"BZh" and head[3:4] in b"123456789" and head[4:10] in _BZIP2_BLOCKS:
        return "bzip2"
    return None


def open_compressed(source: Path | BinaryIO, kind: str | None) -> BinaryIO:
    """Open ``source`` decompressed as ``kind``.

    ``source`` (a path, or a binary stream) decompressed as ``kind`` (from
    :func:`compression_of`); a path with ``kind`` None opens as it is. A stream passed in is not
    closed with the result."""
    if kind is None:
        return source if not isinstance(source, Path) else source.open("rb")
    return _OPENERS[kind](source, "rb")


def _compression(path: Path) -> str | None:
    """The compression of the file ``path`` (see :func:`compression_of`).

    Its first bytes are read only when its name has no compression suffix."""
    kind = compression_of(path.name, b"")
    if kind is None:
        with path.open("rb") as f:
            kind = compression_of(path.name, f.read(MAGIC_BYTES))
    return kind


def open_text(path: Path) -> BinaryIO:
    """Open a plain or compressed text file for reading as bytes.

    Open a plain, gzip, xz or bzip2 text file for reading as bytes; iterate it for
    ``\\n``-ended lines. The compression is told by the suffix or else by the magic bytes.

    Bytes, not text, so that the caller decodes each line itself and can name the line that is not
    valid UTF-8. A missing file or a directory raises :class:`MTError`.
    """
    path = Path(path)
    if not path.exists():
        raise MTError(f"{path}: file not found; check the path in the config")
    if path.is_dir():
        raise MTError(f"{path}: is a directory, not a text file; name a file in the config")
    try:
        return open_compressed(path, _compression(path))
    except OSError as exc:
        raise MTError(
            f"{path}: cannot open ({exc.strerror or exc}); check its permissions"
        ) from exc


def _kind_of(stream: BinaryIO) -> str:
    """How the messages call the file behind ``stream``: "gzip file", "xz file", ... or "file"."""
    for kind, cls in (("gzip", gzip.GzipFile), ("xz", lzma.LZMAFile), ("bzip2", bz2.BZ2File)):
        if isinstance(stream, cls):
            return f"{kind} file"
    return "file"


def _read_lines(path: Path, max_bytes: int) -> Generator[bytes, None, None]:
    """Yield the raw lines of ``path`` (without decoding), turning read errors into MTError.

    A truncated or corrupt gzip file only shows itself part-way through, so the error names the
    line where reading stopped. A line longer than ``max_bytes`` is an MTError naming it, read no
    further than that (:func:`transformer_mt.data.limits.bounded_lines`).
    """
    lineno = 0
    with open_text(path) as f:
        try:
            for line in bounded_lines(f, max_bytes, path):
                lineno += 1
                yield line
        except DECOMPRESSION_ERRORS as exc:
            raise MTError(
                f"{path}:{lineno + 1}: cannot read past this line ({exc or type(exc).__name__}); "
                f"the {_kind_of(f)} is corrupt or truncated, download or copy it again"
            ) from exc


def compression_damage(path: Path) -> tuple[str, str] | None:
    """Why the compressed file ``path`` cannot be decompressed to its end, if it cannot.

    (compression, why) when the compressed file ``path`` cannot be decompressed to its end;
    None if it can, or if it is not compressed. Reads the whole file: only for an error that is
    about to be reported."""
    kind = None
    try:
        kind = _compression(path)
        if kind is None:
            return None
        with open_compressed(path, kind) as f:
            while f.read(1 << 20):
                pass
    except DECOMPRESSION_ERRORS as exc:
        return kind or "", str(exc) or type(exc).__name__
    return None


def _count_rest(lines: Iterator[bytes]) -> int:
    """Exhaust ``lines`` and return how many were left (for the mismatched-count message)."""
    return sum(1 for _ in lines)


@dataclass
class CleanConfig:
    """Thresholds for :func:`iter_clean_pairs`; the defaults suit sentence-level corpora."""

    # Longest sentence kept, in whitespace-separated words, on either side; None keeps all lengths.
    max_words: int | None = 250
    # Longest allowed ratio between the two sides' word counts; None turns the check off.
    # 3.0 drops only the clearly misaligned pairs of Multi30k ("@@" against a full sentence).
    max_ratio: float | None = 3.0
    # The ratio check applies only when the longer side has more than this many words: short
    # pairs such as "Danke !" / "Thank you very much" are legitimate at ratios above 3.
    ratio_min_words: int = 5
    # Skip and count pairs with a line that is not valid UTF-8, instead of stopping with an error.
    skip_bad_lines: bool = False
    # The longest line read, in bytes (data.max_line_bytes): a longer one is an error. A bound on
    # the input, not a cleaning rule: it changes no output, so no cache key holds it.
    max_line_bytes: int = DEFAULT_LIMITS.max_line_bytes

    def __post_init__(self) -> None:
        if self.max_words is not None and self.max_words < 1:
            raise MTError(f"data.max_words must be at least 1 or null (got {self.max_words})")
        if self.max_ratio is not None and self.max_ratio < 1.0:
            raise MTError(f"data.max_ratio must be at least 1.0 or null (got {self.max_ratio})")
        if self.ratio_min_words < 0:
            raise MTError(f"data.ratio_min_words must be >= 0 (got {self.ratio_min_words})")
        if self.max_line_bytes < 1:
            raise MTError(f"data.max_line_bytes must be at least 1 (got {self.max_line_bytes})")


@dataclass
class CleanReport:
    """What cleaning kept, dropped and changed.

    Every pair read counts in exactly one of ``kept``, ``dropped_empty``, ``dropped_too_long``,
    ``dropped_ratio``, ``skipped_bad_utf8``."""

    config: CleanConfig = field(default_factory=CleanConfig)
    kept: int = 0
    dropped_empty: int = 0
    dropped_too_long: int = 0
    dropped_ratio: int = 0
    skipped_bad_utf8: int = 0
    # Lines (either side) whose CR / CRLF endings or stray CRs were normalized; pairs stay kept.
    crlf_normalized: int = 0

    @property
    def total(self) -> int:
        """Number of pairs read."""
        return (
            self.kept
            + self.dropped_empty
            + self.dropped_too_long
            + self.dropped_ratio
            + self.skipped_bad_utf8
        )

    @property
    def dropped(self) -> int:
        """Number of pairs read but not kept, for any reason."""
        return self.total - self.kept

    def format(self) -> str:
        """A few human-readable lines, for printing after preparation."""
        cfg = self.config
        pct = 100.0 * self.kept / self.total if self.total else 0.0
        too_long = f"over {cfg.max_words:,} words" if cfg.max_words is not None else "too long"
        ratio = (
            f"with length ratio > {cfg.max_ratio:g} (longer side > {cfg.ratio_min_words} words)"
            if cfg.max_ratio is not None
            else "by length ratio"
        )
        lines = [
            f"kept {self.kept:,} of {self.total:,} pairs ({pct:.2f}%)",
            f"dropped {self.dropped_empty:,} empty, {self.dropped_too_long:,} {too_long}, "
            f"{self.dropped_ratio:,} {ratio}",
        ]
        if self.skipped_bad_utf8 or cfg.skip_bad_lines:
            lines.append(f"skipped {self.skipped_bad_utf8:,} pairs with invalid UTF-8")
        if self.crlf_normalized:
            lines.append(f"normalized CR/CRLF line endings on {self.crlf_normalized:,} lines")
        return "\n".join(lines)


def _decode(raw: bytes, lineno: int) -> tuple[str, bool]:
    """Decode one raw line; return (text without surrounding whitespace, whether CRs were fixed).

    Raises UnicodeDecodeError unchanged: the caller decides between stopping and skipping.
    """
    text = raw.decode("utf-8")
    if lineno == 1:
        text = text.removeprefix(UTF8_BOM)
    text = text.rstrip("\n")
    had_cr = "\r" in text
    if had_cr:
        # A trailing CR is CRLF; one inside the line separated two sentences on an old Mac.
        # Keeping the pair (as one line) matches the other file's line count.
        text = text.rstrip("\r").replace("\r", " ")
    return text.strip(), had_cr


def _utf8_error(path: Path, lineno: int, exc: UnicodeDecodeError) -> MTError:
    """The one-line error for a line that is not valid UTF-8.

    In a damaged compressed file it names the damage (a corrupt deflate stream yields garbage bytes
    before its checksum is reached); otherwise it names the line."""
    damage = compression_damage(path)
    if damage is not None:
        kind, why = damage
        return MTError(
            f"{path}: the {kind} file is corrupt or truncated ({why}; line {lineno} already "
            "decompresses to bytes that are not UTF-8); download or copy it again"
        )
    return MTError(
        f"{path}:{lineno}: invalid UTF-8 ({exc.reason} at byte {exc.start} of the line); "
        "fix the file (e.g. iconv -f LATIN1 -t UTF-8) or set data.skip_bad_lines: true"
    )


def iter_clean_pairs(
    src_path: Path,
    trg_path: Path,
    cfg: CleanConfig | None = None,
    report: CleanReport | None = None,
) -> Iterator[tuple[str, str]]:
    """Stream the kept (source, target) pairs of two aligned files, counting drops in ``report``.

    The report is complete only once the iterator is exhausted. Mismatched line counts are found
    only at the end of the shorter file, after earlier pairs were yielded, so consumers that write
    output must build it aside and publish it only on success (as the binarized cache does).

    Raises:
        MTError: a file is missing or unreadable, a line is not valid UTF-8 (unless
            ``cfg.skip_bad_lines``) or longer than ``cfg.max_line_bytes``, or the files have
            different numbers of lines.
    """
    cfg = cfg if cfg is not None else CleanConfig()
    report = report if report is not None else CleanReport(config=cfg)
    report.config = cfg
    src_path, trg_path = Path(src_path), Path(trg_path)
    src_lines = _read_lines(src_path, cfg.max_line_bytes)
    trg_lines = _read_lines(trg_path, cfg.max_line_bytes)
    try:
        yield from _clean(src_path, trg_path, src_lines, trg_lines, cfg, report)
    finally:
        # Close both files now, not whenever the generators are collected.
        src_lines.close()
        trg_lines.close()


def _clean(
    src_path: Path,
    trg_path: Path,
    src_lines: Iterator[bytes],
    trg_lines: Iterator[bytes],
    cfg: CleanConfig,
    report: CleanReport,
) -> Iterator[tuple[str, str]]:
    """The loop of :func:`iter_clean_pairs`, over already opened line iterators."""
    lineno = 0
    while True:
        src_raw = next(src_lines, None)
        trg_raw = next(trg_lines, None)
        if src_raw is None and trg_raw is None:
            return
        lineno += 1
        if src_raw is None or trg_raw is None:
            # Count the rest of the longer file so the message gives both totals.
            n_short = lineno - 1
            rest = trg_lines if src_raw is None else src_lines
            n_long = lineno + _count_rest(rest)
            short, long_ = (src_path, trg_path) if src_raw is None else (trg_path, src_path)
            raise MTError(
                f"{long_}:{lineno}: line has no partner: {short} has {n_short:,} lines but "
                f"{long_} has {n_long:,}; the two files must be aligned one sentence per line"
            )

        try:
            src, src_cr = _decode(src_raw, lineno)
        except UnicodeDecodeError as exc:
            if not cfg.skip_bad_lines:
                raise _utf8_error(src_path, lineno, exc) from None
            report.skipped_bad_utf8 += 1
            continue
        try:
            trg, trg_cr = _decode(trg_raw, lineno)
        except UnicodeDecodeError as exc:
            if not cfg.skip_bad_lines:
                raise _utf8_error(trg_path, lineno, exc) from None
            report.skipped_bad_utf8 += 1
            continue
        report.crlf_normalized += src_cr + trg_cr

        if not src or not trg:
            report.dropped_empty += 1
            continue
        n_src, n_trg = len(src.split()), len(trg.split())
        longer, shorter = max(n_src, n_trg), min(n_src, n_trg)
        if cfg.max_words is not None and longer > cfg.max_words:
            report.dropped_too_long += 1
            continue
        if (
            cfg.max_ratio is not None
            and longer > cfg.ratio_min_words
            and longer > cfg.max_ratio * shorter
        ):
            report.dropped_ratio += 1
            continue
        report.kept += 1
        yield src, trg


def clean_parallel(
    src_path: Path, trg_path: Path, cfg: CleanConfig | None = None
) -> tuple[list[str], list[str], CleanReport]:
    """Clean two aligned files into memory: (sources, targets, report).

    See :func:`iter_clean_pairs` for the rules; use that instead for corpora larger than RAM.
    """
    cfg = cfg if cfg is not None else CleanConfig()
    report = CleanReport(config=cfg)
    srcs: list[str] = []
    trgs: list[str] = []
    for src, trg in iter_clean_pairs(src_path, trg_path, cfg, report):
        srcs.append(src)
        trgs.append(trg)
    return srcs, trgs, report
