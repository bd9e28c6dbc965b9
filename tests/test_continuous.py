"""Continuous batching: sentences that join a running beam search at different steps get what
beam search gives each of them alone (tokens, n-best order, scores), the decoder cache does not
grow with uptime, and bad requests are refused."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from transformer_mt.config import DecodeConfig
from transformer_mt.data.tokenizer import BOS_ID, PAD_ID
from transformer_mt.decoding import beam_search, greedy_search
from transformer_mt.decoding.continuous import ContinuousSearch
from transformer_mt.model import Transformer
from transformer_mt.model.cache import AttentionCache

VOCAB = 16


@pytest.fixture(scope="module")
def model() -> Transformer:
    torch.manual_seed(0)
    args = dict(d_model=32, n_head=4, max_len=64, ffn_hidden=64, n_layers=2, drop_prob=0.1)
    return Transformer(PAD_ID, PAD_ID, BOS_ID, VOCAB, VOCAB, **args).eval()


@pytest.fixture(scope="module")
def sources() -> list[list[int]]:
    from conftest import random_sources

    return [[i for i in row if i != PAD_ID] for row in random_sources(VOCAB).tolist()]


def _alone(model, ids: list[int], decode: DecodeConfig):
    src = torch.tensor([ids])
    if decode.beam_size == 1:
        return greedy_search(model, src, decode)[0]
    return beam_search(model, src, decode)[0]


def _run(search: ContinuousSearch, arrivals: dict[int, list[tuple[int, list[int], DecodeConfig]]]):
    """Add each sentence at its step, step until all are done; {tag: result}."""
    expected = sum(len(group) for group in arrivals.values())
    got, step = {}, 0
    while len(got) < expected:
        for tag, ids, decode in arrivals.get(step, []):
            search.add(tag, ids, decode)
        for tag, result in search.step():
            assert tag not in got
            got[tag] = result
        step += 1
        assert step < 500
    assert search.running == search.queued == 0
    return got


@pytest.mark.parametrize("beam", [1, 3])
def test_joining_at_any_step_gives_what_each_gets_alone(model, sources, beam):
    """Sentences arrive at steps 0, 0, 0, 2, 3, 3, 7, 7 with different length budgets and
    length penalties; each result equals that sentence's own beam search (greedy at beam 1)."""
    decodes = [
        DecodeConfig(beam_size=beam, nbest=min(2, beam), max_len_a=a, max_len_b=1.0, len_penalty=p)
        for a, p in [(2.0, 1.0), (5.0, 0.0), (0.0, 2.0), (3.0, 1.0)]
    ]
    when = [0, 0, 0, 2, 3, 3, 7, 7]
    arrivals: dict[int, list] = {}
    for tag, (ids, step) in enumerate(zip(sources, when, strict=True)):
        arrivals.setdefault(step, []).append((tag, ids, decodes[tag % len(decodes)]))
    got = _run(ContinuousSearch(model, beam), arrivals)
    for tag, ids in enumerate(sources):
        want = _alone(model, ids, decodes[tag % len(decodes)])
        assert [h.tokens for h in got[tag].nbest] == [h.tokens for h in want.nbest], tag
        assert [h.finished for h in got[tag].nbest] == [h.finished for h in want.nbest], tag
        for mine, theirs in zip(got[tag].nbest, want.nbest, strict=True):
            assert mine.score == pytest.approx(theirs.score, abs=1e-4)


def test_history_stays_as_long_as_the_oldest_sentence(model, sources):
    """A sentence joins at every step for 60 steps: the cached target history is cut to the
    oldest running sentence's, never the number of steps since the search began."""
    decode = DecodeConfig(beam_size=2, max_len_a=0.0, max_len_b=1.0)  # at most 12 tokens each
    search = ContinuousSearch(model, 2)
    longest = 0
    for step in range(60):
        search.add(step, sources[step % len(sources)], decode)
        search.step()
        longest = max(longest, search.history)
        if search._running is not None:  # its token columns too: BOS and at most 12 ids
            assert search._running.tokens.size(1) <= 13
    assert 0 < longest <= 12
    while search.running or search.queued:
        search.step()
    assert search.history == 0


