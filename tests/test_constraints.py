"""Lexically constrained beam search (decoding/constraints.py): every finished hypothesis holds
each of its sentence's constraints; on a tiny vocabulary an exhaustive beam finds exactly the
best sequences that an enumeration of all of them finds (scores and length penalty included);
no constraints change nothing; a batch equals its sentences one at a time; the KV cache changes
nothing; bad constraints, and constraints with no room, are one-line errors; every hypothesis
returned holds them (fewer than asked where fewer do). Checked on a random-weight model and on a
tiny model trained to reverse sequences (which ends its hypotheses with EOS)."""

from __future__ import annotations

import dataclasses
import itertools
import random
import warnings

import pytest
import torch
from conftest import REVERSE_VOCAB as VOCAB
from conftest import reverse_batch, tiny_transformer
from conftest import reverse_model as train_reverse_model
from torch.nn import functional

from transformer_mt.config import DecodeConfig
from transformer_mt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from transformer_mt.decoding import (
    DecodeResult,
    Ensemble,
    beam_search,
    constrained_beam_search,
    decode_sources,
    greedy_search,
    length_penalty,
    search,
)
from transformer_mt.decoding.constraints import (
    ConstraintRows,
    ConstraintTable,
    Words,
    allocation_order,
    drop_duplicates,
    kmp_steps,
    unmet,
)
from transformer_mt.decoding.text import check_room, translate_texts
from transformer_mt.errors import MTError
from transformer_mt.model import Transformer


@pytest.fixture(scope="module")
def random_model() -> Transformer:
    return tiny_transformer(0).eval()


@pytest.fixture(scope="module")
def reverse_model() -> Transformer:
    """Trained for 150 steps (~3 s) to reverse 2-7 symbols: it ends hypotheses with EOS."""
    return train_reverse_model(150)


@pytest.fixture(scope="module")
def random_src() -> torch.Tensor:
    """Eight sources of 3-12 pieces (EOS included), padded: (8, 12)."""
    from conftest import random_sources

    return random_sources(VOCAB)


@pytest.fixture(scope="module")
def reverse_src() -> torch.Tensor:
    return reverse_batch(torch.Generator().manual_seed(99), 12)[0]


LEN = DecodeConfig(max_len_a=2.0, max_len_b=1.0)


def _beam(size: int, nbest: int = 1, **kw) -> DecodeConfig:
    return dataclasses.replace(LEN, beam_size=size, nbest=nbest, **kw)


def _toks(results: list[DecodeResult]) -> list[list[list[int]]]:
    return [[h.tokens for h in r.nbest] for r in results]


def _scores(results: list[DecodeResult]) -> list[float]:
    return [h.score for r in results for h in r.nbest]


def _random_constraints(n: int, seed: int, most: int = 3) -> list[list[list[int]]]:
    """Per sentence 0..``most`` constraints of 1-3 symbols (ids 4 .. VOCAB-1)."""
    rng = random.Random(seed)
    return [
        [
            [rng.randrange(4, VOCAB) for _ in range(rng.randint(1, 3))]
            for _ in range(rng.randint(0, most))
        ]
        for _ in range(n)
    ]


def holds_all(tokens: list[int], constraints: list[list[int]]) -> bool:
    """Whether ``tokens`` holds every constraint contiguously, in disjoint places (any order):
    the exact definition, by trying every occurrence of each constraint."""

    def place(todo: list[list[int]], used: frozenset[int]) -> bool:
        if not todo:
            return True
        first, rest = todo[0], todo[1:]
        for start in range(len(tokens) - len(first) + 1):
            span = frozenset(range(start, start + len(first)))
            fits = tokens[start : start + len(first)] == first and not span & used
            if fits and place(rest, used | span):
                return True
        return False

    return place(sorted(constraints, key=len, reverse=True), frozenset())


def _ending(text: list[int], ids: list[int]) -> int:
    """The length of the longest prefix of ``ids`` that ends ``text``."""
    return max(q for q in range(min(len(ids), len(text)) + 1) if text[len(text) - q :] == ids[:q])


