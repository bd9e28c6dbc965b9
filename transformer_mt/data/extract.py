"""One source of ``data.train`` / ``valid`` / ``test`` -> a plain (source, target) file pair.

Plain text files (``.gz``, ``.xz`` and ``.bz2`` included) are read where they are. Every other
source is read once through its reader (:mod:`transformer_mt.data.readers` for files and
archives, :mod:`transformer_mt.data.external` for sacrebleu, mtdata and Hugging Face datasets)
into one-sentence-per-line files under ``<data.cache_dir>/sources/``, keyed by a hash of the
source's settings and of its input files' bytes; cleaning, tokenization and binarization then
read them like any text pair. A changed input file or setting gets a new entry; an unchanged one
is reused (a second run reads no archive or XML again). The files are written aside and renamed
into place complete, under a lock beside them (processes sharing the cache extract once).
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from transformer_mt.config import Config, SourceConfig
from transformer_mt.data.binarized import cache_key
from transformer_mt.data.limits import ReadLimits
from transformer_mt.data.locking import exclusive_lock
from transformer_mt.data.sides import source_kind
from transformer_mt.errors import MTError

log = logging.getLogger(__name__)

EXTRACT_VERSION = 1  # bump when a reader's output changes: every extracted file is read again
_COMPRESSED = (".gz", ".xz", ".bz2")
_NOT_READ = ("weight", "name", "src_lang", "trg_lang")  # source keys the extracted text ignores
# The split a Hugging Face dataset calls ours by.
_HF_SPLITS = {"train": "train", "valid": "validation", "test": "test"}

Pairs = Iterator[tuple[str, str]]


@dataclass(frozen=True)
class SplitSource:
    """One source of a split, as data preparation reads it: a plain text file pair."""

    label: str  # a plain name: reports and cache entries
    files: tuple[Path, Path]  # (source-language file, target-language file)
    weight: float = 1.0  # training sources: the share of it an epoch draws
    pair: tuple[str, str] | None = None  # (source, target) language; None = the config's


def source_label(source: SourceConfig) -> str:
    """``source.name``, or a plain name made from what the source is (file stem, dataset ID)."""
    if source.name:
        return source.name
    kind, value = source_kind(source)
    if kind in ("src", "tsv", "jsonl", "parquet", "tmx"):
        value = _stem(Path(value).name)
    elif kind == "hf":
        value = "-".join(x for x in (Path(value).name, source.hf_config, source.split) if x)
    return re.sub(r"[^A-Za-z0-9_.+-]+", "_", value).strip("._") or kind


def _stem(name: str) -> str:
    for suffix in _COMPRESSED:
        name = name.removesuffix(suffix)
    return name.rsplit(".", 1)[0] if "." in name else name


def text_format(name: str) -> str:
    """How a src/trg file is read, from its name.

    "sgm" (WMT), "iwslt" (.xml, train.tags), or
    "text" (one sentence a line)."""
    for suffix in _COMPRESSED:
        name = name.removesuffix(suffix)
    if name.endswith(".sgm"):
        return "sgm"
    if name.endswith(".xml") or ".tags." in name or name.startswith("train.tags"):
        return "iwslt"
    return "text"


def resolve_source(cfg: Config, source: SourceConfig, split: str, label: str) -> SplitSource:
    """The text file pair ``source`` means, read and extracted when needed.

    A registry corpus (``corpus``: downloaded, not read) is :mod:`transformer_mt.data.sources`'
    to resolve; every other kind is this module's."""
    weight = source.weight
    if source.corpus is not None:
        raise AssertionError("data.sources resolves registry corpora")
    if source.src is not None and source.archive is None and text_format(source.src) == "text":
        files = (Path(source.src), Path(source.trg or ""))
        for key, path in zip(("src", "trg"), files, strict=True):
            if not path.is_file():
                raise MTError(f"{label}: {key} {path} is not a file; check the path")
        return SplitSource(label, files, weight)
    return SplitSource(label, _extracted(cfg, source, split, label), weight)


