"""The server on pasted text: paragraphs split into sentences and joined back, /detect and
source "auto" among the model's source languages, glossaries by name or inline."""

from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the serve extra is not installed")
httpx = pytest.importorskip("httpx", reason="the serve extra is not installed")

from test_serve import LIMITS, running  # noqa: E402

from transformer_mt.config import DecodeConfig  # noqa: E402
from transformer_mt.engines.engine import Engine  # noqa: E402
from transformer_mt.engines.options import TranslateExtras  # noqa: E402
from transformer_mt.engines.results import LineResult  # noqa: E402
from transformer_mt.engines.torch_engine import TorchEngine  # noqa: E402
from transformer_mt.errors import MTError  # noqa: E402
from transformer_mt.serve.app import create_app  # noqa: E402
from transformer_mt.serve.settings import ServeSettings  # noqa: E402
from transformer_mt.serve.state import load_glossaries  # noqa: E402

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "old_checkpoint"
CKPT = FIXTURE / "old_last.pt"
TERM = "trumenaul"  # a target word of the fixture model's language


class Multi(Engine):
    """A de/fr/cs -> en engine that upper-cases each sentence, keeping the calls."""

    def __init__(self, sources: tuple[str, ...] = ("de", "fr", "cs")) -> None:
        pairs = [(source, "en") for source in sources]
        first = sources[0]
        super().__init__("fake", None, None, DecodeConfig(beam_size=2), first, "en", pairs=pairs)
        self.calls: list[list[str]] = []

    def count_tokens(self, lines) -> int:
        return sum(len(line.split()) + 1 for line in lines)

    def _translate(self, lines, decode, attention, stop, target, extras):
        self.calls.append(list(lines))
        return [LineResult(s.upper(), -1.0, [(s.upper(), -1.0)] * decode.nbest) for s in lines]


@pytest.fixture(scope="module")
def torch_served(tmp_path_factory):
    terms = tmp_path_factory.mktemp("glossary") / "terms.tsv"
    terms.write_text(f"horse\t{TERM}\n")
    engine = TorchEngine(CKPT)
    app = create_app(engine, LIMITS, settings=ServeSettings(glossaries=(f"animals={terms}",)))
    with running(app) as url, httpx.Client(base_url=url, timeout=60) as client:
        yield client, engine


def test_a_paragraph_is_split_and_joined_with_its_own_spacing(torch_served):
    client, engine = torch_served
    first, second = "The light friend saw the blue letter.", "The friend closed the woman."
    alone = [r.text for r in engine.translate([first, second], engine.decode)]
    text = f"  {first}  {second}\n\n{first}"
    reply = client.post("/translate", json={"q": text, "source": "src", "target": "trg"})
    assert reply.status_code == 200, reply.text
    assert reply.json()["translatedText"] == f"  {alone[0]}  {alone[1]}\n\n{alone[0]}"


def test_a_glossary_by_name_or_inline_keeps_its_term(torch_served):
    client, engine = torch_served
    line = "The horse pulls the mouse on a cup although the doctor watches a cold bird."
    plain = engine.translate([line], engine.decode)[0].text
    assert TERM not in plain
    body = {"q": line, "source": "src", "target": "trg"}
    for glossary in ("animals", {"horse": TERM}):
        reply = client.post("/translate", json={**body, "glossary": glossary})
        assert reply.status_code == 200, reply.text
        assert TERM in reply.json()["translatedText"]
    extras = TranslateExtras(terms=[[TERM]])
    assert (
        reply.json()["translatedText"]
        == engine.translate([line], engine.decode, extras=extras)[0].text
    )
    unknown = client.post("/translate", json={**body, "glossary": "plants"})
    assert unknown.status_code == 400
    assert unknown.json()["error"] == (
        "Invalid request: no glossary named 'plants' (glossaries: animals)"
    )


