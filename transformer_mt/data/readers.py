"""Streaming readers for the formats parallel corpora come in: each yields (source, target) pairs.

Formats: two one-sentence-per-line files (:func:`iter_text_pairs`), tab-separated columns
(:func:`iter_tsv_pairs`), JSON lines (:func:`iter_jsonl_pairs`), Parquet (:func:`iter_parquet_pairs`),
WMT's SGML test sets (:func:`iter_sgm_pairs`), IWSLT's tagged and XML files
(:func:`iter_iwslt_pairs`) and TMX translation memories (:func:`iter_tmx_pairs`).
:func:`write_pairs` turns any of them into the two aligned files the rest of the package reads.

A file is named by a :class:`Location`: a path, or a member of a tar or zip archive, read without
unpacking the archive. Files and members compressed with gzip, xz or bzip2 are decompressed on the
fly (told by the suffix or the magic bytes).

What every reader promises:

- Streaming: one line, record batch or translation unit at a time; memory does not grow with the
  file.
- Each side of a pair is one line: the characters that any line splitter breaks at (``\\n``,
  ``\\r``, U+2028, U+2029, ...) and tabs become spaces, and outer whitespace goes. A newline left
  inside a segment would shift every later line of a one-sentence-per-line file.
- Strict UTF-8: a bad byte is an :class:`MTError` naming the file and line; a byte-order mark at
  the start is dropped.
- Pairs with an empty side are yielded as they are: cleaning drops them later, and counts them.
- Bad input (a missing column, field or language, sides of different length, malformed markup)
  is an :class:`MTError` whose one line names the file and the line.
- Bounded: each reader takes a :class:`~transformer_mt.data.limits.ReadLimits` (the ``data.max_*``
  settings) and checks it while it reads: the length of a line or TMX unit, the bytes and
  members of an archive, the nesting of JSON and XML. Past one is an :class:`MTError` naming the
  file, the bound and the setting that raises it; no reader's time grows faster than its input.
"""

from __future__ import annotations

import codecs
import contextlib
import difflib
import functools
import html
import io
import json
import re
import tarfile
import zipfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO, NamedTuple, cast
from xml.parsers import expat

from transformer_mt.data.corpus import (
    COMPRESSION_SUFFIXES,
    DECOMPRESSION_ERRORS,
    MAGIC_BYTES,
    compression_damage,
    compression_of,
    open_compressed,
    open_text,
)
from transformer_mt.data.limits import (
    DEFAULT_LIMITS,
    ReadLimits,
    bounded_lines,
    too_deep,
)
from transformer_mt.data.sides import Side, primary_language, same_input
from transformer_mt.errors import MTError
from transformer_mt.fileio import UTF8_BOM, atomic_write

TAR_SUFFIXES = (".tar", ".tgz", ".tar.gz", ".txz", ".tar.xz", ".tbz", ".tbz2", ".tar.bz2")
ZIP_SUFFIXES = (".zip",)
READ_ERRORS = (*DECOMPRESSION_ERRORS, tarfile.TarError, zipfile.BadZipFile)
"""What reading a damaged file, archive or archive member raises part-way through."""

# Every character at which str.splitlines() breaks a line, and the tab (the TSV separator).
_BREAKS = re.compile("[\t\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")


def clean_segment(text: str) -> str:
    """``text`` as one line, its separators and tabs made spaces.

    ``text`` as one line: line and paragraph separators and tabs become spaces, and the
    whitespace around it goes; nothing else changes."""
    return _BREAKS.sub(" ", text).strip()


# --- where a file is -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Location:
    """A file, or the member ``member`` of the tar or zip archive ``path``."""

    path: Path
    member: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", Path(self.path))  # frozen: accept a str path too
        if self.member == "":
            raise ValueError("an archive member name cannot be empty")

    def __str__(self) -> str:
        return f"{self.path}:{self.member}" if self.member is not None else str(self.path)

    @property
    def name(self) -> str:
        """The file's own name: the member's last part, or the path's."""
        return PurePosixPath(self.member).name if self.member is not None else self.path.name

    @classmethod
    def parse(cls, text: str) -> Location:
        """Parse a path that may name a member of an archive.

        ``"corpus.tgz:de-en/train.de"`` -> the member ``de-en/train.de`` of ``corpus.tgz``; a
        text without an archive name followed by ``:`` is a plain path."""
        match = _ARCHIVE_MEMBER.match(text)
        if match is None:
            return cls(Path(text))
        return cls(Path(match.group(1)), match.group(2))


_ARCHIVE_MEMBER = re.compile(
    r"^(.+?(?:" + "|".join(re.escape(s) for s in TAR_SUFFIXES + ZIP_SUFFIXES) + r")):(.+)$",
    re.IGNORECASE,
)

Source = Location | Path | str
"""What a reader accepts: a :class:`Location`, or a plain path."""


def as_location(source: Source) -> Location:
    """``source`` as a :class:`Location` (a path names a plain file)."""
    return source if isinstance(source, Location) else Location(Path(source))


@contextlib.contextmanager
def open_location(source: Source, limits: ReadLimits = DEFAULT_LIMITS) -> Iterator[BinaryIO]:
    """Open a file or archive member for reading as bytes, decompressing gzip, xz or bzip2.

    An archive is read in place: a tar is scanned as a stream up to the member, a zip opens the
    member directly. A missing file or member is an :class:`MTError` naming the archive and the
    member, with the archive's members that are most like it.

    An archive is held to ``limits``: at most ``max_archive_members`` members, and at most
    ``max_archive_bytes`` decompressed to reach and read the member, checked against the sizes
    that the archive declares before anything is read, and counted as a compressed member is
    decompressed. A tar header (a long name, pax attributes) larger than ``max_line_bytes`` is
    refused before it is read.
    """
    loc = as_location(source)
    if loc.member is None:
        with open_text(loc.path) as f:
            yield f
        return
    _require_file(loc.path)
    opener = _open_zip_member if _is_zip(loc.path) else _open_tar_member
    with contextlib.ExitStack() as stack:
        try:
            raw, before = stack.enter_context(opener(loc, limits))
            stream = stack.enter_context(_decompressed(raw, loc.member))
        except READ_ERRORS as exc:
            raise _unreadable(loc, exc) from None
        if stream is not raw:  # only the member's stored bytes were checked: count the rest
            budget = limits.max_archive_bytes - before
            stream = stack.enter_context(_counted(stream, budget, loc, limits.max_archive_bytes))
        yield stream


