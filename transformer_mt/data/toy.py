"""A built-in synthetic corpus (English into two invented languages): `mt train` works offline.

The source is a small English, translated into two invented target languages. Each target's
corpus translates English sentences of its own, as multilingual corpora are rarely parallel
(:func:`generate_multi` renders one set of sentences into every target, to compare grammars).
Their grammars differ from English and from each other the way real languages do, so a model must
learn more than a word-for-word lookup.

"trg" (the first target; the toy recipe's language) is verb-second and fusional:

- word order: verb-second in main clauses (a fronted time adverb moves the verb before the
  subject) and verb-final in subordinate clauses; adjectives follow their noun; prepositions;
- agreement: articles and adjectives agree with the noun's gender (m/f/n), number and case
  (nominative subject, accusative object, dative after a preposition);
- inflection: verbs take person/number endings and a past-tense infix; nouns a plural suffix that
  depends on their gender; English has its own irregular plurals and past forms;
- negation: a particle right after the verb in main clauses, before it in subordinate ones.

"trg2" (the second target) is head-final and agglutinative, one suffix per meaning:

- word order: subject-object-verb in every clause (subject, then a time adverb, then a
  postpositional phrase, then the object, then the verb); a subordinate clause follows the main
  clause and ends in its conjunction ("..., because he sleeps" -> "..., ho <sleep>po kara.");
  adjectives precede their noun; postpositions follow their noun phrase;
- no articles and no gender: a noun is stem + plural "-ri" + case ("-bo" accusative, "-de"
  oblique after a postposition; the nominative is unmarked);
- agreement: an adjective agrees with its noun in number only (stem + "-ri" if plural + "-n");
  a verb agrees with its subject in person and number (-pa/-pe/-po for the first, second and
  third person singular; plural adds "ri": -pari/-peri/-pori);
- inflection and negation: verb = negative prefix "ze-" + stem + past "-fu" + person ending;
- word shapes: stems are open syllables (ending in a vowel) over consonants the suffixes never
  use (h j k m n s t w y sh ch ts), so only adjectives end in "n" and only verbs in a person
  ending; in these fixed lexicons no "trg2" word is also a "trg" word.

The lexicons are fixed (their words come from constant seeds, so every corpus speaks the same
languages); the first target's sentences are drawn from ``random.Random(seed)``, another target's
from a seed of the seed and its code: the same seed gives the same corpus.
"""

import random
from collections.abc import Callable
from dataclasses import dataclass

_NOUNS = (
    "dog cat man woman child teacher doctor farmer bird horse house car book apple tree river "
    "city garden table window door letter song picture boat train flower mountain village "
    "student king queen friend baker singer painter soldier girl boy mouse frog cake bread "
    "chair bottle key shoe hat coat ball box cup plate knife lamp bed wall road bridge forest "
    "lake field island castle church school shop market kitchen room stone card glass egg"
).split()
_IRREGULAR_PLURAL = {
    "man": "men",
    "woman": "women",
    "child": "children",
    "mouse": "mice",
    "foot": "feet",
    "knife": "knives",
    "shelf": "shelves",
}
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
_INTRANSITIVE_PAIRS = [(v.split(":")[0], v.split(":")[1]) for v in _INTRANSITIVE.split()]
_PREPOSITIONS = ("in on near with under behind").split()
_CONJUNCTIONS = ("because when while although").split()
# Pronoun subjects: (English, person-number, English verb agreement)
_PRONOUNS = [
    ("I", "1sg"),
    ("you", "2sg"),
    ("he", "3sg"),
    ("she", "3sg"),
    ("we", "1pl"),
    ("they", "3pl"),
]
_PERSON = dict(_PRONOUNS)