def test_refuses_what_it_cannot_run(model):
    search = ContinuousSearch(model, 3)
    with pytest.raises(ValueError, match="runs beam 3, not 2"):
        search.add("a", [5, 2], DecodeConfig(beam_size=2))
    with pytest.raises(ValueError, match="nbest=4 exceeds the beam"):
        search.add("a", [5, 2], dataclasses.replace(DecodeConfig(beam_size=3), nbest=4))
    with pytest.raises(ValueError, match="empty source"):
        search.add("a", [], DecodeConfig(beam_size=3))
    model.train()
    try:
        with pytest.raises(ValueError, match=r"model\.eval\(\)"):
            ContinuousSearch(model, 3)
    finally:
        model.eval()


def test_queued_sentences_join_together_or_after_a_few_steps(model, sources):
    """One newcomer waits join_wait steps beside 8 running sentences (it is less than
    join_share of them), and so does the next one (the wait starts again after a join); three
    newcomers (a quarter of the 10 or fewer running) join at the next step."""
    decode = DecodeConfig(beam_size=2, max_len_a=40.0, max_len_b=1.0)
    search = ContinuousSearch(model, 2, join_share=0.25, join_wait=3)
    for i, ids in enumerate(sources):
        search.add(i, ids, decode)
    search.step()  # nothing runs: all join at once
    assert (search.running, search.queued) == (8, 0)
    search.add("late", sources[0], decode)
    queued = []
    for _ in range(4):
        search.step()
        queued.append(search.queued)
    assert queued == [1, 1, 1, 0] and search.running > 4
    search.add("later", sources[1], decode)  # the wait counts again from 0
    queued = []
    for _ in range(4):
        search.step()
        queued.append(search.queued)
    assert queued == [1, 1, 1, 0] and search.running >= 4
    for tag in "abc":
        search.add(tag, sources[1], decode)
    search.step()
    assert search.queued == 0


def _pad_left(t: torch.Tensor, length: int) -> torch.Tensor:
    return torch.nn.functional.pad(t, (0, 0, length - t.size(2), 0))


@pytest.mark.parametrize("seed", range(40))
def test_attention_cache_lazy_moves_equal_eager_ones(seed):
    """Random sequences of append, select (rows repeated and reordered), join_later (either
    history longer), drop_first and reads: the lazily moved cache always holds what doing each
    move at once gives."""
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=gen)

    def pick(n: int) -> int:
        return int(torch.randint(n, (1,), generator=gen))

    cache, keys = AttentionCache(), rand(1 + pick(4), 2, 1 + pick(3), 3)
    values = -keys
    cache.store(keys, values)
    for _ in range(12):
        op, rows = pick(5), keys.size(0)
        if op == 0:
            new = rand(rows, 2, 1, 3)
            got = cache.append(new, -new)
            keys, values = torch.cat([keys, new], dim=2), torch.cat([values, -new], dim=2)
            assert torch.equal(got[0], keys) and torch.equal(got[1], values)
        elif op == 1:
            index = torch.randint(rows, (1 + pick(5),), generator=gen)
            cache.select(index)
            keys, values = keys.index_select(0, index), values.index_select(0, index)
        elif op == 2:
            joined = rand(1 + pick(3), 2, 1 + pick(6), 3)
            cache.join_later(joined, -joined)
            width = max(keys.size(2), joined.size(2))
            keys = torch.cat([_pad_left(keys, width), _pad_left(joined, width)])
            values = torch.cat([_pad_left(values, width), _pad_left(-joined, width)])
        elif op == 3:
            n = pick(keys.size(2))
            cache.drop_first(n)
            keys, values = keys[:, :, n:], values[:, :, n:]
        else:
            assert torch.equal(cache.keys, keys) and torch.equal(cache.values, values)
    assert torch.equal(cache.keys, keys) and torch.equal(cache.values, values)