def _require_file(path: Path) -> None:
    """Raise a one-line MTError unless ``path`` is an existing file."""
    if not path.exists():
        raise MTError(f"{path}: file not found; check the path")
    if path.is_dir():
        raise MTError(f"{path}: is a directory; name an archive file")


def _is_zip(path: Path) -> bool:
    """Whether the archive ``path`` is a zip (by suffix, else by content); otherwise a tar."""
    if path.name.lower().endswith(ZIP_SUFFIXES):
        return True
    return not path.name.lower().endswith(TAR_SUFFIXES) and zipfile.is_zipfile(path)


def _unreadable(loc: Location, exc: BaseException) -> MTError:
    """The error for an archive that cannot be opened or scanned."""
    return MTError(
        f"{loc.path}: cannot read the archive ({exc or type(exc).__name__}); it must be a tar "
        "(.tar, .tgz, .tar.xz, .tar.bz2) or a zip, complete: download or copy it again"
    )


def _too_many_members(loc: Location, count: int | None, limit: int) -> MTError:
    """The error for an archive with ``count`` members (None: a tar, scanned up to the bound)."""
    holds = f"{count:,} members, more than {limit:,}" if count else f"more than {limit:,} members"
    return MTError(
        f"{loc.path}: the archive holds {holds} (data.max_archive_members); unpack it and name "
        "the file itself, or raise data.max_archive_members"
    )


def _too_many_bytes(loc: Location, what: str) -> MTError:
    """The error for a member that costs more decompressed bytes to read than the bound.

    ``what`` says what costs them and the bound: "the member is N bytes, more than M"."""
    return MTError(
        f"{loc}: {what} (data.max_archive_bytes); unpack the archive and name the file itself, "
        "or raise data.max_archive_bytes"
    )


def _decompressed(raw: BinaryIO, name: str) -> contextlib.AbstractContextManager[BinaryIO]:
    """``raw`` decompressed when the member ``name`` is gzip, xz or bzip2 (by suffix or magic)."""
    peek = getattr(raw, "peek", None)
    head = peek(MAGIC_BYTES)[:MAGIC_BYTES] if peek is not None else b""
    kind = compression_of(name, head)
    if kind is None:
        return contextlib.nullcontext(raw)
    return open_compressed(raw, kind)


class _CountedReader(io.RawIOBase):
    """The bytes of ``inner``, an MTError once more than ``budget`` of them are read."""

    def __init__(self, inner: BinaryIO, budget: int, error: Callable[[], MTError]) -> None:
        super().__init__()
        self.inner, self.budget, self.error, self.count = inner, budget, error, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self.inner.read(len(buffer))
        self.count += len(data)
        if self.count > self.budget:
            raise self.error()
        buffer[: len(data)] = data
        return len(data)


def _counted(inner: BinaryIO, budget: int, loc: Location, limit: int) -> BinaryIO:
    """``inner`` read through a buffer that counts its bytes against ``budget``."""
    what = f"decompresses to more than {limit:,} bytes"
    reader = _CountedReader(inner, budget, lambda: _too_many_bytes(loc, what))
    # A BufferedReader over it: readline and iteration in C, as over any file.
    return cast(BinaryIO, io.BufferedReader(reader, buffer_size=1 << 16))


def _zip_entries(path: Path) -> int | None:
    """The member count that a zip's end record declares, read before its directory (or None)."""
    end_record = getattr(zipfile, "_EndRecData", None)  # the reader ZipFile itself uses
    if end_record is None:
        return None
    with path.open("rb") as f:
        record = end_record(f)
    return int(record[getattr(zipfile, "_ECD_ENTRIES_TOTAL", 4)]) if record else None


@contextlib.contextmanager
def _open_zip_member(loc: Location, limits: ReadLimits) -> Iterator[tuple[BinaryIO, int]]:
    """The member of a zip archive, opened directly; and the bytes read to reach it (none).

    The member count is checked before the archive's directory is read, the member's size
    before the member is opened.
    """
    assert loc.member is not None
    entries = _zip_entries(loc.path)
    if entries is not None and entries > limits.max_archive_members:
        raise _too_many_members(loc, entries, limits.max_archive_members)
    with zipfile.ZipFile(loc.path) as zf:
        if len(zf.filelist) > limits.max_archive_members:
            raise _too_many_members(loc, len(zf.filelist), limits.max_archive_members)
        try:
            info = zf.getinfo(loc.member)
        except KeyError:
            raise _no_member(loc, zf.namelist()) from None
        if info.is_dir():
            raise MTError(f"{loc}: is a directory in the archive; name a file in it")
        if info.file_size > limits.max_archive_bytes:
            what = f"the member is {info.file_size:,} bytes, more than {limits.max_archive_bytes:,}"
            raise _too_many_bytes(loc, what)
        try:
            member = zf.open(info)
        except RuntimeError as exc:  # an encrypted member
            raise MTError(f"{loc}: cannot open ({exc}); unpack the archive yourself") from None
        with member:
            # typeshed types zipfile.ZipExtFile as io.BufferedIOBase, not typing.BinaryIO,
            # though it has BinaryIO's reading methods. zipfile stops a member at the size it
            # declares: the check above bounds it.
            yield cast(BinaryIO, member), 0


