"""Search invariants: beam 1 equals greedy, the KV cache changes nothing, a batch equals its sentences
one at a time, n-best lists are sorted and distinct, top-k 1 sampling equals greedy, and the length
limit holds; ``search`` runs what the DecodeConfig asks for, and ``decode_sources`` batches within
its budget and answers in input order. Forced target prefixes start every hypothesis and keep those
invariants (an empty prefix changes nothing; their log-probs count in the score). Checked on a random-weight model and on a tiny model trained
to reverse sequences (so that beam search really ends hypotheses with EOS)."""

from __future__ import annotations

import dataclasses
import importlib

import numpy as np
import pytest
import torch
from conftest import REVERSE_VOCAB as VOCAB
from conftest import reverse_batch, tiny_transformer
from conftest import reverse_model as train_reverse_model
from torch.nn import functional

from transformer_mt.config import DecodeConfig, validate_decode
from transformer_mt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from transformer_mt.decoding import (
    DecodeResult,
    beam_search,
    decode_sources,
    filter_logits,
    greedy_search,
    length_penalty,
    max_target_lengths,
    sample,
    search,
)
from transformer_mt.decoding.search import LineDraws, draw_tokens
from transformer_mt.errors import MTError
from transformer_mt.model import Transformer

# The module (the package's name "search" is the function).
search_module = importlib.import_module("transformer_mt.decoding.search")


@pytest.fixture(scope="module")
def random_model() -> Transformer:
    return tiny_transformer(0).eval()


@pytest.fixture(scope="module")
def reverse_model() -> Transformer:
    """Trained for 250 steps (~6 s) to reverse 2-7 symbols; greedy then gets ~100% right."""
    return train_reverse_model(250)


@pytest.fixture(scope="module")
def random_src() -> torch.Tensor:
    """Eight sources of 3-12 pieces (EOS included), padded: (8, 12)."""
    from conftest import random_sources

    return random_sources(VOCAB)


@pytest.fixture(scope="module")
def reverse_src() -> torch.Tensor:
    return reverse_batch(torch.Generator().manual_seed(99), 24)[0]


def _toks(results: list[DecodeResult]) -> list[list[list[int]]]:
    return [[h.tokens for h in r.nbest] for r in results]


LEN = DecodeConfig(max_len_a=2.0, max_len_b=1.0)  # greedy ignores the beam settings


def _beam(size: int, nbest: int = 1, **kw) -> DecodeConfig:
    return dataclasses.replace(LEN, beam_size=size, nbest=nbest, **kw)


def _sampling(**kw) -> DecodeConfig:
    return dataclasses.replace(LEN, beam_size=1, sampling=True, **kw)


@pytest.mark.parametrize("which", ["random", "reverse"])
def test_beam_one_equals_greedy(which, random_model, reverse_model, random_src, reverse_src):
    model, src = (random_model, random_src) if which == "random" else (reverse_model, reverse_src)
    greedy = greedy_search(model, src, LEN)
    beam = beam_search(model, src, _beam(1))
    assert _toks(beam) == _toks(greedy)
    assert [r.score for r in beam] == pytest.approx([r.score for r in greedy], abs=1e-5)


@pytest.mark.parametrize("search", ["greedy", "beam"])
@pytest.mark.parametrize("which", ["random", "reverse"])
def test_cache_equals_no_cache(search, which, random_model, reverse_model, random_src, reverse_src):
    model, src = (random_model, random_src) if which == "random" else (reverse_model, reverse_src)
    if search == "greedy":
        cached = greedy_search(model, src, LEN)
        full = greedy_search(model, src, LEN, use_cache=False)
    else:
        cached = beam_search(model, src, _beam(4, 4))
        full = beam_search(model, src, _beam(4, 4), use_cache=False)
    assert _toks(cached) == _toks(full)
    assert [h.score for r in cached for h in r.nbest] == pytest.approx(
        [h.score for r in full for h in r.nbest], abs=1e-4
    )


