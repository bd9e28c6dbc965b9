"""Constraints on a translation: glossary files and their terms in a sentence, protected spans."""

from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from transformer_mt.errors import MTError
from transformer_mt.text.glossary import DuplicateTerm, Entry, Glossary, TermMatch, read_glossary
from transformer_mt.text.protect import (
    Marks,
    Span,
    find_protected,
    mask,
    unmark,
)


def write(tmp_path, content: str | bytes, name: str = "terms.tsv"):
    path = tmp_path / name
    if isinstance(content, str):
        path.write_text(content, encoding="utf-8", newline="")
    else:
        path.write_bytes(content)
    return path


# -- glossary files -------------------------------------------------------------------------


def test_a_glossary_file_with_comments_blank_lines_bom_and_crlf(tmp_path):
    path = write(
        tmp_path,
        "\ufeff# en\tde\r\n\r\nbank\tBank\r\n  river bank \t Ufer \r\n   # indented comment\n"
        "bank\tBank\n",  # the same pair twice is fine
    )
    glossary = read_glossary(path)
    assert glossary.entries == [Entry("bank", "Bank", 3), Entry("river bank", "Ufer", 4)]
    assert len(glossary) == 2


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("bank\tBank\nonly one column\n", r"terms\.tsv:2: has 1 column, needs 2"),
        ("a\tb\tc\n", r"terms\.tsv:1: has 3 columns, needs 2"),
        ("\tBank\n", r"terms\.tsv:1: empty source term"),
        ("bank\t  \n", r"terms\.tsv:1: empty target term"),
        ("ba\x07nk\tBank\n", r"terms\.tsv:1: the source term has a control character"),
        (
            "# header\nbank\tBank\nriver\tFluss\nbank\tUfer\n",
            r"terms\.tsv:4: source term 'bank' is already on line 2 with another target",
        ),
    ],
)
def test_a_bad_line_is_one_error_naming_the_file_and_line(tmp_path, content, message):
    with pytest.raises(MTError, match=message) as caught:
        read_glossary(write(tmp_path, content))
    assert "\n" not in str(caught.value)


def test_bad_bytes_and_missing_files(tmp_path):
    with pytest.raises(MTError, match=r"terms\.tsv:2: not UTF-8"):
        read_glossary(write(tmp_path, b"bank\tBank\nstra\xdfe\tstreet\n"))
    with pytest.raises(MTError, match="glossary file not found"):
        read_glossary(tmp_path / "nope.tsv")
    with pytest.raises(MTError, match="is a directory"):
        read_glossary(tmp_path)


def test_ignore_case_makes_case_variants_duplicates(tmp_path):
    path = write(tmp_path, "Bank\tBank\nbank\tUfer\n")
    assert len(read_glossary(path)) == 2
    with pytest.raises(MTError, match=r":2: source term 'bank' is already on line 1"):
        read_glossary(path, ignore_case=True)


# -- glossary matching ---------------------------------------------------------------------

GLOSSARY = Glossary(
    [
        Entry("bank", "Bank"),
        Entry("New York", "NY"),
        Entry("New York City", "NYC"),
        Entry("York City", "YC"),
        Entry("City Hall", "Rathaus"),
        Entry("服务器", "Server"),
        Entry("Python", "Python"),
        Entry("C++", "C++"),
        Entry("café", "Café"),
    ]
)


def test_case_sensitive_whole_words():
    found = GLOSSARY.find("The bank by the embankment, not the Bank, nor banks; bank.")
    assert found == [TermMatch(4, 8, "bank", "Bank"), TermMatch(53, 57, "bank", "Bank")]
    assert GLOSSARY.targets("The bank and the bank") == ["Bank"]


def test_longest_match_wins_then_leftmost():
    assert GLOSSARY.targets("I love New York City Hall.") == ["NYC"]
    assert GLOSSARY.targets("New York, City Hall") == ["NY", "Rathaus"]
    two = Glossary([Entry("ab cd", "A"), Entry("cd ef", "B")])
    assert two.targets("ab cd ef") == ["A"]  # as long: the leftmost


def test_scripts_without_spaces_match_anywhere():
    found = GLOSSARY.find("我用Python写服务器程序。")
    assert [m.source for m in found] == ["Python", "服务器"]
    assert GLOSSARY.targets("用C++和C+++") == ["C++"]


def test_a_combining_accent_continues_the_word():
    assert GLOSSARY.targets("cafe\u0301") == []  # "café" decomposed is not "cafe"
    assert Glossary([Entry("cafe", "x")]).targets("cafe\u0301 au lait") == []
    assert GLOSSARY.targets("un café noir") == ["Café"]


def test_ignore_case_matches_any_case():
    glossary = Glossary([Entry("bank", "Bank")], ignore_case=True)
    assert [m.source for m in glossary.find("BANK, Bank and bank")] == ["BANK", "Bank", "bank"]
    assert glossary.targets("İbank bank") == ["Bank"]  # a letter that lowercases to two


# -- protected spans -----------------------------------------------------------------------

