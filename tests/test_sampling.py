"""Subword regularization: sampled epochs are reproducible, lossless, and keep the binarized pairs."""

import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from transformer_mt.config import load_config
from transformer_mt.data.batching import make_batches
from transformer_mt.data.binarized import BinarizedPair
from transformer_mt.data.prepare import prepare
from transformer_mt.data.sampling import SampledEpochs
from transformer_mt.data.tokenizer import EOS_ID
from transformer_mt.errors import MTError
from transformer_mt.training.batches import BatchStream, collate
from transformer_mt.training.distributed import DistInfo


def _prepared(tiny_config, *sets: str):
    cfg = load_config(tiny_config, ["tokenizer.sample_alpha=0.1", *sets])
    return cfg, prepare(cfg, progress=False)


def _ids(pairs) -> list[tuple[list[int], list[int]]]:
    return [(s.tolist(), t.tolist()) for s, t in (pairs[i] for i in range(len(pairs)))]


def test_an_epoch_is_the_same_draw_every_time_and_epochs_differ(tiny_config):
    _, data = _prepared(tiny_config)
    first = _ids(data.sampler.epoch(3))
    data.sampler.epoch(4)  # numpy's global generator moves on meanwhile: no epoch may use it
    np.random.random(5)
    again = _ids(data.sampler.epoch(3))
    other = _ids(data.sampler.epoch(4))
    assert first == again
    changed = sum(a != b for a, b in zip(first, other, strict=True))
    assert changed > len(first) // 4, f"only {changed} of {len(first)} pairs segmented anew"


def test_sampled_ids_spell_the_same_text_as_the_binarized_ones(tiny_config):
    _, data = _prepared(tiny_config)
    sampled = data.sampler.epoch(0)
    assert len(sampled) == len(data.train)
    differs = 0
    for i in range(len(sampled)):
        (s, t), (bs, bt) = sampled[i], data.train[i]
        assert s[-1] == EOS_ID and bs[-1] == EOS_ID and t.size and EOS_ID not in t
        assert data.src_tok.decode(s) == data.src_tok.decode(bs)
        assert data.trg_tok.decode(t) == data.trg_tok.decode(bt)
        differs += not np.array_equal(t, bt)
    assert differs > len(sampled) // 4, "sampling must change segmentations, not only copy them"
    assert np.array_equal(sampled.trg_lengths, [len(sampled[i][1]) for i in range(len(sampled))])


def test_the_token_limit_drops_the_same_pairs_and_caps_the_sampled_ones(tiny_config):
    # A limit that the best segmentation of some pairs exceeds: those are dropped as in the
    # binarized split; a sampled segmentation over it falls back to the best one.
    _, full = _prepared(tiny_config)
    limit = int(np.percentile(full.train.src_lengths, 70))
    # Source lengths count EOS; targets need one more for BOS (input) or EOS (output).
    kept = (full.train.src_lengths <= limit) & (full.train.trg_lengths + 1 <= limit)
    over = full.sampler.draws.src_lengths.reshape(len(full.train), -1)[kept].max(axis=1) > limit
    assert over.any(), "some kept pairs must have sampled segmentations over the limit"
    _, data = _prepared(tiny_config, f"data.max_tokens_per_side={limit}", "train.batch_tokens=400")
    assert len(data.train) == kept.sum() < len(full.train), "the limit must drop some pairs"
    for epoch in (0, 1):
        sampled = data.sampler.epoch(epoch)
        assert len(sampled) == len(data.train)
        assert sampled.src_lengths.max() <= limit and sampled.trg_lengths.max() + 1 <= limit
        for i in range(len(sampled)):
            for side in (0, 1):
                got, want = sampled[i][side], data.train[i][side]
                assert data.trg_tok.decode(got) == data.trg_tok.decode(want)


def test_a_stream_resumed_mid_epoch_yields_what_the_uninterrupted_one_did(tiny_config):
    cfg, data = _prepared(tiny_config)
    info = DistInfo()
    # Epoch lengths depend on the cached draws (sentencepiece's samples differ from process to
    # process), so the cut points come from them: the middle of epoch 1, then into epoch 2.
    n_batches = [
        len(make_batches(pairs.src_lengths, pairs.trg_lengths + 1, cfg.train.batch_tokens,
                         seed=cfg.train.seed, epoch=epoch))
        for epoch, pairs in ((e, data.sampler.epoch(e)) for e in (0, 1))
    ]  # fmt: skip
    cut, more = n_batches[0] + n_batches[1] // 2, n_batches[1]
    whole = BatchStream(data.train, cfg, info, data.sampler)
    batches = [next(whole) for _ in range(cut)]
    # A new process would rebuild its stream from the checkpointed position only.
    at_epoch, at_batch = whole.position
    batches += [next(whole) for _ in range(more)]
    assert (at_epoch, whole.position[0]) == (1, 2) and 0 < at_batch < n_batches[1], (
        "the test must resume mid-epoch, then cross one"
    )
    resumed = BatchStream(
        data.train, cfg, info, data.sampler, epoch=at_epoch, batch_in_epoch=at_batch
    )
    for want in batches[cut:]:
        got = next(resumed)
        assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))


