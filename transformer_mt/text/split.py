"""Sentences of pasted text, and the exact whitespace between them.

Contract: :func:`split_text` cuts ``text`` into sentences and keeps everything else as
separators, so that ``result.join(result.sentences) == text`` for every string, byte for byte:

- a sentence is never empty, never starts or ends with whitespace and never holds a line break;
- ``separators`` has one entry more than ``sentences``: the whitespace before the first sentence,
  between each two, and after the last (possibly empty strings); a text with no sentence (empty
  or whitespace only) is one separator;
- a line break always ends a sentence: the line breaks (those of :meth:`str.splitlines`: ``\\n``,
  ``\\r\\n``, ``\\r``, ``\\v``, ``\\f``, ``\\x1c``-``\\x1e``, ``\\x85``, U+2028, U+2029), empty
  lines, indentation and trailing spaces all stay in the separators;
- :meth:`SplitText.join` puts translations (one per sentence, inserted verbatim) back between
  the original separators.

Inside a line the sentences come from sentencex (Wikimedia's rule-based segmenter, a Rust
library whose rules and abbreviation lists ship in its wheel: no download, no model), chosen by
``scripts/compare_splitters.py`` over pysbd, sentencesplit (pysbd's maintained fork),
sentence-splitter (Moses' rules) and the generic rule below. On Multi30k test_2016 joined into
paragraphs of 3-6 sentences (999 sentences a language) all five were within 1.5 points of each
other (boundary precision 99.9-100 %, F1 97.4-98.9 % on en, de, fr, cs; most misses are captions
without a full stop, which no splitter can cut); on 53 hand-written hard cases (en, de, fr, cs,
zh, ja: "Dr.", "z. B.", "M.", "usw.", "3.5", ellipses, quotes, ordinals, Chinese and Japanese
full stops) sentencex got 43, pysbd 44, sentencesplit 45, Moses 35 of 44 (it has no zh, ja) and
the generic rule 41; sentencex with the corrections below gets 50. What decided:

- Czech: sentencex splits it with Slovak's rules (its own fallback); pysbd and sentencesplit
  have no Czech;
- speed: about 1 us a sentence, against 120-700 us for the pure-Python ones (one thread);
- it is maintained (releases through 2026), MIT, without dependencies, for Python 3.10+, and
  non-destructive (its pieces concatenate to the input); pysbd's last release is from 2021,
  sentencesplit needs Python 3.11 (the project supports 3.10), sentence-splitter (2019, LGPL)
  squeezes whitespace and knows no Chinese or Japanese.

Its misses that the hard cases showed are undone by four corrections (merging its pieces back):

- no cut where no whitespace follows, but after a full stop of a script without spaces
  (``。 ！ ？ ｡ । ॥ ። ፧ ။``): it cut "E.|S.E. Electronics" in a Multi30k caption;
- French: no cut after the titles ``M. MM. Mgr. Mlle. Mme.`` or an abbreviated month
  (``janv. févr. avr. juil. sept. oct. nov. déc.``): "M. Dupont", "le 1er janv. 1990";
- languages that write ordinals with a period (:data:`ORDINAL_LANGUAGES`: German, Danish,
  Finnish, Polish, Slovak and so Czech): no cut after a number of 1-3 digits and a period
  ("im 19. Jahrhundert", "v 19. století"); a sentence that does end with such a number stays
  joined to the next, the lesser harm for translation;
- Japanese: no cut between a closing 」 or 』 and the quotative particle と
  (「はい。」と答えた).

Languages with sentencex rules (:data:`SENTENCEX_LANGUAGES`, or a close relative's through its
fallback chain, :data:`SENTENCEX_RELATIVES`: Czech gets Slovak's) go to it. Every other
language, Chinese included (sentencex would use English rules for it), gets
:func:`generic_pieces`, the generic rule: a sentence ends after

- a run of full stops, question or exclamation marks or ellipses of any script
  (``. ! ? … ‼ ⁇ ⁈ ⁉ ; ؟ ۔ । ॥ ። ፧ ։ ။``) and any closing quotes or brackets (French ones
  after a space too), when whitespace and then a character that is neither a lowercase letter
  nor a digit follow, except after a lone capital letter and a period (an initial: "J. Smith");
- a run of the full-width marks of Chinese and Japanese (``。 ！ ？ ｡``) and any closing quotes
  or brackets, whatever follows (these scripts put no space between sentences).

The generic rule knows no abbreviations: "Dr. Smith" is two pieces there.

sentencex is a dependency of the package (a broken install raises an :class:`MTError` saying how
to reinstall it). A line sentencex cannot take gets the generic rule: a lone surrogate (not
UTF-8), or text its Rust code panics on (sentencex 1.0.32 on "Type A\u00a0. Next." with a
no-break, narrow, thin or ideographic space, in en, fr, de and others). It sees a line longer
than :data:`WINDOW` in windows of that size (:func:`_windowed`), so that splitting takes time
linear in the text, where sentencex alone takes quadratic time on some texts.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from transformer_mt.errors import MTError

EXTRA_HINT = "reinstall the package's dependencies: pip install 'transformer-mt'"

SENTENCEX_LANGUAGES = frozenset(
    "am ar bg bn ca da de el en es fi fr gu hi hy it ja kk kn ml mr my nl pa pl pt ru sk ta te uk".split()
)
"""The languages sentencex has rules of its own for (abbreviations, terminators)."""

SENTENCEX_RELATIVES = {
    **dict.fromkeys(["ab", "av", "ba", "ce", "cv", "kv", "os", "tt"], "ru"),
    **dict.fromkeys(["an", "ay", "gn", "qu"], "es"),
    **dict.fromkeys(["bm", "ht", "ln", "mg", "sg", "ty", "wa", "wo"], "fr"),
    **{"co": "it", "cs": "sk", "gl": "pt", "kl": "da", "lb": "de", "li": "nl", "oc": "ca"},
    **{"rm": "de", "sa": "hi"},
}
"""Languages sentencex segments with a close relative's rules (its own fallback chain)."""

