"""The one rule for a pair's two sides: they must not read the same input.

A source whose target side reads what its source side reads (one file named twice, one column,
one field, one language of a corpus) gives pairs of identical text: a model trained on them
learns to copy. Every kind of source says what each of its sides reads as a :class:`Side`
(:func:`source_sides`, and :mod:`transformer_mt.data.sources` for ``data.corpus``);
:func:`same_input` alone decides whether two sides read the same, and :func:`check_sides` turns
that into the one-line error, before any file is read.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from transformer_mt.config import SOURCE_KINDS, DataConfig, SourceConfig
from transformer_mt.errors import MTError


@dataclass(frozen=True)
class Side:
    """What one side of a pair reads.

    ``key`` is the config key that says so and ``value`` its value, as errors show them;
    ``source`` is the file or dataset read (``member`` a member of that archive), and ``part``
    what picks the side out of it: a column, a field, a language (None: all of it, a file of one
    language).
    """

    key: str
    value: object
    source: str
    part: str | None = None
    member: str | None = None
    is_path: bool = True  # ``source`` names a file (compared as files), not a dataset


def same_input(a: Side, b: Side) -> bool:
    """Whether the two sides read the same input: the same part of the same file or dataset.

    Two paths are the same file when they resolve to one (``./a``, a symbolic link, a hard
    link); archive members compare without a leading ``./``. The parts compare as the kinds
    name them: languages without case, ``_`` as ``-`` (a TMX's by its primary subtag), a
    field's name exactly.
    """
    if a.part != b.part or _member(a.member) != _member(b.member):
        return False
    if not (a.is_path and b.is_path):
        return a.source == b.source
    first, second = Path(a.source).expanduser(), Path(b.source).expanduser()
    if first.resolve() == second.resolve():
        return True
    try:
        return os.path.samefile(first, second)
    except OSError:  # one of them is missing: the reader says so
        return False


def _member(name: str | None) -> str | None:
    """An archive member's name as compared: without a leading ``./`` or a trailing ``/``."""
    return name.removeprefix("./").rstrip("/") if name is not None else None


def check_sides(a: Side, b: Side, advice: str | None = None) -> None:
    """Raise the one-line error for two sides that read the same input (see :func:`same_input`).

    ``advice`` replaces what the message tells the user to do, for a kind that knows better.
    """
    if not same_input(a, b):
        return
    if a.part is None:
        shown = f"{a.value} in {a.source}" if a.member else a.value
        raise MTError(
            f"{a.key} and {b.key} are the same file ({shown}); give the source-language file "
            "and the target-language file"
        )
    what = f"{a.part} of {a.source}" + (f":{a.member}" if a.member else "")
    if a.value == b.value:
        both = f"both {a.value!r}"
    else:
        both = f"{a.value!r} and {b.value!r}, both {a.part}"
    advice = advice or f"both sides would read {what}: give one for each side"
    raise MTError(f"{a.key} and {b.key} are {both}; {advice}")


def language(code: str) -> str:
    """A language code as sides compare it: lower case, ``_`` as ``-``."""
    return code.lower().replace("_", "-")


def primary_language(code: str) -> str:
    """The primary subtag of a language code, as TMX units are matched: ``de-DE`` -> ``de``."""
    return language(code).strip().split("-", 1)[0]


def language_sides(
    data: DataConfig,
    source: SourceConfig,
    prefix: str,
    name: str,
    part: Callable[[str], str] = lambda code: f"language {language(code)}",
) -> tuple[Side, Side]:
    """The sides of a source picked out of ``name`` by language (``part`` names the part).

    The keys are the source's own ``src_lang`` / ``trg_lang`` where it sets them, else the
    config's ``data.src_lang`` / ``data.trg_lang``.
    """
    sides = []
    for side in ("src_lang", "trg_lang"):
        own = getattr(source, side)
        key, code = (f"{prefix}.{side}", own) if own else (f"data.{side}", getattr(data, side))
        sides.append(Side(key, code, name, part(code), is_path=False))
    return sides[0], sides[1]


def source_kind(source: SourceConfig) -> tuple[str, str]:
    """(kind, value): the one kind key a validated source sets, and its value."""
    for kind in SOURCE_KINDS:
        if getattr(source, kind) is not None:
            return kind, getattr(source, kind)
    raise AssertionError("a validated source has exactly one kind")  # see config/validation.py


def source_sides(data: DataConfig, source: SourceConfig, prefix: str) -> tuple[Side, Side]:
    """What each side of the listed ``source`` reads; ``prefix`` is its key (``data.train[0]``).

    Every kind: a file pair (in an archive or not), a TSV's columns, the fields of JSON lines,
    Parquet and Hugging Face rows (``translation.<lang>`` when ``fields`` is null), a TMX's
    primary languages, and the languages of a corpus, task, sacrebleu or mtdata set.
    """
    kind, value = source_kind(source)
    archive = source.archive
    if kind == "src":
        trg = source.trg or ""
        if archive is not None:
            return (
                Side(f"{prefix}.src", value, archive, member=value),
                Side(f"{prefix}.trg", trg, archive, member=trg),
            )
        return Side(f"{prefix}.src", value, value), Side(f"{prefix}.trg", trg, trg)
    name = archive if archive is not None else value
    member = value if archive is not None else None
    if kind == "tsv":
        a, b = (
            Side(f"{prefix}.columns[{i}]", c, name, f"column {c}", member)
            for i, c in enumerate(source.columns[:2])
        )
        return a, b
    if kind in ("jsonl", "parquet", "hf"):
        is_path = kind != "hf"
        if source.fields is not None:
            a, b = (
                Side(f"{prefix}.fields[{i}]", f, name, f"the field {f}", member, is_path)
                for i, f in enumerate(source.fields[:2])
            )
            return a, b
        # A field's name is read as it is: translation.de and translation.DE are two fields.
        a, b = language_sides(data, source, prefix, name, lambda c: f"the field translation.{c}")
        return (
            Side(a.key, a.value, name, a.part, member, is_path),
            Side(b.key, b.value, name, b.part, member, is_path),
        )
    if kind == "tmx":  # its reader matches a unit's languages by their primary subtag
        a, b = language_sides(
            data, source, prefix, name, lambda c: f"language {primary_language(c)}"
        )
        return Side(a.key, a.value, name, a.part, member), Side(
            b.key, b.value, name, b.part, member
        )
    return language_sides(data, source, prefix, value)  # corpus (or task), sacrebleu, mtdata


def check_source_sides(data: DataConfig, source: SourceConfig, prefix: str) -> None:
    """:func:`check_sides` for one listed source (see :func:`source_sides`)."""
    src, trg = source_sides(data, source, prefix)
    advice = None
    if source.tmx is not None:
        advice = "TMX units are matched by primary language: give two languages"
    elif source.corpus is not None:
        advice = f"{source.corpus} holds one file a language: give two languages"
    check_sides(src, trg, advice)