# "trg" grammar tables.
_GENDERS = ("m", "f", "n")
_DEF = {  # definite article by (gender or "pl", case)
    ("m", "nom"): "do",
    ("m", "acc"): "dan",
    ("m", "dat"): "dem",
    ("f", "nom"): "da",
    ("f", "acc"): "da",
    ("f", "dat"): "der",
    ("n", "nom"): "di",
    ("n", "acc"): "di",
    ("n", "dat"): "dim",
    ("pl", "nom"): "du",
    ("pl", "acc"): "du",
    ("pl", "dat"): "dun",
}
_INDEF = {  # indefinite article (singular only; plural indefinite has none, like English "some")
    ("m", "nom"): "en",
    ("m", "acc"): "enan",
    ("m", "dat"): "enem",
    ("f", "nom"): "ena",
    ("f", "acc"): "ena",
    ("f", "dat"): "ener",
    ("n", "nom"): "eni",
    ("n", "acc"): "eni",
    ("n", "dat"): "enim",
}
_PLURAL_SUFFIX = {"m": "en", "f": "as", "n": "ir"}
_ADJ_SUFFIX = {"m": "o", "f": "a", "n": "e", "pl": "i"}
_VERB_SUFFIX = {"1sg": "u", "2sg": "is", "3sg": "et", "1pl": "om", "2pl": "ot", "3pl": "ant"}
_PAST_INFIX = "ta"
_NEGATION = "nek"
_TRG_PRONOUNS = {"I": "mi", "you": "ti", "he": "lo", "she": "la", "we": "nos", "they": "los"}
_TRG_FUNCTION = {
    "in": "ina",
    "on": "supa",
    "near": "pres",
    "with": "kon",
    "under": "sota",
    "behind": "tras",
    "because": "porke",
    "when": "kwan",
    "while": "dum",
    "although": "malgre",
    "yesterday": "jeri",
    "today": "oje",
}

# "trg2" grammar tables: suffixes use only consonants that its stems never contain.
_TRG2_PLURAL = "ri"
_TRG2_CASE = {"nom": "", "acc": "bo", "obl": "de"}
_TRG2_ADJ_FINAL = "n"
_TRG2_NEGATION = "ze"  # a verb prefix
_TRG2_PAST = "fu"
_TRG2_PERSON = {"1sg": "pa", "2sg": "pe", "3sg": "po", "1pl": "pari", "2pl": "peri", "3pl": "pori"}
_TRG2_PRONOUNS = {"I": "yo", "you": "chu", "he": "ho", "she": "hi", "we": "yowa", "they": "howa"}
_TRG2_FUNCTION = {
    "in": "uchi",
    "on": "uwe",
    "near": "chika",
    "with": "tomo",
    "under": "shimo",
    "behind": "ato",
    "because": "kara",
    "when": "toki",
    "while": "aida",
    "although": "demo",
    "yesterday": "kino",
    "today": "kyo",
}

# The target language codes; the first ("trg") is the default and draws from the seed itself.
TOY_TARGETS = ("trg", "trg2")
# What a server calls the toy's languages (as ISO 639-3 codes, "src" and "trg" would name two
# real languages: Logudorese Sardinian, Lishan Didan).
TOY_LANGUAGE_NAMES = {
    "src": "Toy English (source)",
    "trg": "Toy verb-second language",
    "trg2": "Toy head-final language",
}
# Bump when the generator's output changes, so cached corpora of the old version are not reused.
TOY_VERSION = 3
_LEXICON_SEED = 20170612  # fixed: the target language never changes between corpora
_LEXICON2_SEED = 20240229  # fixed, likewise, for "trg2"


def _make_words(n: int, rng: random.Random, taken: set[str]) -> list[str]:
    """``n`` distinct pronounceable "trg" stems (CV syllables, a final consonant)."""
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


def _make_open_words(n: int, rng: random.Random, taken: set[str]) -> list[str]:
    """``n`` distinct "trg2" stems: two or three open syllables over the stems' own consonants."""
    onsets = "h j k m n s t w y sh ch ts".split()
    vowels = "a e i o u".split()
    words: list[str] = []
    while len(words) < n:
        word = "".join(rng.choice(onsets) + rng.choice(vowels) for _ in range(rng.choice((2, 3))))
        if word not in taken:
            taken.add(word)
            words.append(word)
    return words


