"""The built-in corpus: deterministic, with held-out splits and the promised grammar."""

from transformer_mt.data.toy import generate_pairs, toy_splits


def test_same_seed_same_corpus_other_seed_other_corpus():
    assert generate_pairs(50, seed=3) == generate_pairs(50, seed=3)
    assert generate_pairs(50, seed=3) != generate_pairs(50, seed=4)


def test_valid_and_test_sources_are_not_in_train():
    splits = toy_splits(2000, 100, 100, seed=1)
    train = {s for s, _ in splits["train"]}
    assert len(splits["valid"]) == 100 and len(splits["test"]) == 100
    assert not train & {s for s, _ in splits["valid"] + splits["test"]}


def test_word_order_and_agreement_differ_from_the_source():
    pairs = generate_pairs(3000, seed=0)
    # A fronted time adverb puts the verb second: "Yesterday he cleaned ..." -> "Jeri <verb> lo ...".
    fronted = [t.split() for s, t in pairs if s.startswith("Yesterday he ")]
    assert fronted and all(w[2] == "lo" for w in fronted)
    # The target vocabulary is larger than the source's: inflection multiplies word forms.
    src_words = {w for s, _ in pairs for w in s.split()}
    trg_words = {w for _, t in pairs for w in t.split()}
    assert len(trg_words) > len(src_words) > 250
