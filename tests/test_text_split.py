"""Sentence splitting of pasted text: sentences in several scripts, whitespace byte for byte."""

import gzip
import random
import subprocess
import sys
import time
from unittest.mock import patch

import pytest
from conftest import shared_multi30k
from hypothesis import given, settings
from hypothesis import strategies as st

from transformer_mt.errors import MTError
from transformer_mt.text import split as split_module
from transformer_mt.text.split import SplitText, generic_pieces, split_text

LINE_BREAKS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"


def check_contract(text: str, result: SplitText) -> None:
    """The module's contract: join gives the text back; sentences are stripped, one line each."""
    assert result.join(result.sentences) == text
    assert len(result.separators) == len(result.sentences) + 1
    for sentence in result.sentences:
        assert sentence and sentence == sentence.strip()
        assert not any(ch in LINE_BREAKS for ch in sentence)
    for separator in result.separators:
        assert separator == "" or separator.isspace()


@pytest.mark.parametrize(
    ("lang", "text", "expected"),
    [
        (
            "en",
            "Dr. Smith arrived at 3.5 p.m. yesterday. He was late! Was he? Yes.",
            ["Dr. Smith arrived at 3.5 p.m. yesterday.", "He was late!", "Was he?", "Yes."],
        ),
        (
            "de",
            "Das ist z. B. ein Test. Er kam am 3. Oktober usw. und blieb. Im 19. Jahrhundert nicht.",
            ["Das ist z. B. ein Test.", "Er kam am 3. Oktober usw. und blieb.", "Im 19. Jahrhundert nicht."],
        ),
        (
            "fr",
            "M. Dupont est arrivé à 15 h. Il était en retard. Vraiment ! Tu viens ?",
            ["M. Dupont est arrivé à 15 h.", "Il était en retard.", "Vraiment !", "Tu viens ?"],
        ),
        (
            "cs",
            "Přišel MUDr. Novák. Stalo se to 5. května 2020. Např. jablka a hrušky. Konec.",
            ["Přišel MUDr. Novák.", "Stalo se to 5. května 2020.", "Např. jablka a hrušky.", "Konec."],
        ),
        ("zh", "我今天很忙。你呢？我们明天见！", ["我今天很忙。", "你呢？", "我们明天见！"]),
        ("zh-Hans", "他说：“你好。”然后走了。", ["他说：“你好。”", "然后走了。"]),
        (
            "ja",
            "今日は晴れです。明日は雨でしょうか？彼は「はい。」と答えた。",
            ["今日は晴れです。", "明日は雨でしょうか？", "彼は「はい。」と答えた。"],
        ),
        ("ru", "Привет. Как дела? Хорошо!", ["Привет.", "Как дела?", "Хорошо!"]),
        ("hi", "यह एक वाक्य है। यह दूसरा है।", ["यह एक वाक्य है।", "यह दूसरा है।"]),
    ],
)  # fmt: skip
def test_sentences_in_several_scripts(lang, text, expected):
    result = split_text(text, lang)
    assert result.sentences == expected
    check_contract(text, result)


def test_whitespace_and_line_breaks_come_back_byte_for_byte():
    text = "  \tHello there.  How are you?\r\n\r\n\nFine.\u2028Thanks!   \n\n  "
    result = split_text(text, "en")
    assert result.sentences == ["Hello there.", "How are you?", "Fine.", "Thanks!"]
    assert result.separators == ["  \t", "  ", "\r\n\r\n\n", "\u2028", "   \n\n  "]
    translated = result.join(["Hallo.", "Wie geht's?", "Gut.", "Danke!"])
    assert translated == "  \tHallo.  Wie geht's?\r\n\r\n\nGut.\u2028Danke!   \n\n  "


def test_a_line_break_always_ends_a_sentence():
    result = split_text("a line without a stop\nand another one", "en")
    assert result.sentences == ["a line without a stop", "and another one"]


@pytest.mark.parametrize("text", ["", " ", "\n\n", " \t\r\n "])
def test_no_sentence_is_one_separator(text):
    result = split_text(text, "de")
    assert result.sentences == [] and result.separators == [text]
    assert result.join([]) == text


def test_join_needs_one_translation_per_sentence():
    with pytest.raises(ValueError, match="2 translations for 1 sentences"):
        split_text("One.", "en").join(["Eins.", "Zwei."])


def test_language_codes_with_a_region_or_script():
    text = "Dr. Müller kam. Er ging."
    assert split_text(text, "de-DE").sentences == split_text(text, "DE_at").sentences
    assert split_text(text, "de-DE").sentences == ["Dr. Müller kam.", "Er ging."]


def test_a_language_without_rules_gets_the_generic_rule():
    # Hungarian: neither sentencex's rules nor a relative's
    text = "Ez az első mondat. Ez a második! Harmadik?"
    assert split_text(text, "hu").sentences == ["Ez az első mondat.", "Ez a második!", "Harmadik?"]
    assert generic_pieces("J. Smith came. He left.  Then 3.5 kg. x") == [
        "J. Smith came. ",
        "He left.  ",
        "Then 3.5 kg. x",
    ]
    assert generic_pieces("« Tu viens ? » demanda-t-il. Oui.") == [
        "« Tu viens ? » demanda-t-il. ",
        "Oui.",
    ]


def test_a_lone_surrogate_keeps_the_contract():
    text = "Hello \ud800 there. Yes."  # as a JSON escape can give it
    result = split_text(text, "en")
    check_contract(text, result)
    assert result.sentences == ["Hello \ud800 there.", "Yes."]


