"""Pasted text through an engine: paragraphs cut into sentences and joined back, glossaries kept,
source languages detected (`mt translate --source-lang auto`)."""

import dataclasses
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from transformer_mt.cli import app
from transformer_mt.engines.engine import load_engine
from transformer_mt.engines.options import TranslateExtras
from transformer_mt.engines.paragraphs import split_lines, translate_split
from transformer_mt.engines.results import LineResult
from transformer_mt.text.glossary import Entry, Glossary

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "old_checkpoint"
CKPT = FIXTURE / "old_last.pt"
runner = CliRunner()


@pytest.fixture(scope="module")
def engine():
    return load_engine("torch", CKPT)


class _Recorder:
    """An engine stand-in: each sentence's translation is its upper case; the calls are kept."""

    pairs = (("en", "de"),)
    src_lang = "en"

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def translate(self, lines, decode, stop=None, target=None, extras=None):
        self.calls.append(list(lines))
        return [LineResult(s.upper(), -1.0, [(s.upper(), -1.0), (s.lower(), -2.0)]) for s in lines]


def test_a_paragraph_is_translated_a_sentence_at_a_time_and_joined_with_its_own_spacing(engine):
    """Between sentences, spaces, line breaks and empty lines come back byte for byte; every
    line's sentences go to the engine in one call (batched together)."""
    recorder = _Recorder()
    lines = [
        "Dr. Smith came home.  He was tired!\n\nThen he slept.",
        "   ",
        "One sentence",
        "Er kam z. B. am 19. Mai. Dann ging er.",
    ]
    decode = engine.run_decode.__class__(nbest=2, beam_size=2)
    extras = TranslateExtras(split=True, source_lang="en")
    results = translate_split(recorder, lines, decode, None, None, extras)  # type: ignore[arg-type]
    assert len(recorder.calls) == 1
    assert recorder.calls[0][:3] == ["Dr. Smith came home.", "He was tired!", "Then he slept."]
    assert results[0].text == "DR. SMITH CAME HOME.  HE WAS TIRED!\n\nTHEN HE SLEPT."
    assert results[0].nbest[1] == ("dr. smith came home.  he was tired!\n\nthen he slept.", -2.0)
    assert results[1].text == ""  # a line of spaces: the line contract's empty line
    assert results[2].text == "ONE SENTENCE"
    assert [len(s.sentences) for s in split_lines(lines[3:], ["de"]).splits] == [2]


def test_split_equals_the_sentences_translated_one_by_one_and_joined(engine):
    """The model's own check: a line of two sentences gives what each gives alone."""
    first, second = "The light friend saw the blue letter.", "The friend closed the woman."
    decode = engine.run_decode
    alone = engine.translate([first, second], decode)
    together = engine.translate([f"{first} {second}"], decode, extras=TranslateExtras(split=True))
    assert together[0].text == f"{alone[0].text} {alone[1].text}"
    unsplit = engine.translate([f"{first} {second}"], decode)
    assert unsplit[0].text != together[0].text  # one segment: another translation


def test_mt_translate_splits_by_default_and_no_split_keeps_one_segment(tmp_path, engine):
    src = tmp_path / "in.txt"
    src.write_text("The light friend saw the blue letter. The friend closed the woman.\n")
    base = ["translate", "-c", str(CKPT), "-i", str(src), "--beam", "1"]
    split = runner.invoke(app, base)
    whole = runner.invoke(app, [*base, "--no-split"])
    assert split.exit_code == 0 and whole.exit_code == 0, split.output + whole.output
    decode = engine.run_decode.__class__(beam_size=1)
    sentences = src.read_text().strip().split(". ")
    alone = engine.translate([sentences[0] + ".", sentences[1]], decode)
    assert split.stdout == f"{alone[0].text} {alone[1].text}\n"
    assert whole.stdout == engine.translate([src.read_text().strip()], decode)[0].text + "\n"


def test_a_glossary_term_comes_out_as_the_glossary_says(tmp_path, engine):
    line = "The horse pulls the mouse on a cup although the doctor watches a cold bird."
    decode = engine.run_decode
    plain = engine.translate([line], decode)[0].text
    term = "trumenaul"  # a target word the model knows, not in the plain translation
    assert term not in plain
    glossary = Glossary([Entry("horse", term)])
    kept = engine.translate([line], decode, extras=TranslateExtras(glossary=glossary))[0].text
    assert term in kept  # its pieces, from a word start (the word may go on: "trumenaulen")
    other = "The friend closed the woman."  # no source term: unconstrained, unchanged
    with_glossary = engine.translate([other], decode, extras=TranslateExtras(glossary=glossary))
    assert with_glossary[0].text == engine.translate([other], decode)[0].text
    terms = tmp_path / "terms.tsv"
    terms.write_text(f"# source\ttarget\nhorse\t{term}\n")
    src = tmp_path / "in.txt"
    src.write_text(line + "\n")
    result = runner.invoke(
        app, ["translate", "-c", str(CKPT), "-i", str(src), "--glossary", str(terms)]
    )
    assert result.exit_code == 0, result.output
    assert term in result.stdout


