"""Documents: HTML fragments and files (.txt, .html, .docx, .odt, .pptx, .epub) translated with
their structure kept, and `mt translate -i x.docx -o y.docx`.

Most cases translate with a stand-in for the model that is exact and easy to check: it writes
each word in capitals (or in reverse order) with an attention matrix that links each target
word to its source word, so where markup must land is known. The fixture checkpoint then
translates real files through the engine and the CLI. Every office file is written by the
format's own library (skipped where the `documents` extra is missing).
"""

from __future__ import annotations

import io
import random
import sys
import zipfile
from html.parser import HTMLParser
from pathlib import Path

import pytest
from typer.testing import CliRunner

from transformer_mt.cli import app
from transformer_mt.documents.document import html_document, read_document, read_document_file
from transformer_mt.documents.translate import translate_document
from transformer_mt.engines.results import Attention, LineResult
from transformer_mt.engines.torch_engine import TorchEngine
from transformer_mt.errors import MTError

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "old_checkpoint"
CKPT = FIXTURE / "old_last.pt"
WORD = "\u2581"


def capitals(line: str, reverse: bool = False) -> LineResult:
    """``line``'s words in capitals (in reverse order with ``reverse``), each target word
    attending to its own source word only."""
    words = line.split()
    order = list(range(len(words)))[:: -1 if reverse else 1]
    target = [words[i].upper() for i in order]
    n = len(words)
    weights = [[0.0] * (n + 1) for _ in range(n + 1)]
    for t, s in enumerate(order):
        weights[t][s] = 1.0
    weights[n][n] = 1.0  # EOS looks at EOS
    attention = Attention(
        [WORD + w for w in words] + ["</s>"], [WORD + w for w in target] + ["</s>"], weights
    )
    return LineResult(" ".join(target), 0.0, [(" ".join(target), 0.0)], attention)


def translated(fragment: str, reverse: bool = False) -> str:
    document = html_document(fragment)
    return document.render([capitals(s, reverse) for s in document.segments]).decode("utf-8")