def tracker_meets(tokens: list[int], constraints: list[list[int]]) -> bool:
    """The rule by which the search counts constraints (constraints.py's text), written naively:
    each unmet constraint's match is the longest prefix of it that ends the tokens written since
    the last constraint was met; the longest completed one is met (the first among equals)
    unless another match in progress is as long or longer; meeting one starts every match
    afresh."""
    return len(tracker_met_at(tokens, constraints)) == len(constraints)


def tracker_met_at(tokens: list[int], constraints: list[list[int]]) -> list[int]:
    """The positions of the tokens at which :func:`tracker_meets` meets a constraint."""
    return [i for i, (_, meets) in enumerate(_tracker_steps(tokens, constraints)) if meets]


def tracker_detours(tokens: list[int], constraints: list[list[int]]) -> bool:
    """Whether ``tokens`` ever leaves a match in progress (by :func:`tracker_meets`' rule) with
    a token that goes on with none of the matches in progress: what the search never writes."""
    steps = _tracker_steps(tokens, constraints)
    return any(going and tok not in going for tok, (going, _) in zip(tokens, steps, strict=True))


def _tracker_steps(tokens: list[int], constraints: list[list[int]]) -> list[tuple[list[int], bool]]:
    """Per token: the next tokens of the matches in progress before it, and whether it meets a
    constraint (the rule of :func:`tracker_meets`)."""
    met = [False] * len(constraints)
    progress = [0] * len(constraints)
    since: list[int] = []  # tokens since the last constraint was met
    steps = []
    for tok in tokens:
        going = [
            c[p]
            for c, m, p in zip(constraints, met, progress, strict=True)
            if not m and 0 < p < len(c)
        ]
        since.append(tok)
        progress = [0 if m else _ending(since, c) for c, m in zip(constraints, met, strict=True)]
        done = [
            len(c) if not m and p == len(c) else 0
            for c, m, p in zip(constraints, met, progress, strict=True)
        ]
        longest = max(done, default=0)
        others = [p for p, d, m in zip(progress, done, met, strict=True) if not d and not m]
        meets = bool(longest and max(others, default=0) < longest)
        if meets:
            met[done.index(longest)] = True
            since, progress = [], [0] * len(constraints)
        steps.append((going, meets))
    return steps


def _check_holds(results: list[DecodeResult], constraints: list[list[list[int]]]) -> None:
    """Every hypothesis returned is marked as meeting its constraints, and holds them."""
    for res, cons in zip(results, constraints, strict=True):
        for hyp in res.nbest:
            assert hyp.constraints_met, (hyp, cons)
            assert holds_all(hyp.tokens, cons), (hyp, cons)
            assert tracker_meets(hyp.tokens, cons)


# (1) Every constraint appears.


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("which", ["random", "reverse"])
def test_every_finished_hypothesis_holds_its_constraints(
    which, seed, random_model, reverse_model, random_src, reverse_src
):
    model, src = (random_model, random_src) if which == "random" else (reverse_model, reverse_src)
    constraints = _random_constraints(src.size(0), seed)
    results = constrained_beam_search(model, src, _beam(4, 4, max_len_b=3.0), constraints)
    _check_holds(results, constraints)
    for res in results:
        scores = [h.score for h in res.nbest]
        assert scores == sorted(scores, reverse=True)
        assert len({tuple(h.tokens) for h in res.nbest}) == len(res.nbest) == 4
    if which == "reverse":  # the trained model ends hypotheses with EOS once they are written
        # (a long hypothesis cut at the budget may still outscore them in a sentence's n-best)
        assert sum(any(h.finished for h in r.nbest) for r in results) >= len(results) - 2


def test_a_met_constraint_is_never_followed_by_a_token_that_continues_a_word(
    random_model, random_src
):
    continues = torch.zeros(VOCAB, dtype=torch.bool)
    continues[4:10] = True  # half the symbols "go on with the word before them"
    words = Words(starts=~continues, continues=continues)
    follows = {"masked": 0, "unmasked": 0}
    for seed in range(3):
        constraints = _random_constraints(random_src.size(0), seed)
        for name, given in (("masked", words), ("unmasked", None)):
            decode = _beam(4, 4, max_len_b=3.0)
            results = constrained_beam_search(
                random_model, random_src, decode, constraints, words=given
            )
            _check_holds(results, constraints)
            for res, cons in zip(results, constraints, strict=True):
                for hyp in res.nbest:
                    met_at = tracker_met_at(hyp.tokens, cons)
                    after = [hyp.tokens[i + 1] for i in met_at if i + 1 < len(hyp.tokens)]
                    follows[name] += sum(4 <= tok < 10 for tok in after)
    assert follows["masked"] == 0
    assert follows["unmasked"] > 0  # the random model does write them where nothing stops it


