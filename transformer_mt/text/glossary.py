"""Glossaries: a file of source -> target terms, and the terms a source sentence holds.

The file (:func:`read_glossary`): UTF-8 text (a byte-order mark is skipped), one entry a line,
``source term<TAB>target term``:

- blank lines, and lines whose first non-blank character is ``#``, are skipped: a comment (so a
  source term cannot start with ``#``);
- there is no header line, and none is guessed: a first line ``source<TAB>target`` would be an
  entry, so write a header as a comment (``# en<TAB>de``). Google's glossaries take no header
  either; guessing one would silently drop a real first entry;
- whitespace around each term is dropped (trailing spaces are invisible in an editor);
- an error is an :class:`MTError` of one line, ``FILE:LINE: what is wrong``: a line with one
  column or with three or more, an empty term, a control character in a term, bytes that are not
  UTF-8, and a source term given twice with different targets (the same pair twice is fine).

Matching (:meth:`Glossary.find`, :meth:`Glossary.targets`):

- case-sensitive by default, as Google Cloud Translation's glossaries (``ignoreCase`` false by
  default): "bank" does not match "Bank". ``ignore_case=True`` matches any case (as Amazon
  Translate's custom terminology always does; two source terms that differ only by case are
  then a duplicate). DeepL leaves it to its model ("flexes entries to account for case") and
  rejects duplicate source terms, as this does. A term still counts only as written: no
  inflection ("bank" does not match "banks");
- whole words in scripts that separate words by spaces: a term that starts (ends) with a letter
  or digit needs no letter or digit just before (after) it ("bank" is not in "embankment").
  Chinese, Japanese, Korean, Thai, Lao, Khmer and Burmese have no such boundary: a term of those
  scripts matches anywhere;
- overlapping occurrences: the longest wins, then the leftmost ("New York City" over "New
  York"; in "New York City Hall" with "New York" and "City Hall", "New York" and "City Hall"
  both stay since they do not overlap).

The target terms of a sentence are what a caller constrains the translation with: each must
appear in it verbatim (:meth:`Glossary.targets`: each once, in the order of their first source
occurrence).
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from transformer_mt.errors import MTError
from transformer_mt.text._scripts import continues_word, is_word_char


@dataclass(frozen=True)
class Entry:
    """One glossary line: a source term, its target term, and where it was read (1-based)."""

    source: str
    target: str
    line: int = 0


@dataclass(frozen=True)
class TermMatch:
    """An occurrence of a glossary term in a sentence: ``sentence[start:end]`` is its source."""

    start: int
    end: int
    source: str
    target: str


@dataclass
class _Node:
    """A trie node: children by (folded) character, and the entry a term ending here has."""

    children: dict[str, _Node] = field(default_factory=dict)
    entry: Entry | None = None


class Glossary:
    """Source terms -> target terms, and their occurrences in sentences (the module's rules)."""

    def __init__(self, entries: Iterable[Entry], *, ignore_case: bool = False) -> None:
        """Index ``entries``: an empty term, or a source term twice with two targets, is a ValueError.

        (:class:`DuplicateTerm` for the latter; the same pair twice is kept once.)
        """
        self.ignore_case = ignore_case
        self.entries: list[Entry] = []
        self._root = _Node()
        seen: dict[str, Entry] = {}
        for entry in entries:
            if not entry.source or not entry.target:
                raise ValueError(f"empty glossary term in {entry}")
            key = self._fold(entry.source)
            if key in seen:
                if seen[key].target != entry.target:
                    raise DuplicateTerm(seen[key], entry)
                continue
            seen[key] = entry
            self.entries.append(entry)
            node = self._root
            for ch in key:
                node = node.children.setdefault(ch, _Node())
            node.entry = entry

    def __len__(self) -> int:
        """The number of entries (each source term once)."""
        return len(self.entries)

    def find(self, sentence: str) -> list[TermMatch]:
        """The occurrences of glossary terms in ``sentence``, in order, none overlapping."""
        folded = self._fold(sentence)
        found = [m for i in range(len(sentence)) for m in self._starting_at(sentence, folded, i)]
        found.sort(key=lambda m: (m.start - m.end, m.start))  # longest first, then leftmost
        taken = [False] * len(sentence)
        kept = []
        for m in found:
            if not any(taken[m.start : m.end]):
                taken[m.start : m.end] = [True] * (m.end - m.start)
                kept.append(m)
        return sorted(kept, key=lambda m: m.start)

    def targets(self, sentence: str) -> list[str]:
        """The target terms to constrain the translation of ``sentence`` with, each once."""
        return list(dict.fromkeys(m.target for m in self.find(sentence)))

    def _starting_at(self, sentence: str, folded: str, start: int) -> list[TermMatch]:
        """Every whole-word occurrence of a term that starts at ``start``."""
        if start > 0 and is_word_char(sentence[start]) and is_word_char(sentence[start - 1]):
            return []  # inside a word
        node, found = self._root, []
        for end in range(start + 1, len(sentence) + 1):
            child = node.children.get(folded[end - 1])
            if child is None:
                break
            node = child
            if node.entry is not None and _ends_word(sentence, end):
                found.append(TermMatch(start, end, sentence[start:end], node.entry.target))
        return found

    def _fold(self, text: str) -> str:
        """``text`` as terms are compared: itself, or lowercased char by char (ignore_case)."""
        if not self.ignore_case:
            return text
        return "".join(_lower(ch) for ch in text)


def read_glossary(path: str | Path, *, ignore_case: bool = False) -> Glossary:
    """The glossary in the TSV file ``path`` (the module's format); a bad line is an MTError."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise MTError(f"{path}: glossary file not found; check the path") from None
    except IsADirectoryError:
        raise MTError(f"{path}: is a directory; name a glossary file (TSV)") from None
    entries = [
        _parse_line(path, number, line)
        for number, line in enumerate(_decode(path, raw).split("\n"), start=1)
        if line.strip() and not line.lstrip().startswith("#")
    ]
    try:
        return Glossary(entries, ignore_case=ignore_case)
    except DuplicateTerm as dup:
        raise MTError(
            f"{path}:{dup.again.line}: source term {dup.again.source!r} is already on line "
            f"{dup.first.line} with another target ({dup.first.target!r}, here "
            f"{dup.again.target!r}); keep one"
        ) from None


class DuplicateTerm(ValueError):
    """A source term given twice with different targets: ``first`` and ``again``."""

    def __init__(self, first: Entry, again: Entry) -> None:
        """Name the term and both targets."""
        super().__init__(
            f"source term {again.source!r} given twice with different targets "
            f"({first.target!r}, {again.target!r})"
        )
        self.first, self.again = first, again


def _decode(path: Path, raw: bytes) -> str:
    """The file's text (UTF-8, a byte-order mark skipped); bad bytes name their line."""
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise MTError(
            f"{path}:{line}: not UTF-8 ({exc.reason}); save the glossary as UTF-8"
        ) from None


def _parse_line(path: Path, number: int, line: str) -> Entry:
    """One entry line -> an Entry; anything but two non-empty terms is an MTError."""
    cells = line.rstrip("\r").split("\t")
    if len(cells) != 2:
        raise MTError(
            f"{path}:{number}: has {len(cells)} column{'s' * (len(cells) != 1)}, needs 2: "
            "source term, a tab, target term"
        )
    source, target = (cell.strip() for cell in cells)
    for name, term in (("source", source), ("target", target)):
        if not term:
            raise MTError(f"{path}:{number}: empty {name} term; give both terms or remove the line")
        if any(unicodedata.category(ch) == "Cc" for ch in term):
            raise MTError(f"{path}:{number}: the {name} term has a control character")
    return Entry(source, target, number)


def _ends_word(sentence: str, end: int) -> bool:
    """Whether a term may end before ``sentence[end]``: no word goes on across that point."""
    if end == len(sentence) or not is_word_char(sentence[end - 1]):
        return True
    return not continues_word(sentence[end])


def _lower(ch: str) -> str:
    """One character lowercased, or itself when lowercasing would change the length ("İ")."""
    low = ch.lower()
    return low if len(low) == 1 else ch