def test_a_glossary_holds_in_an_html_body_and_protect_is_for_plain_text(torch_served):
    client, _ = torch_served
    line = "The horse pulls the mouse on a cup although the doctor watches a cold bird."
    html = f"<p>{line} <b>The friend</b> closed the woman.</p>"
    body = {"q": html, "source": "src", "target": "trg", "format": "html"}
    plain = client.post("/translate", json=body)
    assert plain.status_code == 200 and TERM not in plain.json()["translatedText"]
    for glossary in ("animals", {"horse": TERM}):
        reply = client.post("/translate", json={**body, "glossary": glossary})
        assert reply.status_code == 200, reply.text
        translated = reply.json()["translatedText"]
        assert translated.count(TERM) == 1 and translated.startswith("<p>"), translated
    unknown = client.post("/translate", json={**body, "glossary": "plants"})
    assert unknown.status_code == 400 and "no glossary named 'plants'" in unknown.json()["error"]
    protect = client.post("/translate", json={**body, "protect": True})
    assert protect.status_code == 400
    assert protect.json()["error"] == "Invalid request: protect is for plain text (format: text)"
    assert 'translate="no"' in protect.json()["detail"]


def test_protect_keeps_links_addresses_numbers_and_marked_text(torch_served):
    client, engine = torch_served
    text = "The horse runs at 12:30 to https://a.io/x. Open <keep>trumenaul</keep> now."
    body = {"q": text, "source": "src", "target": "trg"}
    plain = client.post("/translate", json=body).json()["translatedText"]
    assert "https://a.io/x" not in plain and "12:30" not in plain
    reply = client.post("/translate", json={**body, "protect": True})
    assert reply.status_code == 200, reply.text
    kept = reply.json()["translatedText"]
    for span in ("12:30", "https://a.io/x", "trumenaul"):
        assert kept.count(span) == 1, (span, kept)
    assert "keep" not in kept
    extras = TranslateExtras(protect=True, split=True, source_lang="src")
    assert kept == engine.translate([text], engine.decode, extras=extras)[0].text


def test_server_glossary_options_are_checked_before_the_server_starts(tmp_path):
    bad = tmp_path / "bad.tsv"
    bad.write_text("horse\n")
    for option, message in (
        ("animals", "give NAME=FILE"),
        (f"animals={bad}", "bad.tsv:1"),
        (f"animals={tmp_path / 'none.tsv'}", "none.tsv"),
    ):
        with pytest.raises(MTError, match=message):
            load_glossaries((option,))


@pytest.fixture
def multi_served():
    pytest.importorskip("py3langid", reason="the text extra (py3langid) is not installed")
    engine = Multi()
    with running(create_app(engine, LIMITS)) as url, httpx.Client(base_url=url, timeout=30) as c:
        yield c, engine


@pytest.mark.parametrize(
    ("text", "language", "sure"),
    [
        ("Ein Mann fährt mit dem Fahrrad durch die Stadt.", "de", True),
        ("Un homme fait du vélo dans la ville.", "fr", True),
        ("Muž jede na kole městem.", "cs", True),
        ("A man rides his bike through the city.", "de", False),  # English: not a source
        ("ok", "de", False),  # too short to tell
        ("🙂 42", "de", False),  # nothing to tell from
    ],
)
def test_detect_chooses_among_the_models_sources_and_says_when_unsure(
    multi_served, text, language, sure
):
    client, _ = multi_served
    reply = client.post("/detect", json={"q": text})
    assert reply.status_code == 200, reply.text
    best = reply.json()[0]
    assert best["language"] == language
    assert (best["confidence"] > 90) if sure else (best["confidence"] == 0.0)


def test_source_auto_splits_each_text_by_its_own_language(multi_served):
    client, engine = multi_served
    texts = ["Er kam am 19. Mai. Dann ging er.", "M. Dupont est arrivé. Il est parti."]
    reply = client.post("/translate", json={"q": texts, "source": "auto", "target": "en"})
    assert reply.status_code == 200, reply.text
    assert engine.calls[-1] == [
        "Er kam am 19. Mai.",
        "Dann ging er.",
        "M. Dupont est arrivé.",
        "Il est parti.",
    ]
    assert [d["language"] for d in reply.json()["detectedLanguage"]] == ["de", "fr"]


