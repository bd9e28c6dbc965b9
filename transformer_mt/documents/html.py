"""HTML for translation: its text as sentences, its markup put back around the translations.

HTML for translation: the text of a fragment (or a whole page, an epub's XHTML chapter) as
sentences to translate, and the markup put back around their translations.

Read with the standard library's :class:`html.parser.HTMLParser` (never regular expressions
over markup). What becomes what:

- Every element that is not inline (``<p>``, ``<li>``, ``<td>``, ``<h1>``, ``<div>``, ``<br>``,
  unknown ones...) ends a segment: the text between two such tags is one segment, translated as
  one line (its whitespace collapsed to single spaces; its leading and trailing whitespace kept).
- Inline elements (``<b>``, ``<i>``, ``<a href>``, ``<span>``...) stay in their segment: each is
  put back around the target words aligned to the source words it held
  (:mod:`~transformer_mt.documents.placement`), its start and end tags as written (attributes
  unchanged). Nested elements stay nested: a child is clipped to its parent's words, siblings
  to their own (in the order the translation puts them). ``<img>``, comments, an element with no
  words, a ``<code>`` inside a sentence are kept whole and placed at the boundary after the
  target word of the source word before them.
- ``<script>``, ``<style>``, ``<pre>``, ``<textarea>``, ``<template>``, ``<code>``, ``<kbd>``,
  ``<samp>``, ``<var>`` and any element with ``translate="no"`` are kept as they are, contents
  included. A segment with nothing to translate (:func:`~transformer_mt.decoding.text.has_text`)
  is kept as it is too.
- Text is written back with ``&``, ``<``, ``>`` and the no-break space escaped; the other
  entities of the input come back as the characters they stand for (``&eacute;`` and ``&#233;``
  as ``é``). A named reference that stands for no entity :mod:`html` knows (``&foo;``, an
  entity a DOCTYPE declares, a template's placeholder) comes back exactly as written, never as
  ``&amp;foo;``: it is kept whole at its place, as an ``<img>`` is, and the model never sees it.
- Attribute values that are text, as DeepL and Google translate them: ``alt`` (``<img>``,
  ``<area>``, ``<input type="image">``), ``title`` and ``aria-label`` (any element),
  ``placeholder`` (``<input>``, ``<textarea>``) and the ``content`` of
  ``<meta name="description">``. Each value with text to translate is one more segment of the
  page (an :class:`AttributeText`, counted against the same bound as the others), translated as
  one line without markup and written back double-quoted, escaped as an attribute value
  (``&``, ``<``, ``>``, ``"`` and ``'`` as entities); the rest of its tag stays as written. An
  element with ``translate="no"`` keeps its attributes, and so do its descendants and those of
  the elements kept as they are (``<textarea>``'s own tag excepted: its contents are what a user
  typed, its placeholder is the page's text). An attribute written twice, or a tag that
  :mod:`html.parser` reads otherwise than its attributes are found here, is kept as written;
  so is a value that holds a reference to an unknown entity (``alt="&product; logo"``).
"""

from __future__ import annotations

import bisect
import html
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from html.parser import HTMLParser
from typing import Any

from transformer_mt.documents.limits import Budget, DocumentLimits
from transformer_mt.documents.placement import word_links
from transformer_mt.engines.results import LineResult
from transformer_mt.text.content import has_text

INLINE = frozenset(
    "a abbr acronym b bdi bdo big cite data del dfn em font i ins label mark q s small span "
    "strike strong sub sup time tt u".split()
)
INLINE_OPAQUE = frozenset({"code", "kbd", "samp", "var"})  # inside a sentence, not translated
BLOCK_OPAQUE = frozenset({"script", "style", "pre", "textarea", "template"})
INLINE_VOID = frozenset({"img", "wbr", "input"})  # kept whole inside a sentence
VOID = frozenset(
    "area base br col embed hr img input link meta param source track wbr".split()
)  # no end tag
RAW_TEXT = frozenset({"script", "style"})  # the parser hands their text over unescaped
Attributes = Sequence[tuple[str, "str | None"]]  # a start tag's (name, value) pairs, as parsed
# Where an attribute value to translate sits in the markup until the page is rendered: a
# placeholder between two of these, the first one the source does not hold (noncharacters).
MARKERS = tuple(chr(c) for c in range(0xFDD0, 0xFDF0))
_TAG_NAME = re.compile(r"<[^\s/>]+")
_BETWEEN = re.compile(r"(?:\s|/)*")  # between a start tag's attributes
_ATTRIBUTE = re.compile(r"""([^\s/>][^\s/=>]*)(?:\s*=+\s*('[^']*'|"[^"]*"|(?!['"])[^>\s]*))?""")
# A named character reference, its name an XML name (a DOCTYPE's own entities included).
_NAMED_REFERENCE = re.compile(r"&[A-Za-z_:][-A-Za-z0-9._:]*;")


