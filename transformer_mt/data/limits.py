"""What reading one input may cost: the bounds that every reader checks while it reads.

A corpus is user input, and a small file can claim a large cost: a 300 KB ``.gz`` that holds one
300 MB line, an archive that decompresses to terabytes or holds millions of members, JSON or XML
nested thousands deep. Each cost has a bound, a ``data.*`` setting (:class:`ReadLimits` carries
them to the readers), checked as the input is read, never after it is in memory. An input past one
is an :class:`MTError` of one line that names the file (and line), the bound, and the setting
that raises it.

None of the bounds changes what a reader yields, only whether it stops: they are no part of any
cache key.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

from transformer_mt.config import DataConfig
from transformer_mt.errors import MTError


@dataclass(frozen=True)
class ReadLimits:
    """The bounds of :mod:`transformer_mt.data.limits`, each a ``data.*`` setting of that name."""

    max_line_bytes: int  # a line of a text, TSV, JSONL or SGML file; a TMX translation unit
    max_archive_bytes: int  # decompressed to reach and read one member of a tar or zip
    max_archive_members: int  # in one tar or zip archive
    max_nesting: int  # JSON objects and arrays, XML elements

    @classmethod
    def of(cls, data: DataConfig) -> ReadLimits:
        """The bounds that ``data`` (a config's data section) sets."""
        return cls(
            data.max_line_bytes, data.max_archive_bytes, data.max_archive_members, data.max_nesting
        )


DEFAULT_LIMITS = ReadLimits.of(DataConfig())
"""The bounds of a default config: what a reader checks when it is given none."""


class LineTooLong(MTError):
    """A line longer than ``data.max_line_bytes`` (:func:`line_too_long`)."""


def line_too_long(where: object, lineno: int, limit: int) -> LineTooLong:
    """The error for line ``lineno`` of ``where``, longer than ``limit`` bytes."""
    return LineTooLong(
        f"{where}:{lineno}: the line is longer than {limit:,} bytes (data.max_line_bytes); a "
        "corpus holds one sentence a line: check the file, or raise data.max_line_bytes"
    )


def too_deep(where: str, limit: int, what: str) -> MTError:
    """The error for ``what`` (JSON values, XML elements) nested deeper than ``limit``."""
    return MTError(
        f"{where}: {what} nested more than {limit:,} deep (data.max_nesting); check the file, "
        "or raise data.max_nesting"
    )


def bounded_lines(f: BinaryIO, max_bytes: int, where: object) -> Iterator[bytes]:
    """The ``\\n``-ended lines of ``f``, none longer than ``max_bytes`` (its ``\\n`` aside).

    Each line is read with ``readline(max_bytes + 1)``, so a longer one costs about
    ``max_bytes`` bytes of memory before it is an :class:`MTError` (:func:`line_too_long`)
    naming ``where`` and the line, not its whole length. (A zip member's ``readline`` may return
    a little more than it is asked for: the length is checked, not assumed.) The errors of
    reading ``f`` itself pass through.
    """
    cap = max_bytes + 1
    readline = f.readline
    lineno = 0
    while line := readline(cap):
        lineno += 1
        if len(line) > max_bytes and len(line) - (line[-1:] == b"\n") > max_bytes:
            raise line_too_long(where, lineno, max_bytes)
        yield line
