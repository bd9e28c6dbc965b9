"""The built-in corpus: deterministic, held-out splits, two targets and their grammars."""

import hashlib
import itertools
import re

import pytest

from transformer_mt.data.toy import TOY_TARGETS, generate_multi, generate_pairs, toy_splits

# "trg2" verbs, and only verbs, end in a person ending; only its adjectives end in "n".
TRG2_VERB = re.compile(r"p[aeo](ri)?$")
CONJUNCTIONS = {"because", "when", "while", "although"}


def _digest(splits: dict[str, list[tuple[str, str]]]) -> str:
    """SHA-256 of every (split, source, target) line, in order."""
    h = hashlib.sha256()
    for name in ("train", "valid", "test"):
        for source, target in splits[name]:
            h.update(f"{name}\t{source}\t{target}\n".encode())
    return h.hexdigest()


def _words(sentence: str) -> list[str]:
    """Lower-cased words without punctuation."""
    return [w.strip(".,").lower() for w in sentence.split()]


def test_the_first_target_is_byte_identical_to_the_corpora_already_made():
    # Digests of the corpora made before the second target existed: cached corpora, checkpoints
    # and the recipe's BLEU depend on them; a change to the first target must bump TOY_VERSION.
    recipe = toy_splits(20000, 500, 500, seed=1234)
    assert _digest(recipe) == "532cac9240f7c77b1b99c8a6c5719ec838ba111576f5e91128a55dbd5b22bf62"
    seed_1 = toy_splits(20000, 500, 500, seed=1, target="trg")
    assert _digest(seed_1) == "e72dfdd04bb5bcb34abf5449da7282a2632651b9b02a0e103b16847d12445d91"


def test_same_seed_same_corpus_other_seed_other_corpus():
    for target in TOY_TARGETS:
        assert generate_pairs(50, seed=3, target=target) == generate_pairs(
            50, seed=3, target=target
        )
        assert generate_pairs(50, seed=3, target=target) != generate_pairs(
            50, seed=4, target=target
        )


def test_no_targets_valid_or_test_english_is_in_any_targets_train():
    # Small sentences repeat: a few hundred of 3,000 would be shared without the exclusion.
    splits = {t: toy_splits(3000, 300, 300, seed=1, target=t) for t in TOY_TARGETS}
    train = {s for split in splits.values() for s, _ in split["train"]}
    for split in splits.values():
        assert len(split["valid"]) == 300 and len(split["test"]) == 300
        assert len(split["train"]) > 2800
        assert not train & {s for s, _ in split["valid"] + split["test"]}


def test_each_target_translates_english_sentences_of_its_own():
    first = toy_splits(2000, 100, 100, seed=1, target="trg")
    second = toy_splits(2000, 100, 100, seed=1, target="trg2")
    for split in ("train", "valid", "test"):
        shared = {s for s, _ in first[split]} & {s for s, _ in second[split]}
        assert len(shared) < len(first[split]) / 10  # only short sentences repeat
    # generate_multi renders the first target's sentences into every target.
    multi = generate_multi(50, seed=1)
    assert [(s, t["trg"]) for s, t in multi] == generate_pairs(50, seed=1)
    assert [s for s, _ in multi] != [s for s, _ in generate_pairs(50, seed=1, target="trg2")]


def test_an_unknown_target_is_an_error_listing_the_known_ones():
    with pytest.raises(ValueError, match=r"'trg3'.*trg, trg2"):
        generate_pairs(5, seed=1, target="trg3")
    with pytest.raises(ValueError, match="trg, trg2"):
        toy_splits(5, 1, 1, seed=1, target="de")


def test_word_order_and_agreement_differ_from_the_source():
    pairs = generate_pairs(3000, seed=0)
    # A fronted time adverb puts the verb second: "Yesterday he cleaned ..." -> "Jeri <verb> lo".
    fronted = [t.split() for s, t in pairs if s.startswith("Yesterday he ")]
    assert fronted and all(w[2] == "lo" for w in fronted)
    # The target vocabulary is larger than the source's: inflection multiplies word forms.
    src_words = {w for s, _ in pairs for w in s.split()}
    trg_words = {w for _, t in pairs for w in t.split()}
    assert len(trg_words) > len(src_words) > 250


