"""Do-not-translate spans through an engine (`--protect`, the server's `protect` field), and
terms the target vocabulary cannot spell: URLs, e-mail addresses, numbers and marked text come
back verbatim, and a term ends a word."""

import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from transformer_mt.cli import app
from transformer_mt.decoding.text import respelled
from transformer_mt.engines.engine import load_engine
from transformer_mt.engines.options import TranslateExtras
from transformer_mt.engines.paragraphs import split_lines
from transformer_mt.text.glossary import Entry, Glossary
from transformer_mt.text.protect import as_constraints, find_protected

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "old_checkpoint"
CKPT = FIXTURE / "old_last.pt"
runner = CliRunner()
LINE = "The horse pulls the mouse at https://a.io/x_y?z=1 and bob@b.de, at 12:30."
SPANS = ("https://a.io/x_y?z=1", "bob@b.de", "12:30")


@pytest.fixture(scope="module")
def engine():
    return load_engine("torch", CKPT)


def test_the_fixture_model_cannot_write_the_spans_unaided(engine):
    tok = engine.trg_tok
    for span in SPANS:  # its vocabulary lacks their characters: its pieces misspell each
        assert tok.decode(tok.encode(span)) != span
    plain = engine.translate([LINE], engine.run_decode)[0].text
    assert not any(span in plain for span in SPANS)


def test_protected_spans_come_back_verbatim_in_every_hypothesis(engine):
    decode = engine.run_decode.__class__(**{**vars(engine.run_decode), "nbest": 2})
    [result] = engine.translate([LINE], decode, extras=TranslateExtras(protect=True))
    for text, _ in result.nbest:
        for span in SPANS:
            assert text.count(span) == 1, (span, text)


def test_marked_text_is_kept_and_its_marks_dropped(engine):
    line = "Open <keep>trumenaul</keep> now the horse."
    plain = engine.translate(["Open trumenaul now the horse."], engine.run_decode)[0].text
    assert "trumenaul" not in plain  # a source word: the model translates it
    kept = engine.translate([line], engine.run_decode, extras=TranslateExtras(protect=True))
    assert "trumenaul" in kept[0].text and "keep" not in kept[0].text


def test_a_line_without_spans_translates_as_without_protect(engine):
    lines = ["The friend closed the woman.", "The light friend saw the blue letter."]
    plain = [r.text for r in engine.translate(lines, engine.run_decode)]
    kept = engine.translate(lines, engine.run_decode, extras=TranslateExtras(protect=True))
    assert [r.text for r in kept] == plain


def test_protect_with_split_keeps_each_sentences_spans(engine):
    text = "The horse runs at 12:30. The mouse writes to bob@b.de now."
    extras = TranslateExtras(protect=True, split=True)
    [result] = engine.translate([text], engine.run_decode, extras=extras)
    assert result.text.count("12:30") == 1 and result.text.count("bob@b.de") == 1


def test_a_glossary_term_the_vocabulary_cannot_spell_comes_out_as_given(engine):
    line = "The horse pulls the mouse on a cup although the doctor watches a cold bird."
    glossary = Glossary([Entry("horse", "trumenaul@x.de")])
    [result] = engine.translate(
        [line], engine.run_decode, extras=TranslateExtras(glossary=glossary)
    )
    assert "trumenaul@x.de" in result.text


class _Pieces:
    """Stands for a sentencepiece model over a few pieces ("▁" starts a word)."""

    PIECES = ("<pad>", "<unk>", "<s>", "</s>", "\u2581a", "\u2581b", "c", ".", "\u2581")

    def id_to_piece(self, ids):
        return [self.PIECES[i] for i in ids]

    def decode(self, ids):
        pieces = [self.PIECES[i].replace("<unk>", " \u2047 ") for i in ids if i != 0]
        return "".join(pieces).replace("\u2581", " ").strip()


@pytest.mark.parametrize(
    ("tokens", "respell", "want"),
    [
        ([4, 8, 1, 6, 7], [([8, 1, 6], "@c")], "a @c."),  # followed by punctuation: no space
        ([8, 1, 6, 5], [([8, 1, 6], "@c")], "@c b"),  # at the start, a word after it
        ([4, 8, 1, 5, 8, 1], [([8, 1], "x@"), ([8, 1], "y@")], "a x@ b y@"),  # in order
        ([4, 5], [([8, 1], "@")], "a b"),  # not there (an unfinished hypothesis): as it reads
    ],
)
def test_respelled_puts_each_term_where_its_pieces_are(tokens, respell, want):
    assert respelled(_Pieces(), tokens, respell) == want


