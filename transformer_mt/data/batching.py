"""Token-budget batches and padding: the one batcher and the one padder of the package.

A batch's cost is its padded size: ``n_sentences * longest``, counted on the source and the target
side separately; neither may exceed the budget. Sorting by length before cutting batches keeps
the padding small. Training (:func:`make_batches`) shuffles the *order of batches* from seed and
epoch, which keeps training stochastic; translation (:func:`longest_first_batches`) decodes the
longest sentences first. Both cut with :func:`cut_batches`, and both pad with :func:`pad_batch`.
"""

from collections.abc import Sequence

import numpy as np
import torch


def cut_batches(
    order: np.ndarray, src_lens: np.ndarray, trg_lens: np.ndarray | None, max_tokens: int
) -> list[np.ndarray]:
    """Cut the examples in ``order`` greedily into batches within a token budget.

    A batch's padded size, on each side, fits ``max_tokens``; an example longer than the budget
    gets a batch of its own."""
    batches: list[np.ndarray] = []
    start, widest = 0, 0
    for pos, i in enumerate(order):
        width = max(int(src_lens[i]), 0 if trg_lens is None else int(trg_lens[i]))
        n = pos - start + 1
        if n > 1 and n * max(widest, width) > max_tokens:
            batches.append(order[start:pos])
            start, widest = pos, width
        else:
            widest = max(widest, width)
    if start < len(order):
        batches.append(order[start:])
    return batches


def make_batches(
    src_lens: np.ndarray,
    trg_lens: np.ndarray,
    max_tokens: int,
    *,
    seed: int,
    epoch: int,
    shuffle: bool = True,
) -> list[np.ndarray]:
    """All training batches of one epoch: arrays of example indices, each within the budget.

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
    batches = cut_batches(order, src_lens, trg_lens, max_tokens)
    if shuffle:
        batches = [batches[j] for j in rng.permutation(len(batches))]
    return batches


def longest_first_batches(lengths: Sequence[int] | np.ndarray, max_tokens: int) -> list[np.ndarray]:
    """Batches for decoding: longest first, within a token budget.

    Batches of positions into ``lengths`` for decoding: longest first (ties in input order),
    each within ``max_tokens`` padded tokens; a sentence over the budget gets a batch alone."""
    lengths = np.asarray(lengths, dtype=np.int64)
    order = np.lexsort((np.arange(len(lengths)), -lengths))
    return cut_batches(order, lengths, None, max_tokens)


def shard_batches(batches: list[np.ndarray], rank: int, world_size: int) -> list[np.ndarray]:
    """This rank's batches.

    Every rank gets the same number (so no rank waits for a peer that has stopped) and together the
    ranks cover every example exactly once: where the count does not divide evenly, the largest
    batches are split in two until it does."""
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


def pad_batch(
    seqs: Sequence[Sequence[int] | np.ndarray],
    pad_id: int,
    *,
    bos: int | None = None,
    eos: int | None = None,
) -> torch.Tensor:
    """Pad token id sequences into one LongTensor (B, L).

    A LongTensor (B, L) of ``seqs``, each optionally after ``bos`` and before ``eos``, padded
    with ``pad_id`` on the right to the longest; L = longest + the tokens added."""
    if not seqs:
        raise ValueError("pad_batch needs at least one sequence")
    start = int(bos is not None)
    width = max(len(s) for s in seqs) + start + int(eos is not None)
    out = np.full((len(seqs), width), pad_id, dtype=np.int64)  # (B, L)
    for row, seq in enumerate(seqs):
        n = len(seq)
        out[row, start : start + n] = seq
        if bos is not None:
            out[row, 0] = bos
        if eos is not None:
            out[row, start + n] = eos
    return torch.from_numpy(out)
