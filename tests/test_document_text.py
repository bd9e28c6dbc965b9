"""Documents as people write them: paragraphs of several sentences, attribute text, footnotes.

A document's segment of several sentences (an HTML paragraph, a .docx paragraph) is cut into
sentences as pasted text is, each translated alone, and joined back with the whitespace between
them; the sentences' attention matrices are joined block-diagonally into the segment's, so that
markup still lands on the words it held. HTML attribute text (alt, title, placeholder,
aria-label, a meta description) and .docx footnotes and endnotes are segments too.

Most cases use a stand-in engine that is exact and easy to check: it writes each word in
capitals (or in reverse order), in sentencepiece-like pieces, with an attention matrix that links
each target piece to its source word; it keeps the lines it was given. The fixture checkpoint
(and its CTranslate2 export) then checks the joined attention on a real model's pieces.
"""

from __future__ import annotations

import io
import re
import zipfile
from pathlib import Path

import numpy as np
import pytest

from transformer_mt.config import DecodeConfig
from transformer_mt.documents.document import html_document, read_document
from transformer_mt.documents.limits import DocumentLimits, DocumentTooLarge
from transformer_mt.documents.placement import word_links
from transformer_mt.documents.translate import translate_document
from transformer_mt.engines.base import Engine
from transformer_mt.engines.options import TranslateExtras
from transformer_mt.engines.paragraphs import join_attention, translate_split
from transformer_mt.engines.results import Attention, LineResult
from transformer_mt.text.content import has_text
from transformer_mt.text.split import SplitText, split_text

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "old_checkpoint"
CKPT = FIXTURE / "old_last.pt"
WORD = "\u2581"
EOS = "</s>"
DECODE = DecodeConfig(beam_size=1)


def pieces(word: str) -> list[str]:
    """A word as sentencepiece might cut it: "▁" and its first two characters, then the rest."""
    return [WORD + word[:2], word[2:]] if len(word) > 2 else [WORD + word]


class Fake(Engine):
    """An engine stand-in: each sentence's words in capitals.

    ``reverse``: in reverse order. ``eos``: our engine's convention (the source's EOS column and
    the EOS row) or, without, CTranslate2's (neither; rows sum to a little under 1). ``tag``: a
    multilingual model's target-language piece before each source."""

    def __init__(self, reverse: bool = False, eos: bool = True, tag: str | None = None, lang="de"):
        super().__init__("fake", None, None, DECODE, lang, "en", pairs=[(lang, "en")])  # type: ignore[arg-type]
        self.reverse, self.eos, self.tag = reverse, eos, tag
        self.calls: list[list[str]] = []

    def _translate(self, lines, decode, attention, stop, target, extras):
        assert not extras.split  # the sentences come one by one
        self.calls.append(list(lines))
        return [self.one(line, attention) for line in lines]

    def one(self, line: str, attention: bool) -> LineResult:
        if not has_text(line):  # as an engine returns a line with nothing to translate
            text = line.strip()
            return LineResult(
                text, 0.0, [(text, 0.0)], Attention([], [], []) if attention else None
            )
        words = line.split()
        order = list(range(len(words)))[:: -1 if self.reverse else 1]
        text = " ".join(words[i].upper() for i in order)
        return LineResult(
            text, -1.0, [(text, -1.0)], self.attention(words, order) if attention else None
        )

    def attention(self, words: list[str], order: list[int]) -> Attention:
        tag = [self.tag] if self.tag else []
        source, first, last = list(tag), [], []
        for word in words:
            first.append(len(source))
            source += pieces(word)
            last.append(len(source) - 1)
        rows = []
        for s in order:
            for _ in pieces(words[s].upper()):
                row = [0.0] * (len(source) + self.eos)
                row[first[s]] += 0.6
                row[last[s]] += 0.2
                if tag:
                    row[0] += 0.05
                if self.eos:
                    row[-1] += 0.15
                rows.append(row)
        target = [p for s in order for p in pieces(words[s].upper())]
        if self.eos:
            rows.append([0.0] * len(source) + [1.0])  # the row that wrote EOS
            return Attention([*source, EOS], [*target, EOS], rows, len(tag))
        return Attention(source, target, rows, len(tag))