@dataclass(frozen=True)
class _Lexicon:
    """One target language's stems of the English nouns, adjectives and verbs (and noun genders)."""

    noun_stem: dict[str, str]
    noun_gender: dict[str, str]
    adj_stem: dict[str, str]
    verb_stem: dict[str, str]


_VERBS = [v.split(":")[0] for v in _TRANSITIVE] + [v for v, _ in _INTRANSITIVE_PAIRS]


def _build_lexicon() -> _Lexicon:
    """The "trg" lexicon (its draw order is fixed: corpora and checkpoints depend on it)."""
    rng = random.Random(_LEXICON_SEED)
    taken = set(_TRG_PRONOUNS.values()) | set(_TRG_FUNCTION.values()) | {_NEGATION}
    taken |= set(_DEF.values()) | set(_INDEF.values())
    return _Lexicon(
        noun_stem=dict(zip(_NOUNS, _make_words(len(_NOUNS), rng, taken), strict=True)),
        noun_gender={n: rng.choice(_GENDERS) for n in _NOUNS},
        adj_stem=dict(zip(_ADJECTIVES, _make_words(len(_ADJECTIVES), rng, taken), strict=True)),
        verb_stem=dict(zip(_VERBS, _make_words(len(_VERBS), rng, taken), strict=True)),
    )


def _build_lexicon2() -> _Lexicon:
    """The "trg2" lexicon: genderless, stems distinct from its function words."""
    rng = random.Random(_LEXICON2_SEED)
    taken = set(_TRG2_PRONOUNS.values()) | set(_TRG2_FUNCTION.values())

    def stems(words: list[str]) -> dict[str, str]:
        return dict(zip(words, _make_open_words(len(words), rng, taken), strict=True))

    return _Lexicon(
        noun_stem=stems(_NOUNS),
        noun_gender={},  # no grammatical gender
        adj_stem=stems(_ADJECTIVES),
        verb_stem=stems(_VERBS),
    )


_LEX = _build_lexicon()
_LEX2 = _build_lexicon2()
_TRANSITIVE_PAIRS = [(v.split(":")[0], v.split(":")[1]) for v in _TRANSITIVE]
_PAST = dict(_TRANSITIVE_PAIRS + _INTRANSITIVE_PAIRS)  # base form -> past


def _en_plural(noun: str) -> str:
    """The English plural of a noun."""
    if noun in _IRREGULAR_PLURAL:
        return _IRREGULAR_PLURAL[noun]
    if noun.endswith(("s", "sh", "ch", "x")):
        return noun + "es"
    if noun.endswith("y") and noun[-2] not in "aeiou":
        return noun[:-1] + "ies"
    return noun + "s"


def _en_3sg(verb: str) -> str:
    """The English third person singular present of a verb."""
    if verb.endswith(("s", "sh", "ch", "x", "o")):
        return verb + "es"
    if verb.endswith("y") and verb[-2] not in "aeiou":
        return verb[:-1] + "ies"
    return verb + "s"


@dataclass(frozen=True)
class _NounPhrase:
    """What was drawn for a noun phrase, in English terms."""

    noun: str
    plural: bool
    definite: bool
    adj: str | None

    @property
    def person(self) -> str:
        """The person-number a verb agrees with when this phrase is its subject."""
        return "3pl" if self.plural else "3sg"


@dataclass(frozen=True)
class _Clause:
    """What was drawn for a clause: subject (a phrase or an English pronoun), verb, its phrases."""

    subject: _NounPhrase | str
    verb: str  # the English base form
    past: bool
    negated: bool
    obj: _NounPhrase | None
    oblique: tuple[str, _NounPhrase] | None  # (English preposition, its noun phrase)

    @property
    def person(self) -> str:
        """The subject's person-number ("1sg" ... "3pl")."""
        if isinstance(self.subject, _NounPhrase):
            return self.subject.person
        return _PERSON[self.subject]