def test_a_glossary_holds_in_each_sentence_of_a_document(tmp_path, engine):
    line = "The horse pulls the mouse on a cup although the doctor watches a cold bird."
    term = "trumenaul"
    page = tmp_path / "page.html"
    page.write_text(f"<p>{line} The friend closed the woman.</p><p>A <i>horse</i> ran.</p>")
    terms = tmp_path / "terms.tsv"
    terms.write_text(f"horse\t{term}\n")
    out = tmp_path / "page.en.html"
    base = ["translate", "-c", str(CKPT), "-i", str(page), "-o", str(out)]
    plain = runner.invoke(app, base)
    assert plain.exit_code == 0, plain.output
    assert term not in out.read_text()
    kept = runner.invoke(app, [*base, "--glossary", str(terms)])
    assert kept.exit_code == 0, kept.output
    assert out.read_text().count(term) == 2, out.read_text()
    refused = runner.invoke(app, [*base, "--protect"])
    assert refused.exit_code == 1 and "--protect is for lines of text" in refused.output
    same = runner.invoke(app, ["translate", "-c", str(CKPT), "-i", str(page), "-o", str(terms),
                               "--glossary", str(terms)])  # fmt: skip
    assert same.exit_code == 1 and terms.read_text() == f"horse\t{term}\n"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("horse\n", "terms.tsv:1"),
        ("horse\tone\nhorse\ttwo\n", "terms.tsv:2"),
        ("\tone\n", "terms.tsv:1"),
    ],
)
def test_a_bad_glossary_is_one_line_naming_its_line(tmp_path, content, message):
    terms = tmp_path / "terms.tsv"
    terms.write_text(content)
    src = tmp_path / "in.txt"
    src.write_text("The horse.\n")
    out = tmp_path / "out.txt"
    args = ["translate", "-c", str(CKPT), "-i", str(src), "-o", str(out), "--glossary", str(terms)]
    result = runner.invoke(app, args)
    assert result.exit_code == 1 and message in result.output
    assert len(result.output.strip().splitlines()) == 1 and not out.exists()


def test_a_glossary_needs_a_beam_and_the_torch_engine(tmp_path):
    terms = tmp_path / "terms.tsv"
    terms.write_text("horse\ttrumenaul\n")
    src = tmp_path / "in.txt"
    src.write_text("The horse pulls the mouse.\n")
    base = ["translate", "-c", str(CKPT), "-i", str(src), "--glossary", str(terms)]
    greedy = runner.invoke(app, [*base, "--beam", "1"])
    assert greedy.exit_code == 1 and "beam" in greedy.output
    ct2 = runner.invoke(app, [*base, "--engine", "ct2"])
    assert ct2.exit_code == 1 and "--glossary needs --engine torch" in ct2.output


def test_source_lang_auto_picks_each_lines_rules_among_the_models_languages():
    pytest.importorskip("py3langid", reason="the text extra (py3langid) is not installed")
    from transformer_mt.engines.paragraphs import line_languages

    class Multi:
        pairs = (("de", "en"), ("fr", "en"), ("cs", "en"))
        src_lang = "de"

    lines = [
        "Ein Mann fährt mit dem Fahrrad durch die Stadt.",
        "Un homme fait du vélo dans la ville.",
        "Muž jede na kole městem.",
        "ok",
    ]
    assert line_languages(Multi(), lines, "auto") == ["de", "fr", "cs", "de"]  # type: ignore[arg-type]
    assert line_languages(Multi(), lines, None) == ["de"] * 4  # type: ignore[arg-type]


def test_attention_alone_no_longer_stops_splitting_but_per_line_extras_do():
    """A document's segments ask for attention and are split (their sentences' matrices are
    joined: tests/test_document_text.py); what is asked per line still keeps a line whole."""
    assert TranslateExtras(split=True).splits(attention=True)
    assert TranslateExtras(split=True).splits(attention=False)
    assert not TranslateExtras().splits(attention=True)
    per_line = [
        {"prefixes": ["Die"]},
        {"alignments": True},
        {"attention_dir": Path("pictures")},
        {"terms": [["Haus"]]},
    ]
    for asked in per_line:
        for attention in (False, True):
            assert not TranslateExtras(split=True, **asked).splits(attention)  # type: ignore[arg-type]


