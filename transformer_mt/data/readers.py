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
"""

from __future__ import annotations

import contextlib
import difflib
import html
import json
import re
import tarfile
import zipfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO, NamedTuple
from xml.etree import ElementTree as ET

from transformer_mt.data.corpus import (
    COMPRESSION_SUFFIXES,
    DECOMPRESSION_ERRORS,
    MAGIC_BYTES,
    compression_damage,
    compression_of,
    open_compressed,
    open_text,
)
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
def open_location(source: Source) -> Iterator[BinaryIO]:
    """Open a file or archive member for reading as bytes, decompressing gzip, xz or bzip2.

    An archive is read in place: a tar is scanned as a stream up to the member, a zip opens the
    member directly. A missing file or member is an :class:`MTError` naming the archive and the
    member, with the archive's members that are most like it.
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
            raw = stack.enter_context(opener(loc))
            stream = stack.enter_context(_decompressed(raw, loc.member))
        except READ_ERRORS as exc:
            raise _unreadable(loc, exc) from None
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


def _decompressed(raw: BinaryIO, name: str) -> contextlib.AbstractContextManager[BinaryIO]:
    """``raw`` decompressed when the member ``name`` is gzip, xz or bzip2 (by suffix or magic)."""
    peek = getattr(raw, "peek", None)
    head = peek(MAGIC_BYTES)[:MAGIC_BYTES] if peek is not None else b""
    kind = compression_of(name, head)
    if kind is None:
        return contextlib.nullcontext(raw)
    return open_compressed(raw, kind)


@contextlib.contextmanager
def _open_zip_member(loc: Location) -> Iterator[BinaryIO]:
    """The member of a zip archive, opened directly."""
    assert loc.member is not None
    with zipfile.ZipFile(loc.path) as zf:
        try:
            info = zf.getinfo(loc.member)
        except KeyError:
            raise _no_member(loc, zf.namelist()) from None
        if info.is_dir():
            raise MTError(f"{loc}: is a directory in the archive; name a file in it")
        try:
            member = zf.open(info)
        except RuntimeError as exc:  # an encrypted member
            raise MTError(f"{loc}: cannot open ({exc}); unpack the archive yourself") from None
        with member:
            # typeshed types zipfile.ZipExtFile as io.BufferedIOBase, not typing.BinaryIO,
            # though it has BinaryIO's reading methods.
            yield member  # type: ignore[misc]


@contextlib.contextmanager
def _open_tar_member(loc: Location) -> Iterator[BinaryIO]:
    """Open the member of a tar archive, reading the archive as a stream.

    The member of a tar archive (plain or compressed), found by reading the archive as a
    stream: nothing is unpacked, and of the members before it only their names are kept."""
    assert loc.member is not None
    wanted = _tar_name(loc.member)
    seen: list[str] = []
    with tarfile.open(loc.path, "r|*") as tar:
        for info in tar:
            if _tar_name(info.name) != wanted:
                seen.append(info.name)
                continue
            if not info.isfile():
                what = "a directory" if info.isdir() else "a link or special file"
                raise MTError(f"{loc}: is {what} in the archive; name the file itself")
            member = tar.extractfile(info)
            assert member is not None
            with member:
                # typeshed types TarFile.extractfile as IO[bytes], not typing.BinaryIO, though
                # it returns a tarfile.ExFileObject (an io.BufferedReader).
                yield member  # type: ignore[misc]
            return
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


def _lines(loc: Location) -> Iterator[tuple[int, str]]:
    """The numbered lines of ``loc``, decoded as strict UTF-8.

    (line number, line) for each ``\\n``-ended line of ``loc``, decoded as strict UTF-8,
    without its line ending (``\\n`` or ``\\r\\n``) or a leading byte-order mark."""
    lineno = 0
    with open_location(loc) as f:
        try:
            for raw in f:
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


def _plain_items(loc: Location) -> Iterator[_Item]:
    """Each line of a one-sentence-per-line file, as one line of text."""
    for lineno, line in _lines(loc):
        yield _Item(lineno, clean_segment(line))


def iter_text_pairs(src: Source, trg: Source) -> Iterator[tuple[str, str]]:
    """Pairs from two aligned one-sentence-per-line files (lines split at ``\\n`` only).

    Raises:
        MTError: a side has more lines than the other (naming both and the line), or a line is
            not valid UTF-8.
    """
    src, trg = as_location(src), as_location(trg)
    yield from _pair_up(src, trg, _plain_items(src), _plain_items(trg), "line")