_LINE_BREAKS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
_LINE = re.compile(f"[^{_LINE_BREAKS}]+")
_CLOSERS = "\"'\u2018\u2019\u201c\u201d\u00bb\u203a)\\]}\u300d\u300f\u3011\u3015\u3009\u300b\uff09\uff3d\uff5d"
_STOPS = ".!?\u2026\u203c\u2047\u2048\u2049\u037e\u061f\u06d4\u0964\u0965\u1362\u1367\u0589\u104b"
_FULL_WIDTH_STOPS = "\u3002\uff01\uff1f\uff61"
_NO_SPACE_STOPS = _FULL_WIDTH_STOPS + "\u0964\u0965\u1362\u1367\u104b"
_NO_SPACE_END = re.compile(f"[{_NO_SPACE_STOPS}][{_CLOSERS}]*$")
_QUOTE_END = re.compile("[\u300d\u300f]$")
_ORDINAL = re.compile(r"\d{1,3}\.")
_NO_CUT_AFTER = {
    "fr": frozenset("M. MM. Mgr. Mlle. Mme. janv. févr. avr. juil. sept. oct. nov. déc.".split())
}
ORDINAL_LANGUAGES = frozenset({"da", "de", "fi", "pl", "sk"})
"""Sentencex rules of languages that write an ordinal as a number and a period ("im 19.
Jahrhundert", Czech "v 19. století" through Slovak's rules): no cut after such a number."""
_BREAK = re.compile(
    f"(?:(?P<cjk>[{_FULL_WIDTH_STOPS}]+[{_CLOSERS}]*)"
    f"|(?P<spaced>[{re.escape(_STOPS)}]+(?:[{_CLOSERS}]|[ \u00a0\u202f]+[\u00bb\u203a])*))"
    r"(?P<space>\s*)"
)  # no lookahead: a run of dots that is no stop costs no backtracking