def test_the_budget_grows_to_fit_the_constraints(random_model, random_src):
    """A length rule of 2 tokens and 7 constraint tokens: the budget becomes 8, the best meets
    them; where the position table (64) cannot hold them beside the prefix and EOS, a one-line
    MTError says so before any search."""
    constraints = [[[5, 6, 7], [8], [9, 10, 11]]] + [[]] * 7
    short = _beam(3, 3, max_len_a=2.0, max_len_b=0.0)
    results = constrained_beam_search(random_model, random_src, short, constraints)
    _check_holds(results, constraints)
    assert all(len(h.tokens) <= 8 for h in results[0].nbest)
    assert all(len(h.tokens) <= 2 for r in results[1:] for h in r.nbest)
    exactly = [[[5] * 40, [6] * 23]]  # 63 and EOS: the whole table
    (res,) = constrained_beam_search(random_model, random_src[:1], _beam(3, 3), exactly)
    _check_holds([res], exactly)
    assert all(len(h.tokens) == 64 for h in res.nbest)
    for too_long, prefixes in (([[[5] * 40, [6] * 24]], None), (exactly, [[7]])):
        message = r"sentence 0: its constraints hold 6[34] target ids, and its output has room"
        with pytest.raises(MTError, match=message + " for 6[23]") as caught:
            constrained_beam_search(
                random_model, random_src[:1], _beam(3, 3), too_long, prefixes=prefixes
            )
        assert "\n" not in str(caught.value)


def test_every_hypothesis_returned_holds_the_constraints_at_a_tight_budget(
    random_model, random_src
):
    """A budget a few tokens over the constraints': the last steps keep the beams that can still
    meet them (a bank that cannot fill in the steps left comes after those that can), so all
    K hypotheses cut at the budget hold them, and none that lacks one is returned."""
    decode = _beam(4, 4, max_len_a=0.0, max_len_b=0.0)
    for seed in range(4):
        constraints = [c or [[5]] for c in _random_constraints(8, 23 + seed)]
        for extra in (1, 3):
            tight = dataclasses.replace(decode, max_len_a=float(extra))
            lens = [sum(map(len, c)) + 1 for c in constraints]  # the budget's floor
            results = constrained_beam_search(random_model, random_src, tight, constraints)
            _check_holds(results, constraints)
            for res, n in zip(results, lens, strict=True):
                assert len(res.nbest) == 4
                assert all(len(h.tokens) <= max(n, extra) for h in res.nbest)


def test_a_sentence_that_no_hypothesis_can_meet_returns_its_best_alone(random_model, random_src):
    """Three one-token terms that each go on with a word: after one is met, the next may not
    follow at once, and a budget of 4 (the terms and EOS) cannot hold them with the tokens
    between. The one result is the best cut hypothesis, marked as lacking them; a budget with
    room for the tokens between gives 3 that hold them."""
    continues = torch.zeros(VOCAB, dtype=torch.bool)
    continues[5:8] = True
    words = Words(starts=~continues, continues=continues)
    constraints = [[[5], [6], [7]]]
    src = random_src[:1]
    tight = _beam(3, 3, max_len_a=0.0, max_len_b=0.0)
    (res,) = constrained_beam_search(random_model, src, tight, constraints, words=words)
    assert len(res.nbest) == 1
    (best,) = res.nbest
    assert not best.constraints_met and not best.finished and len(best.tokens) == 4
    assert unmet(constraints[0], best.tokens) and not tracker_meets(best.tokens, constraints[0])
    roomy = dataclasses.replace(tight, max_len_a=6.0)
    (res,) = constrained_beam_search(random_model, src, roomy, constraints, words=words)
    assert len(res.nbest) == 3
    _check_holds([res], constraints)