def iter_tsv_pairs(source: Source, columns: tuple[int, int] = (0, 1)) -> Iterator[tuple[str, str]]:
    """Pairs from the columns ``columns`` (counted from 0) of a tab-separated file.

    Corpus TSVs are not CSV: a quote is text, and a line is split at every tab.

    Raises:
        MTError: a line lacks one of the columns ("FILE:LINE: has N columns, needs column K").
    """
    loc = as_location(source)
    if len(columns) != 2 or min(columns) < 0:
        raise MTError(f"{loc}: columns must be two column numbers from 0 up (got {columns})")
    src_col, trg_col = columns
    need = max(columns)
    for lineno, line in _lines(loc):
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
    source: Source, fields: tuple[str, str] = ("translation.de", "translation.en")
) -> Iterator[tuple[str, str]]:
    """Pairs from a JSON-lines file.

    One object a line, each side at a dotted path into it
    (``translation.de`` is ``obj["translation"]["de"]``). Blank lines are passed over.

    Raises:
        MTError: a line is not a JSON object, or lacks a field, or the field is not a string.
    """
    loc = as_location(source)
    paths = [field.split(".") for field in fields]
    for lineno, line in _lines(loc):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
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
        raise MTError(f"{loc}:{lineno}: field {field!r} is {kind}, not a string")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise MTError(
            f"{loc}:{lineno}: field {field!r} holds an unpaired surrogate escape (\\ud8..); "
            "it is not valid Unicode text"
        ) from None
    return clean_segment(value)


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

_MARKUP = re.compile(
    r"<doc\b(?P<doc>[^>]*)>|</doc\s*>|<seg\b(?P<seg>[^>]*)>(?P<text>.*?)</seg\s*>", re.IGNORECASE
)
_SEG_OPEN = re.compile(r"<seg\b", re.IGNORECASE)


def _attribute(attrs: str, name: str) -> str | None:
    """The value of the attribute ``name`` in a tag's attribute text (quoted or not)."""
    match = re.search(rf"\b{name}\s*=\s*(?:\"([^\"]*)\"|'([^']*)'|([^\s>\"']+))", attrs, re.I)
    if match is None:
        return None
    return next(g for g in match.groups() if g is not None).strip()


def _segments(loc: Location) -> Iterator[_Item]:
    """The ``<seg>`` segments of an SGML or XML file, with their document and segment ids.

    The file is read line by line, tolerantly: a bare ``&`` is text, and other markup is passed
    over; but a segment must open and close on one line."""
    docid: str | None = None
    for lineno, line in _lines(loc):
        if "<" not in line:
            continue
        closed = 0
        for match in _MARKUP.finditer(line):
            if match.group("doc") is not None:
                docid = _attribute(match.group("doc"), "docid")
            elif match.group("seg") is None:
                docid = None  # </doc>
            else:
                closed += 1
                text = clean_segment(html.unescape(match.group("text")))
                yield _Item(lineno, text, (docid, _attribute(match.group("seg"), "id")))
        if len(_SEG_OPEN.findall(line)) > closed:
            raise MTError(
                f"{loc}:{lineno}: <seg> is not closed on its line; each segment must be "
                "<seg ...>text</seg> on one line, fix the file"
            )


def iter_sgm_pairs(src: Source, trg: Source) -> Iterator[tuple[str, str]]:
    """Pairs from WMT ``.sgm`` files, entities such as ``&amp;`` decoded.

    The files hold ``<srcset>``/``<refset>``, ``<doc docid=...>`` and ``<seg id=...>text</seg>``.
    Segments pair up in order; where both sides give document and segment ids, they must match.
    The files are read line by line rather than as XML: real ones are often not well-formed.

    Raises:
        MTError: the sides have different numbers of segments, ids differ, or a ``<seg>`` is not
            closed on its line (naming the file and line).
    """
    src, trg = as_location(src), as_location(trg)
    yield from _pair_up(src, trg, _segments(src), _segments(trg), "segment")


def _tagged_items(loc: Location) -> Iterator[_Item]:
    """The text lines of an IWSLT ``train.tags`` file.

    Markup lines (``<url>``, ``<talkid>``,
    ``<title>``, ``<doc ...>``, ...: a line that starts with ``<``) are left out."""
    for lineno, line in _lines(loc):
        if not line.lstrip().startswith("<"):
            yield _Item(lineno, clean_segment(line))


def _is_xml(loc: Location) -> bool:
    """Whether ``loc`` is named as an XML file (``.xml``, possibly compressed)."""
    name = loc.name.lower()
    for suffix in COMPRESSION_SUFFIXES:
        name = name.removesuffix(suffix)
    return name.endswith(".xml")


def iter_iwslt_pairs(src: Source, trg: Source) -> Iterator[tuple[str, str]]:
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
        yield from _pair_up(src, trg, _segments(src), _segments(trg), "segment")
    else:
        yield from _pair_up(src, trg, _tagged_items(src), _tagged_items(trg), "text line")


# --- TMX -----------------------------------------------------------------------------------------

_XML_LANG = "{http://www.w3.org/XML/1998/namespace}lang"
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