def _same(markup: str) -> str:
    """Markup as it is (no placeholder to fill)."""
    return markup


def escape(text: str, xml: bool = False) -> str:
    """Escape text as HTML.

    Text as HTML: ``&``, ``<``, ``>`` and the no-break space as entities (``&#160;`` for
    XHTML, which knows no ``&nbsp;``)."""
    return html.escape(text, quote=False).replace("\xa0", "&#160;" if xml else "&nbsp;")


def _unknown_references(written: str) -> list[re.Match[str]]:
    """The named references in ``written`` (text as written) that stand for no known entity.

    Those :func:`html.unescape` leaves as they are: html.parser hands them over as text, which
    would be written back escaped (``&amp;foo;``)."""
    if "&" not in written:
        return []
    return [
        found
        for found in _NAMED_REFERENCE.finditer(written)
        if html.unescape(found.group()) == found.group()
    ]


def _text_events(written: str) -> list[tuple[str, str]]:
    """Text as written, as :class:`_Builder` events: text, and unknown entities kept as markup.

    ("text", its entities read) and, for each reference to an unknown entity, ("markup", the
    reference as written)."""
    events, at = [], 0
    for found in _unknown_references(written):
        if at < found.start():
            events.append(("text", html.unescape(written[at : found.start()])))
        events.append(("markup", found.group()))
        at = found.end()
    if at < len(written):
        events.append(("text", html.unescape(written[at:])))
    return events


@dataclass
class _Element:
    """An inline element of a segment: its tags, the characters of the segment's text it holds."""

    tag: str
    open: str
    close: str | None  # None: not closed inside the segment (then kept whole as a point)
    start: int  # character offsets in the segment's text
    end: int = -1
    parent: _Element | None = None
    raw_from: int = 0  # its tags and contents in the segment's raw HTML pieces
    raw_to: int = 0


@dataclass
class _Point:
    """Markup kept whole inside a segment (an image, a comment, an element with no words)."""

    raw: str
    at: int  # character offset in the segment's text
    parent: _Element | None = None


@dataclass
class Segment:
    """One segment of an HTML document: its text (to translate) and the inline markup in it."""

    text: str  # the segment's text, whitespace as in the source
    raw: str  # the segment's HTML as in the source (text escaped)
    elements: list[_Element] = field(default_factory=list)
    points: list[_Point] = field(default_factory=list)
    xml: bool = False  # XHTML: text escaped as XML knows it

    @property
    def words(self) -> list[str]:
        """The segment's whitespace words."""
        return self.text.split()

    @property
    def line(self) -> str:
        """What the model translates: the words, one space between them."""
        return " ".join(self.words)

    def render(self, result: LineResult, fill: Callable[[str], str] = _same) -> str:
        """The segment's HTML with ``result`` (a translation of :attr:`line`) as its text.

        ``fill`` writes the translated attribute values into its markup (never into its text)."""
        target = result.text.split()
        if not target:
            return fill(self.raw)
        first, last = len(self.text) - len(self.text.lstrip()), len(self.text.rstrip())
        # Markup in the whitespace before the first word or after the last (outside any
        # element) stays where it was in that whitespace; the rest goes between the words.
        edge = [p for p in self.points if p.parent is None and not first <= p.at <= last]
        spans = _Spans(self.text)
        links = word_links(result, len(spans.starts))
        layout = _Layout(len(target))
        ranges: dict[int, tuple[int, int]] = {}
        for element in self.elements:  # parents come before their children
            bounds = (0, len(target)) if element.parent is None else ranges[id(element.parent)]
            span = links.span(*spans.words_within(element.start, element.end))
            ranges[id(element)] = layout.fit(element, span, bounds)
        for point in self.points:
            if any(point is p for p in edge):
                continue
            bounds = (0, len(target)) if point.parent is None else ranges[id(point.parent)]
            at = links.point(spans.words_before(point.at))
            glue = _glue(self.text, point.at)
            layout.add_point(point.raw, min(max(at, bounds[0]), bounds[1]), glue)
        body = layout.render([escape(word, self.xml) for word in target], fill)
        lead = self._whitespace(0, first, [p for p in edge if p.at < first], fill)
        trail = self._whitespace(last, len(self.text), [p for p in edge if p.at > last], fill)
        return lead + body + trail

    def _whitespace(self, start: int, end: int, points: list[_Point], fill: Callable) -> str:
        """The text's whitespace ``[start, end)``, ``points`` (offsets in it) where they were."""
        out, at = [], start
        for point in points:
            out += [self.text[at : point.at], fill(point.raw)]
            at = point.at
        return "".join(out) + self.text[at:end]