def split_translate(engine: Fake, lines: list[str], lang: str = "de") -> list[LineResult]:
    extras = TranslateExtras(split=True, source_lang=lang)
    return translate_split(engine, lines, DECODE, None, None, extras, attention=True)  # type: ignore[arg-type]


# --- sentences of real text, their whitespace byte for byte ----------------------------------------


@pytest.mark.parametrize(
    ("line", "lang", "sentences"),
    [
        (
            "Dr. Müller kam um 9 Uhr.  Er ging z. B. nach Hause.",
            "de",
            ["Dr. Müller kam um 9 Uhr.", "Er ging z. B. nach Hause."],
        ),
        (
            "Sie rief: „Komm her!“ Er kam.\tDann „ging“ er.",
            "de",
            ["Sie rief: „Komm her!“", "Er kam.", "Dann „ging“ er."],
        ),
        ('He said "Stop." Then he left.', "en", ['He said "Stop."', "Then he left."]),
        ("Er kam.\r\n\n  Sie ging.", "de", ["Er kam.", "Sie ging."]),
        (
            "今天天气很好。我们去公园吧！你来吗？",
            "zh",
            ["今天天气很好。", "我们去公园吧！", "你来吗？"],
        ),
    ],
)
def test_a_paragraph_of_real_text_is_split_translated_and_joined_with_its_attention(
    line, lang, sentences
):
    engine = Fake()
    (result,) = split_translate(engine, [line], lang)
    assert engine.calls == [sentences]
    split = split_text(line, lang)
    assert result.text == split.join([s.upper() for s in sentences])  # whitespace byte for byte
    assert result.text.upper() == line.upper()
    links = word_links(result, len(line.split()))
    assert links.links is not None  # the joined pieces make the line's whitespace words
    assert links.links == [[t] for t in range(len(line.split()))]


def test_a_split_paragraph_in_reverse_links_each_word_to_its_own_sentence():
    line = "Dr. Müller kam um 9 Uhr. Er ging z. B. nach Hause."
    (result,) = split_translate(Fake(reverse=True), [line])
    assert result.text == "UHR. 9 UM KAM MÜLLER DR. HAUSE. NACH B. Z. GING ER"
    links = word_links(result, 12).links
    assert links == [[5], [4], [3], [2], [1], [0], [11], [10], [9], [8], [7], [6]]


def test_a_sentence_with_nothing_to_translate_keeps_the_rest_of_the_line_linked():
    line = "Hallo Welt. 🙂 🙂. Tschüss jetzt."
    engine = Fake(reverse=True)
    (result,) = split_translate(engine, [line], "de")
    assert engine.calls == [["Hallo Welt.", "🙂 🙂.", "Tschüss jetzt."]]
    assert result.text == "WELT. HALLO 🙂 🙂. JETZT. TSCHÜSS"  # the emoji: as they were
    assert word_links(result, 6).links == [[1], [0], [2], [3], [5], [4]]
    (alone,) = split_translate(engine, ["🙂 42."])
    assert alone.text == "🙂 42."


# --- the join itself --------------------------------------------------------------------------


def _pair(engine: Fake) -> tuple[SplitText, list[LineResult]]:
    split = split_text("Er kam. Sie ging heim.", "de")
    return split, [engine.one(sentence, True) for sentence in split.sentences]


@pytest.mark.parametrize("eos", [True, False], ids=["torch", "ct2"])
@pytest.mark.parametrize("tag", [None, "<2en>"])
def test_joined_attention_is_block_diagonal_and_keeps_each_rows_sum(eos, tag):
    split, results = _pair(Fake(eos=eos, tag=tag))
    first, second = (r.attention for r in results)
    joined = join_attention(split, [r.text for r in results], [first, second])
    skip = 1 if tag else 0
    text = [a.source[skip : len(a.source) - eos] for a in (first, second)]
    out = [a.target[: len(a.target) - eos] for a in (first, second)]
    assert joined.prefix == skip and joined.source[:skip] == ([tag] if tag else [])
    assert joined.source[skip:] == text[0] + text[1] + [EOS] * eos  # pieces in order
    assert joined.target == out[0] + out[1] + [EOS] * eos
    weights = np.asarray(joined.weights)
    n_src = skip + len(text[0]) + len(text[1]) + eos
    assert weights.shape == (len(out[0]) + len(out[1]) + eos, n_src)
    # each row sums as it did (the first sentence's EOS row is dropped, the last one's kept)
    rows = [*first.weights[: len(out[0])], *second.weights]
    assert np.allclose(weights.sum(axis=1), [sum(row) for row in rows])
    # block-diagonal: a sentence's rows look at its own text pieces, the tag and EOS only
    a, b = len(out[0]), skip + len(text[0])
    assert not weights[:a, b : b + len(text[1])].any()
    assert not weights[a : a + len(out[1]), skip:b].any()
    assert np.allclose(
        weights[:a, skip:b], np.asarray(first.weights)[:a, skip : skip + len(text[0])]
    )
    if eos:
        assert np.allclose(weights[:a, -1], np.asarray(first.weights)[:a, -1])