@dataclass(frozen=True)
class _Sentence:
    """A main clause, an optional time adverb, and an optional (conjunction, subordinate clause)."""

    main: _Clause
    adverb: str | None
    sub: tuple[str, _Clause] | None


class _Generator:
    """Draws sentence structures from ``random.Random(seed)``; the draw order is fixed."""

    def __init__(self, seed: int | str) -> None:
        self.rng = random.Random(seed)

    def noun_phrase(self) -> _NounPhrase:
        """A noun, plural or not, definite or not, with an adjective or not."""
        rng = self.rng
        noun = rng.choice(_NOUNS)
        plural = rng.random() < 0.3
        definite = rng.random() < 0.6
        adj = rng.choice(_ADJECTIVES) if rng.random() < 0.4 else None
        return _NounPhrase(noun, plural, definite, adj)

    def clause(self, past: bool) -> _Clause:
        """Subject, verb (maybe negated), an object if transitive, maybe a prepositional phrase."""
        rng = self.rng
        subject: _NounPhrase | str
        subject = rng.choice(_PRONOUNS)[0] if rng.random() < 0.35 else self.noun_phrase()
        transitive = rng.random() < 0.75
        verb = rng.choice(_TRANSITIVE_PAIRS if transitive else _INTRANSITIVE_PAIRS)[0]
        negated = rng.random() < 0.15
        obj = self.noun_phrase() if transitive else None
        oblique = None
        if rng.random() < 0.3:
            prep = rng.choice(_PREPOSITIONS)
            oblique = (prep, self.noun_phrase())
        return _Clause(subject, verb, past, negated, obj, oblique)

    def sentence(self) -> _Sentence:
        """A main clause, maybe a time adverb, maybe a subordinate clause after a conjunction."""
        rng = self.rng
        past = rng.random() < 0.4
        adverb = None
        if rng.random() < 0.25:
            adverb = "yesterday" if past else "today"
        main = self.clause(past)
        sub = None
        if rng.random() < 0.3:
            conj = rng.choice(_CONJUNCTIONS)
            sub = (conj, self.clause(rng.random() < 0.4))
        return _Sentence(main, adverb, sub)


def _starts_vowel(word: str) -> bool:
    """Whether English writes "an" before this word."""
    return word[0] in "aeiou"


def _finish(words: list[str]) -> str:
    """Words -> a sentence: capitalized, with a full stop."""
    text = " ".join(words) + "."  # untokenized, like real text: sacrebleu tokenizes for BLEU
    return text[0].upper() + text[1:]


def _en_noun_phrase(np: _NounPhrase) -> list[str]:
    """English: article (some/a/an/the), adjective, noun."""
    article = "some" if np.plural else ("an" if _starts_vowel(np.adj or np.noun) else "a")
    words = ["the" if np.definite else article]
    if np.adj:
        words.append(np.adj)
    return [*words, _en_plural(np.noun) if np.plural else np.noun]


def _en_clause(clause: _Clause) -> list[str]:
    """English: subject, verb (do-support for negation), object, prepositional phrase."""
    subject = (
        _en_noun_phrase(clause.subject)
        if isinstance(clause.subject, _NounPhrase)
        else [clause.subject]
    )
    if clause.negated:
        aux = "did" if clause.past else ("does" if clause.person == "3sg" else "do")
        verb = [aux, "not", clause.verb]
    elif clause.past:
        verb = [_PAST[clause.verb]]
    else:
        verb = [_en_3sg(clause.verb) if clause.person == "3sg" else clause.verb]
    words = subject + verb + (_en_noun_phrase(clause.obj) if clause.obj else [])
    if clause.oblique:
        prep, np = clause.oblique
        words += [prep, *_en_noun_phrase(np)]
    return words


def _en_sentence(sentence: _Sentence) -> str:
    """The English side of a sentence."""
    words = ([sentence.adverb] if sentence.adverb else []) + _en_clause(sentence.main)
    if sentence.sub:
        conj, clause = sentence.sub
        words += [conj, *_en_clause(clause)]
    return _finish(words)