def test_prefix_and_constraints_together(random_model, random_src):
    prefixes = [[5, 6], [], [7, 7, 7], [9], [4], [], [12], [13, 14]]
    constraints = _random_constraints(8, 5)
    results = constrained_beam_search(
        random_model, random_src, _beam(3, 3), constraints, prefixes=prefixes
    )
    _check_holds(results, constraints)
    for res, prefix in zip(results, prefixes, strict=True):
        assert all(h.tokens[: len(prefix)] == prefix for h in res.nbest)


def test_tracker_and_automaton_follow_their_definitions():
    """ConstraintRows.advance, token by token over random sequences, meets what the naive rule
    meets; the KMP automaton's states are the longest prefixes that end the text read."""
    rng = random.Random(0)
    for _ in range(200):
        cons = [
            [rng.randrange(4, 7) for _ in range(rng.randint(1, 3))]
            for _ in range(rng.randint(1, 3))
        ]
        seq = [rng.randrange(4, 7) for _ in range(rng.randint(0, 9))]
        table = ConstraintTable([cons], torch.device("cpu"))
        rows, sent = ConstraintRows.start(table, torch.tensor([0])), torch.tensor([0])
        for t in seq:
            rows = rows.advance(table, sent, torch.tensor([t]))
        assert bool(rows.all_met()[0]) == tracker_meets(seq, cons), (cons, seq)
    for ids in ([4, 4, 5], [4, 5, 4, 5, 6], [7], [4, 4, 4]):
        steps = kmp_steps(ids)
        for p in range(len(ids) + 1):
            for k in range(len(ids)):
                want = _ending([*ids[:p], ids[k]], ids)
                assert steps[p][k] == want


# (2) Against brute force.

TINY_VOCAB = 8  # PAD, UNK, BOS, EOS + 4 symbols
WRITABLE = [UNK_ID, 4, 5, 6, 7]  # every id search may write besides EOS


@pytest.fixture(scope="module")
def tiny_model() -> Transformer:
    return tiny_transformer(3, vocab=TINY_VOCAB).eval()


def _all_scored(model: Transformer, src: torch.Tensor, n: int, alpha: float) -> list[tuple]:
    """Every output of a budget of ``n`` tokens, scored as search scores it: (tokens, finished,
    score), from one teacher-forced pass over all of them."""
    outs = [
        (list(t), True) for length in range(n) for t in itertools.product(WRITABLE, repeat=length)
    ]
    outs += [(list(t), False) for t in itertools.product(WRITABLE, repeat=n)]
    written = [[*t, EOS_ID] if fin else t for t, fin in outs]
    trg = torch.full((len(outs), n + 1), PAD_ID)
    for i, w in enumerate(written):
        trg[i, : len(w) + 1] = torch.tensor([BOS_ID, *w])
    with torch.inference_mode():
        logits = model(src.expand(len(outs), -1), trg[:, :-1])  # (N, n, V)
    log_probs = functional.log_softmax(logits.float(), dim=-1)
    scored = []
    for i, ((tokens, fin), w) in enumerate(zip(outs, written, strict=True)):
        logp = log_probs[i, torch.arange(len(w)), torch.tensor(w, dtype=torch.long)].sum().item()
        scored.append((tokens, fin, logp / length_penalty(len(w), alpha)))
    return scored


