"""What the training loop reads: this rank's padded batches, from a resumable position."""

from collections.abc import Iterator

import numpy as np
import torch

from transformer_mt.config import Config
from transformer_mt.data.batching import make_batches, pad_batch, shard_batches
from transformer_mt.data.binarized import BinarizedPair
from transformer_mt.data.mixing import MixedCorpus, MixedEpoch
from transformer_mt.data.sampling import EpochPairs, SampledEpochs
from transformer_mt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from transformer_mt.training.distributed import DistInfo


def collate(
    data: BinarizedPair | EpochPairs | MixedEpoch, index: np.ndarray
) -> tuple[torch.Tensor, ...]:
    """Padded (src, trg_in, trg_out) LongTensors for the examples ``index``.

    Sources already end with EOS; the decoder reads BOS + target and predicts target + EOS.
    """
    pairs = [data[int(i)] for i in index]
    sources, targets = [s for s, _ in pairs], [t for _, t in pairs]
    return (
        pad_batch(sources, PAD_ID),  # (B, S)
        pad_batch(targets, PAD_ID, bos=BOS_ID),  # (B, T + 1)
        pad_batch(targets, PAD_ID, eos=EOS_ID),  # (B, T + 1)
    )


class BatchStream:
    """This rank's padded batches, epoch after epoch, from a position (epoch, batch in epoch).

    The stream owns its position; the loop reads it (``position``) into the state it checkpoints,
    and a stream built from that position continues exactly where this one was. With a
    ``sampler`` (subword regularization, or several weighted sources) each epoch reads its own
    draw of the pairs, chosen from the epoch number alone, so a resumed run sees the pairs and
    segmentations it would have seen.
    """

    def __init__(
        self,
        data: BinarizedPair | MixedCorpus,
        cfg: Config,
        info: DistInfo,
        sampler: SampledEpochs | MixedCorpus | None = None,
        *,
        epoch: int = 0,
        batch_in_epoch: int = 0,
    ) -> None:
        self.data, self.info, self.sampler = data, info, sampler
        self.batch_tokens, self.seed = cfg.train.batch_tokens, cfg.train.seed
        self.epoch, self.batch_in_epoch = epoch, batch_in_epoch
        self._loaded_epoch: int | None = None  # the epoch whose pairs and batches are in hand
        # The pairs the loaded epoch reads: a MixedCorpus only through its sampler's epochs.
        self._pairs: BinarizedPair | EpochPairs | MixedEpoch | None = (
            None if isinstance(data, MixedCorpus) else data
        )
        self._batches: list[np.ndarray] = []

    @property
    def position(self) -> tuple[int, int]:
        """(epoch, batches of it already read): where a resumed stream starts."""
        return self.epoch, self.batch_in_epoch

    def _load_epoch(self) -> None:
        """Read the current epoch's pairs and this rank's batches of them."""
        pairs = self.sampler.epoch(self.epoch) if self.sampler is not None else self._pairs
        if pairs is None:
            raise ValueError("a MixedCorpus is read through its epochs: pass it as the sampler too")
        self._pairs = pairs
        trg_lens = pairs.trg_lengths + 1  # + BOS (input) / EOS (output)
        batches = make_batches(
            pairs.src_lengths, trg_lens, self.batch_tokens, seed=self.seed, epoch=self.epoch
        )
        self._batches = shard_batches(batches, self.info.rank, self.info.world_size)
        self._loaded_epoch = self.epoch

    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
        return self

    def __next__(self) -> tuple[torch.Tensor, ...]:
        if self._loaded_epoch != self.epoch:
            self._load_epoch()
        if self.batch_in_epoch >= len(self._batches):
            # The epoch ends lazily, when a batch past its end is asked for: a checkpoint taken
            # after its last batch still says (epoch, len), as it always has.
            self.epoch, self.batch_in_epoch = self.epoch + 1, 0
            return next(self)
        self.batch_in_epoch += 1
        assert self._pairs is not None  # set by _load_epoch
        return collate(self._pairs, self._batches[self.batch_in_epoch - 1])
