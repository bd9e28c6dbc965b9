"""Weighted mixing of several training sources: what each epoch draws from each.

Each source is binarized on its own (:mod:`transformer_mt.data.prepare`); an epoch then takes
``weight x size`` pairs of each source, as fairseq's and OpenNMT's corpus weights do:

- the whole part of the weight is that many full passes over the source (weight 2: each pair
  twice, weight 1: each pair once);
- the fractional part is a random subset of that share of the source's pairs, drawn without
  replacement (weight 0.5: a random half; weight 1.25: every pair once and a random quarter a
  second time).

The counts are exact (``round(weight x size)`` a source, never a random count), so the
proportions hold in every epoch, not only on average. The subsets come from the seed, the epoch
number and the source's position in the list alone: epoch ``e`` draws the same pairs in every
process and after a resume, so a resumed run reads what the uninterrupted run read.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from transformer_mt.data.binarized import BinarizedPair


class MixedCorpus:
    """Training pairs from several binarized sources, each epoch drawn by the sources' weights."""

    def __init__(
        self,
        parts: Sequence[BinarizedPair],
        weights: Sequence[float],
        seed: int,
        labels: Sequence[str] | None = None,
    ) -> None:
        if len(parts) != len(weights) or not parts:
            raise ValueError(f"{len(parts)} sources and {len(weights)} weights")
        if any(not (math.isfinite(w) and w > 0) for w in weights):
            raise ValueError(f"weights must be finite and positive, got {list(weights)}")
        self.parts, self.weights, self.seed = list(parts), [float(w) for w in weights], seed
        self.labels = list(labels) if labels is not None else [str(i) for i in range(len(parts))]
        sizes = [len(p) for p in self.parts]
        self.starts = np.cumsum([0, *sizes])  # source i's pairs are ids starts[i] .. starts[i+1]

    def __len__(self) -> int:
        """The pairs of all sources together (an epoch draws :meth:`epoch_size` of them)."""
        return int(self.starts[-1])

    def describe(self) -> str:
        """``1,234 pairs in 3 sources, 2,000 an epoch``: for logs."""
        return f"{len(self):,} pairs in {len(self.parts)} sources, {self.epoch_size():,} an epoch"

    def counts(self) -> list[int]:
        """Pairs an epoch draws from each source: ``round(weight x size)``."""
        return [round(w * len(p)) for w, p in zip(self.weights, self.parts, strict=True)]

    def epoch_size(self) -> int:
        """Pairs in one epoch, all sources together."""
        return sum(self.counts())

    def chosen(self, epoch: int) -> np.ndarray:
        """The pairs that epoch ``epoch`` draws, as global ids grouped by source.

        Epoch ``epoch``'s pairs as global ids (source ``i``'s pair ``j`` is ``starts[i] + j``),
        grouped by source; the batcher shuffles them."""
        picks = []
        for i, (part, weight) in enumerate(zip(self.parts, self.weights, strict=True)):
            n = len(part)
            whole = math.floor(weight)
            extra = round(weight * n) - whole * n  # the fractional share, in pairs
            ids = [np.tile(np.arange(n, dtype=np.int64), whole)]
            if extra:
                rng = np.random.default_rng([self.seed, epoch, i, 0x313])  # not the batcher's
                ids.append(np.sort(rng.choice(n, size=extra, replace=False)))
            picks.append(np.concatenate(ids) + self.starts[i])
        return np.concatenate(picks)

    def epoch(self, epoch: int) -> MixedEpoch:
        """Epoch ``epoch``'s pairs, read like a :class:`BinarizedPair`."""
        return MixedEpoch(self, self.chosen(epoch))

    def source_of(self, ids: np.ndarray) -> np.ndarray:
        """The source index of each global pair id."""
        return np.searchsorted(self.starts, ids, side="right") - 1

    def __getitem__(self, gid: int) -> tuple[np.ndarray, np.ndarray]:
        i = int(self.source_of(np.asarray([gid]))[0])
        return self.parts[i][int(gid - self.starts[i])]


class MixedEpoch:
    """One epoch's drawn pairs: ``src_lengths`` / ``trg_lengths`` and ``pair[k]``."""

    def __init__(self, corpus: MixedCorpus, chosen: np.ndarray) -> None:
        self.corpus, self.chosen = corpus, chosen
        src, trg = [], []
        for i, part in enumerate(corpus.parts):
            local = chosen[(chosen >= corpus.starts[i]) & (chosen < corpus.starts[i + 1])]
            src.append(part.src_lengths[local - corpus.starts[i]])
            trg.append(part.trg_lengths[local - corpus.starts[i]])
        # chosen is grouped by source in order, so the pieces line up with it
        self.src_lengths = np.concatenate(src)
        self.trg_lengths = np.concatenate(trg)

    def __len__(self) -> int:
        return len(self.chosen)

    def __getitem__(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        return self.corpus[int(self.chosen[k])]