def _trg_noun_phrase(np: _NounPhrase, case: str) -> list[str]:
    """A "trg" noun phrase: article, noun, adjective (both agree in gender, number, case)."""
    gender = _LEX.noun_gender[np.noun]
    cls = "pl" if np.plural else gender
    words: list[str] = []
    if np.definite:
        words.append(_DEF[(cls, case)])
    elif not np.plural:
        words.append(_INDEF[(gender, case)])
    words.append(_LEX.noun_stem[np.noun] + (_PLURAL_SUFFIX[gender] if np.plural else ""))
    if np.adj:
        words.append(_LEX.adj_stem[np.adj] + _ADJ_SUFFIX[cls])
    return words


def _trg_clause(clause: _Clause, subordinate: bool) -> tuple[list[str], list[str]]:
    """A "trg" clause as (subject, the rest): verb-final if subordinate, else the verb first."""
    if isinstance(clause.subject, _NounPhrase):
        subject = _trg_noun_phrase(clause.subject, "nom")
    else:
        subject = [_TRG_PRONOUNS[clause.subject]]
    verb = _LEX.verb_stem[clause.verb] + (_PAST_INFIX if clause.past else "")
    verb += _VERB_SUFFIX[clause.person]
    rest = _trg_noun_phrase(clause.obj, "acc") if clause.obj else []
    if clause.oblique:
        prep, np = clause.oblique
        rest += [_TRG_FUNCTION[prep], *_trg_noun_phrase(np, "dat")]
    negation = [_NEGATION] if clause.negated else []
    if subordinate:  # verb-final, negation before the verb
        return subject, rest + negation + [verb]
    return subject, [verb, *negation, *rest]


def _trg_sentence(sentence: _Sentence) -> str:
    """The "trg" side: verb second in the main clause, the subordinate clause after it."""
    subject, rest = _trg_clause(sentence.main, subordinate=False)
    # Verb second: a fronted adverb takes the first slot, and the subject follows the verb.
    if sentence.adverb:
        words = [_TRG_FUNCTION[sentence.adverb], rest[0], *subject, *rest[1:]]
    else:
        words = subject + rest
    if sentence.sub:
        conj, clause = sentence.sub
        sub_subject, sub_rest = _trg_clause(clause, subordinate=True)
        words += [_TRG_FUNCTION[conj], *sub_subject, *sub_rest]
    return _finish(words)


def _trg2_noun_phrase(np: _NounPhrase, case: str) -> list[str]:
    """A "trg2" noun phrase: adjective agreeing in number, noun + number + case (no articles)."""
    number = _TRG2_PLURAL if np.plural else ""
    words = [_LEX2.adj_stem[np.adj] + number + _TRG2_ADJ_FINAL] if np.adj else []
    return [*words, _LEX2.noun_stem[np.noun] + number + _TRG2_CASE[case]]


def _trg2_clause(clause: _Clause, adverb: str | None = None) -> list[str]:
    """A "trg2" clause: subject, time adverb, postpositional phrase, object, verb (last)."""
    if isinstance(clause.subject, _NounPhrase):
        words = _trg2_noun_phrase(clause.subject, "nom")
    else:
        words = [_TRG2_PRONOUNS[clause.subject]]
    if adverb:
        words.append(_TRG2_FUNCTION[adverb])
    if clause.oblique:
        post, np = clause.oblique
        words += [*_trg2_noun_phrase(np, "obl"), _TRG2_FUNCTION[post]]
    if clause.obj:
        words += _trg2_noun_phrase(clause.obj, "acc")
    verb = (_TRG2_NEGATION if clause.negated else "") + _LEX2.verb_stem[clause.verb]
    verb += (_TRG2_PAST if clause.past else "") + _TRG2_PERSON[clause.person]
    return [*words, verb]