@pytest.mark.parametrize(
    ("source", "text", "sentences"),
    [
        ("ja", "今日は晴れです。\r\n\t明日は？ 「はい。」と彼は言った。", ["今日は晴れです。", "明日は？", "「はい。」と彼は言った。"]),
        ("zh", "我今天很忙。你呢？\t我们明天见！\r\n", ["我今天很忙。", "你呢？", "我们明天见！"]),
        ("de", "Dr. Meier kam um 9.30 Uhr.\r\n\r\nZ. B. \"das\" hier.  Ok.", ["Dr. Meier kam um 9.30 Uhr.", "Z. B. \"das\" hier.", "Ok."]),
    ],
)  # fmt: skip
def test_each_sentence_is_translated_and_the_spacing_comes_back_byte_for_byte(
    source, text, sentences
):
    engine = Multi((source,))
    with running(create_app(engine, LIMITS)) as url, httpx.Client(base_url=url) as client:
        body = {"q": text, "source": source, "target": "en"}
        reply = client.post("/translate", json=body)
        assert reply.status_code == 200, reply.text
        assert engine.calls[-1] == sentences
        assert reply.json()["translatedText"] == text.upper()  # CRLF, tabs, spaces as sent
        form = client.post("/translate", data=body)  # a browser's form: its CRLF read as LF
        assert form.json()["translatedText"] == text.upper().replace("\r\n", "\n")


def test_a_repeated_line_comes_from_the_cache_counted_in_metrics(multi_served_cached):
    client, engine = multi_served_cached
    body = {"q": "Ein Mann fährt Rad. Ein Hund schläft.", "source": "de", "target": "en"}
    first = client.post("/translate", json=body)
    calls = len(engine.calls)
    again = client.post("/translate", json=body)
    assert again.json() == first.json() and len(engine.calls) == calls  # no decoding
    other = client.post("/translate", json={**body, "alternatives": 1})  # other settings: a miss
    assert other.status_code == 200 and len(engine.calls) == calls + 1
    metrics = client.get("/metrics").text
    assert "mt_translation_cache_hits_total 2.0" in metrics
    assert "mt_translation_cache_misses_total 4.0" in metrics
    # One sentence in the cache of 3: the least recently used goes first
    client.post("/translate", json={**body, "q": "Drei. Vier. Fünf."})
    client.post("/translate", json=body)
    assert len(engine.calls) == calls + 3


@pytest.fixture
def multi_served_cached():
    engine = Multi()
    app = create_app(engine, LIMITS, settings=ServeSettings(cache_lines=3))
    with running(app) as url, httpx.Client(base_url=url, timeout=30) as c:
        yield c, engine


@pytest.mark.parametrize(
    ("body", "error", "detail"),
    [
        ({"q": "a", "source": "fr", "target": "de"}, "de is not supported", "de -> en"),
        ({"q": "a", "source": "xx", "target": "en"}, "xx is not supported", "fr -> en"),
        (
            {"q": "a", "source": "de", "target": "en", "format": "xml"},
            "xml format is not supported",
            "text or html",
        ),
        (
            {"q": "a", "source": "de", "target": "en", "alternatives": 9},
            "Invalid request: alternatives parameter must be <= 5",
            "max_beam (6) - 1",
        ),
    ],
)
def test_libretranslates_error_texts_word_for_word_and_ours_apart(
    multi_served, body, error, detail
):
    client, _ = multi_served
    reply = client.post("/translate", json=body)
    assert reply.status_code == 400
    assert reply.json()["error"] == error and detail in reply.json()["detail"]


