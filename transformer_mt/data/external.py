"""Parallel text from the field's own libraries, as streams of (source, target) pairs.

The sources are sacrebleu's test sets, mtdata's datasets and Hugging Face ``datasets``. Each
library is imported only when its source is used (``mtdata`` and ``datasets`` are optional
extras) and does its own fetching, checking and caching, where its users already keep it:

- sacrebleu: ``$SACREBLEU`` (default ``~/.sacrebleu``), with its URLs and MD5 sums;
- mtdata: ``$MTDATA`` (default ``~/.mtdata``), with its index of dataset IDs and its readers;
- datasets: ``$HF_HOME`` / ``$HF_DATASETS_CACHE``; with ``HF_HUB_OFFLINE=1`` only what that
  cache holds is read.

Each ``*_pairs`` function checks what it is asked for at once (an unknown name, a language the
source lacks: an :class:`MTError` that lists what the source has), fetches what is missing, and
returns an iterator that reads lazily, in the source's own order, each side on one line
(:func:`one_line`). Each ``*_identity`` function names that content cheaply, for cache keys.
"""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import importlib
import itertools
import logging
import os
import re
import tarfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

from transformer_mt.data.limits import DEFAULT_LIMITS, LineTooLong, bounded_lines
from transformer_mt.errors import MTError

logger = logging.getLogger(__name__)

Pair = tuple[str, str]
_T = TypeVar("_T")

_LINE_BREAKS = re.compile("[\t\n\v\f\r\x1c\x1d\x1e\x85\u2028\u2029]+")
"""Tabs and every character at which ``str.splitlines`` breaks a line."""


def one_line(text: str) -> str:
    """``text`` as one segment of a one-sentence-per-line file.

    Each run of tabs and line breaks (CR, LF, U+2028, U+2029 and the rest of those at which
    ``str.splitlines`` breaks) becomes a space, and the outer whitespace goes: a line break inside
    a segment would shift every later line of the file against its translation.
    """
    return _LINE_BREAKS.sub(" ", text).strip()


def _require(module: str, extra: str | None) -> ModuleType:
    """Import ``module``; if it is missing, an MTError saying what to install."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        install = f"pip install 'transformer-mt[{extra}]'" if extra else f"pip install {module}"
        raise MTError(f"this data source needs the {module} package ({exc}): {install}") from exc


def _flat(exc: BaseException) -> str:
    """A library's (possibly multi-line) error message as one line."""
    return "; ".join(line.strip() for line in str(exc).splitlines() if line.strip())


def _guarded(
    items: Iterator[_T],
    errors: tuple[type[Exception], ...],
    message: Callable[[int, Exception], str],
    around: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext,
    chunk: int = 1,
) -> Iterator[_T]:
    """The items of a library's reader, with its errors for bad input as MTErrors.

    Items are read ``chunk`` at a time inside ``around()``; one of ``errors`` becomes an MTError
    with ``message(item number, error)``.
    """
    done = 0  # items read in earlier chunks
    while True:
        batch: list[_T] = []
        try:
            with around():
                for item in itertools.islice(items, chunk):
                    batch.append(item)
        except errors as exc:
            raise MTError(message(done + len(batch) + 1, exc)) from exc
        yield from batch
        if len(batch) < chunk:
            return
        done += chunk


# --- sacrebleu ------------------------------------------------------------------------------------


def sacrebleu_pairs(
    test_set: str,
    src_lang: str,
    trg_lang: str,
    *,
    max_line_bytes: int = DEFAULT_LIMITS.max_line_bytes,
) -> Iterator[Pair]:
    """(source, reference) pairs of a sacrebleu test set, such as ``"wmt14/full"`` or ``"wmt14"``.

    ``sacrebleu_pairs("wmt14/full", "de", "en")`` reads what ``sacrebleu -t wmt14/full -l de-en
    --echo src,ref`` prints. sacrebleu downloads the set into its cache the first time, checks
    its MD5 sum and converts it to text files that later calls reuse. A set with several
    references gives the first one. A damaged cache (files that are not UTF-8, cut short, or
    with a line longer than ``max_line_bytes``) is an error that names the folder to delete.

    Raises:
        MTError: an unknown test set (with similar names), a language pair the set lacks (with
            the pairs it has), a failed download, or a damaged cache.
    """
    dataset, langpair = _sacrebleu_dataset(test_set, src_lang, trg_lang)
    with _sacrebleu_failures(test_set):
        source = Path(dataset.get_source_file(langpair))
        reference = Path(dataset.get_reference_files(langpair)[0])
    return _zip_lines(source, reference, _sacrebleu_dir(test_set), max_line_bytes)