def _bounded_tarinfo(max_header: int) -> type[tarfile.TarInfo]:
    """A TarInfo class that refuses a long-name or pax header larger than ``max_header`` bytes.

    tarfile reads such a header's data whole into memory before it yields the member it
    describes; this checks its declared size first.
    """

    class BoundedTarInfo(tarfile.TarInfo):
        def _proc_gnulong(self, archive: tarfile.TarFile) -> tarfile.TarInfo:
            self._check_header_size()
            return super()._proc_gnulong(archive)  # type: ignore[misc]

        def _proc_pax(self, archive: tarfile.TarFile) -> tarfile.TarInfo:
            self._check_header_size()
            return super()._proc_pax(archive)  # type: ignore[misc]

        def _check_header_size(self) -> None:
            if self.size > max_header:
                raise _TarHeaderTooLarge(self.size)

    return BoundedTarInfo


class _TarHeaderTooLarge(Exception):
    """A tar header larger than the bound (raised inside tarfile, caught around it)."""

    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.size = size


@contextlib.contextmanager
def _open_tar_member(loc: Location, limits: ReadLimits) -> Iterator[tuple[BinaryIO, int]]:
    """Open the member of a tar archive, reading the archive as a stream.

    The member of a tar archive (plain or compressed), found by reading the archive as a
    stream: nothing is unpacked, and of the members before it only their names are kept. Yields
    the member and the bytes of the (decompressed) archive read before it. Each header is
    checked before the stream moves past it: the count of members, and the bytes up to the end
    of the member it describes.
    """
    assert loc.member is not None
    wanted = _tar_name(loc.member)
    seen: list[str] = []
    tarinfo = _bounded_tarinfo(limits.max_line_bytes)
    try:
        with tarfile.open(loc.path, "r|*", tarinfo=tarinfo) as tar:
            while (info := tar.next()) is not None:
                # A stream's members are not needed again: memory stays flat.
                tar.members.clear()  # type: ignore[attr-defined]
                if len(seen) >= limits.max_archive_members:
                    raise _too_many_members(loc, None, limits.max_archive_members)
                limit = limits.max_archive_bytes
                if info.offset_data + info.size > limit:
                    what = (
                        f"the member ends {info.offset_data + info.size:,} bytes into the "
                        f"archive, more than {limit:,}"
                        if _tar_name(info.name) == wanted
                        else f"reaching it passes {info.name!r} of {info.size:,} bytes: more than "
                        f"{limit:,} in all"
                    )
                    raise _too_many_bytes(loc, what)
                if _tar_name(info.name) != wanted:
                    seen.append(info.name)
                    continue
                if not info.isfile():
                    what = "a directory" if info.isdir() else "a link or special file"
                    raise MTError(f"{loc}: is {what} in the archive; name the file itself")
                member = tar.extractfile(info)
                assert member is not None
                with member:
                    # typeshed types TarFile.extractfile as IO[bytes], not typing.BinaryIO,
                    # though it returns a tarfile.ExFileObject (an io.BufferedReader).
                    yield cast(BinaryIO, member), info.offset_data
                return
    except _TarHeaderTooLarge as exc:
        raise MTError(
            f"{loc.path}: a member's name or pax header is {exc.size:,} bytes, more than "
            f"{limits.max_line_bytes:,} (data.max_line_bytes); the archive is damaged or not a "
            "corpus: unpack it yourself, or raise data.max_line_bytes"
        ) from None
    raise _no_member(loc, seen)


def _tar_name(name: str) -> str:
    """A tar member name compared without a leading ``./`` or trailing ``/``."""
    return name.removeprefix("./").rstrip("/")


def _no_member(loc: Location, names: list[str]) -> MTError:
    """The error for a member the archive lacks, with a few of its names most like it."""
    assert loc.member is not None
    base = PurePosixPath(loc.member).name
    same_base = [n for n in names if PurePosixPath(n).name == base]
    close = difflib.get_close_matches(loc.member, names, n=3, cutoff=0.5)
    similar = list(dict.fromkeys(same_base + close))[:3] or names[:3]
    hint = f"; similar: {', '.join(repr(n) for n in similar)}" if similar else ""
    return MTError(
        f"{loc.path}: no member {loc.member!r} in the archive ({len(names):,} members{hint}); "
        "check the member's path inside the archive"
    )


# --- lines ---------------------------------------------------------------------------------------


def _lines(loc: Location, limits: ReadLimits) -> Iterator[tuple[int, str]]:
    """The numbered lines of ``loc``, decoded as strict UTF-8.

    (line number, line) for each ``\\n``-ended line of ``loc``, decoded as strict UTF-8,
    without its line ending (``\\n`` or ``\\r\\n``) or a leading byte-order mark. A line longer
    than ``limits.max_line_bytes`` is an MTError, read no further than that."""
    lineno = 0
    with open_location(loc, limits) as f:
        try:
            for raw in bounded_lines(f, limits.max_line_bytes, loc):
                lineno += 1
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise _utf8_error(loc, lineno, exc) from None
                if lineno == 1:
                    text = text.removeprefix(UTF8_BOM)
                yield lineno, text.rstrip("\n").removesuffix("\r")
        except READ_ERRORS as exc:
            raise MTError(
                f"{loc}:{lineno + 1}: cannot read past this line ({exc or type(exc).__name__}); "
                "the file is corrupt or truncated, download or copy it again"
            ) from None