@pytest.mark.parametrize("rules", [False, True], ids=["no-word-rules", "every-token-mid-word"])
@pytest.mark.parametrize(
    "constraints",
    [
        [[5], [6, 7]],
        [[5, 5]],
        [[4, 5], [5, 6]],
        [[6], [6]],
        [[4, 5, 4]],
        [[5], [4, 5, 6]],
        [[5], [5, 6]],
    ],
    ids=["two", "repeat", "sharing", "twice", "self-overlap", "inside", "prefix-of-another"],
)
def test_an_exhaustive_beam_finds_what_enumeration_finds(constraints, rules, tiny_model):
    """Budget 4 (the length rule's, or the constraints' + EOS): a beam wide enough to keep every
    candidate ranks all outputs exactly as an enumeration of them all does (those without a
    detour from a started term that meet the constraints, by score with the length penalty),
    and they hold the constraints; any beam >= 2 returns one that
    meets them and scores no better. With the word rules and no token starting a word, every
    match in progress must go on (the end-of-word rule masks nothing)."""
    src = torch.tensor([[4, 6, 5, EOS_ID]])
    decode = DecodeConfig(beam_size=1000, nbest=25, max_len_a=4.0, max_len_b=0.0, len_penalty=1.0)
    none = torch.zeros(TINY_VOCAB, dtype=torch.bool)
    words = Words(none, none) if rules else None
    (res,) = constrained_beam_search(tiny_model, src, decode, [constraints], words=words)
    n = max(4, sum(map(len, constraints)) + 1)
    # Search can end (EOS) only what meets the constraints; it cuts the rest at the budget.
    # With the word rules (every token mid-word), outputs that leave a match half way are
    # never searched.
    scored = [
        (t, f, s, tracker_meets(t, constraints))
        for t, f, s in _all_scored(tiny_model, src, n, decode.len_penalty)
        if not (rules and tracker_detours(t, constraints))
    ]
    # The n-best hold only those that meet the constraints (some always do here).
    ranked = sorted([x for x in scored if x[3]], key=lambda x: x[2], reverse=True)[:25]
    assert [(h.tokens, h.finished, h.constraints_met) for h in res.nbest] == [
        (t, f, m) for t, f, _, m in ranked
    ]
    assert [h.score for h in res.nbest] == pytest.approx([s for _, _, s, _ in ranked], abs=1e-4)
    assert all(holds_all(h.tokens, constraints) for h in res.nbest if h.constraints_met)
    best = ranked[0][2]
    # Every finished output that holds the constraints, by the exact definition, is ranked.
    exact = max(s for t, f, s, _ in scored if f and holds_all(t, constraints))
    assert exact <= best + 1e-6
    for k in (2, 3):
        (small,) = constrained_beam_search(
            tiny_model,
            src,
            dataclasses.replace(decode, beam_size=k, nbest=k),
            [constraints],
            words=words,
        )
        assert small.nbest[0].constraints_met and holds_all(small.tokens, constraints)
        assert small.score <= best + 1e-4


# (3) No constraints: the plain search, exactly.


@pytest.mark.parametrize("beam", [1, 4])
def test_no_constraints_change_nothing(beam, random_model, random_src):
    decode = _beam(beam, beam)
    plain = search(random_model, random_src, decode)
    for none in (None, [[]] * 8):
        got = search(random_model, random_src, decode, constraints=none)
        assert _toks(got) == _toks(plain)
        assert _scores(got) == _scores(plain)  # exactly: the same path
        assert all(h.constraints_met for r in got for h in r.nbest)


def test_an_unconstrained_sentence_beside_constrained_ones_is_searched_as_alone(
    random_model, random_src, reverse_model, reverse_src
):
    """The constrained path itself, on a sentence without constraints, is beam search."""
    for model, src in ((random_model, random_src), (reverse_model, reverse_src)):
        constraints = [[]] + _random_constraints(src.size(0) - 1, 7, most=2)
        constraints[1] = constraints[1] or [[5]]
        got = constrained_beam_search(model, src, _beam(4, 4), constraints)
        row = src[0][src[0] != PAD_ID][None]
        want = beam_search(model, row, _beam(4, 4))
        assert _toks(got[:1]) == _toks(want)
        assert _scores(got[:1]) == pytest.approx(_scores(want), abs=1e-5)


# (4) A batch equals its sentences one at a time.