def test_long_runs_of_stops_stay_fast():
    text = "." * 100_000 + " A. " * 20_000 + "!" * 50_000
    t0 = time.perf_counter()
    for lang in ("en", "hu"):
        check_contract(text, split_text(text, lang))
    assert time.perf_counter() - t0 < 10


def test_a_missing_sentencex_says_how_to_reinstall(monkeypatch):
    monkeypatch.setattr(split_module, "_sentencex", None)
    monkeypatch.setitem(sys.modules, "sentencex", None)  # import fails
    with pytest.raises(MTError, match=r"sentencex: reinstall the package's dependencies"):
        split_text("Hello. World.", "en")
    assert split_text("Hello. World.", "hu").sentences == ["Hello.", "World."]  # generic rule


_PIECES = [
    *".!?…。！？ \t\n\r\u2028\u00a0«»„“”\"')(",
    "...",
    "Dr. ",
    "3. ",
    "A. ",
    "\r\n",
    "。」と",
]
_TEXT = st.lists(
    st.one_of(
        st.text(max_size=8),  # any characters
        st.sampled_from(_PIECES),
        st.characters(categories=["Cs"]),  # lone surrogates
        st.text(alphabet="abc XYZ", max_size=8),
    ),
    max_size=40,
).map("".join)


@settings(max_examples=300, deadline=None)
@given(text=_TEXT, lang=st.sampled_from(["en", "de", "fr", "cs", "ja", "zh", "hu"]))
def test_join_of_the_sentences_is_the_text(text, lang):
    check_contract(text, split_text(text, lang))


def _paragraphs(lang: str) -> list[list[str]]:
    """Multi30k test_2016 sentences of ``lang`` in paragraphs of 3-6 (skips when absent)."""
    data = shared_multi30k()
    if data is None:
        pytest.skip("Multi30k is not in ../shared/data (or $MT_SHARED_DATA)")
    folder = data if lang in ("de", "en") else data.parent / "multi30k-fr-cs"
    path = folder / f"test_2016_flickr.{lang}.gz"
    if not path.is_file():
        pytest.skip(f"{path} is absent")
    with gzip.open(path, "rt", encoding="utf-8") as f:
        lines = [line.strip() for line in f]
    rng, out, at = random.Random(1), [], 0
    while at < len(lines):
        size = rng.randint(3, 6)
        out.append(lines[at : at + size])
        at += size
    return out


@pytest.mark.parametrize("lang", ["en", "de", "fr", "cs"])
def test_multi30k_paragraphs_split_into_their_sentences(lang):
    """Never a cut inside a caption; a caption that ends without a full stop may stay joined."""
    exact = 0
    for sentences in _paragraphs(lang):
        text = " ".join(sentences)
        result = split_text(text, lang)
        check_contract(text, result)
        # each found sentence is one caption or several whole ones: no cut inside a caption
        captions = iter(sentences)
        for found in result.sentences:
            joined = next(captions)
            while joined != found and len(joined) < len(found):
                joined += " " + next(captions)
            assert joined == found
        exact += result.sentences == sentences
    assert exact / len(_paragraphs(lang)) > 0.8


def test_the_text_package_imports_no_torch():
    code = (
        "import sys\n"
        "import transformer_mt.text.split, transformer_mt.text.detect\n"
        "import transformer_mt.text.glossary, transformer_mt.text.protect\n"
        "from transformer_mt.text.split import split_text\n"
        "split_text('Ein Satz. Noch einer.', 'de')\n"
        "bad = sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))\n"
        "ours = sorted(m for m in sys.modules if m.startswith('transformer_mt.'))\n"
        "print(bad, [m for m in ours if not m.startswith(('transformer_mt.text', 'transformer_mt.errors'))])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[] []"


@pytest.mark.parametrize("space", ["\u00a0", "\u202f", "\u2009", "\u3000"])
@pytest.mark.parametrize("lang", ["en", "fr", "de"])
def test_a_text_sentencex_panics_on_gets_the_generic_rule(space, lang):
    text = f"Type A{space}. Next one."  # sentencex 1.0.32's Rust code panics on these
    result = split_text(text, lang)
    check_contract(text, result)
    assert result.sentences == [f"Type A{space}.", "Next one."]


def test_a_long_line_splits_as_its_sentences_do():
    sentences = [f"Sentence number {i} ends here." for i in range(400)]
    sentences[7] = "Dr. Smith came at 3.5 p.m. and left."
    text = "  ".join(sentences)
    assert len(text) > 10 * split_module.WINDOW
    result = split_text(text, "en")
    check_contract(text, result)
    assert result.sentences == sentences
    ja = "".join(["今日は晴れです。", "彼は「はい。」と答えた。"] * 300)
    assert split_text(ja, "ja").sentences == ["今日は晴れです。", "彼は「はい。」と答えた。"] * 300


@settings(max_examples=200, deadline=None)
@given(text=_TEXT, lang=st.sampled_from(["en", "de", "fr", "ja"]))
def test_windows_keep_the_contract(text, lang):
    with patch.object(split_module, "WINDOW", 12), patch.object(split_module, "_LOOKAHEAD", 5):
        check_contract(text, split_text(text, lang))


def test_splitting_takes_time_linear_in_the_text():
    """Sentencex alone took 14 s on the first and 5 s on the second (quadratic)."""
    for text in ("。」" * 80_000, '!"' * 80_000):
        t0 = time.perf_counter()
        check_contract(text, split_text(text, "en"))
        assert time.perf_counter() - t0 < 2
