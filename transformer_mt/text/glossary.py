"""Glossaries: a file of source -> target terms, and the terms a source sentence holds.

The file (:func:`read_glossary`): UTF-8 text (a byte-order mark is skipped), one entry a line,
``source term<TAB>target term``; lines end with LF, CRLF or CR alone (Excel for Mac's
tab-delimited export):

- blank lines, and lines whose first non-blank character is ``#``, are skipped: a comment (so a
  source term cannot start with ``#``);
- there is no header line, and none is guessed: a first line ``source<TAB>target`` would be an
  entry, so write a header as a comment (``# en<TAB>de``). Google's glossaries take no header
  either; guessing one would silently drop a real first entry;
- whitespace around each term is dropped (trailing spaces are invisible in an editor);
- an error is an :class:`MTError` of one line, ``FILE:LINE: what is wrong``: a line with one
  column or with three or more, an empty term, a control character or line break in a term, a
  term of more than :data:`MAX_TERM_CHARS` characters (a glossary holds words and short phrases),
  bytes that are not UTF-8, and a source term given twice with different targets (the same pair
  twice is fine). A :class:`Glossary` built in code checks its entries by the same rules
  (:class:`BadTerm`, :class:`DuplicateTerm`).

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
  both stay since they do not overlap);
- the cost is linear in the sentence, whatever the terms: an Aho-Corasick automaton over the
  terms read backwards gives, at each position, the terms that start there longest first, and
  only the longest that still fits is ever looked at (a server matches request glossaries on its
  event loop).

The target terms of a sentence are what a caller constrains the translation with: each must
appear in it verbatim (:meth:`Glossary.targets`: each once, in the order of their first source
occurrence).
"""

from __future__ import annotations

import heapq
import unicodedata
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from transformer_mt.errors import MTError
from transformer_mt.text._scripts import continues_word, is_word_char

MAX_TERM_CHARS = 100  # a glossary term is a word or a short phrase; this bounds matching's work


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


@dataclass(eq=False, slots=True)
class _Node:
    """A node of the automaton: a trie of the (folded) source terms read backwards, with links.

    ``entry``: the entry whose term, read backwards, ends here. ``fail``: the node of the longest
    proper suffix of this node's string that the trie holds (None at the root). ``out``: the
    nearest node with an entry among this one and those its fail links reach (None: none).
    Reading a sentence backwards, the node at position i spells the sentence from i on, so its
    ``out`` chain (``out``, ``out.fail.out``, ...) is the terms that start at i, longest first.
    """

    children: dict[str, _Node] = field(default_factory=dict)
    entry: Entry | None = None
    fail: _Node | None = None
    out: _Node | None = None


class Glossary:
    """Source terms -> target terms, and their occurrences in sentences (the module's rules)."""

    def __init__(self, entries: Iterable[Entry], *, ignore_case: bool = False) -> None:
        """Index ``entries``; a bad term is a :class:`BadTerm` (a ValueError) naming it.

        Bad: empty or blank, with a control character or line break, or longer than
        :data:`MAX_TERM_CHARS`; a source term twice with two targets is a :class:`DuplicateTerm`
        (the same pair twice is kept once).
        """
        self.ignore_case = ignore_case
        self.entries: list[Entry] = []
        self._root = _Node()
        seen: dict[str, Entry] = {}
        for entry in entries:
            problem = term_problem(entry)
            if problem is not None:
                raise BadTerm(entry, problem)
            key = self._fold(entry.source)
            if key in seen:
                if seen[key].target != entry.target:
                    raise DuplicateTerm(seen[key], entry)
                continue
            seen[key] = entry
            self.entries.append(entry)
            node = self._root
            for ch in reversed(key):
                node = node.children.setdefault(ch, _Node())
            node.entry = entry
        self._link()

    def _link(self) -> None:
        """Set every node's ``fail`` and ``out`` links, breadth first (Aho-Corasick)."""
        queue = deque([self._root])
        while queue:
            node = queue.popleft()
            for ch, child in node.children.items():
                fail = node.fail
                while fail is not None and ch not in fail.children:
                    fail = fail.fail
                child.fail = self._root if fail is None else fail.children[ch]
                child.out = child if child.entry is not None else child.fail.out
                queue.append(child)

    def __len__(self) -> int:
        """The number of entries (each source term once)."""
        return len(self.entries)

    def find(self, sentence: str) -> list[TermMatch]:
        """The occurrences of glossary terms in ``sentence``, in order, none overlapping.

        Each start's longest term that ends a word waits in a heap, longest first, then
        leftmost; one that overlaps a term kept before it gives way to that start's longest term
        ending before the overlap. That is the module's rule (every occurrence, longest first,
        kept unless it overlaps one kept), in time linear in the sentence: a kept term makes
        fewer starts give way than it has characters, so the heap sees fewer than twice as many
        terms as the sentence has characters, and the terms a start passes over (ending inside a
        word, or past an overlap) are each passed once, at most MAX_TERM_CHARS a start."""
        size = len(sentence)
        word = [is_word_char(ch) for ch in sentence]
        ends = bytearray(size + 1)  # whether a term may end before sentence[end]
        for end in range(1, size + 1):
            ends[end] = end == size or not word[end - 1] or not continues_word(sentence[end])
        longest: list[_Node | None] = [None] * size  # per start: its longest term still possible
        heap: list[tuple[int, int]] = []
        root, node, folded = self._root, self._root, self._fold(sentence)
        for start in range(size - 1, -1, -1):  # the sentence read backwards
            ch = folded[start]
            while ch not in node.children and node.fail is not None:
                node = node.fail
            node = node.children.get(ch, root)
            if node.out is None or (start > 0 and word[start] and word[start - 1]):
                continue  # no term starts here, or this is inside a word
            best = _fitting(node.out, start, size, ends)
            if best is not None:
                longest[start] = best
                heap.append((-_length(best), start))
        heapq.heapify(heap)
        taken, kept = bytearray(size), []
        while heap:
            negative, start = heapq.heappop(heap)
            end = start - negative
            if taken[start]:
                continue
            overlap = taken.find(1, start, end)
            best = longest[start]
            assert best is not None and best.entry is not None
            if overlap < 0:
                taken[start:end] = b"\x01" * (end - start)
                kept.append(TermMatch(start, end, sentence[start:end], best.entry.target))
                continue
            best = _fitting(best, start, overlap, ends)  # give way: end before the overlap
            if best is not None:
                longest[start] = best
                heapq.heappush(heap, (-_length(best), start))
        return sorted(kept, key=lambda m: m.start)

    def targets(self, sentence: str) -> list[str]:
        """The target terms to constrain the translation of ``sentence`` with, each once."""
        return list(dict.fromkeys(m.target for m in self.find(sentence)))

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
        for number, line in enumerate(_lines(_decode(path, raw)), start=1)
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