def _utf8_error(loc: Location, lineno: int, exc: UnicodeDecodeError) -> MTError:
    """The error for a line that is not UTF-8; in a damaged compressed file, the damage."""
    damage = compression_damage(loc.path) if loc.member is None else None
    if damage is not None:
        return MTError(
            f"{loc}: the {damage[0]} file is corrupt or truncated ({damage[1]}; line {lineno} "
            "already decompresses to bytes that are not UTF-8); download or copy it again"
        )
    return MTError(
        f"{loc}:{lineno}: invalid UTF-8 ({exc.reason} at byte {exc.start} of the line); "
        "convert the file to UTF-8 (e.g. iconv -f LATIN1 -t UTF-8)"
    )


class _Item(NamedTuple):
    """One side's segment: where it is, its text, and the ids that must match the other side's."""

    line: int
    text: str
    key: tuple[str | None, str | None] | None = None  # (document id, segment id)


def _pair_up(
    src: Location, trg: Location, src_items: Iterator[_Item], trg_items: Iterator[_Item], unit: str
) -> Iterator[tuple[str, str]]:
    """Pair the items of two sides in order, checking that they match.

    A side that ends first, or ids that differ, is an MTError naming both files and the line."""
    count = 0
    try:
        while True:
            s, t = next(src_items, None), next(trg_items, None)
            if s is None and t is None:
                return
            if s is None or t is None:
                raise _unpartnered(src, trg, s, t, src_items, trg_items, count, unit)
            if s.key is not None and t.key is not None and _keys_differ(s.key, t.key):
                raise MTError(
                    f"{trg}:{t.line}: {unit} {_describe(t.key)} does not match {src}:{s.line} "
                    f"{_describe(s.key)}; both files must hold the same {unit}s in the same order"
                )
            count += 1
            yield s.text, t.text
    finally:
        for items in (src_items, trg_items):
            close = getattr(items, "close", None)
            if close is not None:
                close()


def _unpartnered(
    src: Location,
    trg: Location,
    s: _Item | None,
    t: _Item | None,
    src_items: Iterator[_Item],
    trg_items: Iterator[_Item],
    count: int,
    unit: str,
) -> MTError:
    """The error for the first item of one side that the other side has no partner for."""
    if s is None:
        (short, long_, item, rest) = (src, trg, t, trg_items)
    else:
        (short, long_, item, rest) = (trg, src, s, src_items)
    assert item is not None
    n_long = count + 1 + sum(1 for _ in rest)
    return MTError(
        f"{long_}:{item.line}: {unit} {count + 1:,} has no partner: {short} ends after "
        f"{count:,} {unit}s but {long_} has {n_long:,}; the two sides must be aligned"
    )


def _keys_differ(a: tuple[str | None, ...], b: tuple[str | None, ...]) -> bool:
    """Whether two (document id, segment id) keys differ where both sides give an id."""
    return any(x is not None and y is not None and x != y for x, y in zip(a, b, strict=True))


def _describe(key: tuple[str | None, str | None]) -> str:
    """A segment's ids, as the messages show them."""
    doc, seg = key
    return f"(doc {doc!r}, seg {seg!r})"


# --- one sentence per line, TSV, JSON lines ------------------------------------------------------


def _plain_items(loc: Location, limits: ReadLimits) -> Iterator[_Item]:
    """Each line of a one-sentence-per-line file, as one line of text."""
    for lineno, line in _lines(loc, limits):
        yield _Item(lineno, clean_segment(line))


def iter_text_pairs(
    src: Source, trg: Source, *, limits: ReadLimits = DEFAULT_LIMITS
) -> Iterator[tuple[str, str]]:
    """Pairs from two aligned one-sentence-per-line files (lines split at ``\\n`` only).

    Raises:
        MTError: a side has more lines than the other (naming both and the line), or a line is
            not valid UTF-8 or longer than ``limits.max_line_bytes``.
    """
    src, trg = as_location(src), as_location(trg)
    yield from _pair_up(src, trg, _plain_items(src, limits), _plain_items(trg, limits), "line")


def iter_tsv_pairs(
    source: Source, columns: tuple[int, int] = (0, 1), *, limits: ReadLimits = DEFAULT_LIMITS
) -> Iterator[tuple[str, str]]:
    """Pairs from the columns ``columns`` (counted from 0) of a tab-separated file.

    Corpus TSVs are not CSV: a quote is text, and a line is split at every tab.

    Raises:
        MTError: a line lacks one of the columns ("FILE:LINE: has N columns, needs column K"),
            or is longer than ``limits.max_line_bytes``.
    """
    loc = as_location(source)
    if len(columns) != 2 or min(columns) < 0:
        raise MTError(f"{loc}: columns must be two column numbers from 0 up (got {columns})")
    src_col, trg_col = columns
    need = max(columns)
    for lineno, line in _lines(loc, limits):
        cells = line.split("\t")
        if len(cells) <= need:
            missing = src_col if len(cells) <= src_col else trg_col
            raise MTError(
                f"{loc}:{lineno}: has {len(cells)} column{'s' * (len(cells) != 1)}, needs "
                f"column {missing} (columns count from 0, separated by tabs); fix the line or "
                "choose other columns"
            )
        yield clean_segment(cells[src_col]), clean_segment(cells[trg_col])