def test_the_join_marks_word_starts_by_the_whitespace_between_sentences():
    split = split_text("好。走吧。", "zh")  # no whitespace: one word
    engine = Fake()
    results = [engine.one(sentence, True) for sentence in split.sentences]
    joined = join_attention(split, [r.text for r in results], [r.attention for r in results])
    assert joined.source == [WORD + "好。", "走吧", "。", EOS]  # the second "▁" dropped
    spaced = SplitText(["a.", "b."], ["", "  ", ""])
    bare = Attention(["a."], ["A."], [[1.0]])  # pieces without a word-start mark
    joined = join_attention(spaced, ["A.", "B."], [bare, Attention(["b."], ["B."], [[1.0]])])
    assert joined.source == ["a.", WORD + "b."] and joined.target == ["A.", WORD + "B."]
    assert join_attention(spaced, ["A.", "B."], [bare, None]) is None  # a sentence without
    wrong = Attention(["b.", EOS], ["B."], [[1.0]])  # a matrix of another shape than its pieces
    assert join_attention(spaced, ["A.", "B."], [bare, wrong]) is None


def test_a_paragraph_too_long_for_a_joined_matrix_gets_none(monkeypatch):
    from transformer_mt.engines import paragraphs

    split, results = _pair(Fake())
    texts, matrices = [r.text for r in results], [r.attention for r in results]
    cells = len(join_attention(split, texts, matrices).weights) * len(matrices[0].source)
    monkeypatch.setattr(paragraphs, "MAX_JOINED_CELLS", cells)  # fewer than the join's
    assert join_attention(split, texts, matrices) is None  # markup placed in proportion then


# --- documents: HTML and .docx paragraphs of several sentences ------------------------------


def test_html_bold_in_the_second_sentence_lands_on_that_sentences_words():
    source = "<p>Sentence one. <b>Bold</b> sentence two.</p>"
    engine = Fake(lang="en")
    out = translate_document(engine, html_document(source), DECODE).decode()  # type: ignore[arg-type]
    assert engine.calls == [["Sentence one.", "Bold sentence two."]]
    assert out == "<p>SENTENCE ONE. <b>BOLD</b> SENTENCE TWO.</p>"
    engine = Fake(reverse=True, lang="en")
    out = translate_document(engine, html_document(source), DECODE).decode()  # type: ignore[arg-type]
    assert out == "<p>ONE. SENTENCE TWO. SENTENCE <b>BOLD</b></p>"


def test_a_docx_paragraph_of_two_sentences_keeps_its_runs():
    docx = pytest.importorskip("docx")
    document = docx.Document()
    paragraph = document.add_paragraph("Dr. Müller kam um 9 Uhr. Er ging ")
    paragraph.add_run("z. B.").bold = True
    paragraph.add_run(" nach Hause.")
    data = io.BytesIO()
    document.save(data)
    read = read_document(data.getvalue(), ".docx")
    engine = Fake()
    out = docx.Document(io.BytesIO(translate_document(engine, read, DECODE)))  # type: ignore[arg-type]
    assert engine.calls == [["Dr. Müller kam um 9 Uhr.", "Er ging z. B. nach Hause."]]
    assert [(r.text, r.bold) for r in out.paragraphs[0].runs] == [
        ("DR. MÜLLER KAM UM 9 UHR. ER GING ", None),
        ("Z. B. ", True),
        ("NACH HAUSE.", None),
    ]


# --- HTML attribute text --------------------------------------------------------------------


def _translated(source: str) -> tuple[list[str], str]:
    document = html_document(source)
    engine = Fake(lang="en")
    return document.segments, translate_document(engine, document, DECODE).decode()  # type: ignore[arg-type]


