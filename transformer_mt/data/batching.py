"""Token-budget batches and padding: the one batcher and the one padder of the package.

A batch's cost is its padded size: ``n_sentences * longest``, counted on the source and the target
side separately; neither may exceed the budget. Sorting by length before cutting batches keeps
the padding small. Training (:func:`make_batches`) shuffles the *order of batches* from seed and
epoch, which keeps training stochastic; translation (:func:`longest_first_batches`) decodes the
longest sentences first. Both cut with :func:`cut_batches`, and both pad with :func:`pad_batch`.

Bounded shapes (training on an accelerator, or under torch.compile): with a ``multiple``, a batch
is cut and padded by the length class of its longest sentence (:func:`bucket_length`), both sides
padded to that length and its rows to as many as the budget allows at it (:func:`padded_shape`),
so an epoch meets a handful of (rows, length) shapes instead of one per batch.
"""

from collections.abc import Sequence
from typing import Any

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


def bucket_length(length: int, multiple: int) -> int:
    """``length`` padded up to its length class (bounded shapes).

    The class is the next multiple of ``multiple`` up to 8 x ``multiple``, then of 2 x
    ``multiple`` up to 16 x, of 4 x up to 32 x, and so on. Eight classes up to 8 x ``multiple``
    and four per doubling after: long sentences (few, and wide apart) do not multiply the shapes
    a run meets, and no length past 4 x ``multiple`` grows by more than a quarter. ``multiple`` 0
    (or 1): the length itself."""
    if multiple <= 1:
        return length
    step = multiple
    while length > 8 * step:
        step *= 2
    return -(-length // step) * step


def bucket_lengths(lengths: np.ndarray, multiple: int) -> np.ndarray:
    """:func:`bucket_length` of each of ``lengths`` (int64)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if multiple <= 1:
        return lengths
    step = np.full_like(lengths, multiple)
    while (over := lengths > 8 * step).any():
        step[over] *= 2
    return -(-lengths // step) * step


def padded_shape(rows: int, longest: int, max_tokens: int, multiple: int) -> tuple[int, int]:
    """(rows, length) of a batch of ``rows`` examples whose longest side has ``longest`` tokens.

    With a ``multiple``: the length class of ``longest`` (:func:`bucket_length`) and as many rows
    as ``max_tokens`` allows at that length (at least ``rows``): one shape per length class.
    Without: the batch as it is."""
    if multiple <= 1:
        return rows, longest
    length = bucket_length(longest, multiple)
    return max(rows, max_tokens // length), length


def make_batches(
    src_lens: np.ndarray,
    trg_lens: np.ndarray,
    max_tokens: int,
    *,
    seed: int,
    epoch: int,
    shuffle: bool = True,
    multiple: int = 0,
) -> list[np.ndarray]:
    """All training batches of one epoch: arrays of example indices, each within the budget.

    Examples are sorted by (target length, source length) with ties broken randomly, cut greedily
    into batches whose padded size fits ``max_tokens``, then the batch order is shuffled.
    The result depends only on the lengths, ``max_tokens``, ``seed``, ``epoch`` and ``multiple``.

    With a ``multiple`` (bounded shapes), examples are sorted by the length class of their longer
    side first (:func:`bucket_length`) and cut by it: a batch holds as many examples as
    ``max_tokens`` allows at its class's length, and the few left over at the end of a class join
    the next class's first batch where they fit (else they make a short batch, whose missing rows
    the padder fills: see :func:`padded_shape`).
    """
    src_lens = np.asarray(src_lens, dtype=np.int64)
    trg_lens = np.asarray(trg_lens, dtype=np.int64)
    longest = int(max(src_lens.max(initial=0), trg_lens.max(initial=0)))
    if longest > max_tokens:
        raise ValueError(f"an example of {longest} tokens does not fit max_tokens={max_tokens}")
    rng = np.random.default_rng([seed, epoch])
    tiebreak = rng.permutation(len(src_lens)) if shuffle else np.arange(len(src_lens))
    if multiple > 1:
        classes = bucket_lengths(np.maximum(src_lens, trg_lens), multiple)
        order = np.lexsort((tiebreak, src_lens, trg_lens, classes))
        batches = cut_batches(order, classes, None, max_tokens)
    else:
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


def padding_report(
    batches: list[np.ndarray],
    src_lens: np.ndarray,
    trg_lens: np.ndarray,
    max_tokens: int,
    multiple: int,
) -> dict[str, Any]:
    """What an epoch's batches cost in padding, and the shapes they come in.

    ``shapes``: {(rows, length): batches}; ``real``: the tokens of the examples (source, target);
    ``padded``: the tokens of the padded batches (source, target), shapes as
    :func:`padded_shape` makes them; ``plain``: the same with each batch padded to its own
    longest sentence on each side, and no rows added (what training without a ``multiple``
    pads). ``trg_lens`` count BOS (or EOS), as training's target tensors hold them.
    """
    src_lens, trg_lens = np.asarray(src_lens), np.asarray(trg_lens)
    shapes: dict[tuple[int, int], int] = {}
    real = [0, 0]
    padded = [0, 0]
    plain = [0, 0]
    for b in batches:
        s, t = src_lens[b], trg_lens[b]
        rows, length = padded_shape(len(b), int(max(s.max(), t.max())), max_tokens, multiple)
        shapes[rows, length] = shapes.get((rows, length), 0) + 1
        for side, lens in enumerate((s, t)):
            real[side] += int(lens.sum())
            plain[side] += len(b) * int(lens.max())
            padded[side] += rows * length if multiple > 1 else len(b) * int(lens.max())
    return {"shapes": shapes, "real": tuple(real), "padded": tuple(padded), "plain": tuple(plain)}


def pad_batch(
    seqs: Sequence[Sequence[int] | np.ndarray],
    pad_id: int,
    *,
    bos: int | None = None,
    eos: int | None = None,
    width: int | None = None,
    rows: int | None = None,
    fill: Sequence[int] = (),
) -> torch.Tensor:
    """Pad token id sequences into one LongTensor (B, L).

    A LongTensor (B, L) of ``seqs``, each optionally after ``bos`` and before ``eos``, padded
    with ``pad_id`` on the right to the longest; L = longest + the tokens added, or ``width``
    where that is more. ``rows`` (bounded shapes): rows added after the sequences up to that
    many, each holding ``fill`` as it is (no ``bos``/``eos``) and padding: a row that no loss
    reads, whose ``fill`` gives its attention a key (a row of padding alone would attend to
    nothing)."""
    if not seqs:
        raise ValueError("pad_batch needs at least one sequence")
    start = int(bos is not None)
    width = max(max(len(s) for s in seqs) + start + int(eos is not None), width or 0)
    out = np.full((max(len(seqs), rows or 0), width), pad_id, dtype=np.int64)  # (B, L)
    out[len(seqs) :, : len(fill)] = fill
    for row, seq in enumerate(seqs):
        n = len(seq)
        out[row, start : start + n] = seq
        if bos is not None:
            out[row, 0] = bos
        if eos is not None:
            out[row, start + n] = eos
    return torch.from_numpy(out)