TEXT = (
    "Visit https://en.wikipedia.org/wiki/Foo_(bar). Mail john.doe@example.com at 12:30 on "
    "2021-05-03: pay 1,234.56 EUR or 3,5 %. Run `ls -l` in <keep>File Menu</keep> {name} "
    "3rd A4 x86 3个 (see www.example.com)"
)


def test_find_protected_spans_of_every_kind():
    spans = find_protected(TEXT)
    assert [(s.kind, s.text) for s in spans] == [
        ("url", "https://en.wikipedia.org/wiki/Foo_(bar)"),
        ("email", "john.doe@example.com"),
        ("number", "12:30"),
        ("number", "2021-05-03"),
        ("number", "1,234.56"),
        ("number", "3,5"),
        ("code", "`ls -l`"),
        ("marked", "File Menu"),
        ("placeholder", "{name}"),
        ("number", "3"),
        ("url", "www.example.com"),
    ]
    for span in spans:
        assert span.kind == "marked" or TEXT[span.start : span.end] == span.text


def test_kinds_and_marks_are_chosen_by_the_caller():
    assert [s.kind for s in find_protected("3 and 4 at http://a.io/5", kinds=["url"])] == ["url"]
    marks = Marks("[[", "]]", keep=True)
    assert find_protected("Open [[File]] now", kinds=["marked"], marks=marks) == [
        Span(5, 13, "marked", "[[File]]")
    ]
    assert find_protected("Open <keep>File</keep> now", marks=None) == []
    assert find_protected("a <keep> left open") == find_protected("an empty <keep></keep>") == []
    assert [s.text for s in find_protected("<keep>a <keep>b</keep> c</keep>")] == ["a <keep>b"]
    with pytest.raises(ValueError, match="unknown kinds"):
        find_protected("x", kinds=["numbers"])


def test_code_wins_over_what_it_holds_and_urls_lose_sentence_punctuation():
    spans = find_protected("Try `curl https://x.io/a?b=1` (or https://x.io/c), 42.")
    assert [(s.kind, s.text) for s in spans] == [
        ("code", "`curl https://x.io/a?b=1`"),
        ("url", "https://x.io/c"),
        ("number", "42"),
    ]


def test_unmark_gives_the_model_the_text_without_marks():
    assert unmark("Open <keep>File</keep> and <keep>Edit</keep>.") == "Open File and Edit."
    assert unmark("Open <keep>File", Marks()) == "Open <keep>File"


def test_mask_and_restore_round_trip():
    masked, restore = mask(TEXT)
    assert "https" not in masked and "{0}" in masked and "{10}" in masked
    assert restore(masked) == unmark(TEXT)
    translated = masked.replace("Visit", "Besuche").replace("Mail", "Schreibe an")
    assert restore(translated) == unmark(TEXT).replace("Visit", "Besuche").replace(
        "Mail", "Schreibe an"
    )


def test_restore_when_the_model_drops_repeats_or_mangles_placeholders():
    masked, restore = mask("Call 555 or mail a@b.io now.", kinds=["email", "number"])
    assert masked == "Call {0} or mail {1} now."
    assert restore("Ruf { 0 } an oder schreib ｛１｝.") == "Ruf 555 an oder schreib a@b.io."
    # a repeat is removed (with the space before it): each span once, as in the source
    assert restore("Ruf {0} {0} an, {1}.") == "Ruf 555 an, a@b.io."
    # a dropped placeholder: its text goes at the end, nothing protected is lost
    assert restore("Ruf {0} an.") == "Ruf 555 an. a@b.io"
    assert restore("") == "555 a@b.io"
    # an index the source never had is the model's text, left alone
    assert restore("{0} {1} {7}") == "555 a@b.io {7}"


def test_placeholders_already_in_the_text_are_protected_not_confused():
    masked, restore = mask("Hello {0}, you have {count} messages", kinds=["placeholder"])
    assert masked == "Hello {0}, you have {1} messages"
    assert restore("Hallo {0}, du hast {1} Nachrichten") == "Hallo {0}, du hast {count} Nachrichten"


def test_text_without_protected_spans():
    masked, restore = mask("Nothing here.")
    assert masked == "Nothing here." and restore("Rien ici.") == "Rien ici."


_PIECES = [
    "{",
    "}",
    "{0}",
    "｛",
    "１",
    "`",
    "<keep>",
    "</keep>",
    "http://a.b/c",
    "x@y.io",
    "3.5",
    " ",
    "-",
]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.text(max_size=6), st.sampled_from(_PIECES)), max_size=30).map("".join))
def test_restore_of_the_masked_text_is_the_text_without_marks(text):
    spans = find_protected(text)
    assert all(a.end <= b.start for a, b in pairwise(spans))
    masked, restore = mask(text)
    assert restore(masked) == unmark(text)


def test_a_glossary_built_in_code_checks_its_entries():
    with pytest.raises(DuplicateTerm, match="'bank' given twice with different targets"):
        Glossary([Entry("bank", "Bank"), Entry("bank", "Ufer")])
    with pytest.raises(ValueError, match="empty glossary term"):
        Glossary([Entry("", "x")])
    assert len(Glossary([Entry("bank", "Bank"), Entry("bank", "Bank")])) == 1