@pytest.mark.parametrize("which", ["random", "reverse"])
def test_batch_equals_one_at_a_time(which, random_model, reverse_model, random_src, reverse_src):
    model, src = (random_model, random_src) if which == "random" else (reverse_model, reverse_src)
    constraints = _random_constraints(src.size(0), 11)
    batched = constrained_beam_search(model, src, _beam(3, 3), constraints)
    for i, row in enumerate(src):
        alone = constrained_beam_search(
            model, row[row != PAD_ID][None], _beam(3, 3), constraints[i : i + 1]
        )
        assert _toks(alone) == _toks(batched[i : i + 1])
        assert _scores(alone) == pytest.approx(_scores(batched[i : i + 1]), abs=1e-5)
        assert [h.constraints_met for h in alone[0].nbest] == [
            h.constraints_met for h in batched[i].nbest
        ]
    sources = [row[row != PAD_ID].tolist() for row in src]
    via = decode_sources(model, sources, _beam(3, 3, batch_tokens=30), constraints=constraints)
    assert _toks(via) == _toks(batched)


def test_finished_sentences_leave_the_batch_with_their_states(
    monkeypatch, reverse_model, reverse_src
):
    """Dropping finished sentences a block at a time (ROW_BLOCK 3) or keeping them all retired
    gives the same results: the constraint states leave with their rows."""
    import importlib

    search_module = importlib.import_module("transformer_mt.decoding.search")
    constraints = _random_constraints(reverse_src.size(0), 13)
    results = {}
    for block in (1, 3, 10_000):
        monkeypatch.setattr(search_module, "ROW_BLOCK", block)
        results[block] = constrained_beam_search(
            reverse_model, reverse_src, _beam(3, 3), constraints
        )
    for block in (3, 10_000):
        assert _toks(results[block]) == _toks(results[1])
        assert _scores(results[block]) == pytest.approx(_scores(results[1]), abs=1e-5)


# (5) The cache changes nothing.


@pytest.mark.parametrize("which", ["random", "reverse"])
def test_cache_equals_no_cache(which, random_model, reverse_model, random_src, reverse_src):
    model, src = (random_model, random_src) if which == "random" else (reverse_model, reverse_src)
    constraints = _random_constraints(src.size(0), 17)
    cached = constrained_beam_search(model, src, _beam(4, 4), constraints)
    full = constrained_beam_search(model, src, _beam(4, 4), constraints, use_cache=False)
    assert _toks(cached) == _toks(full)
    assert _scores(cached) == pytest.approx(_scores(full), abs=1e-4)


def test_an_ensemble_of_one_searches_as_its_model(random_model, random_src):
    constraints = _random_constraints(8, 19)
    alone = constrained_beam_search(random_model, random_src, _beam(3, 3), constraints)
    ensemble = constrained_beam_search(
        Ensemble([random_model]), random_src, _beam(3, 3), constraints
    )
    assert _toks(ensemble) == _toks(alone)


# (6) Bad input.


def test_bad_constraints_are_one_line_errors(random_model, random_src):
    src = random_src[:2]
    cases = [
        (
            [[[5, VOCAB]], []],
            rf"sentence 0, constraint 0: id {VOCAB} is outside the target vocabulary \(0..15\)",
        ),
        ([[], [[5], [-1]]], r"sentence 1, constraint 1: id -1 is outside"),
        ([[[5], []], []], "sentence 0, constraint 1 is empty"),
        ([[[6, EOS_ID]], []], "sentence 0, constraint 0: id 3 is PAD, BOS, EOS or a language tag"),
        ([[[BOS_ID]], []], "id 2 is PAD, BOS, EOS"),
    ]
    for constraints, message in cases:
        with pytest.raises(MTError, match=message) as caught:
            search(random_model, src, _beam(3), constraints=constraints)
        assert "\n" not in str(caught.value)
    for decode in (_beam(1), _beam(1, sampling=True)):
        with pytest.raises(MTError, match="need beam search with a beam of at least 2"):
            search(random_model, src, decode, constraints=[[[5]], []])
    with pytest.raises(ValueError, match="3 constraint lists for 2 sentences"):
        search(random_model, src, _beam(3), constraints=[[[5]], [], []])
    with pytest.raises(ValueError, match="1 constraint lists for 8 sources"):
        decode_sources(random_model, [[5, EOS_ID]] * 8, _beam(3), constraints=[[[5]]])
    # Greedy and sampling without constraints (or with empty lists) run as ever.
    assert _toks(search(random_model, src, _beam(1), constraints=[[], []])) == _toks(
        greedy_search(random_model, src, LEN)
    )