def test_the_stream_reads_each_epochs_own_draw(tiny_config):
    cfg, data = _prepared(tiny_config)
    got = next(BatchStream(data.train, cfg, DistInfo(), data.sampler, epoch=2))
    pairs = data.sampler.epoch(2)
    train_cfg = cfg.train
    first = make_batches(pairs.src_lengths, pairs.trg_lengths + 1, train_cfg.batch_tokens,
                         seed=train_cfg.seed, epoch=2)[0]  # fmt: skip
    assert all(np.array_equal(a, b) for a, b in zip(got, collate(pairs, first), strict=True))


@pytest.mark.parametrize(
    ("sets", "key"),
    [
        (["tokenizer.sample_alpha=-0.1"], "tokenizer.sample_alpha"),
        (["tokenizer.model_type=bpe", "tokenizer.sample_alpha=1.0"], "tokenizer.sample_alpha"),
        (["tokenizer.sample_nbest=1"], "tokenizer.sample_nbest"),
        (["tokenizer.sample_nbest=-2"], "tokenizer.sample_nbest"),
        (["tokenizer.sample_draws=0"], "tokenizer.sample_draws"),
    ],
)
def test_bad_sampling_settings_are_config_errors(tiny_config, sets, key):
    with pytest.raises(MTError, match=key):
        load_config(tiny_config, sets)


def test_the_draws_are_cached_once_and_reused(tiny_config):
    _, data = _prepared(tiny_config, "tokenizer.sample_draws=3")
    draws = data.sampler.draws
    assert len(draws) == 3 * len(data.train)
    first = _ids(data.sampler.epoch(5))
    # A second prepare (a resumed run, another rank) must read these draws, not sample anew:
    # sentencepiece would draw differently in another process.
    _, again = _prepared(tiny_config, "tokenizer.sample_draws=3")
    assert _ids(again.sampler.epoch(5)) == first
    _, more = _prepared(tiny_config, "tokenizer.sample_draws=4")
    assert len(more.sampler.draws) == 4 * len(data.train), "a changed setting rebuilds the draws"


def test_every_draw_is_read_once_per_cycle_of_epochs(tiny_config):
    _, data = _prepared(tiny_config, "tokenizer.sample_draws=4")
    cycle = np.stack([data.sampler.epoch(e).chosen for e in range(4, 8)])  # the second cycle
    n = len(data.train)
    assert np.array_equal(np.sort(cycle, axis=0), np.arange(n)[None, :] * 4 + np.arange(4)[:, None])
    first_cycle = np.stack([data.sampler.epoch(e).chosen for e in range(4)])
    assert not np.array_equal(first_cycle, cycle), "each cycle has an order of its own"


def test_an_epoch_takes_memory_for_its_pairs_not_for_every_draw():
    """Picking one of D draws for each of N pairs needs memory for N pairs: no N x D matrix of
    draw orders, no lengths of every cached draw (a large corpus has many draws per rank)."""
    n_pairs, n_draws = 50_000, 64
    lengths = np.arange(n_pairs * n_draws) % 7 + 1  # draw j of pair i: (i * D + j) % 7 + 1 ids
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    tokens = np.full(int(offsets[-1]), 5, dtype=np.uint16)
    meta = {"key": "k", "dtype": "uint16", "vocab_size": 8}
    draws = BinarizedPair(Path("in-memory"), meta, tokens, offsets, tokens, offsets)
    sampler = SampledEpochs(draws, n_draws, seed=1)
    tracemalloc.start()
    try:
        pairs = sampler.epoch(5)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    matrix = n_pairs * n_draws * 8  # one N x D int64 array
    assert peak < matrix // 4, f"an epoch took {peak:,} bytes, an N x D matrix is {matrix:,}"
    chosen = pairs.chosen
    assert np.array_equal(chosen // n_draws, np.arange(n_pairs))  # one draw of each pair, in order
    assert np.array_equal(pairs.src_lengths, lengths[chosen])
    assert np.array_equal(pairs.trg_lengths, lengths[chosen])
    assert len(pairs[7][0]) == lengths[chosen[7]]