def test_mt_translate_protect_and_its_refusals(tmp_path):
    src = tmp_path / "in.txt"
    src.write_text(LINE + "\n")
    result = runner.invoke(app, ["translate", "-c", str(CKPT), "-i", str(src), "--protect"])
    assert result.exit_code == 0, result.output
    assert all(span in result.stdout for span in SPANS)
    greedy = runner.invoke(
        app, ["translate", "-c", str(CKPT), "-i", str(src), "--protect", "--beam", "1"]
    )
    assert greedy.exit_code == 1 and "beam" in greedy.output
    ct2 = runner.invoke(
        app, ["translate", "-c", str(CKPT), "-i", str(src), "--protect", "--engine", "ct2"]
    )
    assert ct2.exit_code == 1 and "--protect needs --engine torch" in ct2.output


def test_a_marked_span_with_sentence_ends_stays_one_sentence(engine):
    text = "The horse <keep>runs. The mouse</keep> writes. The friend closed the woman."
    extras = TranslateExtras(protect=True, split=True)
    [result] = engine.translate([text], engine.run_decode, extras=extras)
    assert result.text.count("runs. The mouse") == 1 and "keep" not in result.text


def test_glossary_terms_are_found_in_the_text_without_marks(engine):
    glossary = Glossary([Entry("horse", "trumenaul")])
    extras = TranslateExtras(protect=True, glossary=glossary)
    lines, constrained = extras.constrained(["The <keep>horse</keep> pulls the mouse at 12:30."])
    assert lines == ["The horse pulls the mouse at 12:30."]
    assert constrained.terms == [["horse", "12:30"]]  # the user keeps "horse": not translated
    lines, constrained = extras.constrained(["The horse pulls the mouse at 12:30."])
    assert constrained.terms == [["trumenaul", "12:30"]]


@pytest.mark.parametrize(
    ("text", "spans"),
    [
        ("见https://example.com。谢谢", [("url", "https://example.com")]),
        ("网址：https://example.com，谢谢", [("url", "https://example.com")]),
        ("（https://example.com）", [("url", "https://example.com")]),
        ("「www.example.com/a」を見て", [("url", "www.example.com/a")]),
        ("https://example.com에서 보세요", [("url", "https://example.com")]),
        ("联系a@b.com。", [("email", "a@b.com")]),
        ("邮箱bob.smith+x@mail.example.co.uk谢谢", [("email", "bob.smith+x@mail.example.co.uk")]),
        ("See https://en.wikipedia.org/wiki/Foo_(bar).", [("url", "https://en.wikipedia.org/wiki/Foo_(bar)")]),
        ("Write to 'bob@b.de' or a@www.example.com.", [("email", "bob@b.de"), ("email", "a@www.example.com")]),
        ("xhttps://example.com", []),
    ],
)  # fmt: skip
def test_links_and_addresses_end_where_chinese_japanese_or_korean_text_begins(text, spans):
    assert [(s.kind, s.text) for s in find_protected(text, ("url", "email"))] == spans


def test_a_split_never_cuts_a_marked_span_and_leaves_unpaired_marks_as_text():
    def sentences(text: str) -> list[str]:
        [split] = split_lines([text], ["en"], marks=True).splits
        assert split.join(split.sentences) == text
        return split.sentences

    friend = "The friend closed the woman."
    assert sentences(f"Use <keep>the horse. {friend} {friend}") == [
        "Use <keep>the horse.",  # never closed: text like any other
        friend,
        friend,
    ]
    assert sentences("A </keep> b. <keep>c. d</keep> e. f.") == [
        "A </keep> b. <keep>c. d</keep> e. f."
    ]
    assert sentences("Hi. </keep> Yes. <keep>No. Ok.</keep> Go. <keep>Stop.") == [
        "Hi.",
        "</keep> Yes.",
        "<keep>No. Ok.</keep> Go.",
        "<keep>Stop.",
    ]
    # each sentence's marks pair up as the line's do: what the model reads keeps the stray one
    text, spans = as_constraints("A </keep> b. <keep>c. d</keep> e. f.")
    assert text == "A </keep> b. c. d e. f." and [s.text for s in spans] == ["c. d"]


def test_marked_spans_are_kept_whole_in_time_linear_in_the_text():
    text = "<keep>" + "The friend closed the woman. " * 40_000  # took 2.7 s at 16,000 sentences
    t0 = time.perf_counter()
    assert len(split_lines([text], ["en"], marks=True).sentences) == 40_000
    closed = "It is <keep>Save. Quit.</keep> here. " * 20_000
    assert len(split_lines([closed], ["en"], marks=True).sentences) == 20_000
    assert time.perf_counter() - t0 < 3


def test_an_unclosed_mark_does_not_swallow_the_sentences_after_it(engine):
    friend = "The friend closed the woman."
    text = "Use <keep>the horse. " + f"{friend} " * 6
    [alone] = engine.translate([friend], engine.run_decode)
    extras = TranslateExtras(protect=True, split=True)
    [result] = engine.translate([text], engine.run_decode, extras=extras)
    assert result.text.count(alone.text) == 6