@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_batch_equals_one_at_a_time(search, random_model, random_src):
    def run(src: torch.Tensor) -> list[DecodeResult]:
        if search == "greedy":
            return greedy_search(random_model, src, LEN)
        return beam_search(random_model, src, _beam(3, 3))

    batched = run(random_src)
    for i, row in enumerate(random_src):
        alone = run(row[row != PAD_ID][None])  # (1, S_i): no padding at all
        assert _toks(alone) == _toks(batched[i : i + 1])


@pytest.mark.parametrize("which", ["random", "reverse"])
def test_nbest_sorted_distinct_and_complete(
    which, random_model, reverse_model, random_src, reverse_src
):
    model, src = (random_model, random_src) if which == "random" else (reverse_model, reverse_src)
    for res in beam_search(model, src, _beam(5, 5)):
        scores = [h.score for h in res.nbest]
        assert len(res.nbest) == 5
        assert scores == sorted(scores, reverse=True)
        assert len({tuple(h.tokens) for h in res.nbest}) == 5


def test_trained_model_beam_reverses_and_ends_with_eos(reverse_model):
    src, trg = reverse_batch(torch.Generator().manual_seed(7), 32)
    results = beam_search(reverse_model, src, _beam(4, 4))
    want = [[t for t in row.tolist()[1:] if t not in (PAD_ID, EOS_ID)] for row in trg]
    assert all(r.nbest[0].finished for r in results)
    assert sum(r.tokens == w for r, w in zip(results, want, strict=True)) >= 30
    # Ended hypotheses of different lengths compete: the penalty's ranking uses EOS-terminated ones.
    assert sum(h.finished for r in results for h in r.nbest) > 32


def test_finished_sentences_leave_the_batch(monkeypatch, reverse_model, reverse_src):
    """Rows fed to the decoder shrink as sentences end (not masked and kept), a block of
    ROW_BLOCK rows at a time (8 here: the fixture's 24 sentences fit in one block of 32)."""
    monkeypatch.setattr(search_module, "ROW_BLOCK", 8)
    rows: list[int] = []
    hook = reverse_model.decoder[0].register_forward_hook(
        lambda m, a, out: rows.append(a[0].size(0))
    )
    try:
        greedy_search(reverse_model, reverse_src, LEN)
        greedy_rows, rows[:] = list(rows), []
        beam_search(reverse_model, reverse_src, _beam(3))
    finally:
        hook.remove()
    assert greedy_rows[0] == 24 and greedy_rows[-1] < 24
    assert greedy_rows == sorted(greedy_rows, reverse=True)
    assert all(r % 8 == 0 for r in greedy_rows), greedy_rows
    # Step 0 runs one row per sentence (its 3 beams are still the same BOS), then 3 per sentence;
    # beam search drops finished sentences 8 // 3 = 2 at a time, so the rows are whole blocks.
    assert rows[0] == 24 and rows[1] == 24 * 3 and rows[-1] < 24 * 3
    assert rows[1:] == sorted(rows[1:], reverse=True)
    assert all(r % 6 == 0 for r in rows[1:]), rows


def _rows_and_results(monkeypatch, block: int, model: Transformer, run) -> tuple[set[int], list]:
    """``run()``'s results with ROW_BLOCK = ``block``, and the row counts its decoder saw."""
    monkeypatch.setattr(search_module, "ROW_BLOCK", block)
    rows: set[int] = set()
    hook = model.decoder[0].register_forward_hook(lambda m, a, out: rows.add(len(a[0])))
    try:
        return rows, run()
    finally:
        hook.remove()


