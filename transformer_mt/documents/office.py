"""Office files for translation: .docx, .odt, .pptx and .epub.

Office files for translation: .docx (python-docx), .odt (odfpy), .pptx (python-pptx) and
.epub (its XHTML chapters through :mod:`~transformer_mt.documents.html`).

Each paragraph is one segment (a table cell's, a header's, a footnote's, a slide's text box's, a
speaker note's: every paragraph of the file's text parts). Inside a paragraph, the text sits in runs (a
word processor's stretches of one formatting: w:t, text spans, a:t); the translation is cut into
the same runs by the words the model aligned to each run's words
(:func:`~transformer_mt.documents.placement.distribute`): formatting follows the words as far
as the alignment allows, and runs keep their order. Everything else -- styles, tables, images,
fields, tabs and line breaks, slide layouts, the epub's other files -- is written back as read.
A .docx's text parts are its body, headers, footers, footnotes and endnotes (their separator
notes, which hold a rule and no text, are left alone). What is left as it was: text outside
paragraphs' runs (a chart's labels, comments), attribute text (alt texts), and paragraphs with
nothing to translate.

The libraries are imported when a file of their format is read: a missing one is an MTError
naming ``pip install 'transformer-mt[documents]'``. Before a library sees a file, the zip and its
XML are checked against the document's bounds (:func:`check_zip`,
:mod:`~transformer_mt.documents.limits`): a library builds a tree of whatever it is given.
"""

from __future__ import annotations

import io
import itertools
import posixpath
import zipfile
import zlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any
from urllib.parse import unquote
from xml.etree import ElementTree

from transformer_mt.documents.html import HtmlPage
from transformer_mt.documents.limits import (
    Budget,
    DocumentLimits,
    check_xml_bytes,
    open_zip,
    scan_zip_xml,
)
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

    def __init__(
        self, paragraphs: Iterable[Paragraph], save: Callable[[], bytes], budget: Budget
    ) -> None:
        self.paragraphs = []
        for paragraph in paragraphs:  # each counted as it is read
            if has_text(paragraph.line):
                budget.add_segment()
                self.paragraphs.append(paragraph)
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
DOCX_NOTES = ("/word/footnotes.xml", "/word/endnotes.xml")  # python-docx reads them as bytes
NOTES = {W + "footnote", W + "endnote"}
SEPARATOR_NOTES = {"separator", "continuationSeparator", "continuationNotice"}  # no text


OLE_MAGIC = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"  # a compound file: encrypted OOXML, .doc, .ppt


def check_zip(data: bytes, suffix: str, budget: Budget) -> None:
    """Check a zip-based document against ``budget`` before its library reads it.

    Its members (count, encryption, declared sizes: :func:`open_zip`) and the elements and
    depth of every XML member in it (:func:`scan_zip_xml`). A password-protected .docx, .pptx
    (or an old .doc, .ppt) is a compound file, not a zip: an MTError that says so."""
    if data[:8] == OLE_MAGIC:
        raise MTError(
            f"{budget.name}: not a zip-based {suffix} file but a compound file: a "
            f"password-protected (encrypted) document or an old binary format; remove the "
            f"password or save it as {suffix}, then translate that"
        )
    with open_zip(data, budget) as archive:
        scan_zip_xml(archive, budget)


def read_docx(data: bytes, budget: Budget) -> Paragraphs:
    """A .docx: the paragraphs of its body, headers, footers, footnotes and endnotes.

    The body's tables and text boxes included; the separator notes left alone."""
    docx = need("docx", ".docx")
    check_zip(data, ".docx", budget)  # every XML member, the notes' too, before lxml reads it
    document = docx.Document(io.BytesIO(data))
    breaks = {W + "tab", W + "br", W + "cr"}
    roots, notes = [], []
    for part in document.part.package.iter_parts():
        name = str(part.partname)
        if name.startswith(DOCX_PARTS) and hasattr(part, "element"):
            roots.append(part.element)
        elif name in DOCX_NOTES:
            note = _NotesPart(part)
            notes.append(note)
            roots += note.notes()
    paragraphs = itertools.chain.from_iterable(
        _xml_paragraphs(root, W + "p", W + "t", breaks) for root in roots
    )

    def save() -> bytes:
        for note in notes:
            note.write()
        out = io.BytesIO()
        document.save(out)
        return out.getvalue()

    return Paragraphs(paragraphs, save, budget)


class _NotesPart:
    """A .docx's footnotes or endnotes part: its XML, read and written back by lxml.

    python-docx keeps such a part as bytes (a newer one may give its XML element: then that)."""

    def __init__(self, part: Any) -> None:
        self.part = part
        self.parsed = not hasattr(part, "element")
        self.element: Any = part.element if not self.parsed else None
        if self.parsed:
            etree = need("lxml.etree", ".docx")  # python-docx's own dependency
            parser = etree.XMLParser(resolve_entities=False, no_network=True, load_dtd=False)
            self.element = etree.fromstring(part.blob, parser)

    def notes(self) -> list[Any]:
        """Its footnotes (or endnotes) that hold text: every one but the separators."""
        return [
            note
            for note in self.element
            if note.tag in NOTES and note.get(W + "type") not in SEPARATOR_NOTES
        ]

    def write(self) -> None:
        """Put the XML, translated, back in the part (where python-docx keeps it as bytes)."""
        if self.parsed:
            etree = need("lxml.etree", ".docx")
            tree = self.element.getroottree()
            self.part._blob = etree.tostring(
                tree, xml_declaration=True, encoding="UTF-8", standalone=True
            )


