"""Token-budget batching: the budget holds, sharding covers every pair once, order is seeded."""

import numpy as np
import pytest
import torch

from transformer_mt.data.batching import (
    longest_first_batches,
    make_batches,
    pad_batch,
    padding_fraction,
    shard_batches,
)


@pytest.fixture
def lengths():
    rng = np.random.default_rng(0)
    src = rng.integers(1, 60, size=1000)
    trg = np.clip(src + rng.integers(-5, 6, size=1000), 1, None)
    return src, trg


def test_no_batch_over_the_budget(lengths):
    src, trg = lengths
    for b in make_batches(src, trg, 500, seed=1, epoch=0):
        assert len(b) * max(src[b].max(), trg[b].max()) <= 500


@pytest.mark.parametrize("world", [1, 2, 3])
def test_ranks_cover_every_pair_exactly_once(lengths, world):
    src, trg = lengths
    batches = make_batches(src, trg, 500, seed=1, epoch=3)
    shards = [shard_batches(batches, r, world) for r in range(world)]
    assert len({len(s) for s in shards}) == 1, "every rank must get the same number of batches"
    seen = np.concatenate([b for s in shards for b in s])
    assert sorted(seen.tolist()) == list(range(len(src)))
    if world > 1:  # different ranks see different batches
        assert not any(np.array_equal(a, b) for a, b in zip(shards[0], shards[1], strict=True))


def test_same_seed_and_epoch_same_batches(lengths):
    src, trg = lengths
    a = make_batches(src, trg, 500, seed=1, epoch=2)
    b = make_batches(src, trg, 500, seed=1, epoch=2)
    c = make_batches(src, trg, 500, seed=1, epoch=3)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert len(a) != len(c) or not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))


def test_bucketing_keeps_padding_low(lengths):
    src, trg = lengths
    bucketed = make_batches(src, trg, 2000, seed=1, epoch=0)
    assert padding_fraction(bucketed, trg) < 0.10


def test_an_example_over_the_budget_is_an_error():
    with pytest.raises(ValueError, match="does not fit"):
        make_batches(np.array([10, 600]), np.array([10, 10]), 500, seed=0, epoch=0)


def test_decoding_batches_go_longest_first_within_the_budget():
    lengths = [3, 9, 1, 4, 4, 7, 2, 12]
    batches = longest_first_batches(lengths, max_tokens=10)
    assert sorted(int(i) for b in batches for i in b) == list(range(len(lengths)))
    for b in batches:
        assert len(b) == 1 or len(b) * max(lengths[i] for i in b) <= 10
    order = [int(i) for b in batches for i in b]
    assert [lengths[i] for i in order] == sorted(lengths, reverse=True)
    assert order.index(3) < order.index(4), "equal lengths keep their input order"
    assert [12] in [[lengths[i] for i in b] for b in batches], "over the budget: a batch alone"


def test_pad_batch_adds_bos_eos_and_pads_on_the_right():
    seqs = [[5, 6, 7], [8], []]
    assert pad_batch(seqs, 0).tolist() == [[5, 6, 7], [8, 0, 0], [0, 0, 0]]
    assert pad_batch(seqs, 0, bos=2).tolist() == [[2, 5, 6, 7], [2, 8, 0, 0], [2, 0, 0, 0]]
    assert pad_batch(seqs, 0, eos=3).tolist() == [[5, 6, 7, 3], [8, 3, 0, 0], [3, 0, 0, 0]]
    assert pad_batch([np.array([4, 5], dtype=np.uint16)], 0).dtype == torch.long