@dataclass(frozen=True)
class SplitText:
    """A text cut into sentences, with the whitespace around them (see the module's contract).

    ``separators[i]`` comes before ``sentences[i]``; ``separators[-1]`` ends the text.
    """

    sentences: list[str]
    separators: list[str]

    @classmethod
    def at(cls, text: str, spans: Sequence[tuple[int, int]]) -> SplitText:
        """``text`` cut at ``spans``: its sentences' (start, end) offsets, in order, apart."""
        separators, sentences, end = [], [], 0
        for start, stop in spans:
            separators.append(text[end:start])
            sentences.append(text[start:stop])
            end = stop
        separators.append(text[end:])
        return cls(sentences, separators)

    def join(self, translations: Sequence[str]) -> str:
        """The text with each sentence replaced by its translation, whitespace as it was.

        ``translations``: one string per sentence, inserted as it is. A count other than the
        sentences' is a ValueError (a caller's bug).
        """
        if len(translations) != len(self.sentences):
            raise ValueError(
                f"{len(translations)} translations for {len(self.sentences)} sentences"
            )
        parts = [self.separators[0]]
        for translation, separator in zip(translations, self.separators[1:], strict=True):
            parts += [translation, separator]
        return "".join(parts)


Pieces = Callable[[str, str], list[str]]
"""A segmenter: (a line without line breaks, a language code) -> pieces that concatenate to it."""


def split_text(text: str, lang: str) -> SplitText:
    """Cut ``text`` into sentences, keeping every separator (the module's contract).

    ``lang``: the text's language code (ISO 639-1 or -3; a region or script after ``-`` or
    ``_`` is ignored); it chooses sentencex's rules or the generic rule.
    """
    pieces = _segmenter(lang)
    code = _base_code(lang)
    spans: list[tuple[int, int]] = []
    for line in _LINE.finditer(text):
        spans += _sentence_spans(line.group(), line.start(), code, pieces)
    return SplitText.at(text, spans)


def _sentence_spans(line: str, offset: int, lang: str, pieces: Pieces) -> list[tuple[int, int]]:
    """The (start, end) offsets in the text of the sentences of one line, whitespace left out."""
    stripped = line.strip()
    if not stripped:
        return []
    offset += len(line) - len(line.lstrip())
    found = pieces(stripped, lang)
    if "".join(found) != stripped:  # never seen; the generic rule keeps the contract if it were
        found = generic_pieces(stripped)
    spans = []
    for piece in found:
        text = piece.strip()
        if text:
            start = offset + len(piece) - len(piece.lstrip())
            spans.append((start, start + len(text)))
        offset += len(piece)
    return spans


def _base_code(lang: str) -> str:
    """A language code's primary subtag, lowercase: "pt-BR" -> "pt", "zh_Hans" -> "zh"."""
    return re.split("[-_]", lang.strip().lower(), maxsplit=1)[0]


def _segmenter(lang: str) -> Pieces:
    """The segmenter of a language: sentencex's rules where it has them, else the generic rule."""
    code = _base_code(lang)
    if code in SENTENCEX_LANGUAGES or code in SENTENCEX_RELATIVES:
        return _sentencex_pieces
    return _generic


def _generic(line: str, lang: str) -> list[str]:
    """:func:`generic_pieces` as a :data:`Pieces` (the language is not used)."""
    return generic_pieces(line)


_sentencex: Any = None
WINDOW = 1000
"""The most characters of a line one call of sentencex sees (some texts take it time quadratic
in their length: 80,000 characters of "。」" took 3.6 s); a longer line goes through it in
windows (:func:`_windowed`)."""
_LOOKAHEAD = 200  # characters past a window's end that sentencex sees to decide a cut at its end
_WINDOW_END = re.compile(r"\s(?=\S)")  # a window ends after whitespace, before a word


def _sentencex_pieces(line: str, lang: str) -> list[str]:
    """Sentencex's pieces of one line, corrected (imported on first use; MTError if missing)."""
    global _sentencex
    if _sentencex is None:
        try:
            import sentencex
        except ImportError:
            raise MTError(f"sentence splitting needs sentencex: {EXTRA_HINT}") from None
        _sentencex = sentencex
    rules = SENTENCEX_RELATIVES.get(lang, lang)
    if len(line) <= WINDOW:
        return _segment(line, rules)
    return _windowed(line, rules)