def _primary(lang: str) -> str:
    """The primary language subtag, lower-case: ``de-DE`` and ``de_de`` -> ``de``."""
    return re.split(r"[-_]", lang.strip(), maxsplit=1)[0].lower()


def _local(tag: Any) -> str:
    """An element's tag without its namespace (comments and processing instructions: "")."""
    return tag.rsplit("}", 1)[-1] if isinstance(tag, str) else ""


def iter_tmx_pairs(
    source: Source, src_lang: str, trg_lang: str, stats: TmxStats | None = None
) -> Iterator[tuple[str, str]]:
    """Pairs from a TMX translation memory, one ``<tu>`` at a time (memory stays flat).

    A language matches by its primary subtag, case-insensitively (``de-DE`` matches ``de``), from
    ``xml:lang`` or the older ``lang``. A segment's text is what a reader sees: its own text and
    the text after each inline element; the codes inside ``<bpt>``, ``<ept>``, ``<ph>``, ``<it>``
    and ``<ut>`` are left out, the text inside ``<hi>`` kept. A unit that lacks one of the two
    languages is skipped and counted in ``stats``.

    Raises:
        MTError: the XML is malformed or not UTF-8 ("FILE:LINE: malformed TMX (...)").
    """
    loc = as_location(source)
    stats = stats if stats is not None else TmxStats()
    langs = (_primary(src_lang), _primary(trg_lang))
    if langs[0] == langs[1]:
        raise MTError(
            f"{loc}: the source and target languages {src_lang!r} and {trg_lang!r} are the same "
            "language; TMX units are matched by primary language"
        )
    with open_location(loc) as f:
        try:
            yield from _tmx_units(f, langs, stats)
        except ET.ParseError as exc:
            raise _tmx_error(loc, exc) from None
        except READ_ERRORS as exc:
            raise MTError(
                f"{loc}: cannot read past {stats.units:,} translation units "
                f"({exc or type(exc).__name__}); the file is corrupt or truncated"
            ) from None


def _tmx_units(f: BinaryIO, langs: tuple[str, str], stats: TmxStats) -> Iterator[tuple[str, str]]:
    """The pairs of the ``<tu>`` elements of a TMX stream.

    Each unit is dropped from the tree
    once read, so the tree never holds more than one."""
    open_elements: list[ET.Element] = []
    for event, element in ET.iterparse(f, events=("start", "end")):
        if event == "start":
            open_elements.append(element)
            continue
        open_elements.pop()
        if _local(element.tag) != "tu":
            continue
        stats.units += 1
        pair = _tu_pair(element, langs)
        element.clear()
        if open_elements:
            open_elements[-1].remove(element)  # by now its parent's only child
        if pair is None:
            stats.skipped += 1
        else:
            yield pair


def _tu_pair(tu: ET.Element, langs: tuple[str, str]) -> tuple[str, str] | None:
    """The (source, target) segments of a translation unit, or None when one is missing."""
    found: dict[str, str] = {}
    for tuv in tu:
        lang = tuv.get(_XML_LANG) or tuv.get("lang")
        if _local(tuv.tag) != "tuv" or lang is None:
            continue
        primary = _primary(lang)
        if primary not in langs or primary in found:
            continue
        seg = next((child for child in tuv if _local(child.tag) == "seg"), None)
        if seg is not None:
            found[primary] = clean_segment(_seg_text(seg))
    if len(found) < 2:
        return None
    return found[langs[0]], found[langs[1]]


def _seg_text(element: ET.Element) -> str:
    """The text a reader sees in a ``<seg>`` (or ``<hi>``): see :func:`iter_tmx_pairs`."""
    parts = [element.text or ""]
    for child in element:
        if _local(child.tag) in _INLINE_TEXT:
            parts.append(_seg_text(child))
        parts.append(child.tail or "")
    return "".join(parts)


def _tmx_error(loc: Location, exc: ET.ParseError) -> MTError:
    """The one-line error for malformed TMX: the line, and whether the bytes were not UTF-8."""
    line, column = exc.position
    reason = str(exc).split(":", 1)[0]
    if "invalid token" in reason and _line_is_not_utf8(loc, line):
        return MTError(f"{loc}:{line}: invalid UTF-8; convert the file to UTF-8")
    return MTError(
        f"{loc}:{line}: malformed TMX ({reason} at column {column + 1}); fix or export the file "
        "again"
    )


def _line_is_not_utf8(loc: Location, lineno: int) -> bool:
    """Whether line ``lineno`` of ``loc`` is not valid UTF-8 (read again, for an error only)."""
    with open_location(loc) as f:
        for n, raw in enumerate(f, start=1):
            if n == lineno:
                try:
                    raw.decode("utf-8")
                except UnicodeDecodeError:
                    return True
                return False
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