def sacrebleu_identity(test_set: str, src_lang: str, trg_lang: str) -> str:
    """A name for what :func:`sacrebleu_pairs` reads, for cache keys; nothing is read.

    It holds sacrebleu's version (its conversion shapes the text), the set, the language pair
    and the MD5 sums (else the URLs) of the set's download.
    """
    dataset, langpair = _sacrebleu_dataset(test_set, src_lang, trg_lang)
    sums = ",".join(dataset.md5 or dataset.data)
    return f"sacrebleu {_require('sacrebleu', None).__version__} {test_set} {langpair} {sums}"


def _sacrebleu_dataset(test_set: str, src_lang: str, trg_lang: str) -> tuple[Any, str]:
    """sacrebleu's dataset object for ``test_set``, and its language pair ``src-trg``."""
    datasets = _require("sacrebleu.dataset", None).DATASETS
    if test_set not in datasets:
        close = difflib.get_close_matches(test_set, list(datasets), n=5)
        similar = f"similar: {', '.join(close)}; " if close else ""
        raise MTError(
            f"sacrebleu has no test set {test_set!r}; {similar}`sacrebleu --list` names them all"
        )
    dataset, langpair = datasets[test_set], f"{src_lang}-{trg_lang}"
    if langpair not in dataset.langpairs:
        pairs = ", ".join(dataset.langpairs)
        raise MTError(f"sacrebleu test set {test_set} has no {langpair}; it has {pairs}")
    return dataset, langpair


def _sacrebleu_dir(test_set: str) -> str:
    """The folder of sacrebleu's cache that holds ``test_set`` (its download and its text)."""
    return os.path.join(_require("sacrebleu.utils", None).SACREBLEU_DIR, test_set)


# A file of its copy that does not read as sacrebleu wrote it: bytes that are not UTF-8, a tar cut
# short, a folder where a file was.
_SACREBLEU_DAMAGE = (
    UnicodeDecodeError,
    EOFError,
    tarfile.TarError,
    IsADirectoryError,
    NotADirectoryError,
)


@contextlib.contextmanager
def _sacrebleu_failures(test_set: str) -> Iterator[None]:
    """A failed sacrebleu download, or a damaged copy in its cache, as an MTError."""
    where = _sacrebleu_dir(test_set)
    try:
        yield
    # sacrebleu exits on a wrong MD5 sum or an SSL error, after logging why
    except SystemExit as exc:
        raise MTError(
            f"sacrebleu could not fetch {test_set} (its message above says why); "
            f"delete {where} and try again"
        ) from exc
    except FileNotFoundError as exc:  # an unpacked file missing: the tar was not (fully) unpacked
        raise MTError(
            f"sacrebleu's copy of {test_set} lacks {exc.filename}; delete {where} so that "
            "sacrebleu fetches it again"
        ) from exc
    except _SACREBLEU_DAMAGE as exc:
        raise _sacrebleu_damaged(test_set, where, exc) from exc
    except OSError as exc:
        if exc.filename is not None:  # its cache, not the network (permissions, disk full)
            raise MTError(
                f"sacrebleu could not use {exc.filename} ({exc.strerror or _flat(exc)}); check "
                "that path ($SACREBLEU moves the cache)"
            ) from exc
        # urllib's errors
        raise MTError(
            f"sacrebleu could not fetch {test_set} into {where} ({_flat(exc)}); "
            "check the network connection ($SACREBLEU moves the cache)"
        ) from exc


def _sacrebleu_damaged(test_set: str, where: str, exc: BaseException) -> MTError:
    """The error for a copy of ``test_set`` in sacrebleu's cache that cannot be read."""
    return MTError(
        f"sacrebleu's copy of {test_set} in {where} is damaged ({type(exc).__name__}: "
        f"{_flat(exc)}); delete {where} so that sacrebleu fetches it again"
    )