def test_a_pair_the_model_lacks_is_named_as_libretranslate_names_it():
    class OneWay(Multi):
        def __init__(self) -> None:
            super().__init__()
            self.pairs = [("de", "en"), ("en", "fr")]

    with running(create_app(OneWay(), LIMITS)) as url, httpx.Client(base_url=url) as client:
        reply = client.post("/translate", json={"q": "a", "source": "de", "target": "fr"})
    assert (
        reply.json()["error"]
        == "French (fr) is not available as a target language from German (de)"
    )


# --- HTML bodies and documents: their segments split into sentences, as `mt translate` does ---


def _library_html(engine, html: str) -> str:
    """``html`` translated by the library's document path (``mt translate`` on a document)."""
    from transformer_mt.documents.document import html_document
    from transformer_mt.documents.translate import translate_document

    return translate_document(engine, html_document(html), engine.decode).decode("utf-8")


def _untagged(html: str) -> str:
    import re

    return re.sub(r"<[^>]*>", "", html)


@pytest.mark.parametrize(
    ("html", "first", "second", "marked"),
    [
        (
            "<p>First sentence. <b>Second</b> sentence here.</p>",
            "First sentence.",
            "Second sentence here.",
            "Second",
        ),
        (
            "<p>The light friend saw the blue letter.\n   The <b>friend</b> closed the woman.</p>",
            "The light friend saw the blue letter.",
            "The friend closed the woman.",
            "friend",
        ),
    ],
)
def test_an_html_body_is_translated_sentence_by_sentence_as_mt_translate_does(
    torch_served, html, first, second, marked
):
    client, engine = torch_served
    body = {"q": html, "source": "src", "target": "trg", "format": "html"}
    reply = client.post("/translate", json=body)
    assert reply.status_code == 200, reply.text
    translated = reply.json()["translatedText"]
    assert translated == _library_html(engine, html)  # byte for byte, spacing included
    alone = [r.text for r in engine.translate([first, second], engine.decode)]
    whole = engine.translate([f"{first} {second}"], engine.decode)[0].text
    assert _untagged(translated) == f"{alone[0]} {alone[1]}" != whole
    # The <b> of the second sentence's word lands on the second sentence's translation.
    assert translated.startswith(f"<p>{alone[0]} ") and translated.endswith("</p>")
    bold = translated[translated.index("<b>") + 3 : translated.index("</b>")]
    assert bold and bold in alone[1] and bold not in alone[0]


def test_html_sentences_count_against_the_request_limits(torch_served):
    client, _ = torch_served
    many = " ".join(["The friend closed the woman."] * (LIMITS.max_lines + 1))
    body = {"q": f"<p>{many}</p>", "source": "src", "target": "trg", "format": "html"}
    reply = client.post("/translate", json=body)
    assert reply.status_code == 413
    assert reply.json()["error"] == (
        f"q sentences: {LIMITS.max_lines + 1} lines exceed max_lines={LIMITS.max_lines} per request"
    )


@pytest.mark.parametrize(
    ("name", "data"),
    [
        (
            "letter.txt",
            b"The light friend saw the blue letter.  The friend closed the woman.\n\n"
            b"The friend closed the woman.\n",
        ),
        (
            "page.html",
            b"<html><body><p>The light friend saw the blue letter. The <b>friend</b> closed "
            b"the woman.</p><p>The friend closed the woman.</p></body></html>",
        ),
    ],
)
def test_an_uploaded_document_is_translated_sentence_by_sentence(torch_served, name, data):
    from transformer_mt.documents.document import read_document
    from transformer_mt.documents.translate import translate_document

    client, engine = torch_served
    fields = {"source": "src", "target": "trg"}
    reply = client.post("/translate_file", data=fields, files={"file": (name, data)})
    assert reply.status_code == 200, reply.text
    download = client.get(reply.json()["translatedFileUrl"])
    assert download.status_code == 200
    document = read_document(data, Path(name).suffix, name)
    assert download.content == translate_document(engine, document, engine.decode)
    first, second = "The light friend saw the blue letter.", "The friend closed the woman."
    alone = [r.text for r in engine.translate([first, second], engine.decode)]
    assert f"{alone[0]} {alone[1]}" in _untagged(download.content.decode("utf-8"))


