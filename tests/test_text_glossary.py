"""Constraints on a translation: glossary files and their terms in a sentence, protected spans."""

from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import transformer_mt.text.glossary as glossary_module
from transformer_mt.errors import MTError
from transformer_mt.text._scripts import continues_word, is_word_char
from transformer_mt.text.glossary import (
    MAX_TERM_CHARS,
    BadTerm,
    DuplicateTerm,
    Entry,
    Glossary,
    TermMatch,
    read_glossary,
)
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
        ("\tBank\n", r"terms\.tsv:1: empty source term \('' -> 'Bank'\)"),
        ("bank\t  \n", r"terms\.tsv:1: empty target term \('bank' -> ''\)"),
        ("ba\x07nk\tBank\n", r"terms\.tsv:1: the source term 'ba\\x07nk' has a control character"),
        ("bank\tBa\u2028nk\n", r"terms\.tsv:1: the target term 'Ba\\u2028nk' has a .* line break"),
        (
            "bank\tBank\n" + "x" * (MAX_TERM_CHARS + 1) + "\tX\n",
            rf"terms\.tsv:2: the source term 'x{{30}}'\.\.\. is 101 characters, more than "
            rf"{MAX_TERM_CHARS}; a glossary term is a word or a short phrase",
        ),
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


def test_lines_may_end_with_cr_alone(tmp_path):
    # Excel for Mac's tab-delimited export ends its lines with CR alone
    path = write(tmp_path, "# en\tde\rbank\tBank\r\rriver bank\tUfer\r\nstreet\tStra\u00dfe\n")
    assert read_glossary(path).entries == [
        Entry("bank", "Bank", 2),
        Entry("river bank", "Ufer", 4),
        Entry("street", "Straße", 5),
    ]
    with pytest.raises(MTError, match=r"terms\.tsv:3: has 3 columns"):
        read_glossary(write(tmp_path, "a\tb\r\rc\td\te\r"))
    with pytest.raises(MTError, match=r"terms\.tsv:3: not UTF-8"):
        read_glossary(write(tmp_path, b"bank\tBank\r\rstra\xdfe\tstreet\r"))


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
    assert len(Glossary([Entry("bank", "Bank"), Entry("bank", "Bank")])) == 1


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (Entry("", "x"), r"^empty source term \('' -> 'x'\); give both terms"),
        (Entry("bank", "   "), r"^empty target term \('bank' -> '   '\)"),
        (Entry("bank", "Ba\nnk"), r"^the target term 'Ba\\nnk' has a control character or line"),
        (Entry("ba\tnk", "Bank"), r"^the source term 'ba\\tnk' has a control character"),
        (
            Entry("bank", "B" * 101),
            r"^the target term 'B{30}'\.\.\. is 101 characters, more than 100",
        ),
    ],
)
def test_a_glossary_built_in_code_checks_its_terms_as_a_file_does(entry, message):
    with pytest.raises(BadTerm, match=message) as caught:
        Glossary([Entry("river", "Fluss"), entry])
    assert caught.value.entry == entry and "\n" not in str(caught.value)
    assert len(Glossary([Entry("x" * MAX_TERM_CHARS, "y" * MAX_TERM_CHARS)])) == 1


# -- matching's cost -----------------------------------------------------------------------


def _reference_find(glossary: Glossary, sentence: str) -> list[TermMatch]:
    """The module's rule, written plainly: every whole-word occurrence, longest first, then
    leftmost, kept unless it overlaps one kept (quadratic: for small sentences only)."""
    fold = glossary._fold
    terms = {fold(e.source): e.target for e in glossary.entries}
    found = []
    for start in range(len(sentence)):
        if start > 0 and is_word_char(sentence[start]) and is_word_char(sentence[start - 1]):
            continue
        for end in range(start + 1, len(sentence) + 1):
            target = terms.get(fold(sentence[start:end]))
            after_ok = (
                end == len(sentence)
                or not is_word_char(sentence[end - 1])
                or not continues_word(sentence[end])
            )
            if target is not None and after_ok:
                found.append(TermMatch(start, end, sentence[start:end], target))
    found.sort(key=lambda m: (m.start - m.end, m.start))
    taken: set[int] = set()
    kept = []
    for m in found:
        if taken.isdisjoint(range(m.start, m.end)):
            taken.update(range(m.start, m.end))
            kept.append(m)
    return sorted(kept, key=lambda m: m.start)


_TEXT = st.text(alphabet="aAb -\u0301服", max_size=40)
_TERM = st.text(alphabet="aAb -服", min_size=1, max_size=6).filter(str.strip)


@settings(max_examples=400, deadline=None)
@given(st.lists(_TERM, max_size=8, unique=True), _TEXT, st.booleans())
def test_matching_keeps_the_rule_longest_first_then_leftmost(terms, sentence, ignore_case):
    try:
        glossary = Glossary([Entry(t, t.upper()) for t in terms], ignore_case=ignore_case)
    except DuplicateTerm:
        return  # two terms that differ only by case, ignoring case
    assert glossary.find(sentence) == _reference_find(glossary, sentence)


def _work(monkeypatch, glossary: Glossary, sentence: str) -> int:
    """How many terms matching looked at: the terms of the automaton's chains it walked."""
    looked = 0
    length = glossary_module._length

    def counted(node):
        nonlocal looked
        looked += 1
        return length(node)

    monkeypatch.setattr(glossary_module, "_length", counted)
    glossary.find(sentence)
    monkeypatch.setattr(glossary_module, "_length", length)
    return looked


@pytest.mark.parametrize(
    ("terms", "text"),
    [
        # every position starts every term: a quadratic matcher walks them all
        ([("-" * k) for k in range(1, MAX_TERM_CHARS + 1)], "-"),
        # terms that end inside words, which matching passes over
        ([("aaa " * 25)[:k].strip() for k in range(1, MAX_TERM_CHARS + 1)], "aaa "),
        (["New York", "New York City", "York City", "City Hall"], "New York City Hall "),
    ],
)
def test_matching_work_is_linear_in_the_sentence(monkeypatch, terms, text):
    glossary = Glossary([Entry(t, "X") for t in dict.fromkeys(terms)])
    small, big = text * (2000 // len(text)), text * (8000 // len(text))
    work = [_work(monkeypatch, glossary, sentence) for sentence in (small, big)]
    assert work[1] <= 3 * len(big), work
    assert work[1] <= 5 * work[0], work  # 4 times the text: about 4 times the work, not 16