@dataclass
class AttributeText:
    """An attribute value to translate (see the module's docstring): one more segment of a page."""

    text: str  # the value, its entities read
    raw: str  # the value as written, quotes included (kept where nothing comes back)

    @property
    def line(self) -> str:
        """What the model translates: the value's words, one space between them."""
        return " ".join(self.text.split())

    def render(self, result: LineResult) -> str:
        """The attribute's value with ``result`` as its text, double-quoted and escaped."""
        words = result.text.split()
        if not words:
            return self.raw
        return '"' + html.escape(" ".join(words), quote=True) + '"'


def _glue(text: str, at: int) -> int:
    """How markup at offset ``at`` of ``text`` sits against the words.

    Returns -1 when it sits against the word before it, 1 against the word after it, 0 between
    spaces (or at an end)."""
    if at > 0 and not text[at - 1].isspace():
        return -1
    return 1 if at < len(text) and not text[at].isspace() else 0


class _Spans:
    """The whitespace words of a text: ``[start, end)`` character offsets, found by bisection."""

    def __init__(self, text: str) -> None:
        self.starts: list[int] = []
        self.ends: list[int] = []
        start = None
        for i, ch in enumerate(text + " "):
            if ch.isspace() and start is not None:
                self.starts.append(start)
                self.ends.append(i)
                start = None
            elif not ch.isspace() and start is None:
                start = i

    def words_before(self, at: int) -> int:
        """How many words start before offset ``at``."""
        return bisect.bisect_left(self.starts, at)

    def words_within(self, start: int, end: int) -> tuple[int, int]:
        """The words ``[s0, s1)`` with a character in ``[start, end)`` (the caller knows some)."""
        return bisect.bisect_right(self.ends, start), bisect.bisect_left(self.starts, end)