def _zip_lines(source: Path, target: Path, where: str, max_line_bytes: int) -> Iterator[Pair]:
    """The lines of two aligned text files of sacrebleu's cache folder ``where``, as pairs.

    Files of different lengths are an MTError: a conversion that was cut short leaves them. So is
    a line that is not UTF-8, or longer than ``max_line_bytes``: each names ``where`` to delete.
    """
    with source.open("rb") as src, target.open("rb") as trg:
        sides = (
            bounded_lines(src, max_line_bytes, source),
            bounded_lines(trg, max_line_bytes, target),
        )
        number = 0
        try:
            for number, (s, t) in enumerate(itertools.zip_longest(*sides), start=1):
                if s is None or t is None:
                    longer, shorter = (source, target) if t is None else (target, source)
                    raise MTError(
                        f"{longer} has more lines than {shorter} (from line {number}); delete "
                        "both so that they are made again"
                    )
                yield one_line(s.decode("utf-8")), one_line(t.decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise MTError(
                f"{source} / {target}: line {number} is not UTF-8 ({exc.reason}); sacrebleu's "
                f"cache is damaged: delete {where} so that sacrebleu makes it again"
            ) from None
        except LineTooLong as exc:
            raise MTError(
                f"{exc}; in sacrebleu's cache such a line is damage: delete {where}"
            ) from None


# --- mtdata ---------------------------------------------------------------------------------------


def mtdata_pairs(dataset_id: str, src_lang: str, trg_lang: str) -> Iterator[Pair]:
    """(source, target) pairs of an mtdata dataset, such as ``"Statmt-news_commentary-16-deu-eng"``.

    ``mtdata_pairs("Statmt-news_commentary-16-deu-eng", "en", "de")`` gives English first,
    whatever the order in the ID. mtdata matches the language codes (ISO 639-1 or -3, BCP-47)
    to the dataset's sides, downloads the dataset into its cache once and reads it with its own
    reader for the format. Every record with two sides is kept, empty ones too, in the
    dataset's order.

    Raises:
        MTError: mtdata missing, a malformed or unknown ID (with similar IDs), a language the
            dataset lacks, a failed download or an unreadable record.
    """
    with _mtdata_logging():
        entry, swapped = _mtdata_entry(dataset_id, src_lang, trg_lang)
        paths = _mtdata_fetch(entry)
        parser = _require("mtdata.parser", "mtdata").Parser(
            paths, ext=entry.in_ext or None, ent=entry
        )
    return _mtdata_records(entry, parser, swapped)


def mtdata_identity(dataset_id: str, src_lang: str, trg_lang: str) -> str:
    """A name for what :func:`mtdata_pairs` reads, for cache keys; mtdata's index is not loaded.

    It holds mtdata's version (its readers shape the text), the ID and the direction. An mtdata
    ID carries the dataset's version, so the content does not change under it.
    """
    with _mtdata_logging():
        did, langs = _mtdata_id(dataset_id), _mtdata_langs(src_lang, trg_lang)
        return f"mtdata {_require('mtdata', 'mtdata').__version__} {did} {langs[0]}-{langs[1]}"


class _MtdataWarnings(logging.Handler):
    """mtdata's warnings and errors (it logs on the root logger) passed to this module's logger."""

    def __init__(self) -> None:
        """A handler for warnings and errors only."""
        super().__init__(logging.WARNING)

    def emit(self, record: logging.LogRecord) -> None:
        """Log an mtdata record again on this module's logger."""
        if record.name == "root":  # not the records of named loggers, which propagate here too
            logger.log(record.levelno, f"mtdata: {record.getMessage()}")


_MTDATA_WARNINGS = _MtdataWarnings()


@contextlib.contextmanager
def _mtdata_logging() -> Iterator[None]:
    """Run mtdata code with a handler on the root logger, removed afterwards.

    mtdata logs through ``logging.info()`` and its kin, which give the root logger a handler of
    their own when it has none, and its import does the same (``logging.basicConfig``): every
    message of this package would then show twice, for the rest of the process. With a handler
    there, both do nothing; mtdata's warnings go to this module's logger.
    """
    root = logging.getLogger()
    level = root.level
    root.addHandler(_MTDATA_WARNINGS)
    try:
        yield
    finally:
        root.removeHandler(_MTDATA_WARNINGS)
        root.setLevel(level)


def _mtdata_id(dataset_id: str) -> Any:
    """mtdata's parsed form of ``dataset_id`` (its languages as BCP-47 tags)."""
    parse = _require("mtdata.entry", "mtdata").DatasetId.parse
    try:
        return parse(dataset_id)
    except Exception as exc:  # mtdata raises Exception, AssertionError or ValueError here
        raise MTError(f"mtdata dataset ID {dataset_id!r}: {_flat(exc)}") from exc


def _mtdata_langs(src_lang: str, trg_lang: str) -> tuple[Any, Any]:
    """The two language codes as mtdata's BCP-47 tags; two codes of one language are an error."""
    bcp47 = _require("mtdata.iso.bcp47", "mtdata").bcp47
    try:
        src, trg = bcp47(src_lang), bcp47(trg_lang)
    except ValueError as exc:
        raise MTError(f"mtdata: {_flat(exc)}; use ISO 639 codes such as de or deu") from exc
    if src.is_compatible(trg):
        raise MTError(f"mtdata: {src_lang} and {trg_lang} are both {src}; give two languages")
    return src, trg


def _mtdata_entry(dataset_id: str, src_lang: str, trg_lang: str) -> tuple[Any, bool]:
    """mtdata's entry for ``dataset_id`` (languages in either order), and whether it is swapped.

    Swapped: its sides are the other way round from (src_lang, trg_lang).
    """
    did, langs = _mtdata_id(dataset_id), _mtdata_langs(src_lang, trg_lang)
    index_file = _require("mtdata", "mtdata").cached_index_file
    if not index_file.exists():
        logger.info(f"mtdata: indexing its datasets, once, into {index_file}")
    index = _require("mtdata.index", "mtdata").INDEX
    flipped = type(did)(did.group, did.name, did.version, tuple(reversed(did.langs)))
    key = did if did in index else flipped
    if key not in index:
        raise MTError(_mtdata_unknown(dataset_id, did, langs, index))
    entry = index[key]
    bcp47_tag = _require("mtdata.iso.bcp47", "mtdata").BCP47Tag
    compatible, swapped = bcp47_tag.check_compat_swap(langs, entry.did.langs)
    if not compatible:
        raise MTError(
            f"mtdata dataset {entry.did} is {entry.did.lang_str}, not {src_lang}-{trg_lang}; "
            f"`mtdata list -id -l {src_lang}-{trg_lang}` lists the datasets of that pair"
        )
    return entry, bool(swapped)


def _mtdata_unknown(dataset_id: str, did: Any, langs: tuple[Any, Any], index: Any) -> str:
    """The message for an ID that mtdata's index lacks, with the IDs that come closest.

    Those are the bitext IDs, in the language pair asked for, of the closest dataset names
    (closest name first), or else those names.
    """
    entries = [e for e in index.get_entries() if len(e.did.langs) == 2]
    names = sorted({f"{e.did.group}-{e.did.name}" for e in entries})
    close = difflib.get_close_matches(f"{did.group}-{did.name}", names, n=3)
    by_name: dict[str, list[str]] = {name: [] for name in close}
    for e in entries:
        name = f"{e.did.group}-{e.did.name}"
        if name in by_name and e.is_compatible(langs):
            by_name[name].append(str(e.did))
    ids = [found for name in close for found in sorted(by_name[name], reverse=True)]
    similar = ids[:6] or close
    listed = f"similar: {', '.join(similar)}; " if similar else ""
    pair = "-".join(str(lang) for lang in langs)
    return f"mtdata has no dataset {dataset_id}; {listed}`mtdata list -id -l {pair}` lists them"


def _mtdata_fetch(entry: Any) -> Any:
    """The local path(s) of an mtdata dataset, downloaded into mtdata's cache if missing."""
    mtdata = _require("mtdata", "mtdata")
    try:
        return _require("mtdata.cache", "mtdata").Cache(mtdata.cache_dir).get_entry(entry)
    # requests' errors are OSErrors; mtdata asserts that the server answered 200
    except (mtdata.MTDataException, OSError, AssertionError) as exc:
        raise MTError(
            f"mtdata could not fetch {entry.did} into {mtdata.cache_dir} "
            f"({type(exc).__name__}: {_flat(exc)}); check the network connection "
            "($MTDATA moves the cache)"
        ) from exc


def _mtdata_records(entry: Any, parser: Any, swapped: bool) -> Iterator[Pair]:
    """The records that mtdata's parser reads, as (source, target) pairs."""
    records = _guarded(
        parser.read_segs(show_pbar=False),
        # a line without its tab, bad UTF-8, a truncated archive:
        (IndexError, ValueError, OSError, EOFError),
        lambda number, exc: (
            f"mtdata cannot read record {number} of {entry.did} ({type(exc).__name__}: "
            f"{_flat(exc)}); if its download was cut short, delete it from the mtdata cache"
        ),
        around=_mtdata_logging,  # its readers log as they go
        chunk=1024,
    )
    skipped = 0
    for record in records:
        if len(record) < 2:
            skipped += 1
            continue
        first, second = one_line(record[0] or ""), one_line(record[1] or "")
        yield (second, first) if swapped else (first, second)
    if skipped:
        logger.warning(f"warning: mtdata {entry.did}: skipped {skipped} records with one side")


# --- Hugging Face datasets ------------------------------------------------------------------------

HF_FILE_BUILDERS = {
    ".parquet": "parquet",
    ".jsonl": "json",
    ".json": "json",
    ".arrow": "arrow",
    ".csv": "csv",
}
"""A local data file's suffix (before any .gz/.bz2/.xz/.zst) -> the datasets builder reading it."""

_COMPRESSIONS = (".gz", ".bz2", ".xz", ".zst")


def hf_pairs(
    name_or_path: str,
    config: str | None,
    split: str,
    src_lang: str,
    trg_lang: str,
    fields: tuple[str, str] | None = None,
) -> Iterator[Pair]:
    """(source, target) pairs of one split of a Hugging Face dataset, local or on the Hub.

    ``name_or_path`` is a Hub name (``"wmt/wmt14"``, config ``"de-en"``), a local directory of
    data files or one saved with ``save_to_disk``, or one local data file (parquet, jsonl/json,
    arrow, csv; it is the ``split`` asked for). Rows are read from ``translation[src_lang]`` and
    ``translation[trg_lang]``, or from the two dotted ``fields`` (``("meta.src", "meta.trg")``).
    Hub datasets and data files are streamed (``load_dataset(..., streaming=True)``); with
    ``HF_HUB_OFFLINE=1`` a Hub dataset is read from the datasets cache. A null value gives an
    empty side.

    A local directory that holds a Python file (a dataset loading script) is refused: nothing
    of it is run. A ``save_to_disk`` dataset is checked whole (pyarrow's full validation) before
    its first row is read: a damaged one is an error naming the folder, never a crash.

    Raises:
        MTError: datasets missing; an unknown dataset, config or split, or a field or language
            that the first row lacks (each with what exists); a value that is not text; a data
            file datasets cannot parse; a damaged saved dataset; a loading script.
    """
    datasets = _require("datasets", "hf")
    where = name_or_path + (f" ({config})" if config else "") + f" split {split}"
    paths = _hf_field_paths(src_lang, trg_lang, fields)
    saved = _hf_saved_dir(datasets, name_or_path)

    def stopped(number: int, exc: Exception) -> str:
        if saved is not None:
            return _hf_damaged(saved, f"row {number}: {_flat(exc)}")
        return f"{where}: reading stopped after {number - 1} rows ({_flat(exc)})"

    rows = _guarded(
        iter(_hf_rows(datasets, name_or_path, config, split, where)),
        # a file that does not parse (pyarrow's errors are ValueErrors, OSErrors or their own):
        (ValueError, OSError, datasets.exceptions.DatasetsError, _arrow_error()),
        stopped,
    )
    first = next(rows, None)
    if first is None:
        return iter(())
    for path in paths:  # now, so that a wrong field fails before any work
        _hf_text(first, path, 1, where)
    return _hf_sides(itertools.chain([first], rows), paths, where)


def hf_identity(
    name_or_path: str,
    config: str | None,
    split: str,
    src_lang: str,
    trg_lang: str,
    fields: tuple[str, str] | None = None,
) -> str:
    """A cheap name for what :func:`hf_pairs` reads, for cache keys.

    For a local file or directory it holds the names, sizes and modification times of its files;
    for a Hub dataset, the revision (commit) that datasets resolves it to (offline: the one in
    its cache); then the config, split and fields.
    """
    path = Path(name_or_path).expanduser()
    if path.exists():
        source = f"{path.resolve()} {_stat_fingerprint(path)}"
    else:
        datasets = _require("datasets", "hf")
        builder = _hf_load(
            datasets, name_or_path, datasets.load_dataset_builder, name_or_path, config
        )
        source = f"{name_or_path} {builder.config_id} {builder.hash}"
    read = fields or (f"translation.{src_lang}", f"translation.{trg_lang}")
    return f"hf {source} {config} {split} {read[0]} {read[1]}"


def _hf_field_paths(
    src_lang: str, trg_lang: str, fields: tuple[str, str] | None
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The key paths of the two sides in a row: ``translation.<lang>``, or the dotted ``fields``."""
    if fields is None:
        return ("translation", src_lang), ("translation", trg_lang)
    if len(fields) != 2 or any("" in f.split(".") for f in fields):
        raise MTError(f"fields={fields!r}: name two fields, such as ('src', 'meta.trg')")
    return tuple(fields[0].split(".")), tuple(fields[1].split("."))


def _arrow_error() -> type[Exception]:
    """pyarrow's base exception (datasets depends on pyarrow; imported with it)."""
    error: type[Exception] = importlib.import_module("pyarrow").ArrowException
    return error


def _hf_saved_dir(datasets: ModuleType, name_or_path: str) -> Path | None:
    """The directory ``name_or_path`` when it holds a dataset saved with ``save_to_disk``."""
    path = Path(name_or_path).expanduser()
    saved = (datasets.config.DATASETDICT_JSON_FILENAME, datasets.config.DATASET_STATE_JSON_FILENAME)
    return path if path.is_dir() and any((path / name).is_file() for name in saved) else None


def _hf_damaged(path: Path, why: str) -> str:
    """The message for a ``save_to_disk`` dataset that cannot be read."""
    return (
        f"{path}: the dataset saved with save_to_disk is damaged ({why}); delete {path} and "
        "save it again"
    )


def _hf_no_script(path: Path) -> None:
    """Refuse a local dataset directory that holds Python code: a loading script is never run.

    datasets (before 4.0) runs ``<dir>/<dir>.py`` to build such a dataset, arbitrary code from
    wherever the directory came from; later versions refuse it with a traceback.
    """
    script = next((p for p in sorted(path.rglob("*.py")) if p.is_file()), None)
    if script is not None:
        raise MTError(
            f"{path}: holds {script.relative_to(path)}, a dataset loading script; scripts are "
            "never run: give a directory of data files (parquet, jsonl, csv, arrow) or one "
            "saved with save_to_disk"
        )


def _hf_rows(
    datasets: ModuleType, name_or_path: str, config: str | None, split: str, where: str
) -> Iterable[Mapping[str, Any]]:
    """The rows of one split, memory-mapped (``save_to_disk``) or streamed (the others)."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        _hf_no_script(path)
    if _hf_saved_dir(datasets, name_or_path) is not None:
        _hf_no_config(config, path, "a dataset saved with save_to_disk")
        return _hf_saved_split(datasets, path, split)
    if path.is_file():
        _hf_no_config(config, path, "a data file")
        files = {split: str(path)}
        load = datasets.load_dataset
        return _hf_load(
            datasets, where, load, _hf_builder(path), data_files=files, split=split, streaming=True
        )
    if path.is_dir():
        name_or_path = str(path)
    elif name_or_path.startswith(("/", "./", "../", "~")) or path.suffix in HF_FILE_BUILDERS:
        raise MTError(f"{name_or_path}: no such file or directory")
    return _hf_load(
        datasets, where, datasets.load_dataset, name_or_path, config, split=split, streaming=True
    )


def _hf_no_config(config: str | None, path: Path, what: str) -> None:
    """Refuse a config for a local file or saved dataset, which would ignore it."""
    if config is not None:
        raise MTError(f"{path} is {what}, which has no configs; leave out the config {config!r}")


def _hf_builder(path: Path) -> str:
    """The datasets builder that reads a local data file, told by its suffix."""
    suffixes = [s.lower() for s in path.suffixes if s.lower() not in _COMPRESSIONS]
    builder = HF_FILE_BUILDERS.get(suffixes[-1] if suffixes else "")
    if builder is None:
        known = ", ".join(HF_FILE_BUILDERS)
        raise MTError(f"{path}: not a data file that datasets reads; use one of {known}")
    return builder


def _hf_saved_split(datasets: ModuleType, path: Path, split: str) -> Iterable[Mapping[str, Any]]:
    """One split of a dataset saved with ``save_to_disk``, its arrow data validated whole.

    Memory-mapped arrow data is trusted by pyarrow's reads: damaged offsets would read past the
    file. So the split is validated (``Table.validate(full=True)``, linear in its size) first.
    """
    errors = (ValueError, OSError, KeyError, TypeError, datasets.exceptions.DatasetsError)
    try:
        saved = datasets.load_from_disk(str(path))
        if isinstance(saved, datasets.DatasetDict):
            if split not in saved:
                raise MTError(f"{path}: no split {split!r}; it has {', '.join(saved)}")
            saved = saved[split]
        elif saved.split is not None and str(saved.split) != split:
            raise MTError(f"{path}: no split {split!r}; it holds the split {saved.split}")
        getattr(saved.data, "table", saved.data).validate(full=True)
    except (*errors, _arrow_error()) as exc:
        raise MTError(_hf_damaged(path, f"{type(exc).__name__}: {_flat(exc)}")) from None
    return saved


def _hf_load(
    datasets: ModuleType, where: str, load: Callable[..., _T], *args: Any, **kwargs: Any
) -> _T:
    """``load(*args, **kwargs)``, a datasets loader, with its errors as one-line MTErrors.

    Those are its errors for an unknown dataset, config or split, or an unreachable Hub.
    """
    try:
        return load(*args, **kwargs)
    # OSError: its ConnectionError (the Hub unreachable) and FileNotFoundError
    except RuntimeError as exc:  # datasets 4+: "Dataset scripts are no longer supported"
        if "script" not in str(exc):
            raise
        raise MTError(
            f"Hugging Face dataset {where}: {_flat(exc)}; loading scripts are never run: use "
            "a dataset of data files (parquet, jsonl, csv, arrow)"
        ) from exc
    except (ValueError, OSError, datasets.exceptions.DatasetsError) as exc:
        offline = ""
        if isinstance(exc, ConnectionError) and datasets.config.HF_HUB_OFFLINE:
            cache = datasets.config.HF_DATASETS_CACHE
            offline = f"; HF_HUB_OFFLINE is set: only datasets in {cache} can be read"
        raise MTError(f"Hugging Face dataset {where}: {_flat(exc)}{offline}") from exc


def _hf_sides(
    rows: Iterable[Mapping[str, Any]], paths: tuple[tuple[str, ...], ...], where: str
) -> Iterator[Pair]:
    """The two sides of each row."""
    src_path, trg_path = paths
    for number, row in enumerate(rows, start=1):
        yield _hf_text(row, src_path, number, where), _hf_text(row, trg_path, number, where)


def _hf_text(row: Mapping[str, Any], path: tuple[str, ...], number: int, where: str) -> str:
    """The text at ``path`` in ``row`` (None -> ""), or an MTError naming the keys that exist."""
    value: Any = row
    for depth, key in enumerate(path):
        inside = ".".join(path[:depth])
        if not isinstance(value, Mapping):
            kind = type(value).__name__
            raise MTError(f"{where}: row {number}: {inside} is of type {kind}, not a record")
        if key not in value:
            missing = f"{inside!r} has no {key!r}" if depth else f"no column {key!r}"
            has = ", ".join(map(str, value)) or "nothing"
            raise MTError(f"{where}: row {number}: {missing}; it has {has}")
        value = value[key]
    if value is None:
        return ""
    if not isinstance(value, str):
        kind = type(value).__name__
        raise MTError(f"{where}: row {number}: {'.'.join(path)} is of type {kind}, not text")
    return one_line(value)


def _stat_fingerprint(path: Path) -> str:
    """A digest of the names, sizes and modification times of the files at ``path``."""
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    digest = hashlib.sha256()
    for file in files:
        stat = file.stat()
        name = file.name if file == path else file.relative_to(path).as_posix()
        digest.update(f"{name}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]