class BadTerm(ValueError):
    """An entry with a term a glossary cannot hold: ``entry``, and ``problem`` (what and why)."""

    def __init__(self, entry: Entry, problem: str) -> None:
        """Keep the entry; the message is the problem."""
        super().__init__(problem)
        self.entry, self.problem = entry, problem


class DuplicateTerm(ValueError):
    """A source term given twice with different targets: ``first`` and ``again``."""

    def __init__(self, first: Entry, again: Entry) -> None:
        """Name the term and both targets."""
        super().__init__(
            f"source term {again.source!r} given twice with different targets "
            f"({first.target!r}, {again.target!r})"
        )
        self.first, self.again = first, again


def term_problem(entry: Entry) -> str | None:
    """What is wrong with ``entry``'s terms, in words that name the term; None: nothing.

    The one check of a term, for a file's lines and a glossary built in code (a server's request):
    empty or blank, a control character or line break (it would break the translation's line),
    more than :data:`MAX_TERM_CHARS` characters."""
    for name, term in (("source", entry.source), ("target", entry.target)):
        if not term.strip():
            pair = f"{entry.source!r} -> {entry.target!r}"
            return f"empty {name} term ({pair}); give both terms or remove the entry"
        if any(unicodedata.category(ch) in ("Cc", "Zl", "Zp") for ch in term):
            return f"the {name} term {term!r} has a control character or line break; remove it"
        if len(term) > MAX_TERM_CHARS:
            return (
                f"the {name} term {term[:30]!r}... is {len(term)} characters, more than "
                f"{MAX_TERM_CHARS}; a glossary term is a word or a short phrase"
            )
    return None


def _lines(text: str) -> list[str]:
    """``text``'s lines, whichever of LF, CRLF and CR ends them (Python's universal newlines)."""
    return text.replace("\r\n", "\n").replace("\r", "\n").split("\n")


def _decode(path: Path, raw: bytes) -> str:
    """The file's text (UTF-8, a byte-order mark skipped); bad bytes name their line."""
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].replace(b"\r\n", b"\n").replace(b"\r", b"\n").count(b"\n") + 1
        raise MTError(
            f"{path}:{line}: not UTF-8 ({exc.reason}); save the glossary as UTF-8"
        ) from None


def _parse_line(path: Path, number: int, line: str) -> Entry:
    """One entry line -> an Entry; anything but two good terms (:func:`term_problem`) is an MTError."""
    cells = line.split("\t")
    if len(cells) != 2:
        raise MTError(
            f"{path}:{number}: has {len(cells)} column{'s' * (len(cells) != 1)}, needs 2: "
            "source term, a tab, target term"
        )
    source, target = (cell.strip() for cell in cells)
    entry = Entry(source, target, number)
    problem = term_problem(entry)
    if problem is not None:
        raise MTError(f"{path}:{number}: {problem}")
    return entry


def _fitting(node: _Node | None, start: int, most: int, ends: bytearray) -> _Node | None:
    """The first of ``node``'s out chain whose term, from ``start``, ends a word by ``most``."""
    while node is not None:
        end = start + _length(node)
        if end <= most and ends[end]:
            return node
        assert node.fail is not None  # a node with an entry is no root
        node = node.fail.out
    return None


def _length(node: _Node) -> int:
    """The length of the term whose entry ``node`` has."""
    assert node.entry is not None
    return len(node.entry.source)


def _lower(ch: str) -> str:
    """One character lowercased, or itself when lowercasing would change the length ("İ")."""
    low = ch.lower()
    return low if len(low) == 1 else ch