def iter_jsonl_pairs(
    source: Source,
    fields: tuple[str, str] = ("translation.de", "translation.en"),
    *,
    limits: ReadLimits = DEFAULT_LIMITS,
) -> Iterator[tuple[str, str]]:
    """Pairs from a JSON-lines file.

    One object a line, each side at a dotted path into it
    (``translation.de`` is ``obj["translation"]["de"]``). Blank lines are passed over. A number
    is read whatever its length (only its type matters here: it is not text).

    Raises:
        MTError: a line is not a JSON object, or lacks a field, or the field is not a string; a
            line is longer than ``limits.max_line_bytes`` or nests objects and arrays deeper
            than ``limits.max_nesting``.
    """
    loc = as_location(source)
    paths = [field.split(".") for field in fields]
    for lineno, line in _lines(loc, limits):
        if not line.strip():
            continue
        if _json_depth(line, limits.max_nesting) > limits.max_nesting:
            raise too_deep(f"{loc}:{lineno}", limits.max_nesting, "JSON objects and arrays")
        try:
            record = json.loads(line, parse_int=_json_int)
        except json.JSONDecodeError as exc:
            raise MTError(
                f"{loc}:{lineno}: bad JSON ({exc.msg} at column {exc.colno}); each line must be "
                "one JSON object"
            ) from None
        src, trg = (_json_field(record, path, loc, lineno) for path in paths)
        yield src, trg


def _json_field(record: Any, path: list[str], loc: Location, lineno: int) -> str:
    """The string at the dotted ``path`` of a JSON record, one line."""
    field = ".".join(path)
    value = record
    for depth, key in enumerate(path):
        if not isinstance(value, dict) or key not in value:
            where = ".".join(path[:depth]) or "the record"
            keys = sorted(value)[:8] if isinstance(value, dict) else []
            has = f"has keys {keys}" if isinstance(value, dict) else "is not an object"
            raise MTError(
                f"{loc}:{lineno}: no field {field!r} ({where} {has}); name the fields the file has"
            )
        value = value[key]
    if not isinstance(value, str):
        kind = "null" if value is None else type(value).__name__
        kind = "int" if isinstance(value, _LongInt) else kind
        raise MTError(f"{loc}:{lineno}: field {field!r} is {kind}, not a string")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise MTError(
            f"{loc}:{lineno}: field {field!r} holds an unpaired surrogate escape (\\ud8..); "
            "it is not valid Unicode text"
        ) from None
    return clean_segment(value)


class _LongInt:
    """A JSON integer too long for ``int()`` (Python refuses over 4,300 digits): not text."""


_INT_DIGITS = 4000  # shorter integers are ints, whatever sys.set_int_max_str_digits says


def _json_int(text: str) -> int | _LongInt:
    """A JSON integer literal as an int, or as :class:`_LongInt` when ``int()`` might refuse it."""
    return int(text) if len(text) <= _INT_DIGITS else _LongInt()


_JSON_TOKEN = re.compile(r'\\.|["\[\]{}]')  # an escape, a quote, or a bracket


def _json_depth(line: str, limit: int) -> int:
    """How deep the JSON on ``line`` nests objects and arrays (exact up to ``limit`` + 1).

    ``json.loads`` recurses once a level: a line nested thousands deep is a RecursionError.
    Linear: a line with no more than ``limit`` brackets is not measured; otherwise one pass over
    its escapes, quotes and brackets counts the brackets outside strings.
    """
    if line.count("[") + line.count("{") <= limit:
        return 0
    depth = deepest = 0
    in_string = False
    for token in _JSON_TOKEN.finditer(line):
        char = token.group()
        if char == '"':
            in_string = not in_string
        elif in_string or len(char) == 2:  # text, or an escape
            continue
        elif char in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > limit:
                    break
        else:
            depth -= 1
    return deepest


# --- Parquet -------------------------------------------------------------------------------------


def iter_parquet_pairs(
    path: Path | str,
    fields: tuple[str, str] = ("translation.de", "translation.en"),
    *,
    batch_rows: int = 8192,
) -> Iterator[tuple[str, str]]:
    """Pairs from a Parquet file.

    Read ``batch_rows`` rows at a time; each field is a column or a
    dotted path into a struct column (Hugging Face's ``translation``: ``{"de": ..., "en": ...}``).

    Needs pyarrow (``pip install 'transformer-mt[hf]'``), imported only here.

    Raises:
        MTError: pyarrow is missing, the file is not Parquet, a field is missing or not a string
            column, or a row's value is null (naming the row, counted from 1).
    """
    path = Path(path)
    pa, pq, pc = _pyarrow(path)
    _require_file(path)
    try:
        pf = pq.ParquetFile(path)
        tops = list(dict.fromkeys(field.split(".")[0] for field in fields))
        for field in fields:
            _check_parquet_field(pa, path, pf.schema_arrow, field)
        row = 0
        for batch in pf.iter_batches(batch_size=batch_rows, columns=tops):
            sides = [_parquet_column(pc, batch, field) for field in fields]
            for i, (src, trg) in enumerate(zip(*sides, strict=True)):
                if src is None or trg is None:
                    field = fields[0] if src is None else fields[1]
                    raise MTError(f"{path}: row {row + i + 1:,}: field {field!r} is null")
                yield clean_segment(src), clean_segment(trg)
            row += batch.num_rows
    except (OSError, pa.ArrowException) as exc:
        raise MTError(f"{path}: cannot read it as Parquet ({exc}); check the file") from None


def _pyarrow(path: Path) -> tuple[Any, Any, Any]:
    """pyarrow, pyarrow.parquet and pyarrow.compute, or an MTError saying how to install them."""
    try:
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.parquet as pq
    except ImportError:
        raise MTError(
            f"{path}: reading Parquet needs pyarrow; pip install 'transformer-mt[hf]'"
        ) from None
    return pa, pq, pc


def _check_parquet_field(pa: Any, path: Path, schema: Any, field: str) -> None:
    """Raise an MTError unless the dotted ``field`` is a string column of ``schema``."""
    top, *rest = field.split(".")
    if top not in schema.names:
        raise MTError(f"{path}: no column {top!r} (the file has {schema.names}); name one of them")
    dtype = schema.field(top).type
    for depth, key in enumerate(rest):
        where = ".".join([top, *rest[:depth]])
        if not pa.types.is_struct(dtype):
            raise MTError(f"{path}: no field {field!r} ({where} holds {dtype}, not a struct)")
        if dtype.get_field_index(key) < 0:
            keys = [dtype.field(i).name for i in range(dtype.num_fields)]
            raise MTError(f"{path}: no field {field!r} ({where} has fields {keys})")
        dtype = dtype.field(key).type
    is_view = getattr(pa.types, "is_string_view", lambda _: False)
    if not (pa.types.is_string(dtype) or pa.types.is_large_string(dtype) or is_view(dtype)):
        raise MTError(f"{path}: field {field!r} holds {dtype}, not strings")