def _segment(text: str, rules: str) -> list[str]:
    """Sentencex's corrected pieces of ``text``; the generic rule's where sentencex fails on it."""
    try:
        pieces = list(_sentencex.segment(rules, text))
    except UnicodeEncodeError:  # a lone surrogate (from a JSON escape) is not UTF-8
        return generic_pieces(text)
    except BaseException as err:  # pyo3's PanicException (its Rust code's) is no Exception
        if type(err).__name__ != "PanicException":  # KeyboardInterrupt, SystemExit...
            raise
        return generic_pieces(text)
    return _undo_cuts(pieces, rules)


def _windowed(line: str, rules: str) -> list[str]:
    """:func:`_segment` of a line longer than :data:`WINDOW`, in time linear in its length.

    A window is up to :data:`WINDOW` characters, ending after whitespace where its second half
    has some; sentencex sees :data:`_LOOKAHEAD` characters more (what decides a cut at the
    window's end), and the cuts it makes up to the window's end are kept. The next window starts
    at the last of them where that is in the window's second half, else (a sentence longer than
    half a window) at the window's end, which is then no cut: each moves on by half a window at
    least."""
    cuts, start = [0], 0
    while len(line) - start > WINDOW:
        half = start + WINDOW // 2
        end = start + WINDOW
        ends = [found.end() for found in _WINDOW_END.finditer(line, half, end)]
        end = ends[-1] if ends else end
        offset = start
        for piece in _segment(line[start : min(len(line), end + _LOOKAHEAD)], rules)[:-1]:
            offset += len(piece)
            if offset > end:
                break
            cuts.append(offset)
        start = cuts[-1] if cuts[-1] > half else end
    offset = start
    for piece in _segment(line[start:], rules)[:-1]:
        offset += len(piece)
        cuts.append(offset)
    cuts.append(len(line))
    return [line[a:b] for a, b in pairwise(cuts)]


def _undo_cuts(pieces: list[str], rules: str) -> list[str]:
    """Sentencex's pieces (of the language ``rules``) with the cuts the corrections undo merged."""
    groups: list[list[str]] = [pieces[:1]]
    for before, piece in pairwise(pieces):
        if _keeps_together(before, piece, rules):
            groups[-1].append(piece)
        else:
            groups.append([piece])
    return ["".join(group) for group in groups]


def _keeps_together(piece: str, following: str, rules: str) -> bool:
    """Whether the cut between two pieces is one the corrections undo (the module's docstring)."""
    if not piece[-1:].isspace():
        if rules == "ja" and _QUOTE_END.search(piece) and following.startswith("\u3068"):
            return True  # 「はい。」と答えた: the quotative particle continues the sentence
        return _NO_SPACE_END.search(piece) is None
    last = piece.split()[-1]
    if last in _NO_CUT_AFTER.get(rules, ()):
        return True
    return rules in ORDINAL_LANGUAGES and _ORDINAL.fullmatch(last) is not None


def generic_pieces(line: str) -> list[str]:
    """Cut one line by the generic rule (the module's docstring); the pieces concatenate to it.

    Each piece but the last ends with the whitespace that followed its sentence.
    """
    cuts = [0]
    for match in _BREAK.finditer(line):
        cut = match.end()  # where the next sentence would start
        if match.group("spaced") is not None and (
            not match.group("space")  # "3.5", "example.com": no whitespace, no stop
            or cut == len(line)
            or _continues(line[cut])
            or _is_initial(line, match.start())
        ):
            continue
        if cuts[-1] < cut < len(line):
            cuts.append(cut)
    cuts.append(len(line))
    return [line[a:b] for a, b in pairwise(cuts)]


def _continues(first: str) -> bool:
    """Whether a text starting with ``first`` goes on with the sentence: a lowercase or digit."""
    return first.islower() or first.isdigit()


def _is_initial(line: str, stop: int) -> bool:
    """Whether the period at ``stop`` follows a lone capital letter ("J." in "J. Smith")."""
    if line[stop] != "." or stop == 0 or not line[stop - 1].isupper():
        return False
    return stop == 1 or not line[stop - 2].isalpha()