def test_html_attribute_text_is_translated_as_deepl_and_google_do():
    source = (
        '<html><head><meta name="description" content="A page about cats">'
        '<meta name="keywords" content="cats dogs"><title>Cats</title></head><body>'
        '<p title="A tip">Hello <a href="/x" title=\'Go "there"\'>world</a> '
        '<img src="c.png" alt=Cat> today</p><area alt="Map part" href="#"><input type="image" '
        'alt="Send it"><input type=text placeholder="Your name" alt="not an image">'
        '<textarea placeholder="Write here">typed text</textarea>'
        '<button aria-label="Close the box">X</button></body></html>'
    )
    segments, out = _translated(source)
    assert segments == [
        "A page about cats",
        "Cats",
        "A tip",
        'Go "there"',
        "Cat",
        "Hello world today",
        "Map part",
        "Send it",
        "Your name",
        "Write here",
        "Close the box",
        "X",
    ]
    assert out == (
        '<html><head><meta name="description" content="A PAGE ABOUT CATS">'
        '<meta name="keywords" content="cats dogs"><title>CATS</title></head><body>'
        '<p title="A TIP">HELLO <a href="/x" title="GO &quot;THERE&quot;">WORLD</a> '
        '<img src="c.png" alt="CAT"> TODAY</p><area alt="MAP PART" href="#"><input type="image" '
        'alt="SEND IT"><input type=text placeholder="YOUR NAME" alt="not an image">'
        '<textarea placeholder="WRITE HERE">typed text</textarea>'
        '<button aria-label="CLOSE THE BOX">X</button></body></html>'
    )


def test_html_attributes_of_untranslated_elements_and_odd_values_stay_as_written():
    source = (
        '<div translate="no" title="keep me"><span aria-label="keep too">x</span></div>'
        '<code title="a code title">c</code><pre><abbr title="in pre">x</abbr></pre>'
        '<img alt="first" alt="second"><img alt="🙂 42"><img alt=""><img title>'
        '<img translate="no" alt="a logo"><a title="https://example.com">link</a>'
    )
    segments, out = _translated(source)
    assert segments == ["link"]
    assert out == source.replace(">link<", ">LINK<")


def test_a_translation_with_quotes_is_escaped_in_its_attribute():
    document = html_document("<p title=\"It's\">x y</p><img alt='a b' src=i.png>")
    quoted = "He said \"no\" & 'yes' <b>"
    results = [LineResult(quoted, 0.0, [(quoted, 0.0)]) for _ in document.segments]
    out = document.render(results).decode()
    escaped = "He said &quot;no&quot; &amp; &#x27;yes&#x27; &lt;b&gt;"
    assert out.startswith(f'<p title="{escaped}">') and f'<img alt="{escaped}" src=i.png>' in out
    from html.parser import HTMLParser

    seen = []

    class Attributes(HTMLParser):
        def handle_starttag(self, tag, attrs):
            seen.extend(value for name, value in attrs if name in ("title", "alt"))

    Attributes().feed(out)
    assert seen == [quoted, quoted]  # read back as written


def test_attribute_text_counts_against_the_segment_bound_and_an_xhtml_page_stays_xml():
    from xml.etree import ElementTree

    source = '<p title="one">two</p><img alt="three"/>'
    with pytest.raises(DocumentTooLarge, match="more than 2 segments"):
        html_document(source, DocumentLimits(max_segments=2))
    assert len(html_document(source, DocumentLimits(max_segments=3)).segments) == 3
    chapter = (
        '<html xmlns="http://www.w3.org/1999/xhtml"><body><img alt="a &amp; b"/></body></html>'
    )
    from transformer_mt.documents.html import HtmlPage

    page = HtmlPage(chapter, xml=True)
    out = page.render([LineResult("x & 'y'", 0.0, [("x & 'y'", 0.0)])])
    assert ElementTree.fromstring(out).find(".//{*}img").get("alt") == "x & 'y'"


def test_a_page_holding_every_placeholder_marker_keeps_its_attributes():
    from transformer_mt.documents.html import MARKERS

    source = "<p title='a tip'>" + "".join(MARKERS) + " text</p>"
    document = html_document(source)
    assert document.segments == ["".join(MARKERS) + " text"]
    assert (
        document.render([LineResult("T", 0.0, [("T", 0.0)])]).decode() == "<p title='a tip'>T</p>"
    )


