"""What the training loop reads: this rank's padded batches, from a resumable position."""

from collections.abc import Iterator

import numpy as np
import torch

from transformer_mt.config import Config
from transformer_mt.data.batching import make_batches, shard_batches
from transformer_mt.data.binarized import BinarizedPair
from transformer_mt.data.sampling import EpochPairs, SampledEpochs
from transformer_mt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from transformer_mt.training.distributed import DistInfo
from transformer_mt.training.state import TrainState


def collate(data: BinarizedPair | EpochPairs, index: np.ndarray) -> tuple[torch.Tensor, ...]:
    """Padded (src, trg_in, trg_out) LongTensors for the examples ``index``.

    Sources already end with EOS; the decoder reads BOS + target and predicts target + EOS.
    """
    pairs = [data[int(i)] for i in index]
    n = len(pairs)
    s_len = max(len(s) for s, _ in pairs)
    t_len = max(len(t) for _, t in pairs) + 1
    src = np.full((n, s_len), PAD_ID, dtype=np.int64)
    trg_in = np.full((n, t_len), PAD_ID, dtype=np.int64)
    trg_out = np.full((n, t_len), PAD_ID, dtype=np.int64)
    for row, (s, t) in enumerate(pairs):
        src[row, : len(s)] = s
        trg_in[row, 0] = BOS_ID
        trg_in[row, 1 : len(t) + 1] = t
        trg_out[row, : len(t)] = t
        trg_out[row, len(t)] = EOS_ID
    return torch.from_numpy(src), torch.from_numpy(trg_in), torch.from_numpy(trg_out)


class BatchStream:
    """This rank's padded batches, epoch after epoch, from a resumable position (epoch, batch index).

    With a ``sampler`` (subword regularization) each epoch reads its own draw of the sampled ids,
    chosen from the epoch number alone, so a resumed run sees the segmentation it would have seen.
    """

    def __init__(
        self,
        data: BinarizedPair,
        cfg: Config,
        info: DistInfo,
        state: TrainState,
        sampler: SampledEpochs | None = None,
    ):
        self.data, self.cfg, self.info, self.state = data, cfg, info, state
        self.sampler = sampler
        self._epoch: int | None = None  # the epoch whose pairs and batches are in hand
        self._pairs: BinarizedPair | EpochPairs = data
        self._batches: list[np.ndarray] = []

    def _load_epoch(self) -> None:
        epoch = self.state.epoch
        if self.sampler is not None:
            self._pairs = self.sampler.epoch(epoch)
        t = self.cfg.train
        trg_lens = self._pairs.trg_lengths + 1  # + BOS (input) / EOS (output)
        batches = make_batches(
            self._pairs.src_lengths, trg_lens, t.batch_tokens, seed=t.seed, epoch=epoch
        )
        self._batches = shard_batches(batches, self.info.rank, self.info.world_size)
        self._epoch = epoch

    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
        while True:
            if self._epoch != self.state.epoch:
                self._load_epoch()
            if self.state.batch_in_epoch >= len(self._batches):
                self.state.epoch += 1
                self.state.batch_in_epoch = 0
                continue
            self.state.batch_in_epoch += 1
            yield collate(self._pairs, self._batches[self.state.batch_in_epoch - 1])
