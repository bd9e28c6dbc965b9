"""A built-in synthetic language pair, so that `mt train` works offline in minutes.

The source is a small English; the target is an invented language whose grammar differs the way real
pairs do, so a model must learn more than a word-for-word lookup:

- word order: the target is verb-second in main clauses (a fronted time adverb moves the verb before
  the subject) and verb-final in subordinate clauses; adjectives follow their noun;
- agreement: articles and adjectives agree with the noun's gender (m/f/n), number and case
  (nominative subject, accusative object, dative after a preposition);
- inflection: verbs take person/number endings and a past-tense infix; nouns a plural suffix that
  depends on their gender; English has its own irregular plurals and past forms;
- negation: a particle right after the verb in main clauses, before it in subordinate ones.

The lexicon is fixed (its target words come from a constant seed, so every corpus speaks the same
language); the sentences are drawn from ``random.Random(seed)``: the same seed gives the same corpus.
"""

import random
from dataclasses import dataclass

_NOUNS = (
    "dog cat man woman child teacher doctor farmer bird horse house car book apple tree river "
    "city garden table window door letter song picture boat train flower mountain village "
    "student king queen friend baker singer painter soldier girl boy mouse frog cake bread "
    "chair bottle key shoe hat coat ball box cup plate knife lamp bed wall road bridge forest "
    "lake field island castle church school shop market kitchen room stone card glass egg"
).split()
_IRREGULAR_PLURAL = {
    "man": "men", "woman": "women", "child": "children", "mouse": "mice", "foot": "feet",
    "knife": "knives", "shelf": "shelves",
}  # fmt: skip
_ADJECTIVES = (
    "big small red old young happy sad green blue heavy light new beautiful quiet loud cold "
    "warm dark bright tall short fast slow clever brave poor rich strong weak clean dirty empty "
    "full sweet"
).split()
# (base, past) of transitive verbs; the past is given where English is irregular.
_TRANSITIVE = (
    "see:saw eat:ate write:wrote buy:bought carry:carried find:found like:liked watch:watched "
    "paint:painted open:opened close:closed visit:visited build:built sell:sold wash:washed "
    "love:loved bring:brought hold:held catch:caught draw:drew break:broke push:pushed "
    "pull:pulled follow:followed help:helped call:called clean:cleaned cook:cooked want:wanted "
    "know:knew take:took"
).split()
_INTRANSITIVE = "sleep:slept run:ran laugh:laughed sing:sang wait:waited swim:swam work:worked"
_INTRANSITIVE_PAIRS = [tuple(v.split(":")) for v in _INTRANSITIVE.split()]
_PREPOSITIONS = ("in on near with under behind").split()
_CONJUNCTIONS = ("because when while although").split()
# Pronoun subjects: (English, person-number, English verb agreement)
_PRONOUNS = [
    ("I", "1sg"), ("you", "2sg"), ("he", "3sg"), ("she", "3sg"), ("we", "1pl"), ("they", "3pl"),
]  # fmt: skip

# Target grammar tables.
_GENDERS = ("m", "f", "n")
_DEF = {  # definite article by (gender or "pl", case)
    ("m", "nom"): "do", ("m", "acc"): "dan", ("m", "dat"): "dem",
    ("f", "nom"): "da", ("f", "acc"): "da", ("f", "dat"): "der",
    ("n", "nom"): "di", ("n", "acc"): "di", ("n", "dat"): "dim",
    ("pl", "nom"): "du", ("pl", "acc"): "du", ("pl", "dat"): "dun",
}  # fmt: skip
_INDEF = {  # indefinite article (singular only; plural indefinite has none, like English "some")
    ("m", "nom"): "en", ("m", "acc"): "enan", ("m", "dat"): "enem",
    ("f", "nom"): "ena", ("f", "acc"): "ena", ("f", "dat"): "ener",
    ("n", "nom"): "eni", ("n", "acc"): "eni", ("n", "dat"): "enim",
}  # fmt: skip
_PLURAL_SUFFIX = {"m": "en", "f": "as", "n": "ir"}
_ADJ_SUFFIX = {"m": "o", "f": "a", "n": "e", "pl": "i"}
_VERB_SUFFIX = {"1sg": "u", "2sg": "is", "3sg": "et", "1pl": "om", "2pl": "ot", "3pl": "ant"}
_PAST_INFIX = "ta"
_NEGATION = "nek"
_TRG_PRONOUNS = {"I": "mi", "you": "ti", "he": "lo", "she": "la", "we": "nos", "they": "los"}
_TRG_FUNCTION = {
    "in": "ina", "on": "supa", "near": "pres", "with": "kon", "under": "sota", "behind": "tras",
    "because": "porke", "when": "kwan", "while": "dum", "although": "malgre",
    "yesterday": "jeri", "today": "oje",
}  # fmt: skip