def _parquet_column(pc: Any, batch: Any, field: str) -> list[str | None]:
    """The values of the dotted ``field`` in a record batch (a null struct gives null)."""
    top, *rest = field.split(".")
    column = batch.column(top)
    if rest:
        column = pc.struct_field(column, rest)
    return column.to_pylist()


# --- SGML and XML segments (WMT, IWSLT) ----------------------------------------------------------

# The tags that matter, each matched where it starts: a tag's attributes end at its ">", or at the
# next "<" (then it is no tag), so that no match scans past the next tag and a line is read in one
# pass, whatever it holds. A "<seg" that is not a whole tag is "open": a segment left unclosed.
_TAGS = re.compile(
    r"<doc\b(?P<doc>[^<>]*)>|</doc\s*>|<seg\b(?P<seg>[^<>]*)>|(?P<end></seg\s*>)|(?P<open><seg\b)",
    re.IGNORECASE,
)


def _attribute(attrs: str, name: str) -> str | None:
    """The value of the attribute ``name`` in a tag's attribute text (quoted or not)."""
    match = re.search(rf"\b{name}\s*=\s*(?:\"([^\"]*)\"|'([^']*)'|([^\s>\"']+))", attrs, re.I)
    if match is None:
        return None
    return next(g for g in match.groups() if g is not None).strip()


def _segments(loc: Location, limits: ReadLimits) -> Iterator[_Item]:
    """The ``<seg>`` segments of an SGML or XML file, with their document and segment ids.

    The file is read line by line, tolerantly: a bare ``&`` is text, and other markup is passed
    over (inside a segment it is the segment's text); but a segment must open and close on one
    line, and holds no other segment. Each line is read in one pass over its tags (linear time,
    however many tags are left open)."""
    docid: str | None = None
    for lineno, line in _lines(loc, limits):
        if "<" not in line:
            continue
        seg: re.Match[str] | None = None  # the open segment's tag
        for match in _TAGS.finditer(line):
            if seg is None and match.group("doc") is not None:
                docid = _attribute(match.group("doc"), "docid")
            elif seg is None and match.group("seg") is not None:
                seg = match
            elif match.group("open") is not None or match.group("seg") is not None:
                raise _unclosed_segment(loc, lineno)
            elif seg is not None and match.group("end") is not None:
                text = clean_segment(html.unescape(line[seg.end() : match.start()]))
                yield _Item(lineno, text, (docid, _attribute(seg.group("seg"), "id")))
                seg = None
            elif seg is None and match.group("end") is None:
                docid = None  # </doc>
        if seg is not None:
            raise _unclosed_segment(loc, lineno)


def _unclosed_segment(loc: Location, lineno: int) -> MTError:
    return MTError(
        f"{loc}:{lineno}: <seg> is not closed on its line; each segment must be "
        "<seg ...>text</seg> on one line, fix the file"
    )


def iter_sgm_pairs(
    src: Source, trg: Source, *, limits: ReadLimits = DEFAULT_LIMITS
) -> Iterator[tuple[str, str]]:
    """Pairs from WMT ``.sgm`` files, entities such as ``&amp;`` decoded.

    The files hold ``<srcset>``/``<refset>``, ``<doc docid=...>`` and ``<seg id=...>text</seg>``.
    Segments pair up in order; where both sides give document and segment ids, they must match.
    The files are read line by line rather than as XML: real ones are often not well-formed.

    Raises:
        MTError: the sides have different numbers of segments, ids differ, or a ``<seg>`` is not
            closed on its line (naming the file and line).
    """
    src, trg = as_location(src), as_location(trg)
    yield from _pair_up(src, trg, _segments(src, limits), _segments(trg, limits), "segment")


def _tagged_items(loc: Location, limits: ReadLimits) -> Iterator[_Item]:
    """The text lines of an IWSLT ``train.tags`` file.

    Markup lines (``<url>``, ``<talkid>``,
    ``<title>``, ``<doc ...>``, ...: a line that starts with ``<``) are left out."""
    for lineno, line in _lines(loc, limits):
        if not line.lstrip().startswith("<"):
            yield _Item(lineno, clean_segment(line))


def _is_xml(loc: Location) -> bool:
    """Whether ``loc`` is named as an XML file (``.xml``, possibly compressed)."""
    name = loc.name.lower()
    for suffix in COMPRESSION_SUFFIXES:
        name = name.removesuffix(suffix)
    return name.endswith(".xml")


def iter_iwslt_pairs(
    src: Source, trg: Source, *, limits: ReadLimits = DEFAULT_LIMITS
) -> Iterator[tuple[str, str]]:
    """Pairs from IWSLT files.

    ``*.xml`` (``IWSLT17.TED.dev2010.de-en.de.xml``) by their
    ``<seg id=...>`` segments, anything else (``train.tags.de-en.de``) by its text lines.

    In a tags file each side drops its own markup lines, as IWSLT's usual preparation scripts do
    (``grep -v '<url>'`` ... on each file); the text lines left must then pair up.

    Raises:
        MTError: one file is XML and the other not, or the sides do not pair up (naming the
            file and line).
    """
    src, trg = as_location(src), as_location(trg)
    if _is_xml(src) != _is_xml(trg):
        raise MTError(
            f"{src} and {trg}: one is an IWSLT .xml file and the other is not; give both sides "
            "of the same set"
        )
    if _is_xml(src):
        yield from _pair_up(src, trg, _segments(src, limits), _segments(trg, limits), "segment")
    else:
        items = _tagged_items(src, limits), _tagged_items(trg, limits)
        yield from _pair_up(src, trg, *items, "text line")