# --- .docx footnotes and endnotes --------------------------------------------------------------

W_NS = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"
REL = "http://schemas.openxmlformats.org/officeDocument/2006/relationships"
CT = "application/vnd.openxmlformats-officedocument.wordprocessingml"


def _notes(kind: str, text: str) -> bytes:
    """A footnotes.xml or endnotes.xml: the two separator notes, then one note of ``text``."""
    return (
        f'<?xml version="1.0" encoding="UTF-8" standalone="yes"?>\n<w:{kind}s xmlns:w="{W_NS}">'
        f'<w:{kind} w:type="separator" w:id="-1"><w:p><w:pPr><w:spacing w:after="0"/></w:pPr>'
        f"<w:r><w:separator/></w:r></w:p></w:{kind}>"
        f'<w:{kind} w:type="continuationSeparator" w:id="0"><w:p><w:r><w:continuationSeparator/>'
        f"</w:r></w:p></w:{kind}>"
        f'<w:{kind} w:id="1"><w:p><w:r><w:rPr><w:vertAlign w:val="superscript"/></w:rPr>'
        f'<w:{kind}Ref/></w:r><w:r><w:t xml:space="preserve"> {text}</w:t></w:r></w:p></w:{kind}>'
        f"</w:{kind}s>"
    ).encode()


def docx_with_notes() -> bytes:
    """A .docx (written by python-docx) given a footnote and an endnote, as Word writes them."""
    docx = pytest.importorskip("docx")
    document = docx.Document()
    document.add_paragraph("Body text here.")
    document.sections[0].footer.paragraphs[0].text = "page footer"
    template = io.BytesIO()
    document.save(template)
    out = io.BytesIO()
    with zipfile.ZipFile(template) as source, zipfile.ZipFile(out, "w") as target:
        for info in source.infolist():
            data = source.read(info)
            if info.filename == "[Content_Types].xml":
                data = data.replace(
                    b"</Types>",
                    f'<Override PartName="/word/footnotes.xml" ContentType="{CT}.footnotes+xml"/>'
                    f'<Override PartName="/word/endnotes.xml" ContentType="{CT}.endnotes+xml"/>'
                    "</Types>".encode(),
                )
            elif info.filename == "word/_rels/document.xml.rels":
                data = data.replace(
                    b"</Relationships>",
                    f'<Relationship Id="rId90" Type="{REL}/footnotes" Target="footnotes.xml"/>'
                    f'<Relationship Id="rId91" Type="{REL}/endnotes" Target="endnotes.xml"/>'
                    "</Relationships>".encode(),
                )
            elif info.filename == "word/document.xml":
                data = data.replace(
                    b"here.</w:t></w:r>",
                    b'here.</w:t></w:r><w:r><w:footnoteReference w:id="1"/></w:r>'
                    b'<w:r><w:endnoteReference w:id="1"/></w:r>',
                )
            target.writestr(info, data)
        target.writestr(
            "word/footnotes.xml", _notes("footnote", "Siehe Dr. Müller. Das ist alles.")
        )
        target.writestr("word/endnotes.xml", _notes("endnote", "An endnote."))
    return out.getvalue()


def _separators(xml: bytes) -> list[bytes]:
    return re.findall(rb'<w:(?:foot|end)note w:type="[a-zA-Z]+".*?</w:(?:foot|end)note>', xml)


def test_docx_footnotes_and_endnotes_are_translated_and_their_separators_left_alone():
    docx = pytest.importorskip("docx")
    data = docx_with_notes()
    read = read_document(data, ".docx", "notes.docx")
    assert sorted(read.segments) == sorted(
        ["Body text here.", "page footer", "Siehe Dr. Müller. Das ist alles.", "An endnote."]
    )
    engine = Fake()
    out = translate_document(engine, read, DECODE)  # type: ignore[arg-type]
    assert len(engine.calls) == 1  # every segment's sentences in one call
    assert {"Siehe Dr. Müller.", "Das ist alles.", "An endnote."} <= set(engine.calls[0])
    before, after = zipfile.ZipFile(io.BytesIO(data)), zipfile.ZipFile(io.BytesIO(out))
    for member in ("word/footnotes.xml", "word/endnotes.xml"):
        assert _separators(after.read(member)) == _separators(before.read(member))
        assert len(_separators(after.read(member))) == 2
    footnotes = after.read("word/footnotes.xml").decode()
    assert '<w:t xml:space="preserve"> SIEHE DR. MÜLLER. DAS IST ALLES.</w:t>' in footnotes
    assert "<w:footnoteRef/>" in footnotes
    assert "AN ENDNOTE." in after.read("word/endnotes.xml").decode()
    body = after.read("word/document.xml").decode()
    assert 'BODY TEXT HERE.</w:t></w:r><w:r><w:footnoteReference w:id="1"/>' in body
    translated = docx.Document(io.BytesIO(out))  # python-docx still reads it
    assert translated.paragraphs[0].text == "BODY TEXT HERE."
    assert translated.sections[0].footer.paragraphs[0].text == "PAGE FOOTER"


