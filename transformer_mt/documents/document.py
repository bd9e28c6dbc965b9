"""Documents in, documents out: HTML fragments and files (.txt, .html, .docx, .odt, .pptx, .epub).

A document is read into the segments to translate (plain text, one per block of text), those are
translated as lines (with their cross-attention, which places inline markup), and the document is
written back with the same structure. Two phases, so that the caller decides how lines are
translated (``mt translate`` in-process, ``mt serve`` through its decode worker):

    document = read_document_file(path)
    results = engine.translate(document.segments, decode, attention=True)
    data = document.render(results)

(:func:`~transformer_mt.documents.translate.translate_document` does so with each segment cut
into its sentences, their translations and attention joined back.) What each format keeps: :mod:`~transformer_mt.documents.html` (HTML, and epub chapters),
:mod:`~transformer_mt.documents.office` (.docx, .odt, .pptx, .epub). A .txt file is translated
line by line, its empty lines and line ends kept. Segments with nothing to translate
(:func:`has_text`: numbers, emoji, links alone) are not segments: they stay as they are.

Reading a document costs at most what its bounds allow (:mod:`~transformer_mt.documents.limits`:
bytes, zip members, segments, elements, nesting; by default those the environment sets), each
checked as it is read. :func:`document_segments` and :func:`render_document` (and their HTML
fragment forms) are the two phases as functions of bytes, for a server that parses in a process
of its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from transformer_mt.documents.limits import Budget, DocumentLimits
from transformer_mt.engines.results import LineResult
from transformer_mt.errors import MTError
from transformer_mt.text.content import has_text

if TYPE_CHECKING:  # read where an HTML document is (documents.html: imported when needed)
    from transformer_mt.documents.html import HtmlPage

# File suffixes a document may have, in the order LibreTranslate lists them.
FILE_FORMATS: tuple[str, ...] = (".txt", ".html", ".docx", ".odt", ".pptx", ".epub")
SUFFIXES = {".htm": ".html", ".xhtml": ".html"}  # other names of a format
LINE_ENDS = "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029"  # where str.splitlines splits ("\r\n": one)


class _Renderer(Protocol):
    """What a parsed document offers :class:`Document`: itself, translated, as bytes."""

    def render(self, results: list[LineResult]) -> bytes: ...


@dataclass
class Document:
    """A document read for translation: the text ``segments`` in order, and what rebuilds it."""

    segments: list[str]  # the plain text to translate, one line each (no newlines inside)
    suffix: str  # ".txt", ".html", ... (what render writes)
    _state: _Renderer | None = field(default=None, repr=False)  # the parsed document

    def render(self, results: list[LineResult]) -> bytes:
        """The document with each segment replaced by its translation.

        ``results`` come in the order of ``segments``, each with ``attention`` where markup must be
        placed inside a segment."""
        if len(results) != len(self.segments):
            raise ValueError(f"{len(results)} results for {len(self.segments)} segments")
        assert self._state is not None
        return self._state.render(results)


class _Html:
    """An :class:`~transformer_mt.documents.html.HtmlPage` written back as UTF-8."""

    def __init__(self, page: HtmlPage) -> None:
        self.page = page

    def render(self, results: list[LineResult]) -> bytes:
        """The page with its segments translated, as UTF-8."""
        return self.page.render(results).encode("utf-8")


class _Text:
    """A text file: each line with text is a segment; line ends and other lines kept."""

    def __init__(self, text: str, budget: Budget) -> None:
        ends = sum(text.count(end) for end in LINE_ENDS) - text.count("\r\n")
        budget.add_elements(ends + 1, "lines")  # counted before a line is split off
        self.lines = text.splitlines(keepends=True)
        self.todo = [i for i, line in enumerate(self.lines) if has_text(line)]
        for _ in self.todo:
            budget.add_segment()

    def render(self, results: list[LineResult]) -> bytes:
        """The text with each line that had text translated (its indentation and end kept)."""
        lines = list(self.lines)
        for i, result in zip(self.todo, results, strict=True):
            body = lines[i].rstrip("\r\n")
            lead = body[: len(body) - len(body.lstrip())]
            lines[i] = lead + " ".join(result.text.split()) + lines[i][len(body) :]
        return "".join(lines).encode("utf-8")


def html_document(
    fragment: str, limits: DocumentLimits | None = None, name: str = "the HTML"
) -> Document:
    """An HTML fragment (LibreTranslate's ``format: "html"``) as a document to translate.

    Read within ``limits`` (by default those the environment sets); ``name`` appears in errors."""
    from transformer_mt.documents.html import HtmlPage

    page = HtmlPage(fragment, budget=Budget(limits or DocumentLimits.from_env(), name))
    return Document([s.line for s in page.segments], ".html", _Html(page))


def read_document(
    data: bytes, suffix: str, name: str = "", limits: DocumentLimits | None = None
) -> Document:
    """Read a file's bytes as a document of the format ``suffix`` names.

    A file's bytes as a document; ``suffix`` picks the format (one of FILE_FORMATS), ``name``
    appears in errors. An MTError for an unknown suffix, a missing optional extra (naming the pip
    extra to install) or a file the format's library cannot read; a
    :class:`~transformer_mt.documents.limits.DocumentTooLarge` past one of ``limits`` (by
    default those the environment sets)."""
    suffix = SUFFIXES.get(suffix.lower(), suffix.lower())
    name = name or f"the {suffix} file"
    if suffix not in FILE_FORMATS:
        raise MTError(
            f"{name}: {suffix or 'no suffix'} is not a document format; "
            f"translate one of: {', '.join(FILE_FORMATS)}"
        )
    budget = Budget(limits or DocumentLimits.from_env(), name)
    if suffix in (".txt", ".html"):
        budget.add_bytes(len(data))
        text = _utf8(data, name)
        if suffix == ".txt":
            state = _Text(text, budget)
            return Document([" ".join(state.lines[i].split()) for i in state.todo], suffix, state)
        from transformer_mt.documents.html import HtmlPage

        page = HtmlPage(text, budget=budget)
        return Document([s.line for s in page.segments], ".html", _Html(page))
    from transformer_mt.documents import office

    readers = {".docx": office.read_docx, ".pptx": office.read_pptx, ".odt": office.read_odt}
    if suffix == ".epub":
        book = office.Epub(data, name, budget)
        return Document(book.segments, suffix, book)
    try:
        paragraphs = readers[suffix](data, budget)
    except (MTError, MemoryError):
        raise
    except Exception as err:  # each library has its own errors for a damaged file
        first = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
        raise MTError(f"{name}: not a readable {suffix} file ({first})") from None
    return Document(paragraphs.segments, suffix, paragraphs)


def read_document_file(path: Path) -> Document:
    """:func:`read_document` of a file on disk (its suffix picks the format)."""
    path = Path(path)
    return read_document(path.read_bytes(), path.suffix, str(path))


def _utf8(data: bytes, name: str) -> str:
    """``data`` as UTF-8 text (a byte-order mark dropped), or an MTError naming the byte."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise MTError(
            f"{name}: byte {err.start} is not UTF-8; save the file as UTF-8 and try again"
        ) from None


# --- the two phases as functions of bytes: what a server's parsing process runs --------------


def document_segments(data: bytes, suffix: str, name: str, limits: DocumentLimits) -> list[str]:
    """The segments of the document ``data`` (:func:`read_document`)."""
    return read_document(data, suffix, name, limits).segments


def render_document(
    data: bytes, suffix: str, name: str, limits: DocumentLimits, results: list[LineResult]
) -> bytes:
    """The document ``data`` read again and rendered with ``results`` (one per segment)."""
    return read_document(data, suffix, name, limits).render(results)


def html_segments(fragments: list[str], limits: DocumentLimits, field: str) -> list[list[str]]:
    """Each HTML fragment's segments (:func:`html_document`; errors name ``field[i]``)."""
    return [
        html_document(text, limits, f"{field}[{i}]").segments for i, text in enumerate(fragments)
    ]


def render_html(
    fragments: list[str], limits: DocumentLimits, field: str, results: list[list[LineResult]]
) -> list[str]:
    """Each HTML fragment read again and rendered with its results."""
    return [
        html_document(text, limits, f"{field}[{i}]").render(found).decode("utf-8")
        for i, (text, found) in enumerate(zip(fragments, results, strict=True))
    ]