@pytest.mark.parametrize("beam", [1, 4, 5])
@pytest.mark.parametrize("which", ["random", "reverse"])
def test_retired_sentences_change_no_result(
    monkeypatch, which, beam, random_model, reverse_model, random_src, reverse_src
):
    """Finished sentences kept in the batch until a block of them can go (ROW_BLOCK 16) give
    the same n-best, scores and all, as dropping each at once (ROW_BLOCK 1), in row counts that
    are whole blocks (and never more of them); a retired sentence never ends another hypothesis
    (the trained model's end with EOS, the random model's mostly at their length limit)."""
    model, src = (random_model, random_src) if which == "random" else (reverse_model, reverse_src)
    end_hypotheses = search_module._end_hypotheses

    def run(block: int) -> tuple[set[int], list[DecodeResult], list[tuple[int, ...]]]:
        ended: list[tuple[int, ...]] = []  # every hypothesis ended: (sentence, *tokens)

        def end(into, sentences, logp, ids, finished, alpha):
            ended.extend((s, *t) for s, t in zip(sentences.tolist(), ids.tolist(), strict=True))
            end_hypotheses(into, sentences, logp, ids, finished, alpha)

        monkeypatch.setattr(search_module, "_end_hypotheses", end)
        rows, results = _rows_and_results(
            monkeypatch, block, model, lambda: beam_search(model, src, _beam(beam, beam))
        )
        return rows, results, sorted(ended)

    (blocked_rows, blocked, blocked_ended), (each_rows, each, each_ended) = run(16), run(1)
    assert blocked_ended == each_ended, "a retired sentence ended a hypothesis"
    assert _toks(blocked) == _toks(each)
    for a, b in zip(blocked, each, strict=True):
        assert [h.score for h in a.nbest] == pytest.approx([h.score for h in b.nbest], abs=1e-5)
        assert [h.finished for h in a.nbest] == [h.finished for h in b.nbest]
    block = 16 // beam * beam  # rows of 16 // K whole sentences
    n = len(src)
    assert all(r in (n, n * beam) or r % block == 0 for r in blocked_rows), blocked_rows
    assert len(blocked_rows) <= len(each_rows), (blocked_rows, each_rows)


@pytest.mark.parametrize("kind", ["greedy", "sample"])
@pytest.mark.parametrize("which", ["random", "reverse"])
def test_retired_rows_change_no_greedy_or_sampled_output(
    monkeypatch, kind, which, random_model, reverse_model, random_src, reverse_src
):
    """Greedy search and sampling keep finished rows until a block can go, too: the same
    outputs and scores as dropping each row at once, in whole blocks of rows."""
    model, src = (random_model, random_src) if which == "random" else (reverse_model, reverse_src)

    def run() -> list[DecodeResult]:
        if kind == "greedy":
            return greedy_search(model, src, LEN)
        return sample(model, src, _sampling(sample_seed=3))

    blocked_rows, blocked = _rows_and_results(monkeypatch, 16, model, run)
    each_rows, each = _rows_and_results(monkeypatch, 1, model, run)
    assert _toks(blocked) == _toks(each)
    for a, b in zip(blocked, each, strict=True):
        assert a.nbest[0].score == pytest.approx(b.nbest[0].score, abs=1e-5)
        assert a.nbest[0].finished == b.nbest[0].finished
    assert all(r == len(src) or r % 16 == 0 for r in blocked_rows), blocked_rows
    assert len(blocked_rows) <= len(each_rows), (blocked_rows, each_rows)


def test_max_length_respected(random_model, random_src):
    limits = [int(2 + 0.5 * n) for n in (random_src != PAD_ID).sum(dim=1).tolist()]
    assert max_target_lengths(random_model, random_src, 2, 0.5).tolist() == limits
    short = DecodeConfig(max_len_a=2, max_len_b=0.5)
    for results in (
        greedy_search(random_model, random_src, short),
        beam_search(random_model, random_src, dataclasses.replace(short, beam_size=3, nbest=3)),
        sample(random_model, random_src, dataclasses.replace(short, beam_size=1, sampling=True)),
    ):
        for res, limit in zip(results, limits, strict=True):
            for hyp in res.nbest:
                assert len(hyp.tokens) <= limit
                assert hyp.finished or len(hyp.tokens) == limit
    # The model's position table caps the budget.
    capped = greedy_search(random_model, random_src[:1], DecodeConfig(max_len_a=1000, max_len_b=0))
    assert len(capped[0].tokens) <= random_model.positions.max_len