# --- TMX -----------------------------------------------------------------------------------------

_XML_LANG = "http://www.w3.org/XML/1998/namespace}lang"  # as expat names xml:lang
_INLINE_TEXT = frozenset({"hi"})  # inline elements whose content is text a reader sees


@dataclass
class TmxStats:
    """What :func:`iter_tmx_pairs` read; complete once the iterator is exhausted."""

    units: int = 0  # translation units (<tu>) read
    skipped: int = 0  # units without a segment in both languages

    @property
    def pairs(self) -> int:
        """Units yielded as pairs."""
        return self.units - self.skipped

    def format(self, src_lang: str, trg_lang: str) -> str:
        """One line for the log: units read and skipped."""
        return (
            f"read {self.units:,} translation units; skipped {self.skipped:,} without both "
            f"{src_lang} and {trg_lang}"
        )


# The primary language subtag, lower-case: ``de-DE`` and ``de_de`` -> ``de``. Cached: a TMX file
# names a few languages, once a segment.
_primary = functools.lru_cache(maxsize=256)(primary_language)


def iter_tmx_pairs(
    source: Source,
    src_lang: str,
    trg_lang: str,
    stats: TmxStats | None = None,
    *,
    limits: ReadLimits = DEFAULT_LIMITS,
) -> Iterator[tuple[str, str]]:
    """Pairs from a TMX translation memory, one ``<tu>`` at a time (memory stays flat).

    A language matches by its primary subtag, case-insensitively (``de-DE`` matches ``de``), from
    ``xml:lang`` or the older ``lang``. A segment's text is what a reader sees: its own text and
    the text after each inline element; the codes inside ``<bpt>``, ``<ept>``, ``<ph>``, ``<it>``
    and ``<ut>`` are left out, the text inside ``<hi>`` kept. A unit that lacks one of the two
    languages is skipped and counted in ``stats``.

    The file is parsed as a stream of events (no tree is built), each unit held to
    ``limits.max_line_bytes`` (from its ``<tu>`` to its ``</tu>``; outside a unit, from one
    element or text to the next) and the elements to ``limits.max_nesting`` deep.

    Raises:
        MTError: the XML is malformed or not UTF-8 ("FILE:LINE: malformed TMX (...)"), a unit is
            too long, or elements nest too deep.
    """
    loc = as_location(source)
    stats = stats if stats is not None else TmxStats()
    langs = (_primary(src_lang), _primary(trg_lang))
    sides = [
        Side(key, lang, str(loc), f"language {_primary(lang)}")
        for key, lang in (("src_lang", src_lang), ("trg_lang", trg_lang))
    ]
    if same_input(*sides):
        raise MTError(
            f"{loc}: the source and target languages {src_lang!r} and {trg_lang!r} are the same "
            "language; TMX units are matched by primary language"
        )
    units = _TmxUnits(loc, langs, stats, limits)
    with open_location(loc, limits) as f:
        try:
            while chunk := f.read(_TMX_CHUNK):
                units.feed(chunk)
                yield from units.pairs
                units.pairs.clear()
            units.feed(b"", final=True)
            yield from units.pairs
        except expat.ExpatError as exc:
            raise _tmx_error(loc, exc, limits) from None
        except READ_ERRORS as exc:
            raise MTError(
                f"{loc}: cannot read past {stats.units:,} translation units "
                f"({exc or type(exc).__name__}); the file is corrupt or truncated"
            ) from None


_TMX_CHUNK = 1 << 16  # bytes parsed at a time


