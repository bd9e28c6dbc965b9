"""Subword regularization: each training epoch sees each sentence in a sampled segmentation.

Kudo (2018, "Subword Regularization") trains on segmentations sampled from the unigram model's
lattice instead of its single best one, so the model learns that "▁Fußball" and "▁Fuß" + "ball"
mean the same thing; on small corpora this is worth about a BLEU point. With ``model_type: bpe``
sentencepiece applies BPE-dropout (Provilkov et al., 2020) instead, ``alpha`` being the dropout
rate. Validation, test and translation always use the deterministic best segmentation.

The draws are made once, when the data is prepared: ``draws`` sampled segmentations of every
training pair, stored as one binarized cache (pair ``i``'s draw ``j`` at index ``i * draws + j``).
Each epoch then picks one draw per pair, from the seed and the epoch number alone; every run of
``draws`` epochs uses each draw of a pair once, in a seeded order. So:

- an epoch takes memory for its pairs, never for pairs x draws: each pair goes through its draws
  in turn from an offset of its own (the draws are independent samples, so an order among them
  matters no more than which one comes first), and only the chosen draws' lengths are read;
- epoch ``e`` reads the same ids in every process and after a resume. (sentencepiece cannot give
  this itself: with sentencepiece 0.2.3, the same ``set_random_generator_seed`` and
  ``num_threads=1`` gave other samples in another process, though the same in one process);
- an epoch costs no encoding, and the ids are memory-mapped like the binarized split's;
- the cache is ``draws`` times the size of the binarized training split;
- deleting the cache in the middle of a run makes a resumed run draw anew: it then continues
  with other segmentations than the uninterrupted run would have seen. Likewise, ranks must share
  one ``data.cache_dir`` (rank 0 builds it): nodes with caches of their own would each draw their
  own, and their length-bucketed batches would no longer split one epoch between them.

The cache is built by :func:`transformer_mt.data.prepare.binarize_split`, which encodes the
binarized training split too. Its pairs are that split's: the same cleaning, and a pair is dropped
exactly when its best segmentation has an empty side or one over the token limit. A sampled side
over the limit (sampling makes them longer), or empty, is replaced by its best segmentation.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from transformer_mt.data.binarized import BinarizedPair


@dataclass(frozen=True)
class SamplingSettings:
    """How segmentations are sampled (mirrors the ``tokenizer.sample_*`` keys)."""

    alpha: float  # unigram: smoothing (lower = more varied); bpe: dropout probability
    nbest: int = -1  # unigram: sample among the n best segmentations (>= 2); -1 = the whole lattice
    draws: int = 16  # segmentations sampled per pair, once, into the cache


class SampledEpochs:
    """The training pairs of any epoch, each in one of its cached sampled segmentations."""

    def __init__(self, draws: BinarizedPair, n_draws: int, seed: int) -> None:
        if len(draws) % n_draws:
            raise ValueError(f"{len(draws)} cached pairs are not {n_draws} draws of each pair")
        self.draws, self.n_draws, self.seed = draws, n_draws, seed
        self.n_pairs = len(draws) // n_draws

    def epoch(self, epoch: int) -> EpochPairs:
        """Epoch ``epoch``'s pairs.

        In each cycle of ``n_draws`` epochs, pair ``i`` reads its draws in turn from an offset of
        its own, drawn from the seed and the cycle ``epoch // n_draws``: draw ``(offset[i] + epoch %
        n_draws) % n_draws``, so each draw once per cycle. Memory: a few integers per pair, not per
        draw."""
        cycle, position = divmod(epoch, self.n_draws)
        rng = np.random.default_rng([self.seed, cycle, 0x5AB])  # not make_batches' generator
        offsets = rng.integers(0, self.n_draws, size=self.n_pairs)
        chosen = np.arange(self.n_pairs) * self.n_draws + (offsets + position) % self.n_draws
        return EpochPairs(self.draws, chosen)


class EpochPairs:
    """One epoch's view of the cached draws, read like a :class:`BinarizedPair`."""

    def __init__(self, draws: BinarizedPair, chosen: np.ndarray) -> None:
        self.draws, self.chosen = draws, chosen
        # From the offsets, for the chosen draws only: draws.src_lengths would hold every draw's.
        (_, src_offsets), (_, trg_offsets) = draws.sides
        self.src_lengths = _lengths(src_offsets, chosen)
        self.trg_lengths = _lengths(trg_offsets, chosen)

    def __len__(self) -> int:
        return len(self.chosen)

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        return self.draws[int(self.chosen[i])]


def _lengths(offsets: np.ndarray, chosen: np.ndarray) -> np.ndarray:
    """The lengths (int64) of the sentences ``chosen``, from a side's (memory-mapped) offsets."""
    return np.asarray(offsets[chosen + 1], dtype=np.int64) - offsets[chosen]