def test_sampling_top_k_one_equals_greedy(random_model, random_src):
    greedy = greedy_search(random_model, random_src, LEN)
    sampled = sample(random_model, random_src, _sampling(top_k=1, temperature=0.7))
    assert _toks(sampled) == _toks(greedy)
    nucleus = sample(random_model, random_src, _sampling(top_p=1e-6))  # keeps only the best token
    assert _toks(nucleus) == _toks(greedy)


def test_sampling_is_reproducible_and_each_seed_draws_its_own(random_model, random_src):
    def draw(seed: int) -> list[list[list[int]]]:
        decode = _sampling(temperature=2.0, sample_seed=seed)
        return _toks(sample(random_model, random_src, decode))

    assert draw(5) == draw(5)
    assert draw(5) != draw(6)
    assert draw(-1) == draw(2**64 - 1), "the seed is a 64-bit word, signed or not"


def test_a_lines_sample_does_not_depend_on_its_batch(random_model, random_src):
    """A line keeps its draws wherever it is decoded: alone, in another batch size, or among
    other lines (a generator shared by the batch gave each row whatever draw came next)."""
    sources = _sources(random_src)
    keys = list(range(100, 100 + len(sources)))
    decode = _sampling(temperature=2.0, sample_seed=3)
    whole = _toks(decode_sources(random_model, sources, decode, line_keys=keys))
    small = dataclasses.replace(decode, batch_tokens=1)  # one line per batch
    assert _toks(decode_sources(random_model, sources, small, line_keys=keys)) == whole
    order = list(reversed(range(len(sources))))
    reordered = [sources[i] for i in order]
    got = _toks(decode_sources(random_model, reordered, decode, line_keys=[keys[i] for i in order]))
    assert [got[order.index(i)] for i in range(len(sources))] == whole
    assert len({tuple(map(tuple, t)) for t in whole}) > 1


def test_draw_tokens_follows_the_distribution_and_never_draws_probability_zero():
    probs = torch.tensor([0.0, 0.5, 0.0, 0.3, 0.2, 0.0])
    n = 20_000
    draws = LineDraws(7, range(n)).uniform(torch.arange(n), step=3)
    assert float(draws.min()) > 0.0 and float(draws.max()) < 1.0
    assert abs(float(draws.mean()) - 0.5) < 0.01 and abs(float(draws.var()) - 1 / 12) < 0.005
    tokens = draw_tokens(probs.expand(n, -1), draws)
    counts = torch.bincount(tokens, minlength=6).double() / n
    assert counts[[0, 2, 5]].tolist() == [0.0, 0.0, 0.0]
    sigma = (probs * (1 - probs) / n).sqrt()
    assert ((counts - probs).abs() <= 4 * sigma + 1e-12).all(), counts
    # numpy and torch integers are keys and seeds too.
    np_keys = LineDraws(np.int64(7), np.arange(n)).uniform(torch.arange(n), step=3)
    assert torch.equal(np_keys, draws)
    with pytest.raises(MTError, match="sampling met a distribution with no probability"):
        draw_tokens(torch.tensor([[0.5, 0.5], [float("nan"), 0.1]]), torch.tensor([0.3, 0.3]))
    # Steps and keys draw apart: another step is another set of draws.
    other_step = LineDraws(7, range(n)).uniform(torch.arange(n), step=4)
    assert float(torch.corrcoef(torch.stack([draws, other_step]))[0, 1]) < 0.05


def test_filter_logits_top_k_and_top_p():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    assert filter_logits(logits, top_k=2).isfinite().tolist() == [[True, True, False, False]]
    assert filter_logits(logits, top_p=0.75).isfinite().tolist() == [[True, True, False, False]]
    assert filter_logits(logits, top_p=0.85).isfinite().tolist() == [[True, True, True, False]]
    assert filter_logits(logits).isfinite().all()