def test_an_uploaded_document_holds_a_named_glossary(torch_served):
    from transformer_mt.documents.document import read_document
    from transformer_mt.documents.translate import translate_document
    from transformer_mt.text.glossary import Entry, Glossary

    client, engine = torch_served
    line = "The horse pulls the mouse on a cup although the doctor watches a cold bird."
    data = f"<p>{line} The friend closed the woman.</p>".encode()
    fields = {"source": "src", "target": "trg", "glossary": "animals"}
    reply = client.post("/translate_file", data=fields, files={"file": ("page.html", data)})
    assert reply.status_code == 200, reply.text
    translated = client.get(reply.json()["translatedFileUrl"]).content
    assert translated.decode().count(TERM) == 1, translated
    document = read_document(data, ".html", "page.html")
    glossary = Glossary([Entry("horse", TERM)])
    assert translated == translate_document(engine, document, engine.decode, glossary=glossary)
    fields["glossary"] = "plants"
    unknown = client.post("/translate_file", data=fields, files={"file": ("page.html", data)})
    assert unknown.status_code == 400 and "no glossary named 'plants'" in unknown.json()["error"]


def test_html_with_source_auto_splits_each_fragment_by_its_own_language(multi_served):
    client, engine = multi_served
    # German rules read "19." and "3." as ordinals; French ones cut after "3.".
    html = [
        "<p>Er kam am 19. Mai. Dann ging er.</p>",
        "<p>Il a lu le chapitre 3. Puis il est parti.</p>",
    ]
    body = {"q": html, "source": "auto", "target": "en", "format": "html"}
    reply = client.post("/translate", json=body)
    assert reply.status_code == 200, reply.text
    assert engine.calls[-1] == [
        "Er kam am 19. Mai.",
        "Dann ging er.",
        "Il a lu le chapitre 3.",
        "Puis il est parti.",
    ]
    assert reply.json()["translatedText"] == [
        "<p>ER KAM AM 19. MAI. DANN GING ER.</p>",
        "<p>IL A LU LE CHAPITRE 3. PUIS IL EST PARTI.</p>",
    ]
    assert [d["language"] for d in reply.json()["detectedLanguage"]] == ["de", "fr"]


def test_a_document_with_source_auto_is_split_by_its_detected_language(multi_served):
    client, engine = multi_served
    # French rules cut after "3."; German ones, the model's first source, read an ordinal.
    data = "Il a lu le chapitre 3. Puis il est parti.\n\nLa maison est très belle.\n".encode()
    fields = {"source": "auto", "target": "en"}
    reply = client.post("/translate_file", data=fields, files={"file": ("lettre.txt", data)})
    assert reply.status_code == 200, reply.text
    assert engine.calls[-1] == [
        "Il a lu le chapitre 3.",
        "Puis il est parti.",
        "La maison est très belle.",
    ]
    download = client.get(reply.json()["translatedFileUrl"])
    assert download.content == data.decode().upper().encode()


def test_protect_and_glossary_need_an_engine_with_a_constrained_search(multi_served):
    client, engine = multi_served  # its engine is no torch engine (as a CTranslate2 export)
    body = {"q": "Ein Hund.", "source": "de", "target": "en"}
    calls = len(engine.calls)
    for field, value in (("protect", True), ("glossary", {"Hund": "puppy"})):
        reply = client.post("/translate", json={**body, field: value})
        assert reply.status_code == 400
        assert reply.json()["error"] == (
            f"Invalid request: {field} needs a constrained search, which this server's fake "
            "engine lacks (serve the checkpoint with --engine torch)"
        )
    assert len(engine.calls) == calls  # refused before any decoding


