"""Office files for translation: .docx, .odt, .pptx and .epub.

Office files for translation: .docx (python-docx), .odt (odfpy), .pptx (python-pptx) and
.epub (its XHTML chapters through :mod:`~transformer_mt.documents.html`).

Each paragraph is one segment (a table cell's, a header's, a slide's text box's, a speaker
note's: every paragraph of the file's text parts). Inside a paragraph, the text sits in runs (a
word processor's stretches of one formatting: w:t, text spans, a:t); the translation is cut into
the same runs by the words the model aligned to each run's words
(:func:`~transformer_mt.documents.placement.distribute`): formatting follows the words as far
as the alignment allows, and runs keep their order. Everything else -- styles, tables, images,
fields, tabs and line breaks, slide layouts, the epub's other files -- is written back as read.
What is left as it was: text outside paragraphs' runs (a docx's footnotes, a chart's labels),
attribute text (alt texts), and paragraphs with nothing to translate.

The libraries are imported when a file of their format is read: a missing one is an MTError
naming ``pip install 'transformer-mt[documents]'``.
"""

from __future__ import annotations

import io
import posixpath
import zipfile
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import unquote
from xml.etree import ElementTree

from transformer_mt.documents.html import HtmlPage
from transformer_mt.documents.placement import distribute, words_of
from transformer_mt.engines.results import LineResult
from transformer_mt.errors import MTError
from transformer_mt.text.content import has_text

EXTRA = "pip install 'transformer-mt[documents]'"


def need(module: str, suffix: str) -> Any:
    """Import ``module`` (a library of the ``documents`` extra).

    Or an MTError saying how to
    install it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise MTError(f"{suffix} files need the {module.split('.')[0]} library: {EXTRA}") from None


class Paragraph:
    """A paragraph's runs.

    The texts of its text nodes in order, each with how to write it back
    (None: a tab or a line break, kept)."""

    def __init__(self) -> None:
        self.texts: list[str] = []
        self.writers: list[Callable[[str], None] | None] = []

    def add(self, text: str, writer: Callable[[str], None] | None) -> None:
        """Append a run (``writer`` None: a separator, kept as it is)."""
        self.texts.append(text)
        self.writers.append(writer)

    @property
    def line(self) -> str:
        """What the model translates: the paragraph's words, one space between them."""
        return " ".join(words_of(self.texts)[0])

    def write(self, result: LineResult) -> None:
        """Put the translation in the runs (see the module's docstring)."""
        fixed = [writer is None for writer in self.writers]
        for text, writer in zip(distribute(self.texts, fixed, result), self.writers, strict=True):
            if writer is not None:
                writer(text)


class Paragraphs:
    """A document's paragraphs with text to translate, and how to save the document."""

    def __init__(self, paragraphs: list[Paragraph], save: Callable[[], bytes]) -> None:
        self.paragraphs = [p for p in paragraphs if has_text(p.line)]
        self.save = save

    @property
    def segments(self) -> list[str]:
        """The paragraphs' lines, in document order."""
        return [p.line for p in self.paragraphs]

    def render(self, results: list[LineResult]) -> bytes:
        """The document with each paragraph translated (``results`` in segment order)."""
        for paragraph, result in zip(self.paragraphs, results, strict=True):
            paragraph.write(result)
        return self.save()


# --- OOXML (.docx, .pptx): paragraphs of runs of text elements, through lxml ---------------


def _xml_paragraphs(root: Any, para: str, text: str, breaks: set[str]) -> Iterator[Paragraph]:
    """Every ``para`` element under ``root``, its ``text`` elements as runs.

    Nested ``para`` elements come on their own; ``breaks`` elements are kept as separators."""
    for p in root.iter(para):
        paragraph = Paragraph()
        _collect(p, para, text, breaks, paragraph)
        yield paragraph


def _collect(node: Any, para: str, text: str, breaks: set[str], into: Paragraph) -> None:
    """Add the runs under ``node`` to ``into``, in document order."""
    for child in node:
        if child.tag == para:
            continue  # a paragraph inside (a text box): read on its own
        if child.tag == text:
            into.add(child.text or "", _xml_writer(child))
        elif child.tag in breaks:
            into.add(" ", None)
        else:
            _collect(child, para, text, breaks, into)


def _xml_writer(element: Any) -> Callable[[str], None]:
    """What writes a new text into the text element ``element``."""

    def write(value: str) -> None:
        element.text = value
        if value != value.strip():  # OOXML drops a w:t's edge spaces unless told to keep them
            element.set("{http://www.w3.org/XML/1998/namespace}space", "preserve")

    return write


W = "{http://schemas.openxmlformats.org/wordprocessingml/2006/main}"
A = "{http://schemas.openxmlformats.org/drawingml/2006/main}"
DOCX_PARTS = ("/word/document.xml", "/word/header", "/word/footer")


def read_docx(data: bytes) -> Paragraphs:
    """A .docx: the paragraphs of its body (tables and text boxes included), headers, footers."""
    docx = need("docx", ".docx")
    document = docx.Document(io.BytesIO(data))
    paragraphs: list[Paragraph] = []
    for part in document.part.package.iter_parts():
        if str(part.partname).startswith(DOCX_PARTS) and hasattr(part, "element"):
            breaks = {W + "tab", W + "br", W + "cr"}
            paragraphs += _xml_paragraphs(part.element, W + "p", W + "t", breaks)

    def save() -> bytes:
        out = io.BytesIO()
        document.save(out)
        return out.getvalue()

    return Paragraphs(paragraphs, save)