class _TmxUnits:
    """The pairs of a TMX stream's ``<tu>`` elements, from expat's events (see iter_tmx_pairs).

    Only what the unit being read needs is kept: the segments found so far, and the text of the
    segment being read. ``pairs`` gathers the pairs of the bytes fed so far.
    """

    def __init__(
        self, loc: Location, langs: tuple[str, str], stats: TmxStats, limits: ReadLimits
    ) -> None:
        self.loc, self.langs, self.stats, self.limits = loc, langs, stats, limits
        self.parser = expat.ParserCreate(namespace_separator="}")
        self.parser.buffer_text = True  # a text in one piece, not one call per line
        self.parser.StartElementHandler = self._start
        self.parser.EndElementHandler = self._end
        self.parser.CharacterDataHandler = self._text
        self.parser.CommentHandler = self._other
        self.parser.ProcessingInstructionHandler = self._other
        self.pairs: list[tuple[str, str]] = []
        self.fed = 0  # bytes fed to the parser
        self.depth = 0  # elements open
        self.mark = 0  # where the open unit began, or (outside units) the last event
        self.unit_line = 0  # the line of the open unit's <tu>
        self.unit_depth = 0  # the open <tu>'s depth; 0 = outside a unit
        self.found: dict[str, str] = {}  # primary language -> the unit's segment in it
        self.lang: str | None = None  # the open <tuv>'s language, when it is one still wanted
        self.seg_depth = 0  # the depth of the <seg> whose text is being read; 0 = none
        self.hidden = 0  # elements open inside that <seg> whose text a reader does not see
        self.text: list[str] = []
        self.text_size = 0  # characters in ``text`` (entities expanded)

    def feed(self, chunk: bytes, final: bool = False) -> None:
        """Parse ``chunk`` (the next bytes of the file), adding the pairs of the units it ends."""
        self.fed += len(chunk)
        self.parser.Parse(chunk, final)
        # Past the bound: a unit still open, or (outside) no event for that long (one tag's
        # attributes, a comment, ...: expat keeps the part it has read).
        if self.fed - self.mark > self.limits.max_line_bytes:
            self._too_long()

    def _too_long(self) -> None:
        limit = self.limits.max_line_bytes
        if self.unit_depth:
            where, what = f"{self.loc}:{self.unit_line}", "the translation unit is"
        else:
            where, what = f"{self.loc}:{self.parser.CurrentLineNumber}", "a tag or text is"
        raise MTError(
            f"{where}: {what} longer than {limit:,} bytes (data.max_line_bytes); check the file, "
            "or raise data.max_line_bytes"
        )

    def _start(self, name: str, attrs: dict[str, str]) -> None:
        depth = self.depth = self.depth + 1
        if depth > self.limits.max_nesting:
            where = f"{self.loc}:{self.parser.CurrentLineNumber}"
            raise too_deep(where, self.limits.max_nesting, "XML elements")
        if self.seg_depth:  # inside the segment being read
            if self.hidden or name[name.rfind("}") + 1 :] not in _INLINE_TEXT:
                self.hidden += 1
            return
        unit = self.unit_depth
        if unit:
            if depth == unit + 1 and name[name.rfind("}") + 1 :] == "tuv":
                lang = attrs.get(_XML_LANG) or attrs.get("lang")
                primary = _primary(lang) if lang is not None else None
                wanted = primary in self.langs and primary not in self.found
                self.lang = primary if wanted else None
            elif (
                depth == unit + 2 and self.lang is not None and name[name.rfind("}") + 1 :] == "seg"
            ):
                self.seg_depth, self.text, self.text_size = depth, [], 0
            return
        self.mark = self.parser.CurrentByteIndex
        if name[name.rfind("}") + 1 :] == "tu":
            self.unit_depth, self.found = depth, {}
            self.unit_line = self.parser.CurrentLineNumber

    def _end(self, name: str) -> None:
        depth = self.depth
        self.depth = depth - 1
        if self.seg_depth:
            if depth > self.seg_depth:
                if self.hidden:
                    self.hidden -= 1
                return
            assert self.lang is not None
            self.found[self.lang] = clean_segment("".join(self.text))
            self.seg_depth, self.lang, self.text = 0, None, []  # a <tuv>'s first <seg> only
        elif depth == self.unit_depth:
            self.stats.units += 1
            if len(self.found) < 2:
                self.stats.skipped += 1
            else:
                self.pairs.append((self.found[self.langs[0]], self.found[self.langs[1]]))
            self.unit_depth, self.found = 0, {}
            self.mark = self.parser.CurrentByteIndex
        elif not self.unit_depth:
            self.mark = self.parser.CurrentByteIndex
        elif depth == self.unit_depth + 1:
            self.lang = None  # </tuv>

    def _other(self, *_: str) -> None:
        """A comment or processing instruction: an event, outside units."""
        if not self.unit_depth:
            self.mark = self.parser.CurrentByteIndex

    def _text(self, data: str) -> None:
        # Inside a unit, what is kept grows by one chunk at most before feed() checks the bound,
        # or by the entities that the chunk expands to (counted here).
        if self.seg_depth:
            if not self.hidden:
                self.text.append(data)
                self.text_size += len(data)
                if self.text_size > self.limits.max_line_bytes:
                    self._too_long()
        elif not self.unit_depth:
            self.mark = self.parser.CurrentByteIndex


def _tmx_error(loc: Location, exc: expat.ExpatError, limits: ReadLimits) -> MTError:
    """The one-line error for malformed TMX: the line, and whether the bytes were not UTF-8."""
    reason = expat.ErrorString(exc.code)
    if "invalid token" in reason and _line_is_not_utf8(loc, exc.lineno, limits):
        return MTError(f"{loc}:{exc.lineno}: invalid UTF-8; convert the file to UTF-8")
    return MTError(
        f"{loc}:{exc.lineno}: malformed TMX ({reason} at column {exc.offset + 1}); fix or export "
        "the file again"
    )


def _line_is_not_utf8(loc: Location, lineno: int, limits: ReadLimits) -> bool:
    """Whether line ``lineno`` of ``loc`` is not valid UTF-8 (read again, for an error only).

    Read in pieces of ``limits.max_line_bytes`` at most: an XML file may be one long line."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    n = 1
    with open_location(loc, limits) as f:
        while n <= lineno:
            piece = f.readline(limits.max_line_bytes)
            try:
                if n == lineno:  # the line's last piece ends it, or the file
                    last = piece.endswith(b"\n") or len(piece) < limits.max_line_bytes
                    decoder.decode(piece, final=last)
            except UnicodeDecodeError:
                return True
            if not piece:
                break
            n += piece.endswith(b"\n")
    return False


# --- writing -------------------------------------------------------------------------------------


def write_pairs(pairs: Iterable[tuple[str, str]], src_out: Path, trg_out: Path) -> int:
    """Write pairs as two aligned UTF-8 one-sentence-per-line files; return how many.

    Streams: one pair in memory at a time. Atomic: both files appear complete, or (when the
    pairs raise part-way, or on Ctrl-C) neither changes. Each side is made one line first
    (:func:`clean_segment`), so a stray newline cannot misalign the files.
    """
    src_out, trg_out = Path(src_out), Path(trg_out)
    if src_out.resolve() == trg_out.resolve():
        raise MTError(f"{src_out}: the source and target outputs are the same file")
    count = 0
    with atomic_write(src_out, "wb") as src_file, atomic_write(trg_out, "wb") as trg_file:
        for src, trg in pairs:
            src_file.write(clean_segment(src).encode("utf-8") + b"\n")
            trg_file.write(clean_segment(trg).encode("utf-8") + b"\n")
            count += 1
    return count