def read_pptx(data: bytes, budget: Budget) -> Paragraphs:
    """A .pptx: the paragraphs of every slide's shapes (tables and groups included) and notes."""
    pptx = need("pptx", ".pptx")
    check_zip(data, ".pptx", budget)
    presentation = pptx.Presentation(io.BytesIO(data))
    paragraphs = itertools.chain.from_iterable(
        _xml_paragraphs(root, A + "p", A + "t", {A + "br"})
        for slide in presentation.slides
        for root in _slide_roots(slide)
    )

    def save() -> bytes:
        out = io.BytesIO()
        presentation.save(out)
        return out.getvalue()

    return Paragraphs(paragraphs, save, budget)


def _slide_roots(slide: Any) -> list[Any]:
    """A slide's XML, and its notes' where it has notes."""
    return [slide.element, slide.notes_slide.element] if slide.has_notes_slide else [slide.element]


# --- OpenDocument text (.odt), through odfpy ------------------------------------------------

ODF_TEXT = "urn:oasis:names:tc:opendocument:xmlns:text:1.0"
ODF_BREAKS = {"s", "tab", "line-break"}  # text:s (spaces), text:tab, text:line-break
ODF_SKIP = {"note", "annotation", "p", "h", "frame"}  # read on their own, or not text


def read_odt(data: bytes, budget: Budget) -> Paragraphs:
    """Read an .odt: its paragraphs and headings in document order.

    An .odt: its paragraphs and headings in document order (tables, lists, frames and notes
    included), and those of its page headers and footers."""
    opendocument = need("odf.opendocument", ".odt")
    check_zip(data, ".odt", budget)
    document = opendocument.load(io.BytesIO(data))
    paragraphs = (
        _odf_paragraph(element)
        for root in (document.text, document.masterstyles)
        for element in _odf_paragraphs(root)
    )

    def save() -> bytes:
        out = io.BytesIO()
        document.save(out)
        return out.getvalue()

    return Paragraphs(paragraphs, save, budget)


def _odf_paragraph(element: Any) -> Paragraph:
    """The runs of a text:p or text:h element."""
    paragraph = Paragraph()
    _collect_odf(element, paragraph)
    return paragraph


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


EPUB_ERRORS = (
    zipfile.BadZipFile,
    KeyError,
    ElementTree.ParseError,
    UnicodeDecodeError,
    zlib.error,
    EOFError,
)  # what a damaged epub raises while it is read


class Epub:
    """An epub: its chapters as :class:`HtmlPage` (XHTML), every other member kept as read."""

    def __init__(self, data: bytes, name: str, budget: Budget | None = None) -> None:
        budget = budget or Budget(DocumentLimits.from_env(), name)
        self.data = data
        try:
            with open_zip(data, budget) as archive:
                members = _chapters(archive, name, budget)
                _refuse_drm(archive, members, name, budget)
                self.chapters = {
                    member: HtmlPage(archive.read(member).decode("utf-8"), True, budget)
                    for member in members
                }
        except EPUB_ERRORS as err:
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


def _xml_member(archive: zipfile.ZipFile, member: str, budget: Budget) -> ElementTree.Element:
    """The XML member ``member``, parsed once :func:`check_xml_bytes` has counted it."""
    return ElementTree.fromstring(check_xml_bytes(archive.read(member), budget, member))


def _chapters(archive: zipfile.ZipFile, name: str, budget: Budget) -> list[str]:
    """The members holding the book's XHTML documents, in the package's manifest order."""
    container = _xml_member(archive, CONTAINER, budget)
    rootfile = next((e for e in container.iter() if e.tag.endswith("rootfile")), None)
    package_path = rootfile.get("full-path") if rootfile is not None else None
    if not package_path:
        raise MTError(f"{name}: its {CONTAINER} names no package document (a rootfile)")
    package = _xml_member(archive, package_path, budget)
    base = posixpath.dirname(package_path)
    members = set(archive.namelist())
    chapters = []
    for item in package.iter():
        if item.tag.endswith("}item") and item.get("media-type") in XHTML_TYPES:
            member = posixpath.normpath(posixpath.join(base, unquote(item.get("href", ""))))
            if member in members:
                chapters.append(member)
    return chapters


ENCRYPTION = "META-INF/encryption.xml"


def _refuse_drm(archive: zipfile.ZipFile, chapters: list[str], name: str, budget: Budget) -> None:
    """An MTError when ``META-INF/encryption.xml`` lists a chapter: the book has DRM.

    (Fonts listed there, obfuscated as the standard allows, are copied as they are.)"""
    if ENCRYPTION not in archive.namelist():
        return
    encrypted = {
        posixpath.normpath(unquote(item.get("URI", "")))
        for item in _xml_member(archive, ENCRYPTION, budget).iter()
        if item.tag.endswith("}CipherReference")
    }
    locked = [member for member in chapters if member in encrypted]
    if locked:
        raise MTError(
            f"{name}: {len(locked)} of its chapters are encrypted ({locked[0]}, listed in "
            f"{ENCRYPTION}: DRM); only a book without DRM can be translated"
        )