def test_docx_notes_count_against_the_documents_bounds():
    data = docx_with_notes()
    with pytest.raises(DocumentTooLarge, match="more than 3 segments"):
        read_document(data, ".docx", "notes.docx", DocumentLimits(max_segments=3))
    assert len(read_document(data, ".docx", "n.docx", DocumentLimits(max_segments=4)).segments) == 4
    with pytest.raises(DocumentTooLarge, match="XML elements"):  # scanned before lxml reads them
        read_document(data, ".docx", "notes.docx", DocumentLimits(max_elements=50))


# --- the fixture model: the joined attention on real pieces -----------------------------------

FIRST, SECOND = "The light friend saw the blue letter.", "The friend closed the woman."


@pytest.fixture(scope="module")
def engine():
    from transformer_mt.engines.engine import load_engine

    return load_engine("torch", CKPT)


def _check_joined(engine, decode) -> None:
    line = f"{FIRST} {SECOND}"
    extras = TranslateExtras(split=True, source_lang=engine.src_lang)
    (joined,) = translate_split(engine, [line], decode, None, None, extras, attention=True)
    alone = engine.translate([FIRST, SECOND], decode, attention=True)
    assert joined.text == f"{alone[0].text} {alone[1].text}"
    attention = joined.attention

    def text_pieces(pieces: list[str]) -> list[str]:
        return [p.removeprefix(WORD) for p in pieces if p != EOS]

    for side in ("source", "target"):  # each sentence's pieces, in order
        each = [text_pieces(getattr(a.attention, side)) for a in alone]
        assert text_pieces(getattr(attention, side)) == each[0] + each[1]
    sums = np.asarray(attention.weights).sum(axis=1)
    first_rows = [sum(row) for row in alone[0].attention.weights]
    n_first = len([p for p in alone[0].attention.target if p != EOS])
    assert np.allclose(sums[:n_first], first_rows[:n_first], atol=1e-5)
    links = word_links(joined, len(line.split()))
    assert links.links is not None
    n_words = len(FIRST.split())
    for s, targets in enumerate(links.links):  # each word links inside its own sentence
        first_half = len(alone[0].text.split())
        assert all((t < first_half) == (s < n_words) for t in targets), (s, targets)


def test_the_model_splits_a_paragraph_and_its_joined_attention_maps_to_words(engine):
    _check_joined(engine, engine.run_decode)
    source = f"<p>{FIRST} The <b>friend</b> closed the woman.</p>"
    out = translate_document(engine, html_document(source), engine.run_decode).decode()
    alone = engine.translate([FIRST, SECOND], engine.run_decode)
    assert re.sub("</?b>", "", out) == f"<p>{alone[0].text} {alone[1].text}</p>"
    second = out.split(alone[0].text, 1)[1]
    assert "<b>" in second and "</b>" in second  # on the second sentence's words


def test_the_ct2_export_joins_attention_without_an_eos_column(engine, tmp_path):
    pytest.importorskip("ctranslate2", reason="the ct2 extra is not installed")
    from transformer_mt.convert.ctranslate2 import export_ctranslate2
    from transformer_mt.engines.engine import load_engine
    from transformer_mt.engines.loading import load_for_inference

    directory = export_ctranslate2(load_for_inference(CKPT), tmp_path / "ct2")
    ct2 = load_engine("ct2", directory)
    (one,) = ct2.translate([FIRST], ct2.decode, attention=True)
    assert EOS not in one.attention.source  # CTranslate2's convention
    _check_joined(ct2, ct2.decode)