# Bump when the generator's output changes, so cached corpora of the old version are not reused.
TOY_VERSION = 2
_LEXICON_SEED = 20170612  # fixed: the target language never changes between corpora


def _make_words(n: int, rng: random.Random, taken: set[str]) -> list[str]:
    """``n`` distinct pronounceable stems (CV syllables, a final consonant)."""
    onsets = "b d f g k l m n p r s t v z br kr pl st tr sk".split()
    vowels = ["a", "e", "i", "o", "u", "ai", "au"]
    codas = ["l", "m", "n", "r", "s", "k", "t"]
    words: list[str] = []
    while len(words) < n:
        syl = rng.choice((1, 2, 2, 3))
        word = "".join(rng.choice(onsets) + rng.choice(vowels) for _ in range(syl))
        word += rng.choice(codas)
        if word not in taken and len(word) >= 4:
            taken.add(word)
            words.append(word)
    return words


@dataclass(frozen=True)
class _Lexicon:
    noun_stem: dict[str, str]
    noun_gender: dict[str, str]
    adj_stem: dict[str, str]
    verb_stem: dict[str, str]


def _build_lexicon() -> _Lexicon:
    rng = random.Random(_LEXICON_SEED)
    taken = set(_TRG_PRONOUNS.values()) | set(_TRG_FUNCTION.values()) | {_NEGATION}
    taken |= set(_DEF.values()) | set(_INDEF.values())
    verbs = [v.split(":")[0] for v in _TRANSITIVE] + [v for v, _ in _INTRANSITIVE_PAIRS]
    return _Lexicon(
        noun_stem=dict(zip(_NOUNS, _make_words(len(_NOUNS), rng, taken), strict=True)),
        noun_gender={n: rng.choice(_GENDERS) for n in _NOUNS},
        adj_stem=dict(zip(_ADJECTIVES, _make_words(len(_ADJECTIVES), rng, taken), strict=True)),
        verb_stem=dict(zip(verbs, _make_words(len(verbs), rng, taken), strict=True)),
    )


_LEX = _build_lexicon()
_TRANSITIVE_PAIRS = [tuple(v.split(":")) for v in _TRANSITIVE]


def _en_plural(noun: str) -> str:
    if noun in _IRREGULAR_PLURAL:
        return _IRREGULAR_PLURAL[noun]
    if noun.endswith(("s", "sh", "ch", "x")):
        return noun + "es"
    if noun.endswith("y") and noun[-2] not in "aeiou":
        return noun[:-1] + "ies"
    return noun + "s"


def _en_3sg(verb: str) -> str:
    if verb.endswith(("s", "sh", "ch", "x", "o")):
        return verb + "es"
    if verb.endswith("y") and verb[-2] not in "aeiou":
        return verb[:-1] + "ies"
    return verb + "s"