def test_the_second_target_puts_verbs_last_and_adjectives_first():
    multi = generate_multi(3000, seed=0)
    for english, targets in multi:
        words = _words(targets["trg2"])
        clauses = 1 + bool(CONJUNCTIONS & set(_words(english)))
        # Each clause ends in its verb; a subordinate clause (after the main one) then in its
        # conjunction.
        verb = words[-1] if clauses == 1 else words[-2]
        assert TRG2_VERB.search(verb), targets["trg2"]
        assert sum(bool(TRG2_VERB.search(w)) for w in words) == clauses
    # "Yesterday he ..." -> "Ho kino ... <verb>.": subject first, verb last (in "trg": second).
    fronted = [
        t for s, t in multi if s.startswith("Yesterday he ") and not CONJUNCTIONS & set(_words(s))
    ]
    assert fronted and all(_words(t["trg2"])[:2] == ["ho", "kino"] for t in fronted)
    assert all(_words(t["trg"])[2] == "lo" for t in fronted)
    # "<main> because <clause>." -> "<main>, <clause> kara.": the conjunction ends its clause.
    because = [t["trg2"] for s, t in multi if " because " in s]
    assert because and all(re.search(r"p[aeo](ri)?, .* \S+p[aeo](ri)? kara\.$", t) for t in because)
    # "The big apple sang." -> "<big>n <apple> <sing>fupo.": the adjective before its noun; the
    # first target puts it after ("di <apple> <big>e <sing>taet.").
    determiners = {"The", "A", "An", "Some"}  # four words from one: "Det Adj Noun Verb."
    simple = [
        (s.split(), t) for s, t in multi if len(s.split()) == 4 and s.split()[0] in determiners
    ]
    assert len(simple) > 20
    adjectives: dict[str, set[str]] = {}
    for english, targets in simple:
        adjective, noun, verb = _words(targets["trg2"])
        assert adjective.endswith("n") and not noun.endswith("n") and TRG2_VERB.search(verb)
        adjectives.setdefault(english[1], set()).add(adjective.removesuffix("n").removesuffix("ri"))
        assert _words(targets["trg"])[-2][-1] in "oaei"  # the first target's agreeing adjective
    assert all(len(stems) == 1 for stems in adjectives.values())  # one stem per English adjective


def test_the_second_target_agrees_in_number_and_person():
    multi = generate_multi(3000, seed=0)
    for _, targets in multi:
        words = _words(targets["trg2"])
        for adjective, noun in itertools.pairwise(words):
            if adjective.endswith("n"):  # an adjective carries its noun's number
                assert ("ri" in adjective) == ("ri" in noun), targets["trg2"]
    endings = {"i": "pa", "you": "pe", "he": "po", "she": "po", "we": "pari", "they": "pori"}
    single = [(_words(s), _words(t["trg2"])) for s, t in multi if not CONJUNCTIONS & set(_words(s))]
    for english, trg2 in single:
        verb = trg2[-1]
        if english[0] in endings:
            assert verb.endswith(endings[english[0]]), (english, trg2)
        elif english[0] == "some":  # plural indefinite subject: plural noun, plural verb
            subject = next(w for w in trg2 if not w.endswith("n"))  # after its adjective, if any
            assert "ri" in subject
            assert verb.endswith("pori")
        elif english[0] in {"a", "an"}:
            assert verb.endswith("po")
        assert verb.startswith("ze") == ("not" in english)  # negation: a verb prefix
        if english[0] in {"yesterday", "today"}:  # the past: a suffix before the person ending
            assert ("fu" in verb) == (english[0] == "yesterday")


def test_the_two_targets_share_no_word():
    multi = generate_multi(3000, seed=0)
    first = {w for _, t in multi for w in _words(t["trg"])}
    second = {w for _, t in multi for w in _words(t["trg2"])}
    assert len(first) > 500 and len(second) > 500
    assert not first & second