def test_length_penalty_formula():
    assert length_penalty(3, 1.0) == pytest.approx(8 / 6)
    assert length_penalty(7, 0.6) == pytest.approx(2.0**0.6)
    assert length_penalty(10, 0.0) == 1.0


def test_training_mode_is_refused(random_src):
    model = tiny_transformer(0)  # train mode: dropout on
    with pytest.raises(ValueError, match=r"model\.eval\(\)"):
        greedy_search(model, random_src, LEN)


def test_nbest_beyond_the_beam_is_refused_by_config_validation():
    # Checked once, where the config is validated; search trusts a validated DecodeConfig.
    with pytest.raises(MTError, match="nbest"):
        validate_decode(DecodeConfig(beam_size=2, nbest=3))


@pytest.mark.parametrize("kind", ["greedy", "beam", "sampling"])
def test_search_runs_what_the_config_asks_for(kind, random_model, random_src):
    decode = {"greedy": _beam(1), "beam": _beam(3, 2), "sampling": _sampling(top_k=4)}[kind]
    got = search(random_model, random_src, decode)
    if kind == "greedy":
        want = greedy_search(random_model, random_src, decode)
    elif kind == "beam":
        want = beam_search(random_model, random_src, decode)
    else:
        want = sample(random_model, random_src, decode)
    assert _toks(got) == _toks(want)
    assert [h.score for r in got for h in r.nbest] == [h.score for r in want for h in r.nbest]


def _sources(src: torch.Tensor) -> list[list[int]]:
    return [row[row != PAD_ID].tolist() for row in src]


@pytest.mark.parametrize("decode", [_beam(1, batch_tokens=30), _beam(3, 2, batch_tokens=30)])
def test_decode_sources_in_input_order_within_budget(decode, random_model, random_src):
    sources = _sources(random_src)
    batches: list[tuple[list[int], torch.Tensor]] = []
    results = decode_sources(
        random_model, sources, decode, on_batch=lambda pos, src, res: batches.append((pos, src))
    )
    # Every source in exactly one batch, longest first, each batch within the token budget.
    assert sorted(i for positions, _ in batches for i in positions) == list(range(len(sources)))
    lengths = [len(sources[i]) for positions, _ in batches for i in positions]
    assert lengths == sorted(lengths, reverse=True) and len(batches) > 1
    for positions, src in batches:
        assert src.shape == (len(positions), max(len(sources[i]) for i in positions))
        assert len(positions) == 1 or src.numel() <= decode.batch_tokens
    # The results come back in input order, each equal to searching its sentence alone.
    for ids, result in zip(sources, results, strict=True):
        alone = search(random_model, torch.tensor([ids]), decode)
        assert _toks([result]) == _toks(alone)
        assert [h.score for h in result.nbest] == pytest.approx([h.score for h in alone[0].nbest])


def test_decode_sources_sampling_is_seeded_by_the_config(random_model, random_src):
    sources = _sources(random_src)
    decode = _sampling(top_k=8, sample_seed=4, batch_tokens=30)
    first = _toks(decode_sources(random_model, sources, decode))
    assert _toks(decode_sources(random_model, sources, decode)) == first
    other = dataclasses.replace(decode, sample_seed=5, temperature=3.0)
    assert _toks(decode_sources(random_model, sources, other)) != first


# Target prefixes: per sentence, possibly empty; the fifth is longer than the length rule allows
# for its 5-piece source (2 + 1 * 5 = 7 tokens), so its budget grows to hold it and one more.
PREFIXES = [[5, 6], [], [7, 7, 7], [9], [4, 5, 6, 7, 8, 9, 10, 11], [], [12], [13, 14]]


def _starts_with_prefixes(results: list[DecodeResult], prefixes) -> bool:
    return all(
        h.tokens[: len(p)] == p for r, p in zip(results, prefixes, strict=True) for h in r.nbest
    )