class _Generator:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def noun_phrase(self, case: str) -> tuple[list[str], list[str], str]:
        """English words, target words and the agreement class ("3sg"/"3pl") of a noun phrase."""
        rng = self.rng
        noun = rng.choice(_NOUNS)
        plural = rng.random() < 0.3
        definite = rng.random() < 0.6
        adj = rng.choice(_ADJECTIVES) if rng.random() < 0.4 else None
        gender = _LEX.noun_gender[noun]
        cls = "pl" if plural else gender
        article = "some" if plural else ("an" if _starts_vowel(adj or noun) else "a")
        en = ["the" if definite else article]
        if adj:
            en.append(adj)
        en.append(_en_plural(noun) if plural else noun)
        trg: list[str] = []
        if definite:
            trg.append(_DEF[(cls, case)])
        elif not plural:
            trg.append(_INDEF[(gender, case)])
        trg.append(_LEX.noun_stem[noun] + (_PLURAL_SUFFIX[gender] if plural else ""))
        if adj:
            trg.append(_LEX.adj_stem[adj] + _ADJ_SUFFIX[cls])
        return en, trg, "3pl" if plural else "3sg"

    def clause(self, subordinate: bool, past: bool) -> tuple[list[str], list[str], list[str]]:
        """English words, and target words split as (before the verb, the verb group)."""
        rng = self.rng
        if rng.random() < 0.35:
            en_subj, person = rng.choice(_PRONOUNS)
            en_s, trg_s = [en_subj], [_TRG_PRONOUNS[en_subj]]
        else:
            en_s, trg_s, person = self.noun_phrase("nom")
        transitive = rng.random() < 0.75
        base, past_form = rng.choice(_TRANSITIVE_PAIRS if transitive else _INTRANSITIVE_PAIRS)
        negated = rng.random() < 0.15
        if negated:
            aux = "did" if past else ("does" if person == "3sg" else "do")
            en_v = [aux, "not", base]
        elif past:
            en_v = [past_form]
        else:
            en_v = [_en_3sg(base) if person == "3sg" else base]
        verb = _LEX.verb_stem[base] + (_PAST_INFIX if past else "") + _VERB_SUFFIX[person]
        en_o: list[str] = []
        trg_o: list[str] = []
        if transitive:
            en_o, trg_o, _ = self.noun_phrase("acc")
        if rng.random() < 0.3:
            prep = rng.choice(_PREPOSITIONS)
            en_np, trg_np, _ = self.noun_phrase("dat")
            en_o, trg_o = en_o + [prep, *en_np], trg_o + [_TRG_FUNCTION[prep], *trg_np]
        en = en_s + en_v + en_o
        if subordinate:  # verb-final, negation before the verb
            trg = trg_s + trg_o + ([_NEGATION] if negated else []) + [verb]
            return en, trg, []
        return en, trg_s, [verb] + ([_NEGATION] if negated else []) + trg_o

    def sentence(self) -> tuple[str, str]:
        rng = self.rng
        past = rng.random() < 0.4
        adverb = None
        if rng.random() < 0.25:
            adverb = "yesterday" if past else "today"
        en, trg_subj, trg_rest = self.clause(False, past)
        if adverb:  # verb second: the adverb takes the first slot, the subject follows the verb
            en = [adverb, *en]
            trg = [_TRG_FUNCTION[adverb], trg_rest[0], *trg_subj, *trg_rest[1:]]
        else:
            trg = trg_subj + trg_rest
        if rng.random() < 0.3:
            conj = rng.choice(_CONJUNCTIONS)
            en_sub, trg_sub, _ = self.clause(True, rng.random() < 0.4)
            en += [conj, *en_sub]
            trg += [_TRG_FUNCTION[conj], *trg_sub]
        return _finish(en), _finish(trg)


def _starts_vowel(word: str) -> bool:
    return word[0] in "aeiou"


def _finish(words: list[str]) -> str:
    text = " ".join(words) + "."  # untokenized, like real text: sacrebleu tokenizes for BLEU
    return text[0].upper() + text[1:]


def generate_pairs(n: int, seed: int) -> list[tuple[str, str]]:
    """``n`` (source, target) sentence pairs, deterministic for a given seed."""
    gen = _Generator(seed)
    return [gen.sentence() for _ in range(n)]


def toy_splits(
    train_size: int, valid_size: int, test_size: int, seed: int
) -> dict[str, list[tuple[str, str]]]:
    """Train/valid/test splits with no test or valid pair also in train (exact duplicates removed)."""
    pairs = generate_pairs(train_size + valid_size + test_size, seed)
    valid = pairs[train_size : train_size + valid_size]
    test = pairs[train_size + valid_size :]
    held_out = {p[0] for p in valid + test}
    train = [p for p in pairs[:train_size] if p[0] not in held_out]
    return {"train": train, "valid": valid, "test": test}