def _extracted(cfg: Config, source: SourceConfig, split: str, label: str) -> tuple[Path, Path]:
    """The cache's text pair for ``source``, extracted first when missing."""
    from transformer_mt.data.readers import write_pairs

    langs = (cfg.data.src_lang, cfg.data.trg_lang)
    limits = ReadLimits.of(cfg.data)
    reader, identity = _reader(source, split, langs, limits)
    # What the text depends on: neither the weight (it only mixes) nor the name (it names the
    # folder), and the languages as resolved (a null and the config's own code are one source).
    read = {k: v for k, v in dataclasses.asdict(source).items() if k not in _NOT_READ}
    key = cache_key({"version": EXTRACT_VERSION, "source": read, "langs": langs}, *identity)[:16]
    out = Path(cfg.data.cache_dir) / "sources" / f"{label}-{key}"
    files = (out / f"{split}.{langs[0]}", out / f"{split}.{langs[1]}")
    if all(p.is_file() for p in files):
        return files
    out.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(out / "extract.lock"):
        if not all(p.is_file() for p in files):
            what = source_kind(source)[1]
            log.info(f"{label}: reading {what} into {out}")
            count = write_pairs(_bounded(reader(), f"{label} ({what})", limits), *files)
            log.info(f"{label}: {count:,} pairs")
    return files


def _bounded(pairs: Pairs, where: str, limits: ReadLimits) -> Pairs:
    """``pairs``, each side at most ``limits.max_line_bytes`` long in UTF-8.

    A line of a text file is bounded as it is read; a record's side (Parquet, Hugging Face,
    mtdata) is bounded here, before it becomes a line of the extracted text.
    """
    limit = limits.max_line_bytes
    for number, pair in enumerate(pairs, start=1):
        for side in pair:
            # UTF-8 takes 1 to 4 bytes a character: only a side in between is measured.
            if len(side) > limit or (4 * len(side) > limit and len(side.encode()) > limit):
                raise MTError(
                    f"{where}: pair {number:,}: a side is longer than {limit:,} bytes "
                    "(data.max_line_bytes); check the source, or raise data.max_line_bytes"
                )
        yield pair


def _reader(
    source: SourceConfig, split: str, langs: tuple[str, str], limits: ReadLimits
) -> tuple[Callable[[], Pairs], list[Path | str]]:
    """(a function streaming the source's pairs, what identifies its contents for the key)."""
    from transformer_mt.data import readers

    kind, value = source_kind(source)
    named = source.fields or (f"translation.{langs[0]}", f"translation.{langs[1]}")
    fields = (named[0], named[1])  # two, as the config checks
    if kind in ("mtdata", "hf", "sacrebleu"):
        return _external(source, kind, value, split, langs, fields, limits)
    archive = Path(source.archive) if source.archive else None

    def where(name: str) -> readers.Location:
        return readers.Location(archive, name) if archive else readers.Location(Path(name))

    identity: list[Path | str] = [archive] if archive else []
    if kind == "src":
        src, trg = where(value), where(source.trg or "")
        identity += [] if archive else [src.path, trg.path]
        read = {
            "sgm": readers.iter_sgm_pairs,
            "iwslt": readers.iter_iwslt_pairs,
            "text": readers.iter_text_pairs,
        }[text_format(value)]
        return (lambda: read(src, trg, limits=limits)), identity
    loc = where(value)
    identity += [] if archive else [loc.path]
    if kind == "tsv":
        columns = (source.columns[0], source.columns[1])
        return (lambda: readers.iter_tsv_pairs(loc, columns, limits=limits)), identity
    if kind == "jsonl":
        return (lambda: readers.iter_jsonl_pairs(loc, fields, limits=limits)), identity
    if kind == "parquet":
        return (lambda: readers.iter_parquet_pairs(loc.path, fields)), identity

    def tmx() -> Pairs:
        stats = readers.TmxStats()
        yield from readers.iter_tmx_pairs(loc, *langs, stats, limits=limits)
        log.info(f"{loc}: {stats.format(*langs)}")

    return tmx, identity


def _external(
    source: SourceConfig,
    kind: str,
    value: str,
    split: str,
    langs: tuple[str, str],
    fields: tuple[str, str],
    limits: ReadLimits,
) -> tuple[Callable[[], Pairs], list[Path | str]]:
    """Readers and identities of the sources that the field's libraries fetch."""
    from transformer_mt.data import external

    if kind == "sacrebleu":
        identity = external.sacrebleu_identity(value, *langs)
        max_bytes = limits.max_line_bytes
        return (lambda: external.sacrebleu_pairs(value, *langs, max_line_bytes=max_bytes)), [
            identity
        ]
    if kind == "mtdata":
        identity = external.mtdata_identity(value, *langs)
        return (lambda: external.mtdata_pairs(value, *langs)), [identity]
    hf_split = source.split or _HF_SPLITS[split]
    hf_fields = fields if source.fields else None
    identity = external.hf_identity(value, source.hf_config, hf_split, *langs, fields=hf_fields)
    return (
        lambda: external.hf_pairs(value, source.hf_config, hf_split, *langs, fields=hf_fields)
    ), [identity]