class _CharTokenizer:
    """Stands for a sentencepiece model: one id per letter a..l (4..15), spaces dropped."""

    vocab_size = VOCAB

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [[4 + "abcdefghijkl".index(ch) for ch in text if ch != " "] for text in texts]

    def decode(self, ids) -> str:
        return "".join("abcdefghijkl"[i - 4] for i in ids if i >= 4)

    def id_to_piece(self, ids) -> list[str]:  # each letter a word of its own
        return [f"<{i}>" if i < 4 else "\u2581" + "abcdefghijkl"[i - 4] for i in ids]


def test_translate_texts_passes_terms_as_target_pieces(random_model):
    tok = _CharTokenizer()
    lines = ["abc", "", "d e f g", "hij"]
    terms = [["ka"], ["x"], ["bb", "c"], []]
    got = translate_texts(random_model, tok, tok, lines, _beam(3, 2), constraints=terms)
    assert got[1] == [("", 0.0)] * 2
    for (text, _), want in ((got[0][0], ["ka"]), (got[2][0], ["bb", "c"])):
        assert holds_all(list(text), [list(t) for t in want]), text
    plain = translate_texts(random_model, tok, tok, lines, _beam(3, 2))
    assert got[3] == plain[3]
    with pytest.raises(MTError, match="2 constraint lists for 4 input lines"):
        translate_texts(random_model, tok, tok, lines, _beam(3), constraints=[[], []])
    with pytest.raises(MTError, match=r"line 3: constraint 2 is empty"):
        translate_texts(
            random_model, tok, tok, lines, _beam(3), constraints=[[], [], ["a", " "], []]
        )


def test_terms_with_no_room_in_a_line_are_one_line_errors_naming_them(random_model):
    """The position table (64) holds a line's terms, its prefix and EOS, or an MTError names
    the line and the term (a long one shortened), before any search."""
    tok = _CharTokenizer()
    long_term = "a" * 70
    cases = [
        ([[long_term]], None, r"line 1: the term 'a{40}…' has 70 target pieces, and a "
         r"translation of this line has room for 63 \(the model's 64 target positions less "
         r"EOS\): shorten it or leave it out"),
        ([["b" * 40, "c" * 23, "d"]], None, r"line 1: the line's terms up to 'd' have 64 "
         r"target pieces, and a translation of this line has room for 63"),
        ([["b" * 40, "c" * 23]], ["ef"], r"line 1: the line's terms up to 'c{23}' have 63 target "
         r"pieces, and a translation of this line has room for 61 \(the model's 64 target "
         r"positions less EOS and its prefix's 2 pieces\): give the line fewer terms"),
    ]  # fmt: skip
    for terms, prefixes, message in cases:
        with pytest.raises(MTError, match=message) as caught:
            translate_texts(
                random_model, tok, tok, ["abc"], _beam(3), constraints=terms, prefixes=prefixes
            )
        assert "\n" not in str(caught.value)
    fits = [[("b" * 40, [5] * 40), ("c" * 23, [6] * 23)]]
    check_room(fits, [0], None, 64)
    with pytest.raises(MTError, match="line 7: the line's terms up to"):
        check_room(fits, [0], [[4]], 64, first_line=7)
    got = translate_texts(random_model, tok, tok, ["abc"], _beam(3), constraints=[["bb" * 20]])
    assert "b" * 40 in got[0][0][0]


class _WordTokenizer(_CharTokenizer):
    """As _CharTokenizer, but b, c and d go on with the word before them."""

    def id_to_piece(self, ids) -> list[str]:
        return [p[1:] if p[1:] in ("b", "c", "d") else p for p in super().id_to_piece(ids)]