def test_source_lang_is_auto_or_a_language_code(tmp_path, engine):
    """A code the splitting rules cannot know is one line naming --source-lang, before the model
    loads; auto, ISO 639 codes (with a region or script) and the model's own code are taken."""
    src = tmp_path / "in.txt"
    src.write_text("The light friend saw the blue letter. The friend closed the woman.\n")
    base = ["translate", "-c", str(CKPT), "-i", str(src), "--beam", "1"]
    for code in ("xx", "english", "e", "en-", "de DE"):
        result = runner.invoke(app, [*base, "--source-lang", code])
        assert result.exit_code == 1, (code, result.output)
        (line,) = result.output.strip().splitlines()
        assert line.startswith(f"error: --source-lang {code!r}: not a language code"), line
    english = runner.invoke(app, [*base, "--source-lang", "en"])
    assert english.exit_code == 0, english.output
    for code in ("en-GB", "pt_BR", "zh-Hant", "yue", engine.src_lang):
        result = runner.invoke(app, [*base, "--source-lang", code])
        assert result.exit_code == 0, (code, result.output)


def test_evaluate_translates_a_line_of_two_sentences_as_one_segment(tmp_path, engine):
    """`mt evaluate` scores line against line: a source line of two sentences is translated
    whole, as training's validation translates it (not cut as `mt translate` cuts it)."""
    first, second = "The light friend saw the blue letter.", "The friend closed the woman."
    lines = [f"{first} {second}", "The horse pulls the mouse."]
    decode = dataclasses.replace(engine.run_decode, beam_size=1)  # as `--beam 1` changes it
    whole = [result.text for result in engine.translate(lines, decode)]
    split = engine.translate(lines[:1], decode, extras=TranslateExtras(split=True))[0].text
    assert split != whole[0]  # the two ways differ on this line
    src, ref = tmp_path / "src.txt", tmp_path / "ref.txt"
    src.write_text("".join(line + "\n" for line in lines))
    ref.write_text("".join(text + "\n" for text in whole))
    args = ["evaluate", "-c", str(CKPT), "--src", str(src), "--ref", str(ref), "--beam", "1"]
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    scores = json.loads(result.stdout)
    assert scores["bleu"] == pytest.approx(100) and scores["chrf"] == pytest.approx(100)


@pytest.mark.parametrize(
    ("line", "terms", "beam", "nbest"),
    [
        ("A clean wall runs.", ["zoskas", "kraskigaul", "brimail"], 3, 3),  # alternatives=2
        ("The horse pulls the mouse.", ["trumenaul"], 4, 3),
    ],
)
def test_every_alternative_holds_every_term(engine, line, terms, beam, nbest):
    """Each of the n-best holds every term: on these lines the search cut every hypothesis at
    its budget, and once returned one cut without a term among them."""
    decode = dataclasses.replace(engine.run_decode, beam_size=beam, nbest=nbest)
    (result,) = engine.translate([line], decode, extras=TranslateExtras(terms=[terms]))
    assert len(result.nbest) == nbest
    for text, _ in result.nbest:
        assert all(term in text for term in terms), (text, terms)


def test_terms_with_no_room_are_refused_before_any_search(engine):
    """Terms longer than the model's 64 target positions can hold, alone or together, are a
    one-line MTError naming the line and the term (what the server answers with a 400)."""
    from transformer_mt.errors import MTError

    line = "The horse pulls the mouse."
    huge = [chr(65 + i) * 2000 for i in range(5)]
    with pytest.raises(MTError, match=r"line 1: the term 'A{40}…' has \d+ target pieces, and a "
                       r"translation of this line has room for 63") as caught:  # fmt: skip
        engine.translate([line] * 8, engine.run_decode, extras=TranslateExtras(terms=[huge] * 8))
    assert "\n" not in str(caught.value)
    many = [["zoskas"] * 10]  # 7 pieces each
    with pytest.raises(MTError, match=r"the line's terms up to 'zoskas' have 70 target pieces"):
        engine.translate([line], engine.run_decode, extras=TranslateExtras(terms=many))


def test_a_paragraph_has_as_many_alternatives_as_its_sentence_with_the_most():
    from transformer_mt.engines.paragraphs import split_lines
    from transformer_mt.engines.results import LineResult

    paragraphs = split_lines(["One here. Two there."], ["en"])
    one = LineResult("A.", -1.0, [("A.", -1.0)])  # a constrained search kept one
    two = LineResult("B.", -1.0, [("B.", -1.0), ("C.", -3.0)])
    one.logprobs, two.logprobs = [(-2.0, 2)], [(-2.0, 2), (-6.0, 2)]
    (joined,) = paragraphs.join([one, two], 3, outer=True)
    assert joined.nbest == [("A. B.", -1.0), ("A. C.", -2.0)]  # not "A. C." twice
    assert joined.logprobs == [(-4.0, 4), (-8.0, 4)]
    (both,) = paragraphs.join([one, dataclasses.replace(two, nbest=two.nbest[:1])], 3, outer=True)
    assert both.nbest == [("A. B.", -1.0)]