class _Layout:
    """Tags to put between the words of a translation: starts and ends of elements, points."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.before: list[list[str]] = [[] for _ in range(n + 1)]  # opening, at boundary t
        self.after: list[list[str]] = [[] for _ in range(n + 1)]  # closing, at boundary t
        self.points: list[list[tuple[int, str]]] = [[] for _ in range(n + 1)]  # (glue, raw)
        self.taken: dict[int, _Ranges] = {}  # parent id -> its children's ranges

    def fit(
        self, element: _Element, span: tuple[int, int], bounds: tuple[int, int]
    ) -> tuple[int, int]:
        """Place ``element`` on target words ``span``; return its range.

        The range lies inside ``bounds`` (its parent's words) and clear of its siblings placed
        before it; an empty range keeps the element as a point."""
        t0 = min(max(span[0], bounds[0]), bounds[1])
        t1 = min(max(span[1], t0), bounds[1])
        siblings = self.taken.setdefault(id(element.parent), _Ranges())
        for a, b in siblings.overlapping(t0, t1):  # in the order they were placed
            if a < t1 and t0 < b:  # overlap: keep the part after the sibling, else before it
                t0, t1 = (b, max(t1, b)) if t1 > b else (t0, a)
                t0, t1 = min(t0, bounds[1]), min(max(t1, t0), bounds[1])
        if element.close is None or t0 >= t1:
            self.points[t0].append((1, element.open + (element.close or "")))
            return (t0, t0)
        siblings.add(t0, t1)
        self.before[t0].append(element.open)
        self.after[t1].append(element.close)  # written in reverse: the innermost closes first
        return (t0, t1)

    def add_point(self, raw: str, at: int, glue: int) -> None:
        """Put ``raw`` at boundary ``at``.

        Against the word before it (``glue`` -1), after it
        (1), or apart (0)."""
        self.points[at].append((glue, raw))

    def render(self, words: list[str], fill: Callable[[str], str] = _same) -> str:
        """The words with the tags between them.

        At each boundary, the elements that end, a space, the points, then the elements that
        start; ``fill`` is applied to each tag (the words are written as they are)."""
        out: list[str] = []
        for t in range(self.n + 1):
            out.extend(fill(raw) for raw in reversed(self.after[t]))
            out.extend(fill(raw) for glue, raw in self.points[t] if glue < 0)
            apart = [fill(raw) for glue, raw in self.points[t] if glue == 0]
            if t == self.n:
                out.extend(" " + raw for raw in apart)
            else:
                out.append(" " if t > 0 else "")
                out.extend(raw + " " for raw in apart)
            out.extend(fill(raw) for glue, raw in self.points[t] if glue > 0)
            out.extend(fill(raw) for raw in self.before[t])
            if t < self.n:
                out.append(words[t])
        return "".join(out)


class _Ranges:
    """Ranges placed inside one parent: disjoint, non-empty, kept in order of their starts.

    A new range only ever shrinks as it clears the ranges it overlaps, so only those
    (a contiguous run, found by bisection) can move it."""

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.ends: list[int] = []
        self.order: list[int] = []  # when each was placed

    def overlapping(self, t0: int, t1: int) -> list[tuple[int, int]]:
        """The ranges with ``b > t0`` and ``a < t1``, in the order they were placed."""
        k = bisect.bisect_right(self.ends, t0)
        found = []
        while k < len(self.starts) and self.starts[k] < t1:
            found.append((self.order[k], self.starts[k], self.ends[k]))
            k += 1
        return [(a, b) for _, a, b in sorted(found)]

    def add(self, a: int, b: int) -> None:
        """Place the range ``[a, b)`` (clear of every other)."""
        k = bisect.bisect_left(self.starts, a)
        self.starts.insert(k, a)
        self.ends.insert(k, b)
        self.order.insert(k, len(self.order))


class HtmlPage:
    """An HTML text read for translation: markup kept as written, and the segments between.

    ``budget`` counts its elements, segments and inline nesting against a document's limits
    (:mod:`~transformer_mt.documents.limits`; by default those the environment sets), while it
    is read: past one, a :class:`~transformer_mt.documents.limits.DocumentTooLarge`."""

    def __init__(self, source: str, xml: bool = False, budget: Budget | None = None) -> None:
        budget = budget or Budget(DocumentLimits.from_env(), "the HTML")
        self.xml = xml  # XHTML (an epub's chapter): text escaped as XML knows it
        marker = next((ch for ch in MARKERS if ch not in source), None)
        builder = _Builder(xml, budget, marker)
        # After the last ">" nothing can end a tag, a comment or a declaration: the parser
        # would read that tail as text, but only after scanning it to its end once per "<" in it.
        end = source.rfind(">") + 1
        parser = _Events(source[:end], builder, budget)
        parser.feed(source[:end])
        parser.close()
        if parser.cdata_elem is not None:  # an unclosed <script> or <style>: kept as written
            builder.add("markup", "", parser.rawdata + source[end:])
        else:
            for kind, text in _text_events(source[end:]):
                builder.add(kind, "", text)
        self.parts: list[str | Segment] = builder.finish()
        # the segments to translate: blocks of text and attribute values, in document order
        self.segments: list[Segment | AttributeText] = builder.order
        self._attributes = builder.attributes
        self._placeholder = re.compile(f"{marker}([0-9]+){marker}") if marker else None

    def render(self, results: list[LineResult]) -> str:
        """The HTML with each segment's text replaced by its translation.

        ``results`` come in the order of :attr:`segments`."""
        if len(results) != len(self.segments):
            raise ValueError(f"{len(results)} results for {len(self.segments)} segments")
        found = {
            id(segment): result for segment, result in zip(self.segments, results, strict=True)
        }
        fill = self._filler(found)
        return "".join(
            fill(part) if isinstance(part, str) else part.render(found[id(part)], fill)
            for part in self.parts
        )

    def _filler(self, found: dict[int, LineResult]) -> Callable[[str], str]:
        """What writes the translated attribute values into markup, by their placeholders."""
        pattern = self._placeholder
        if pattern is None or not self._attributes:
            return _same
        values = [value.render(found[id(value)]) for value in self._attributes]
        return lambda markup: pattern.sub(lambda m: values[int(m.group(1))], markup)


# What ends a comment, and a marked section (<![CDATA[...]]>, <![if ...]>), in any version of
# html.parser: a construct with none after its start is text, found without a scan per "<".
COMMENT_END = re.compile(r"-!?\s*>")
SECTION_END = re.compile(r"]\s*>")
DOCTYPE = "<!doctype"
SUBSET_END = re.compile(r"]\s*>")  # a DOCTYPE's internal subset: "[ <!ENTITY ...> ]>"


class _Events(HTMLParser):
    """The HTML parser's events handed to a :class:`_Builder` as they come.

    Events ``(kind, tag, text, attributes)``: "start", "void" and "end" tags as written,
    "text" unescaped, "markup" (comments, declarations, the text of a script or a style) as
    written. Linear in its input: a comment or marked section that nothing ends is known as such
    at once (``html.parser`` would look for its end once per "<" after it), and a DOCTYPE's
    internal subset is read whole (the parser would end it at its first ">")."""

    def __init__(self, source: str, builder: _Builder, budget: Budget) -> None:
        super().__init__(convert_charrefs=True)
        self.builder, self.budget = builder, budget
        self._raw_text: str | None = None  # inside <script> or <style>
        self._source = source  # fed whole: an end tag is read back as written (SVG's camelCase)
        self._line_starts = [0]  # html.parser counts lines by "\n" alone
        at = source.find("\n")
        while at >= 0:
            self._line_starts.append(at + 1)
            at = source.find("\n", at + 1)
        self._buffer: str | None = None  # the parser's buffer that _last describes
        self._last: dict[re.Pattern, int] = {}  # pattern -> where its last match ends there

    def _ends_after(self, i: int, pattern: re.Pattern) -> bool:
        """Whether a match of ``pattern`` ends after offset ``i`` of the parser's buffer."""
        if self.rawdata is not self._buffer:
            self._buffer, self._last = self.rawdata, {}
        if pattern not in self._last:
            self._last[pattern] = max((m.end() for m in pattern.finditer(self.rawdata)), default=-1)
        return self._last[pattern] > i

    def parse_comment(self, i: int, *args: Any, **kwargs: Any) -> int:
        if not self._ends_after(i + 4, COMMENT_END):
            return -1  # nothing ends it: text up to the next ">", as html.parser has it
        return super().parse_comment(i, *args, **kwargs)

    def parse_marked_section(self, i: int, *args: Any, **kwargs: Any) -> int:
        if not self._ends_after(i + 3, SECTION_END):
            return -1
        try:
            return super().parse_marked_section(i, *args, **kwargs)
        except AssertionError:  # "<![name" of a kind it does not know: text, as any junk
            return -1

    def parse_html_declaration(self, i: int) -> int:
        rawdata = self.rawdata
        if rawdata[i : i + 9].lower() == DOCTYPE:
            close = rawdata.find(">", i + 9)
            bracket = rawdata.find("[", i + 9, close) if close >= 0 else -1
            if bracket >= 0:  # an internal subset
                if not self._ends_after(bracket, SUBSET_END):
                    return -1
                end = SUBSET_END.search(rawdata, bracket)  # the DOCTYPE ends at "]>"
                assert end is not None
                self.handle_decl(rawdata[i + 2 : end.end() - 1])
                return end.end()
        return super().parse_html_declaration(i)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.budget.add_elements(1, "HTML elements")
        kind = "void" if tag in VOID else "start"
        self.builder.add(kind, tag, self.get_starttag_text() or "", attrs)
        if tag in RAW_TEXT:
            self._raw_text = tag

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.budget.add_elements(1, "HTML elements")
        self.builder.add("void", tag, self.get_starttag_text() or "", attrs)

    def handle_endtag(self, tag: str) -> None:
        if tag == self._raw_text:
            self._raw_text = None
        self.builder.add("end", tag, self._end_tag_text(tag))

    def _offset(self) -> int:
        """Where in the source the event being handled starts (-1: not known)."""
        line, column = self.getpos()
        return self._line_starts[line - 1] + column if line <= len(self._line_starts) else -1

    def _end_tag_text(self, tag: str) -> str:
        """The end tag being handled as the source writes it (the parser lowercases names)."""
        at = self._offset()
        end = self._source.find(">", at) if at >= 0 else -1
        raw = self._source[at : end + 1] if end >= 0 else ""
        return raw if raw.lower().startswith(f"</{tag}") else f"</{tag}>"

    def handle_data(self, data: str) -> None:
        written = None if self._raw_text or "&" not in data else self._written(data)
        if written is None:
            self.builder.add("markup" if self._raw_text else "text", "", data)
            return
        for kind, text in _text_events(written):  # references to unknown entities as written
            self.builder.add(kind, "", text)

    def _written(self, data: str) -> str | None:
        """The source text that the parser read as the text ``data`` (None: not found).

        The parser hands text over with its entities read (``convert_charrefs``): text up to
        the next "<" (or the end), or a "<" that starts no tag up to the next ">" or alone (the
        ends tried here, each no farther than the parser itself looked); the one that reads as
        ``data`` is the text as written."""
        at, source = self._offset(), self._source
        if at < 0:
            return None
        next_tag = source.find("<", at + 1)
        ends = (len(source) if next_tag < 0 else next_tag, source.find(">", at) + 1, at + 1)
        for end in ends:
            if end > at and html.unescape(source[at:end]) == data:
                return source[at:end]
        return None

    def handle_comment(self, data: str) -> None:
        self.builder.add("markup", "", f"<!--{data}-->")

    def handle_decl(self, decl: str) -> None:
        self.builder.add("markup", "", f"<!{decl}>")

    def handle_pi(self, data: str) -> None:
        self.builder.add("markup", "", f"<?{data}>")

    def unknown_decl(self, data: str) -> None:
        self.builder.add("markup", "", f"<![{data}]>")


def _attributes(attrs: Attributes) -> dict[str, str]:
    """The parser's attribute pairs as a dict (a bare attribute's value: "")."""
    return {name: value or "" for name, value in attrs}


def _text_attributes(tag: str, values: dict[str, str]) -> set[str]:
    """The attributes of a ``tag`` start tag whose values are text to translate."""
    names = {"title", "aria-label"}
    if tag in ("img", "area") or (
        tag == "input" and values.get("type", "").strip().lower() == "image"
    ):
        names.add("alt")
    if tag in ("input", "textarea"):
        names.add("placeholder")
    if tag == "meta" and values.get("name", "").strip().lower() == "description":
        names.add("content")
    return names & values.keys()


def _attribute_spans(raw: str) -> list[tuple[str, str | None, int, int]] | None:
    """Each attribute of the start tag ``raw``: name, value as written (None: none), its span.

    The value's span in ``raw`` (its quotes included); None where the tag does not read as
    attributes (the caller then compares these with what the parser found)."""
    name = _TAG_NAME.match(raw)
    if name is None:
        return None
    found: list[tuple[str, str | None, int, int]] = []
    at = name.end()
    while True:
        at = _BETWEEN.match(raw, at).end()  # type: ignore[union-attr]  # matches "" at least
        if at >= len(raw) or raw[at] == ">":
            return found
        attribute = _ATTRIBUTE.match(raw, at)
        if attribute is None:
            return None
        found.append((attribute.group(1).lower(), attribute.group(2), *attribute.span(2)))
        at = attribute.end()


def _as_parsed(value: str | None) -> str | None:
    """An attribute value as written, read as :mod:`html.parser` reads it."""
    if value is not None and value[:1] in ("'", '"') and value[:1] == value[-1:]:
        value = value[1:-1]
    return html.unescape(value) if value else value


@dataclass
class _Opaque:
    """An element kept as written, contents included, while its end tag is awaited."""

    tag: str
    inline: bool
    pieces: list[str]
    depth: int = 1


class _Builder:
    """Parser events -> the parts of an :class:`HtmlPage` (see the module's docstring)."""

    def __init__(self, xml: bool, budget: Budget, marker: str | None = None) -> None:
        self.xml, self.budget = xml, budget
        self.marker = marker  # around an attribute value's placeholder (None: none translated)
        self.parts: list[str | Segment] = []
        self.order: list[Segment | AttributeText] = []  # the segments, as they are found
        self.attributes: list[AttributeText] = []  # by their placeholders' numbers
        self.opaque: _Opaque | None = None
        self._reset()

    def _reset(self) -> None:
        """Start a new segment."""
        self.text: list[str] = []
        self.length = 0
        self.raw: list[str] = []
        self.elements: list[_Element] = []
        self.points: list[_Point] = []
        self.stack: list[_Element] = []
        self.open: dict[str, int] = {}  # tag -> its elements on the stack

    def add(self, kind: str, tag: str, text: str, attrs: Attributes = ()) -> None:
        """Take one parser event."""
        if self.opaque is not None:
            self._add_opaque(kind, tag, text)
            return
        values = _attributes(attrs)
        kept = values.get("translate", "").strip().lower() == "no"
        opaque = tag in INLINE_OPAQUE or tag in BLOCK_OPAQUE
        if kind in ("start", "void") and not kept and (tag == "textarea" or not opaque):
            text = self._translate_attributes(tag, text, attrs, values)
        if kind == "text":
            self.raw.append(escape(text, self.xml))
            self.text.append(text)
            self.length += len(text)
        elif kind == "markup":
            self._point(text)
        elif kind == "start" and (opaque or kept):
            self.opaque = _Opaque(tag, tag in INLINE or tag in INLINE_OPAQUE, [text])
        elif kind == "void":
            self._point(text) if tag in INLINE_VOID else self._break(text)
        elif kind == "start":
            self._open(tag, text) if tag in INLINE else self._break(text)
        else:
            self._close(tag, text) if tag in INLINE else self._break(text)

    def _translate_attributes(
        self, tag: str, raw: str, attrs: Attributes, values: dict[str, str]
    ) -> str:
        """The start tag ``raw`` with each value to translate replaced by its placeholder.

        Each such value becomes a segment (:class:`AttributeText`); a tag whose attributes are
        not found here as the parser found them, or an attribute written twice, stays as it is."""
        names = _text_attributes(tag, values)
        if not names or self.marker is None:
            return raw
        spans = _attribute_spans(raw)
        if spans is None or [(n, _as_parsed(v)) for n, v, _, _ in spans] != list(attrs):
            return raw
        counts = Counter(name for name, *_ in spans)
        pieces, at = [], 0
        for name, value, start, end in spans:
            if name not in names or counts[name] > 1 or value is None:
                continue
            if not has_text(values[name]) or _unknown_references(value):
                continue  # nothing to translate, or a reference to keep as written
            self.budget.add_segment()
            attribute = AttributeText(values[name], value)
            pieces += [raw[at:start], f"{self.marker}{len(self.attributes)}{self.marker}"]
            self.attributes.append(attribute)
            self.order.append(attribute)
            at = end
        return "".join(pieces) + raw[at:]

    def finish(self) -> list[str | Segment]:
        """The parts, once every event was added (an element left open is kept as written)."""
        if self.opaque is not None:  # an element to keep as written that nothing closed
            whole, inline = "".join(self.opaque.pieces), self.opaque.inline
            self.opaque = None
            self._point(whole) if inline else self._break(whole)
        self._flush()
        return self.parts

    def _add_opaque(self, kind: str, tag: str, text: str) -> None:
        """Keep an event inside an element kept as written; at its end tag, place it whole."""
        opaque = self.opaque
        assert opaque is not None
        opaque.pieces.append(escape(text, self.xml) if kind == "text" else text)
        if tag == opaque.tag and kind in ("start", "end"):
            opaque.depth += 1 if kind == "start" else -1
        if opaque.depth == 0:
            self.opaque = None
            whole = "".join(opaque.pieces)
            self._point(whole) if opaque.inline else self._break(whole)

    def _point(self, raw: str) -> None:
        """Markup kept whole at this place of the segment."""
        self.points.append(_Point(raw, self.length, self.stack[-1] if self.stack else None))
        self.raw.append(raw)

    def _open(self, tag: str, raw: str) -> None:
        """An inline element starts."""
        self.budget.check_depth(len(self.stack) + 1, "HTML inline elements")
        parent = self.stack[-1] if self.stack else None
        element = _Element(tag, raw, None, self.length, parent=parent, raw_from=len(self.raw))
        self.raw.append(raw)
        self.elements.append(element)
        self.stack.append(element)
        self.open[tag] = self.open.get(tag, 0) + 1

    def _close(self, tag: str, raw: str) -> None:
        """End the innermost open element ``tag``.

        Misnested elements opened inside it end with it and stay unclosed; an end tag with no open
        element is kept as a point."""
        if not self.open.get(tag):
            self._point(raw)
            return
        while True:  # each element leaves the stack once: linear in all
            element = self.stack.pop()
            self.open[element.tag] -= 1
            if element.tag == tag:
                break
        self.raw.append(raw)
        element.close, element.end, element.raw_to = raw, self.length, len(self.raw)

    def _break(self, raw: str) -> None:
        """A block's tag: the segment ends, the tag is written as it is."""
        self._flush()
        self.parts.append(raw)

    def _flush(self) -> None:
        """End the segment being read.

        A :class:`Segment` when it has text to translate, else
        its HTML as written."""
        text, raw = "".join(self.text), "".join(self.raw)
        if has_text(text):
            self.budget.add_segment()
            segment = self._segment(text, raw)
            self.parts.append(segment)
            self.order.append(segment)
        elif raw:
            self.parts.append(raw)
        self._reset()

    def _segment(self, text: str, raw: str) -> Segment:
        """The segment being read, its markup placed by words or kept as points.

        The segment: an element with no words is kept whole as a point (its contents with
        it), one left open keeps its start tag as a point; the others are placed by words."""
        kept: list[_Element] = []
        points: list[_Point] = []
        # what a child of each element sees above it: (False, None) inside an element kept
        # whole, else (True, its nearest placed ancestor); parents come before their children
        seen: dict[int, tuple[bool, _Element | None]] = {}
        inked = [0]  # inked[i]: characters before offset i that are not whitespace
        for ch in text:
            inked.append(inked[-1] + (not ch.isspace()))

        def parent_of(node: _Element | _Point) -> tuple[bool, _Element | None]:
            """(False, None) inside an element kept whole, else (True, nearest placed parent)."""
            return (True, None) if node.parent is None else seen[id(node.parent)]

        for element in self.elements:
            shown, parent = parent_of(element)
            if not shown:
                seen[id(element)] = (False, None)
            elif element.close is None:  # its start tag a point; its children see past it
                points.append(_Point(element.open, element.start, parent))
                seen[id(element)] = (True, parent)
            elif inked[element.end] == inked[element.start]:  # no words
                seen[id(element)] = (False, None)
                contents = "".join(self.raw[element.raw_from : element.raw_to])
                points.append(_Point(contents, element.start, parent))
            else:
                element.parent = parent
                kept.append(element)
                seen[id(element)] = (True, element)
        for point in self.points:
            shown, parent = parent_of(point)
            if shown:
                points.append(_Point(point.raw, point.at, parent))
        points.sort(key=lambda point: point.at)
        return Segment(text, raw, kept, points, self.xml)