@pytest.mark.parametrize("kind", ["greedy", "beam", "sampling"])
def test_prefix_starts_every_hypothesis(kind, random_model, random_src):
    decode = {"greedy": LEN, "beam": _beam(4, 4), "sampling": _sampling(top_k=8)}[kind]
    results = search(random_model, random_src, decode, prefixes=PREFIXES)
    assert _starts_with_prefixes(results, PREFIXES)
    # The over-long prefix: its budget is the prefix and one more token.
    assert all(len(h.tokens) <= 9 for h in results[4].nbest)
    assert any(
        len(h.tokens) > len(p) for r, p in zip(results, PREFIXES, strict=True) for h in r.nbest
    )


@pytest.mark.parametrize("which", ["random", "reverse"])
def test_beam_one_with_prefix_equals_greedy_with_it(
    which, random_model, reverse_model, random_src, reverse_src
):
    model, src = (random_model, random_src) if which == "random" else (reverse_model, reverse_src)
    prefixes = (PREFIXES * 3)[: src.size(0)]
    greedy = greedy_search(model, src, LEN, prefixes=prefixes)
    beam = beam_search(model, src, _beam(1), prefixes=prefixes)
    assert _toks(beam) == _toks(greedy)
    assert [r.score for r in beam] == pytest.approx([r.score for r in greedy], abs=1e-5)


@pytest.mark.parametrize("search_kind", ["greedy", "beam"])
def test_prefix_cache_equals_no_cache(search_kind, reverse_model, reverse_src):
    prefixes = (PREFIXES * 3)[:24]
    run = greedy_search if search_kind == "greedy" else beam_search
    decode = LEN if search_kind == "greedy" else _beam(4, 4)
    cached = run(reverse_model, reverse_src, decode, prefixes=prefixes)
    full = run(reverse_model, reverse_src, decode, use_cache=False, prefixes=prefixes)
    assert _toks(cached) == _toks(full)
    assert [h.score for r in cached for h in r.nbest] == pytest.approx(
        [h.score for r in full for h in r.nbest], abs=1e-4
    )


@pytest.mark.parametrize("search_kind", ["greedy", "beam"])
def test_empty_prefix_changes_nothing(search_kind, random_model, random_src):
    run = greedy_search if search_kind == "greedy" else beam_search
    decode = LEN if search_kind == "greedy" else _beam(3, 3)
    plain = run(random_model, random_src, decode)
    empty = run(random_model, random_src, decode, prefixes=[[]] * 8)
    mixed = run(random_model, random_src, decode, prefixes=PREFIXES)
    assert _toks(empty) == _toks(plain)
    assert [h.score for r in empty for h in r.nbest] == [h.score for r in plain for h in r.nbest]
    for i, prefix in enumerate(PREFIXES):
        if not prefix:  # the other sentences' prefixes do not touch this one
            assert _toks(mixed[i : i + 1]) == _toks(plain[i : i + 1])


def test_prefix_score_counts_its_log_probs(random_model, random_src):
    """Greedy with a prefix, alpha 0: the score is the teacher-forced sum over all its tokens."""
    results = greedy_search(
        random_model, random_src, dataclasses.replace(LEN, len_penalty=0.0), prefixes=PREFIXES
    )
    for i, res in enumerate(results):
        hyp = res.nbest[0]
        out = [*hyp.tokens, EOS_ID] if hyp.finished else hyp.tokens
        with torch.inference_mode():
            logits = random_model(random_src[i : i + 1], torch.tensor([[BOS_ID, *out[:-1]]]))
        log_probs = functional.log_softmax(logits[0].float(), dim=-1)  # (T, V)
        want = log_probs.gather(1, torch.tensor(out)[:, None]).sum().item()
        assert hyp.score == pytest.approx(want, abs=1e-4)