def test_a_line_whose_translation_lacks_a_term_says_which(random_model):
    """Where no hypothesis holds every term (each goes on with a word, and the budget leaves
    no token between them), the line gets one translation and a warning naming it and the
    terms it lacks; with room, every translation holds them, and no warning."""
    tok = _WordTokenizer()
    terms = [["b", "c", "d"]]
    tight = _beam(3, 3, max_len_a=0.0, max_len_b=0.0)
    with pytest.warns(UserWarning, match=r"line 5: no translation holds every term; the best "
                      r"one, given, lacks ('[bcd]'(, )?)+$") as caught:  # fmt: skip
        (got,) = translate_texts(random_model, tok, tok, ["abc"], tight, constraints=terms,
                                 first_line=5)  # fmt: skip
    assert len(got) == 1
    lacked = str(caught[0].message).split("lacks ")[1]
    assert all((f"'{t}'" in lacked) == (t not in got[0][0]) for t in "bcd"), (got, lacked)
    roomy = dataclasses.replace(tight, max_len_a=6.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        (got,) = translate_texts(random_model, tok, tok, ["abc"], roomy, constraints=terms)
    assert len(got) == 3 and all(set("bcd") <= set(text) for text, _ in got)


def test_allocation_stripes_the_banks_and_drops_repeats():
    """fairseq's example: banks 3 3 3 2 2 2 2 1 1 1 0 0 (each bank's candidates best first) are
    taken as 3 2 1 0 3 2 1 0 3 2 1 2; banks that can no longer meet the constraints come after
    the others; invalid candidates come last; a repeated (beam, token) keeps its first entry."""
    banks = torch.tensor([[3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 0, 0, 3]])
    scores = -torch.arange(13.0)[None]
    valid = torch.ones_like(banks, dtype=torch.bool)
    valid[0, 12] = False
    order = allocation_order(scores, banks, valid, 3)
    assert banks[0, order[0]].tolist() == [3, 2, 1, 0, 3, 2, 1, 0, 3, 2, 1, 2, 3]
    assert order[0, -1] == 12 and order[0, :4].tolist() == [0, 3, 7, 10]
    # Banks below 2 can no longer meet the constraints: after the others, still striped.
    late = allocation_order(scores, banks, valid, 3, torch.tensor([2]))
    assert banks[0, late[0]].tolist() == [3, 2, 3, 2, 3, 2, 2, 1, 0, 1, 0, 1, 3]
    assert bool((allocation_order(scores, banks, valid, 3, torch.tensor([0])) == order).all())
    keys = torch.tensor([[5, 7, 5, 9, 7, 7]])
    kept = drop_duplicates(keys, torch.tensor([[True, True, True, True, False, True]]))
    assert kept.tolist() == [[True, True, False, True, False, False]]


def test_a_match_in_progress_allows_only_its_next_tokens():
    """After 4 5 with the constraints [5] and [4 5 6]: [5] is complete but left to the longer
    match, whose next token, 6, is the only one allowed; with nothing in progress, all are."""
    mid_word = torch.zeros(VOCAB, dtype=torch.bool)  # no token starts a word: always inside
    table = ConstraintTable([[[5], [4, 5, 6]]], torch.device("cpu"), Words(mid_word, mid_word))
    sent = torch.tensor([0, 0])
    rows = ConstraintRows.start(table, sent)
    for tok in ([4, 7], [5, 7]):
        rows = rows.advance(table, sent, torch.tensor(tok))
    log_probs = rows.mask_detours(torch.zeros(2, VOCAB), table, sent)
    assert (log_probs[0] > float("-inf")).nonzero().flatten().tolist() == [6]
    assert bool((log_probs[1] == 0).all())


def test_a_forced_prefix_wins_over_the_word_rules(random_model, random_src):
    """A prefix that writes a term and goes on with its word (the prefix "Two toddlers" with the
    term "toddler"), or starts a term and leaves it mid-word: the prefix is written, the
    search goes on (no rule leaves a row without a token)."""
    continues = torch.zeros(VOCAB, dtype=torch.bool)
    continues[6] = True
    words = Words(starts=~continues, continues=continues)
    src = random_src[:2]
    for prefixes, constraints in (
        ([[5, 6], [5, 6]], [[[5]], [[5]]]),
        ([[5, 4]] * 2, [[[5, 6]]] * 2),
    ):
        results = constrained_beam_search(
            random_model, src, _beam(3, 2), constraints, prefixes=prefixes, words=words
        )
        for res, prefix in zip(results, prefixes, strict=True):
            assert res.nbest and all(h.tokens[:2] == prefix for h in res.nbest)