def _trg2_sentence(sentence: _Sentence) -> str:
    """The "trg2" side: the main clause, then a subordinate clause that ends in its conjunction."""
    words = _trg2_clause(sentence.main, sentence.adverb)
    if sentence.sub:
        conj, clause = sentence.sub
        words = [*words[:-1], words[-1] + ",", *_trg2_clause(clause), _TRG2_FUNCTION[conj]]
    return _finish(words)


_RENDER: dict[str, Callable[[_Sentence], str]] = {"trg": _trg_sentence, "trg2": _trg2_sentence}


def _check_target(target: str) -> Callable[[_Sentence], str]:
    """The renderer of a target language code; an unknown code is a ValueError naming the known."""
    if target not in _RENDER:
        raise ValueError(
            f"unknown toy target {target!r}; expected one of: {', '.join(TOY_TARGETS)}"
        )
    return _RENDER[target]


def _sentences(n: int, seed: int | str) -> list[_Sentence]:
    """``n`` drawn sentence structures, deterministic for a given seed."""
    gen = _Generator(seed)
    return [gen.sentence() for _ in range(n)]


def _target_seed(seed: int, target: str) -> int | str:
    """The seed of a target's own English sentences: ``seed`` itself for the first target."""
    return seed if target == TOY_TARGETS[0] else f"{seed}:{target}"


def generate_pairs(n: int, seed: int, *, target: str = "trg") -> list[tuple[str, str]]:
    """``n`` (English, target) sentence pairs, deterministic for a given seed.

    ``target`` is a code from TOY_TARGETS; every target of one seed has the same English lines.
    """
    render = _check_target(target)
    return [(_en_sentence(s), render(s)) for s in _sentences(n, _target_seed(seed, target))]


def generate_multi(n: int, seed: int) -> list[tuple[str, dict[str, str]]]:
    """``n`` English sentences, each with its translation into every target of TOY_TARGETS.

    The sentences are the first target's (those of ``generate_pairs(n, seed)``), rendered into
    every grammar; a corpus of :func:`toy_splits` gives each target sentences of its own.
    """
    return [
        (_en_sentence(s), {code: _RENDER[code](s) for code in TOY_TARGETS})
        for s in _sentences(n, seed)
    ]


def _split(
    pairs: list[tuple[str, str]], train_size: int, valid_size: int
) -> dict[str, list[tuple[str, str]]]:
    """Train/valid/test of pairs, less the training pairs whose English is also held out."""
    valid = pairs[train_size : train_size + valid_size]
    test = pairs[train_size + valid_size :]
    held_out = {p[0] for p in valid + test}
    train = [p for p in pairs[:train_size] if p[0] not in held_out]
    return {"train": train, "valid": valid, "test": test}


def toy_splits(
    train_size: int, valid_size: int, test_size: int, seed: int, *, target: str = "trg"
) -> dict[str, list[tuple[str, str]]]:
    """Train/valid/test splits with no test or valid pair also in train (exact duplicates removed).

    ``target`` is a code from TOY_TARGETS. Each target translates English sentences of its own
    (multilingual corpora are rarely parallel), and no target's held-out English is in another
    target's training split: a model of several targets is never validated on an English
    sentence it was trained on.
    """
    if target == TOY_TARGETS[0]:
        pairs = generate_pairs(train_size + valid_size + test_size, seed, target=target)
        return _split(pairs, train_size, valid_size)
    render = _check_target(target)
    first = toy_splits(train_size, valid_size, test_size, seed)
    first_train = {english for english, _ in first["train"]}
    gen = _Generator(_target_seed(seed, target))
    drawn = [gen.sentence() for _ in range(train_size)]
    held_out = 0
    while held_out < valid_size + test_size:  # held out: English that the first target trains on
        sentence = gen.sentence()
        if _en_sentence(sentence) not in first_train:
            drawn.append(sentence)
            held_out += 1
    splits = _split([(_en_sentence(s), render(s)) for s in drawn], train_size, valid_size)
    first_held_out = {english for english, _ in first["valid"] + first["test"]}
    splits["train"] = [p for p in splits["train"] if p[0] not in first_held_out]
    return splits