@pytest.mark.parametrize(
    ("glossary", "error"),
    [
        ({"Hund": "a\nb"}, "the target term 'a\\nb' has a control character or line break"),
        ({"   ": "puppy"}, "empty source term ('' -> 'puppy'); give both terms"),
        (
            {"Hund": "puppy", "-" * 101: "x"},
            f"the source term {'-' * 30!r}... is 101 characters, more than 100",
        ),
    ],
)
def test_a_request_glossary_is_checked_as_a_glossary_file_is(multi_served, glossary, error):
    client, engine = multi_served
    calls = len(engine.calls)
    body = {"q": "Ein Hund.", "source": "de", "target": "en", "glossary": glossary}
    reply = client.post("/translate", json=body)
    assert reply.status_code == 400
    assert reply.json()["error"].startswith(f"Invalid request: glossary: {error}")
    assert len(engine.calls) == calls


def test_a_request_glossary_drops_the_whitespace_around_its_terms(torch_served):
    client, engine = torch_served
    line = "The horse pulls the mouse on a cup although the doctor watches a cold bird."
    body = {"q": line, "source": "src", "target": "trg", "glossary": {" horse ": f" {TERM}\t"}}
    reply = client.post("/translate", json=body)
    assert reply.status_code == 200, reply.text
    extras = TranslateExtras(terms=[[TERM]])
    held = engine.translate([line], engine.decode, extras=extras)[0].text
    assert reply.json()["translatedText"] == held and TERM in held


def test_a_request_glossary_holds_at_most_1000_terms():
    from dataclasses import replace

    engine = Multi()
    app = create_app(engine, replace(LIMITS, max_body_bytes=64 * 1024))
    body = {"q": "Ein Hund.", "source": "de", "target": "en"}
    with running(app) as url, httpx.Client(base_url=url, timeout=30) as client:
        for count in (1000, 1001):
            glossary = {f"Hund{i}": "puppy" for i in range(count)}
            reply = client.post("/translate", json={**body, "glossary": glossary})
            if count == 1000:  # refused by the fake engine alone, as any glossary
                assert "needs a constrained search" in reply.json()["error"]
            else:
                assert reply.status_code == 400
                assert reply.json()["error"] == (
                    "Invalid request: glossary: 1001 terms, more than 1000 in a request; give a "
                    "big glossary to the server (mt serve --glossary NAME=FILE) and name it"
                )


def test_texts_too_big_for_the_limits_are_refused_before_they_are_split():
    import dataclasses

    from transformer_mt.serve.routes_libre import INLINE_SPLIT_CHARS

    engine = Multi(("en",))
    limits = dataclasses.replace(LIMITS, max_body_bytes=1 << 20, max_lines=400)
    with running(create_app(engine, limits)) as url, httpx.Client(base_url=url, timeout=60) as c:
        # sentencex alone took minutes on 990 KB of this, the event loop blocked
        body = {"q": ['!"' * 100_000, " \n "], "source": "en", "target": "en"}
        reply = c.post("/translate", json=body)
        assert reply.status_code == 413
        assert reply.json()["error"] == (
            f"q: 200000 characters besides whitespace exceed max_lines={limits.max_lines} "
            f"sentences of max_chars={limits.max_chars} per request"
        )
        assert engine.calls == []
        # within the bound: split as before (in a parsing process, the text not being small)
        sentence = "Ein" + " sehr" * 55 + " langer Satz."
        fits = " \u3000".join([sentence] * limits.max_lines)
        assert len(fits) > INLINE_SPLIT_CHARS and len(sentence) <= limits.max_chars
        reply = c.post("/translate", json={"q": fits, "source": "en", "target": "en"})
        assert reply.status_code == 200, reply.text
        assert engine.calls[-1] == [sentence] * limits.max_lines
        assert reply.json()["translatedText"] == fits.upper()


def test_a_text_sentencex_panics_on_is_translated():
    engine = Multi(("en",))
    with running(create_app(engine, LIMITS)) as url, httpx.Client(base_url=url, timeout=60) as c:
        reply = c.post(
            "/translate", json={"q": "Type A\u00a0. Next one.", "source": "en", "target": "en"}
        )
        assert reply.status_code == 200, reply.text
        assert engine.calls[-1] == ["Type A\u00a0.", "Next one."]
