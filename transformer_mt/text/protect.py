"""Spans of a sentence that translation must leave as they are, as constraints or placeholders.

Contract: :func:`find_protected` returns the protected :class:`Span` s of a text, in order and
never overlapping; each span's ``text`` is what the translation must contain verbatim. A caller
either

- passes the spans' texts as constraints to a constrained search and gives the model the text
  without the user's marks (:func:`as_constraints`: what ``--protect`` does), or
- calls :func:`mask`, which replaces each span by a placeholder ``{0}``, ``{1}``... in order, and
  translates the masked text; its :class:`Restore` puts the spans back into the translation.

What is protected (``kinds``, all by default), where two overlap the first kind listed wins:

- ``marked``: text between the user's marks, by default ``<keep>`` and ``</keep>`` (a tag, as
  DeepL's ``ignore_tags`` and Google's ``translate="no"`` keep text out of translation; any pair
  of strings is a :class:`Marks`). The marks are dropped from the translation unless
  ``Marks(keep=True)``: "Open <keep>File</keep>" protects "File". A mark left open protects
  nothing; marks do not nest;
- ``code``: inline code in backticks, as Markdown writes it (`` `ls -l` ``, ````a `b` c````),
  backticks included;
- ``url``: ``scheme://...`` (http, https, ftp, ftps, file, sftp, ssh, git) and ``www.`` links,
  and ``mailto:`` addresses, without the punctuation that ends the sentence after them (a closing
  bracket stays when the link opened it: ``.../Foo_(bar)``). A link starts at its scheme, or
  ``www.``, unless a letter or digit of a script with spaces between words, ``@`` or ``.`` comes
  right before; it ends before a character of a script without spaces (a Chinese, Japanese
  or Korean letter, or their full-width punctuation: "见https://example.com。谢谢");
- ``email``: ``name@example.com``, its local part of RFC 5322's characters but those that often
  come right before an address (``' ` { } | / = ? !``), both parts of letters and digits of
  scripts with spaces between words ("联系a@b.com。" protects "a@b.com");
- ``placeholder``: a template placeholder in braces (``{0}``, ``{name}``, ``{{ name }}``) -
  which also keeps :func:`mask`'s own placeholders unambiguous;
- ``number``: digits with an optional sign, and groups of digits joined by ``. , : / ' -`` or
  a no-break or thin space (``3.5``, ``1,234,567.89``, ``1 234,5``, ``12:30``, ``2021-05-03``),
  not touching a letter or digit of a script with spaces between words (``3rd``, ``A4``, ``x86``
  stay text; in ``3个`` the 3 is a number).

:class:`Restore` (what :func:`mask` returns with the masked text), on a translation:

- each placeholder ``{i}`` of a span becomes the span's text; the model's spacing inside it
  (``{ 0 }``) and full-width braces or digits (``｛０｝``) are accepted;
- a placeholder the model repeats: the first occurrence is restored, the repeats are removed
  (with one space before each), so that each span appears once, as in the source;
- a placeholder the model dropped: its span's text is appended at the end of the translation,
  after a space, so that nothing protected is lost (a reader sees it out of place rather than
  not at all);
- a placeholder with an index the text never had is left as the model wrote it.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass

from transformer_mt.text._scripts import NO_SPACE_CLASS, is_word_char

KINDS = ("marked", "code", "url", "email", "placeholder", "number")
"""The kinds of protected spans, in the order that decides overlaps."""


@dataclass(frozen=True)
class Marks:
    """The pair of strings around a span the user protects; ``keep``: marks stay in the output."""

    open: str = "<keep>"
    close: str = "</keep>"
    keep: bool = False


DEFAULT_MARKS = Marks()


@dataclass(frozen=True)
class Span:
    """A protected part of a text: ``text[start:end]``, of a kind; ``text`` must be in the target.

    ``text`` is the source's characters, but for a marked span without ``keep``, the text
    between the marks.
    """

    start: int
    end: int
    kind: str
    text: str


# A letter, digit or _ of a script with spaces between words (not Chinese, Japanese...).
_WORD = f"[^\\W{NO_SPACE_CLASS}]"
# An e-mail address's local part: RFC 5322's atext and dots, but the characters that in text
# often stand right before an address (' ` { } | / = ? !); the domain's labels: such letters,
# digits and "-".
_LOCAL = f"(?:{_WORD}|[.#$%&*+^~-])"
_LABEL = f"(?:{_WORD}|-)+"
_PATTERNS = {
    "code": re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)"),
    "url": re.compile(
        f"(?<!{_WORD})(?<![@.])(?:(?:https?|ftps?|sftp|ssh|git|file)://|www\\.|mailto:)"
        f"[^\\s<>\"'`{NO_SPACE_CLASS}]+",
        re.IGNORECASE,
    ),
    "email": re.compile(f"(?<!{_LOCAL}){_LOCAL}+@{_LABEL}(?:\\.{_LABEL})+"),
    "placeholder": re.compile(r"\{\{\s*\w+\s*\}\}|\{\s*\w+\s*\}"),
    "number": re.compile(r"[-+\u2212]?\d+(?:[.,:/'\u00a0\u202f\u2009-]\d+)*"),
}
_PLACEHOLDER = re.compile(r"(?P<space>[ \t]?)[{\uff5b]\s*(?P<index>\d+)\s*[}\uff5d]")
_URL_END = ".,;:!?'\")]}>"
_CLOSING = {")": "(", "]": "[", "}": "{"}


def find_protected(
    text: str, kinds: Collection[str] = KINDS, marks: Marks | None = DEFAULT_MARKS
) -> list[Span]:
    """The protected spans of ``text`` (the module's contract), in order, none overlapping.

    ``kinds``: which of :data:`KINDS` to look for (an unknown one is a ValueError);
    ``marks``: the user's marks, or None for no marking.
    """
    unknown = set(kinds) - set(KINDS)
    if unknown:
        raise ValueError(f"unknown kinds of protected spans: {sorted(unknown)}; know {KINDS}")
    taken: list[Span] = []
    used = bytearray(len(text))  # 1 where a span of an earlier kind already is
    for kind in KINDS:
        if kind not in kinds:
            continue
        for span in _marked(text, marks) if kind == "marked" else _matches(text, kind):
            if not any(used[span.start : span.end]):
                used[span.start : span.end] = b"\x01" * (span.end - span.start)
                taken.append(span)
    return sorted(taken, key=lambda s: s.start)


def unmark(text: str, marks: Marks = DEFAULT_MARKS) -> str:
    """``text`` with the user's marks removed where they protect a span (the text between stays).

    What a model sees when the spans go to it as constraints. With ``marks.keep`` the text is
    returned as it is.
    """
    spans = [] if marks.keep else _marked(text, marks)
    parts, end = [], 0
    for span in spans:
        parts += [text[end : span.start], span.text]
        end = span.end
    return "".join(parts) + text[end:]


def as_constraints(
    text: str, kinds: Collection[str] = KINDS, marks: Marks | None = DEFAULT_MARKS
) -> tuple[str, list[Span]]:
    """What a constrained search needs to carry ``text``'s protected spans through.

    The text the model translates (:func:`unmark`: without the user's marks) and its protected
    spans, placed in that text (``start``/``end`` index it): their ``text`` is what the
    translation must contain verbatim."""
    parts, placed, end, at = [], [], 0, 0
    for span in find_protected(text, kinds, marks):
        before = text[end : span.start]
        parts += [before, span.text]  # a marked span without its marks, any other as it is
        at += len(before)
        placed.append(Span(at, at + len(span.text), span.kind, span.text))
        at, end = at + len(span.text), span.end
    return "".join(parts) + text[end:], placed


@dataclass(frozen=True)
class Restore:
    """Puts protected spans back into a translation of a masked text (the module's rules)."""

    spans: tuple[Span, ...]

    def __call__(self, translation: str) -> str:
        """``translation`` with each placeholder replaced by its span's text."""
        done: set[int] = set()

        def put(match: re.Match[str]) -> str:
            index = int(match.group("index"))
            if index >= len(self.spans):
                return match.group()
            if index in done:
                return ""
            done.add(index)
            return match.group("space") + self.spans[index].text

        out = _PLACEHOLDER.sub(put, translation)
        missing = [s.text for i, s in enumerate(self.spans) if i not in done]
        if not missing:
            return out
        return " ".join([out.rstrip(), *missing] if out.strip() else missing)


def mask(
    text: str, kinds: Collection[str] = KINDS, marks: Marks | None = DEFAULT_MARKS
) -> tuple[str, Restore]:
    """``text`` with each protected span replaced by ``{0}``, ``{1}``..., and how to restore it.

    ``kinds`` and ``marks`` as :func:`find_protected`'s. The placeholders count the spans in
    order; :class:`Restore` on the translation puts the spans back.
    """
    spans = find_protected(text, kinds, marks)
    parts, end = [], 0
    for index, span in enumerate(spans):
        parts += [text[end : span.start], f"{{{index}}}"]
        end = span.end
    return "".join(parts) + text[end:], Restore(tuple(spans))


def _marked(text: str, marks: Marks | None) -> list[Span]:
    """The spans the user marked: from an open mark to the next close mark, not empty."""
    if marks is None or not marks.open or not marks.close:
        return []
    spans, at = [], 0
    while (start := text.find(marks.open, at)) >= 0:
        inner = start + len(marks.open)
        close = text.find(marks.close, inner)
        if close < 0:
            break
        end = close + len(marks.close)
        if close > inner:
            kept = text[start:end] if marks.keep else text[inner:close]
            spans.append(Span(start, end, "marked", kept))
        at = end
    return spans


def _matches(text: str, kind: str) -> list[Span]:
    """The spans of one pattern kind, trimmed and checked as the module describes."""
    spans = []
    for match in _PATTERNS[kind].finditer(text):
        start, end = match.span()
        if kind == "url":
            end = start + len(_trim_url(match.group()))
        if kind == "number" and not _stands_alone(text, start, end):
            continue
        if end > start:
            spans.append(Span(start, end, kind, text[start:end]))
    return spans


def _trim_url(url: str) -> str:
    """A matched link without the punctuation after it; a bracket it opened stays."""
    while url and url[-1] in _URL_END:
        opener = _CLOSING.get(url[-1])
        if opener is not None and url.count(opener) >= url.count(url[-1]):
            break
        url = url[:-1]
    return url


def _stands_alone(text: str, start: int, end: int) -> bool:
    """Whether a number is not part of a word: no letter or digit of a spaced script touches it."""
    before = text[start - 1] if start > 0 else " "
    after = text[end] if end < len(text) else " "
    return not (is_word_char(before) or is_word_char(after) or before == "_" or after == "_")