def read_pptx(data: bytes) -> Paragraphs:
    """A .pptx: the paragraphs of every slide's shapes (tables and groups included) and notes."""
    pptx = need("pptx", ".pptx")
    presentation = pptx.Presentation(io.BytesIO(data))
    paragraphs: list[Paragraph] = []
    for slide in presentation.slides:
        roots = [slide.element]
        if slide.has_notes_slide:
            roots.append(slide.notes_slide.element)
        for root in roots:
            paragraphs += _xml_paragraphs(root, A + "p", A + "t", {A + "br"})

    def save() -> bytes:
        out = io.BytesIO()
        presentation.save(out)
        return out.getvalue()

    return Paragraphs(paragraphs, save)


# --- OpenDocument text (.odt), through odfpy ------------------------------------------------

ODF_TEXT = "urn:oasis:names:tc:opendocument:xmlns:text:1.0"
ODF_BREAKS = {"s", "tab", "line-break"}  # text:s (spaces), text:tab, text:line-break
ODF_SKIP = {"note", "annotation", "p", "h", "frame"}  # read on their own, or not text


def read_odt(data: bytes) -> Paragraphs:
    """Read an .odt: its paragraphs and headings in document order.

    An .odt: its paragraphs and headings in document order (tables, lists, frames and notes
    included), and those of its page headers and footers."""
    opendocument = need("odf.opendocument", ".odt")
    document = opendocument.load(io.BytesIO(data))
    paragraphs: list[Paragraph] = []
    for root in (document.text, document.masterstyles):
        for element in _odf_paragraphs(root):
            paragraph = Paragraph()
            _collect_odf(element, paragraph)
            paragraphs.append(paragraph)

    def save() -> bytes:
        out = io.BytesIO()
        document.save(out)
        return out.getvalue()

    return Paragraphs(paragraphs, save)


def _odf_paragraphs(node: Any) -> Iterator[Any]:
    """The text:p and text:h elements under ``node``, in document order.

    Nested ones come after the paragraph that holds them."""
    for child in node.childNodes:
        if child.nodeType == child.ELEMENT_NODE:
            if child.qname == (ODF_TEXT, "p") or child.qname == (ODF_TEXT, "h"):
                yield child
            yield from _odf_paragraphs(child)


def _collect_odf(node: Any, into: Paragraph) -> None:
    """Add the text nodes under ``node`` to ``into``.

    Spans and links are entered; notes, frames and comments are left to be read on their own."""
    for child in node.childNodes:
        if child.nodeType == child.TEXT_NODE:
            into.add(child.data, _odf_writer(child))
        elif child.nodeType == child.ELEMENT_NODE:
            name = child.qname[1]
            if name in ODF_BREAKS:
                into.add(" ", None)
            elif name not in ODF_SKIP:
                _collect_odf(child, into)


def _odf_writer(node: Any) -> Callable[[str], None]:
    """What writes a new text into the text node ``node``."""

    def write(value: str) -> None:
        node.data = value

    return write


# --- EPUB: a zip of XHTML chapters, listed in its package document --------------------------

CONTAINER = "META-INF/container.xml"
XHTML_TYPES = {"application/xhtml+xml", "text/html"}


class Epub:
    """An epub: its chapters as :class:`HtmlPage` (XHTML), every other member kept as read."""

    def __init__(self, data: bytes, name: str) -> None:
        self.data = data
        try:
            with zipfile.ZipFile(io.BytesIO(data)) as archive:
                self.chapters = {
                    member: HtmlPage(archive.read(member).decode("utf-8"), xml=True)
                    for member in _chapters(archive, name)
                }
        except (zipfile.BadZipFile, KeyError, ElementTree.ParseError, UnicodeDecodeError) as err:
            raise MTError(f"{name}: not a readable epub ({err}); is it an .epub file?") from None

    @property
    def segments(self) -> list[str]:
        """The chapters' segments, chapter after chapter."""
        return [s.line for page in self.chapters.values() for s in page.segments]

    def render(self, results: list[LineResult]) -> bytes:
        """The epub with its chapters translated; its other members as they were, in order."""
        rendered: dict[str, bytes] = {}
        at = 0
        for member, page in self.chapters.items():
            count = len(page.segments)
            rendered[member] = page.render(results[at : at + count]).encode("utf-8")
            at += count
        out = io.BytesIO()
        with zipfile.ZipFile(io.BytesIO(self.data)) as source, zipfile.ZipFile(out, "w") as target:
            for info in source.infolist():  # "mimetype" first and stored, as it was
                target.writestr(info, rendered.get(info.filename) or source.read(info))
        return out.getvalue()


def _chapters(archive: zipfile.ZipFile, name: str) -> list[str]:
    """The members holding the book's XHTML documents, in the package's manifest order."""
    container = ElementTree.fromstring(archive.read(CONTAINER))
    rootfile = next((e for e in container.iter() if e.tag.endswith("rootfile")), None)
    package_path = rootfile.get("full-path") if rootfile is not None else None
    if not package_path:
        raise MTError(f"{name}: its {CONTAINER} names no package document (a rootfile)")
    package = ElementTree.fromstring(archive.read(package_path))
    base = posixpath.dirname(package_path)
    members = set(archive.namelist())
    chapters = []
    for item in package.iter():
        if item.tag.endswith("}item") and item.get("media-type") in XHTML_TYPES:
            member = posixpath.normpath(posixpath.join(base, unquote(item.get("href", ""))))
            if member in members:
                chapters.append(member)
    return chapters
