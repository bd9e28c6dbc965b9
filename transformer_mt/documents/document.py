"""Documents in, documents out: HTML fragments and files (.txt, .html, .docx, .odt, .pptx, .epub).

A document is read into the segments to translate (plain text, one per block of text), those are
translated as lines (with their cross-attention, which places inline markup), and the document is
written back with the same structure. Two phases, so that the caller decides how lines are
translated (``mt translate`` in-process, ``mt serve`` through its decode worker):

    document = read_document_file(path)
    results = engine.translate(document.segments, decode, attention=True)
    data = document.render(results)

What each format keeps: :mod:`~transformer_mt.documents.html` (HTML, and epub chapters),
:mod:`~transformer_mt.documents.office` (.docx, .odt, .pptx, .epub). A .txt file is translated
line by line, its empty lines and line ends kept. Segments with nothing to translate
(:func:`has_text`: numbers, emoji, links alone) are not segments: they stay as they are.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from transformer_mt.engines.results import LineResult
from transformer_mt.errors import MTError
from transformer_mt.text.content import has_text

# File suffixes a document may have, in the order LibreTranslate lists them.
FILE_FORMATS: tuple[str, ...] = (".txt", ".html", ".docx", ".odt", ".pptx", ".epub")
SUFFIXES = {".htm": ".html", ".xhtml": ".html"}  # other names of a format


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

    def __init__(self, page) -> None:
        self.page = page

    def render(self, results: list[LineResult]) -> bytes:
        """The page with its segments translated, as UTF-8."""
        return self.page.render(results).encode("utf-8")


class _Text:
    """A text file: each line with text is a segment; line ends and other lines kept."""

    def __init__(self, text: str) -> None:
        self.lines = text.splitlines(keepends=True)
        self.todo = [i for i, line in enumerate(self.lines) if has_text(line)]

    def render(self, results: list[LineResult]) -> bytes:
        """The text with each line that had text translated (its indentation and end kept)."""
        lines = list(self.lines)
        for i, result in zip(self.todo, results, strict=True):
            body = lines[i].rstrip("\r\n")
            lead = body[: len(body) - len(body.lstrip())]
            lines[i] = lead + " ".join(result.text.split()) + lines[i][len(body) :]
        return "".join(lines).encode("utf-8")


def html_document(fragment: str) -> Document:
    """An HTML fragment (LibreTranslate's ``format: "html"``) as a document to translate."""
    from transformer_mt.documents.html import HtmlPage

    page = HtmlPage(fragment)
    return Document([s.line for s in page.segments], ".html", _Html(page))


def read_document(data: bytes, suffix: str, name: str = "") -> Document:
    """Read a file's bytes as a document of the format ``suffix`` names.

    A file's bytes as a document; ``suffix`` picks the format (one of FILE_FORMATS), ``name``
    appears in errors. An MTError for an unknown suffix, a missing optional extra (naming the pip
    extra to install) or a file the format's library cannot read."""
    suffix = SUFFIXES.get(suffix.lower(), suffix.lower())
    name = name or f"the {suffix} file"
    if suffix not in FILE_FORMATS:
        raise MTError(
            f"{name}: {suffix or 'no suffix'} is not a document format; "
            f"translate one of: {', '.join(FILE_FORMATS)}"
        )
    if suffix in (".txt", ".html"):
        text = _utf8(data, name)
        if suffix == ".txt":
            state = _Text(text)
            return Document([" ".join(state.lines[i].split()) for i in state.todo], suffix, state)
        document = html_document(text)
        return document
    from transformer_mt.documents import office

    readers = {".docx": office.read_docx, ".pptx": office.read_pptx, ".odt": office.read_odt}
    if suffix == ".epub":
        book = office.Epub(data, name)
        return Document(book.segments, suffix, book)
    try:
        paragraphs = readers[suffix](data)
    except MTError:
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