class _Tags(HTMLParser):
    """The tags of an HTML text in order, as (kind, tag, attributes)."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, str, tuple]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(("start", tag, tuple(attrs)))

    def handle_endtag(self, tag):
        self.tags.append(("end", tag, ()))


def tags(text: str) -> list[tuple[str, str, tuple]]:
    parser = _Tags()
    parser.feed(text)
    parser.close()
    return parser.tags


def well_nested(found: list[tuple[str, str, tuple]]) -> bool:
    stack = []
    for kind, tag, _ in found:
        if tag in ("img", "br"):
            continue
        if kind == "start":
            stack.append(tag)
        elif not stack or stack.pop() != tag:
            return False
    return not stack


# --- HTML ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ('<p><img src="a.png"> Ein Mann.</p>', '<p><img src="a.png"> EIN MANN.</p>'),
        ('<p>Ein Mann. <img src="a.png"></p>', '<p>EIN MANN. <img src="a.png"></p>'),
        ('<p> <img src="a.png">  Ein Mann. <!-- c --> </p>', '<p> <img src="a.png">  EIN MANN. <!-- c --> </p>'),
        ('<p><img src="a.png">Ein Mann.</p>', '<p><img src="a.png">EIN MANN.</p>'),
        ('<p>Ein <img src="a.png"> Mann.</p>', '<p>EIN <img src="a.png"> MANN.</p>'),
    ],
)  # fmt: skip
def test_markup_in_the_whitespace_around_a_segments_words_stays_where_it_was(source, expected):
    assert translated(source) == expected


def test_html_keeps_tags_attributes_and_entities_around_the_words_they_held():
    source = (
        '<p class="intro">Hello <b>big</b> world &amp; <a href="/x?a=1&amp;b=2" title="T &lt;">'
        "you <i>all</i></a> now</p>\n<ul>\n  <li>one &lt; two</li>\n  <li>caf&eacute; "
        '<img src="a.png" alt="A"> au lait</li>\n</ul>'
    )
    assert html_document(source).segments == [
        "T <",  # the title of <a>: attribute text, a segment of its own
        "Hello big world & you all now",
        "one < two",
        "A",  # the alt of <img>
        "café au lait",
    ]
    assert translated(source) == (
        '<p class="intro">HELLO <b>BIG</b> WORLD &amp; <a href="/x?a=1&amp;b=2" title="T &lt;">'
        "YOU <i>ALL</i></a> NOW</p>\n<ul>\n  <li>ONE &lt; TWO</li>\n  <li>CAFÉ "
        '<img src="a.png" alt="A"> AU LAIT</li>\n</ul>'
    )


def test_html_inline_elements_follow_their_words_when_the_translation_reorders_them():
    source = '<p>one <b>two <i>three</i></b> four <a href="#">five six</a> seven</p>'
    assert translated(source, reverse=True) == (
        '<p>SEVEN <a href="#">SIX FIVE</a> FOUR <b><i>THREE</i> TWO</b> ONE</p>'
    )


def test_html_untranslated_parts_stay_as_written():
    source = (
        "<div>Run <code>mt train --steps 5</code> now<script>if (a < b && c) go();</script>"
        "<style>p > b { color: red }</style><br>2024 🙂<br/>https://example.com</div>"
        '<p translate="no">keep this</p><pre>  keep\n  this</pre><!-- a note -->'
    )
    out = translated(source)
    assert html_document(source).segments == ["Run now"]
    assert out == (
        "<div>RUN <code>mt train --steps 5</code> NOW<script>if (a < b && c) go();</script>"
        "<style>p > b { color: red }</style><br>2024 🙂<br/>https://example.com</div>"
        '<p translate="no">keep this</p><pre>  keep\n  this</pre><!-- a note -->'
    )


def test_html_without_attention_keeps_every_tag_well_nested():
    source = '<p>a <b>b <i>c d</i> e</b> <span class="x">f</span> g <em></em>h</p>'
    document = html_document(source)
    result = LineResult("W X Y Z", 0.0, [("W X Y Z", 0.0)], None)
    out = document.render([result]).decode()
    assert sorted(tags(out)) == sorted(tags(source))
    assert well_nested(tags(out))
    assert HTMLParserText.text_of(out).split() == ["W", "X", "Y", "Z"]


@pytest.mark.parametrize("seed", range(30))
def test_random_nested_markup_comes_back_whole_and_well_nested(seed):
    gen = random.Random(seed)

    def fragment(depth: int) -> str:
        parts = []
        for _ in range(gen.randint(1, 4)):
            roll = gen.random()
            if depth < 3 and roll < 0.35:
                tag = gen.choice(["b", "i", "a", "span", "em"])
                attrs = f' href="/{gen.randint(0, 9)}"' if tag == "a" else ""
                parts.append(f"<{tag}{attrs}>{fragment(depth + 1)}</{tag}>")
            elif roll < 0.42:
                parts.append('<img src="p.png">')
            else:
                parts.append(
                    " ".join(
                        gen.choice(["alpha", "beta", "gamma", "x"])
                        for _ in range(gen.randint(1, 3))
                    )
                )
        return gen.choice([" ", ""]).join(parts)

    source = f"<p>{fragment(0)} end</p>"
    document = html_document(source)
    results = [capitals(s, reverse=gen.random() < 0.5) for s in document.segments]
    out = document.render(results).decode()
    assert sorted(tags(out)) == sorted(tags(source))
    assert well_nested(tags(out))
    words = HTMLParserText.text_of(out).split()
    assert words == " ".join(r.text for r in results).split()


class HTMLParserText(HTMLParser):
    """The text of an HTML text."""

    def __init__(self) -> None:
        super().__init__()
        self.parts: list[str] = []

    def handle_data(self, data):
        self.parts.append(data)

    @classmethod
    def text_of(cls, text: str) -> str:
        parser = cls()
        parser.feed(text)
        parser.close()
        return " ".join(parser.parts)


def test_text_file_keeps_its_empty_lines_line_ends_and_untranslatable_lines():
    data = "first line\r\n\r\n  42\nsecond  one\n🙂".encode()
    document = read_document(data, ".txt", "x.txt")
    assert document.segments == ["first line", "second one"]
    out = document.render([capitals(s) for s in document.segments])
    assert out == "FIRST LINE\r\n\r\n  42\nSECOND ONE\n🙂".encode()


def test_unknown_formats_and_bad_bytes_are_one_line_errors(tmp_path):
    with pytest.raises(
        MTError, match=r"notes\.rtf: \.rtf is not a document format; translate one of"
    ):
        read_document(b"{\\rtf1}", ".rtf", "notes.rtf")
    with pytest.raises(MTError, match=r"page\.html: byte 3 is not UTF-8"):
        read_document(b"<p>\xff</p>", ".html", "page.html")
    for suffix in (".docx", ".pptx", ".odt", ".epub"):
        pytest.importorskip("docx")
        with pytest.raises(MTError, match=rf"x{suffix}: not a readable"):
            read_document(b"PK not a zip", suffix, f"x{suffix}")


def test_a_missing_library_names_the_extra_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "docx", None)  # as if python-docx were not installed
    with pytest.raises(MTError) as err:
        read_document(b"", ".docx", "x.docx")
    assert str(err.value) == (
        ".docx files need the docx library: pip install 'transformer-mt[documents]'"
    )


# --- office files ------------------------------------------------------------------------------


def test_docx_round_trip_keeps_headings_runs_tables_and_headers():
    docx = pytest.importorskip("docx")
    document = docx.Document()
    document.add_heading("The title", level=1)
    paragraph = document.add_paragraph("plain start ")
    paragraph.add_run("bold words").bold = True
    paragraph.add_run(" and\tthe end.")
    table = document.add_table(rows=2, cols=2)
    table.cell(0, 0).text = "cell one"
    table.cell(1, 1).text = "2024"
    document.sections[0].header.paragraphs[0].text = "page header"
    data = io.BytesIO()
    document.save(data)

    read = read_document(data.getvalue(), ".docx", "x.docx")
    assert read.segments == [
        "The title",
        "plain start bold words and the end.",
        "cell one",
        "page header",
    ]
    out = docx.Document(io.BytesIO(read.render([capitals(s) for s in read.segments])))
    heading, body = out.paragraphs
    assert heading.style.name == "Heading 1" and heading.text == "THE TITLE"
    assert [(r.text, r.bold) for r in body.runs] == [
        ("PLAIN START ", None),
        ("BOLD WORDS ", True),
        ("AND\tTHE END.", None),
    ]
    assert [c.text for row in out.tables[0].rows for c in row.cells] == ["CELL ONE", "", "", "2024"]
    assert out.sections[0].header.paragraphs[0].text == "PAGE HEADER"


def test_pptx_round_trip_keeps_slides_runs_tables_and_notes():
    pptx = pytest.importorskip("pptx")
    from pptx.util import Inches

    presentation = pptx.Presentation()
    slide = presentation.slides.add_slide(presentation.slide_layouts[1])
    slide.shapes.title.text = "slide title"
    frame = slide.placeholders[1].text_frame
    frame.text = "first point"
    paragraph = frame.add_paragraph()
    paragraph.add_run().text = "second "
    italic = paragraph.add_run()
    italic.text, italic.font.italic = "point here", True
    shape = slide.shapes.add_table(1, 2, Inches(1), Inches(5), Inches(4), Inches(1))
    shape.table.cell(0, 0).text = "table cell"
    slide.notes_slide.notes_text_frame.text = "speaker notes"
    data = io.BytesIO()
    presentation.save(data)

    read = read_document(data.getvalue(), ".pptx")
    assert read.segments == [
        "slide title",
        "first point",
        "second point here",
        "table cell",
        "speaker notes",
    ]
    out = pptx.Presentation(io.BytesIO(read.render([capitals(s) for s in read.segments])))
    shapes = out.slides[0].shapes
    assert shapes.title.text_frame.text == "SLIDE TITLE"
    body = shapes[1].text_frame.paragraphs
    assert body[0].text == "FIRST POINT"
    assert [(r.text, r.font.italic) for r in body[1].runs] == [
        ("SECOND ", None),
        ("POINT HERE", True),
    ]
    assert shapes[2].table.cell(0, 0).text == "TABLE CELL" and shapes[2].table.cell(0, 1).text == ""
    assert out.slides[0].notes_slide.notes_text_frame.text == "SPEAKER NOTES"


def test_odt_round_trip_keeps_headings_spans_and_tables():
    pytest.importorskip("odf")
    from odf import teletype
    from odf.opendocument import OpenDocumentText, load
    from odf.style import Style, TextProperties
    from odf.table import Table, TableCell, TableColumn, TableRow
    from odf.text import H, P, Span

    document = OpenDocumentText()
    bold = Style(name="Bold", family="text")
    bold.addElement(TextProperties(fontweight="bold"))
    document.automaticstyles.addElement(bold)
    document.text.addElement(H(outlinelevel=1, text="odt heading"))
    paragraph = P(text="some ")
    paragraph.addElement(Span(stylename=bold, text="bold text"))
    paragraph.addText(" after")
    document.text.addElement(paragraph)
    table = Table(name="T")
    table.addElement(TableColumn())
    row = TableRow()
    cell = TableCell()
    cell.addElement(P(text="in a cell"))
    row.addElement(cell)
    table.addElement(row)
    document.text.addElement(table)
    data = io.BytesIO()
    document.save(data)

    read = read_document(data.getvalue(), ".odt")
    assert read.segments == ["odt heading", "some bold text after", "in a cell"]
    out = load(io.BytesIO(read.render([capitals(s) for s in read.segments])))
    heading = out.getElementsByType(H)[0]
    assert teletype.extractText(heading) == "ODT HEADING"
    body, in_cell = out.getElementsByType(P)
    assert teletype.extractText(body) == "SOME BOLD TEXT AFTER"
    span = body.getElementsByType(Span)[0]
    assert str(span) == "BOLD TEXT " and span.getAttribute("stylename") == "Bold"
    assert teletype.extractText(in_cell) == "IN A CELL"
    assert len(out.getElementsByType(TableCell)) == 1


def _epub(chapter: str) -> bytes:
    data = io.BytesIO()
    with zipfile.ZipFile(data, "w") as book:
        book.writestr(zipfile.ZipInfo("mimetype"), "application/epub+zip")  # stored, first
        book.writestr(
            "META-INF/container.xml",
            '<?xml version="1.0"?><container version="1.0" xmlns="urn:oasis:names:tc:'
            'opendocument:xmlns:container"><rootfiles><rootfile full-path="OEBPS/content.opf" '
            'media-type="application/oebps-package+xml"/></rootfiles></container>',
        )
        book.writestr(
            "OEBPS/content.opf",
            '<?xml version="1.0"?><package xmlns="http://www.idpf.org/2007/opf" version="3.0">'
            '<manifest><item id="c1" href="text/ch%201.xhtml" media-type="application/xhtml+xml"/>'
            '<item id="css" href="style.css" media-type="text/css"/></manifest>'
            '<spine><itemref idref="c1"/></spine></package>',
            compress_type=zipfile.ZIP_DEFLATED,
        )
        book.writestr("OEBPS/text/ch 1.xhtml", chapter, compress_type=zipfile.ZIP_DEFLATED)
        book.writestr("OEBPS/style.css", "p { color: red }")
    return data.getvalue()


def test_epub_chapters_go_through_html_and_every_other_member_is_kept():
    from xml.etree import ElementTree

    chapter = (
        '<?xml version="1.0" encoding="utf-8"?>\n<html xmlns="http://www.w3.org/1999/xhtml">'
        "<head><title>Chapter one</title></head><body><p>It was <em>a dark</em>&#160;night."
        '</p><svg xmlns="http://www.w3.org/2000/svg"><linearGradient id="g"/><text>'
        "a label</text></svg></body></html>"
    )
    source = _epub(chapter)
    read = read_document(source, ".epub", "book.epub")
    assert read.segments == ["Chapter one", "It was a dark night.", "a label"]
    out = zipfile.ZipFile(io.BytesIO(read.render([capitals(s) for s in read.segments])))
    before = zipfile.ZipFile(io.BytesIO(source))
    assert out.namelist() == before.namelist()
    assert out.getinfo("mimetype").compress_type == zipfile.ZIP_STORED
    for name in before.namelist():
        if name != "OEBPS/text/ch 1.xhtml":
            assert out.read(name) == before.read(name)
    text = out.read("OEBPS/text/ch 1.xhtml").decode()
    ElementTree.fromstring(text.encode())  # still XML
    assert "<title>CHAPTER ONE</title>" in text
    assert "<p>IT WAS <em>A DARK</em> NIGHT.</p>" in text
    assert '<linearGradient id="g"/><text>A LABEL</text>' in text


# --- the fixture model: the engine and `mt translate` ---------------------------------------------


@pytest.fixture(scope="module")
def engine() -> TorchEngine:
    return TorchEngine(CKPT)


@pytest.fixture(scope="module")
def lines() -> list[str]:
    return [line for line in (FIXTURE / "src.txt").read_text(encoding="utf-8").splitlines() if line]


def test_html_translated_by_the_model_keeps_its_markup(engine, lines):
    words = lines[1].split()
    source = (
        f'<h1 id="t">{lines[0]}</h1>\n<p>{words[0]} <b>{" ".join(words[1:3])}</b> '
        f'<a href="https://example.com/?a=1&amp;b=2">{" ".join(words[3:])}</a></p><p>🙂 42</p>'
    )
    document = html_document(source)
    out = translate_document(engine, document, engine.decode).decode()
    plain = engine.translate([lines[0], lines[1]], engine.decode)
    assert sorted(tags(out)) == sorted(tags(source)) and well_nested(tags(out))
    assert out.startswith(f'<h1 id="t">{plain[0].text}</h1>\n<p>')
    assert HTMLParserText.text_of(out).split() == f"{plain[0].text} {plain[1].text} 🙂 42".split()
    assert out.endswith("</p><p>🙂 42</p>")


def test_mt_translate_a_docx_file_through_the_cli(engine, lines, tmp_path):
    docx = pytest.importorskip("docx")
    document = docx.Document()
    document.add_heading(lines[0], level=2)
    words = lines[1].split()
    paragraph = document.add_paragraph(words[0] + " ")
    paragraph.add_run(" ".join(words[1:3])).bold = True
    paragraph.add_run(" " + " ".join(words[3:]))
    document.add_table(rows=1, cols=2).cell(0, 0).text = lines[2]
    document.save(tmp_path / "report.docx")

    runner = CliRunner()
    args = ["translate", "-c", str(CKPT), "-i", str(tmp_path / "report.docx")]
    result = runner.invoke(app, [*args, "-o", str(tmp_path / "report.de.docx")])
    assert result.exit_code == 0, result.output
    assert "report.de.docx: 3 segments translated" in result.output
    out = docx.Document(tmp_path / "report.de.docx")
    plain = [r.text for r in engine.translate(lines[:3], engine.decode)]
    heading, body = out.paragraphs
    assert heading.style.name == "Heading 2" and heading.text == plain[0]
    assert " ".join(body.text.split()) == plain[1]
    assert len(body.runs) == 3 and body.runs[1].bold and not body.runs[0].bold
    assert out.tables[0].cell(0, 0).text == plain[2] and out.tables[0].cell(0, 1).text == ""

    errors = {
        "report.txt: a .docx document translates into a .docx file; give --output the suffix": [
            "-o",
            str(tmp_path / "report.txt"),
        ],
        "is a document: name its translation with --output FILE": [],
        "--nbest is for lines of text": ["-o", str(tmp_path / "y.docx"), "--nbest", "2"],
    }
    for message, extra in errors.items():
        result = runner.invoke(app, [*args, *extra])
        assert result.exit_code == 1 and message in result.output, result.output
        assert result.output.count("\n") == 1
    assert not (tmp_path / "y.docx").exists() and not (tmp_path / "report.txt").exists()


def test_read_document_file_picks_the_format_by_suffix(tmp_path):
    (tmp_path / "page.htm").write_text("<p>Hi <b>there</b></p>", encoding="utf-8")
    document = read_document_file(tmp_path / "page.htm")
    assert document.suffix == ".html" and document.segments == ["Hi there"]


# --- nothing to translate: the engines and `mt translate --engine ct2` -------------------------


def test_the_torch_engine_returns_lines_without_words_unchanged(engine, lines):
    for attention in (False, True):
        results = engine.translate(["🙂", lines[0], " 2024 ", ""], engine.decode, attention)
        assert [results[i].text for i in (0, 2, 3)] == ["🙂", "2024", ""]
        assert results[0].nbest == [("🙂", 0.0)] and results[1].text
        if attention:
            assert results[0].attention == Attention([], [], []) and results[1].attention.weights
    assert engine.encode_lines(["🙂", lines[0]], engine.decode).keys() == {1}


def test_the_ct2_engine_and_mt_translate_ct2_return_lines_without_words_unchanged(
    engine, lines, tmp_path
):
    pytest.importorskip("ctranslate2", reason="the ct2 extra is not installed")
    from transformer_mt.convert.ctranslate2 import export_ctranslate2
    from transformer_mt.engines.ct2_engine import CT2Engine
    from transformer_mt.engines.loading import load_for_inference

    directory = export_ctranslate2(load_for_inference(CKPT), tmp_path / "ct2")
    ct2 = CT2Engine(directory)
    source = ["🙂", lines[0], "https://example.com", ""]
    plain = ct2.translate([lines[0]], ct2.decode)[0].text
    for attention in (False, True):
        for stop in (None, lambda: False):
            results = ct2.translate(source, ct2.decode, attention, stop)
            assert [r.text for r in results] == ["🙂", plain, "https://example.com", ""]
    (tmp_path / "in.txt").write_text("\n".join(source) + "\n", encoding="utf-8")
    args = ["translate", "--engine", "ct2", "-c", str(directory), "-i", str(tmp_path / "in.txt")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == ["🙂", plain, "https://example.com", ""]
