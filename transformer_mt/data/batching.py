"""Token-budget batches, bucketed by length, shuffled per epoch and sharded by rank.

A batch's cost is its padded size: ``n_sentences * longest``, counted on the source and the target
side separately; neither may exceed ``max_tokens``. Sorting by length before cutting batches keeps
the padding small; shuffling the *order of batches* (from seed and epoch) keeps training stochastic.
"""

import numpy as np


def make_batches(
    src_lens: np.ndarray,
    trg_lens: np.ndarray,
    max_tokens: int,
    *,
    seed: int,
    epoch: int,
    shuffle: bool = True,
) -> list[np.ndarray]:
    """All batches of one epoch: arrays of example indices, each within the token budget.

    Examples are sorted by (target length, source length) with ties broken randomly, cut greedily
    into batches whose padded size fits ``max_tokens``, then the batch order is shuffled.
    The result depends only on the lengths, ``max_tokens``, ``seed`` and ``epoch``.
    """
    src_lens = np.asarray(src_lens, dtype=np.int64)
    trg_lens = np.asarray(trg_lens, dtype=np.int64)
    longest = int(max(src_lens.max(initial=0), trg_lens.max(initial=0)))
    if longest > max_tokens:
        raise ValueError(f"an example of {longest} tokens does not fit max_tokens={max_tokens}")
    rng = np.random.default_rng([seed, epoch])
    tiebreak = rng.permutation(len(src_lens)) if shuffle else np.arange(len(src_lens))
    order = np.lexsort((tiebreak, src_lens, trg_lens))  # last key sorts first
    batches: list[np.ndarray] = []
    start, max_s, max_t = 0, 0, 0
    for pos, i in enumerate(order):
        s, t = int(src_lens[i]), int(trg_lens[i])
        n = pos - start + 1
        if n > 1 and n * max(max_s, s, max_t, t) > max_tokens:
            batches.append(order[start:pos])
            start, max_s, max_t = pos, s, t
        else:
            max_s, max_t = max(max_s, s), max(max_t, t)
    if start < len(order):
        batches.append(order[start:])
    if shuffle:
        batches = [batches[j] for j in rng.permutation(len(batches))]
    return batches


def shard_batches(batches: list[np.ndarray], rank: int, world_size: int) -> list[np.ndarray]:
    """This rank's batches. Every rank gets the same number (so no rank waits for a peer that has
    stopped) and together the ranks cover every example exactly once: where the count does not
    divide evenly, the largest batches are split in two until it does."""
    if world_size == 1:
        return batches
    batches = list(batches)
    while len(batches) % world_size:
        big = max(range(len(batches)), key=lambda j: len(batches[j]))
        if len(batches[big]) < 2:
            raise ValueError(f"too few examples to give each of {world_size} ranks a batch")
        b = batches.pop(big)
        half = len(b) // 2
        batches[big:big] = [b[:half], b[half:]]
    return batches[rank::world_size]


def padding_fraction(batches: list[np.ndarray], lens: np.ndarray) -> float:
    """Share of the padded tokens that are padding, over all batches (one side)."""
    real = sum(int(lens[b].sum()) for b in batches)
    padded = sum(len(b) * int(lens[b].max()) for b in batches)
    return 1.0 - real / padded if padded else 0.0