def test_prefix_batch_equals_one_at_a_time(random_model, random_src):
    batched = beam_search(random_model, random_src, _beam(3, 2), prefixes=PREFIXES)
    for i, row in enumerate(random_src):
        alone = beam_search(
            random_model, row[row != PAD_ID][None], _beam(3, 2), prefixes=[PREFIXES[i]]
        )
        assert _toks(alone) == _toks(batched[i : i + 1])
    sources = _sources(random_src)
    via_batches = decode_sources(
        random_model, sources, _beam(3, 2, batch_tokens=30), prefixes=PREFIXES
    )
    assert _toks(via_batches) == _toks(batched)


def test_bad_prefixes_are_refused(random_model, random_src):
    with pytest.raises(ValueError, match="2 prefixes for 8 sentences"):
        greedy_search(random_model, random_src, LEN, prefixes=[[5], [6]])
    with pytest.raises(ValueError, match="prefix 1 holds PAD, BOS or EOS"):
        beam_search(random_model, random_src, _beam(2), prefixes=[[5], [6, EOS_ID]] + [[]] * 6)
    with pytest.raises(ValueError, match=r"prefix 0: 64 ids leave no room .* at most 63"):
        greedy_search(random_model, random_src[:1], LEN, prefixes=[[5] * 64])
    with pytest.raises(ValueError, match="3 prefixes for 8 sources"):
        decode_sources(random_model, _sources(random_src), LEN, prefixes=[[]] * 3)


@pytest.mark.parametrize("width", [8000, 8013, 40])
def test_row_topk_finds_topk_values(width):
    """Two-stage ranking returns the values torch.topk returns, at the columns that hold them:
    random rows, rows whose best values crowd into one block, a row with one finite value (a
    forced prefix), the best value in the partial last block, and (width 40) the plain path."""
    from transformer_mt.decoding.search import row_topk

    torch.manual_seed(0)
    k = 8
    x = torch.randn(6, width)
    x[1, 64:96] += 10.0  # all k best in one block
    x[2] = float("-inf")
    x[2, width // 2] = -3.0  # one finite value: the others of its top-k are -inf
    x[3, -1] = 50.0  # in the partial last block when width % 32 != 0
    x[4] = 1.0  # all tied
    values, cols = row_topk(x, k)
    assert values.shape == cols.shape == (6, k)
    want = x.topk(k, dim=1).values
    assert torch.equal(values.sort(dim=1, descending=True).values, want)
    assert torch.equal(x.gather(1, cols), values)
    assert all(len(set(row)) == k for row in cols.tolist())  # k distinct columns per row
    assert cols[2].tolist().count(width // 2) == 1 and cols[3].tolist().count(width - 1) == 1


def test_top_candidates_equal_ranking_all_k_times_v():
    """Ranking each beam's row first, then the survivors, finds the 2K best (beam, token) pairs
    of the whole (n, K*V) candidate table, with their scores."""
    from transformer_mt.decoding.search import _top_candidates

    torch.manual_seed(0)
    n, k, vocab = 5, 3, 50
    scores = torch.randn(n, k)
    scores[0, 1:] = float("-inf")  # step 0: only beam 0 may expand
    log_probs = torch.randn(n * k, vocab).log_softmax(dim=-1)
    top_scores, top_beam, top_tok = _top_candidates(scores, log_probs, k)
    table = (scores.view(-1, 1) + log_probs).view(n, k * vocab)
    want_scores, want_idx = table.topk(2 * k, dim=1)
    assert torch.equal(top_scores, want_scores)
    assert torch.equal(top_beam, want_idx // vocab) and torch.equal(top_tok, want_idx % vocab)
    assert (top_beam[0] == 0).all()
    # Step 0: beam 0 of each sentence alone (B = 1) ranks as the full table of that beam.
    first = _top_candidates(scores[:, :1], log_probs[::k], k)
    want_scores, want_tok = log_probs[::k].topk(2 * k, dim=1)
    assert torch.equal(first[0], want_scores + scores[:, :1]) and torch.equal(first[2], want_tok)
    assert (first[1] == 0).all()
