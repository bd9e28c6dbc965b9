"""What the training loop reads: padded tensors, and this rank's batches from a resumable position."""

from collections.abc import Iterator

import numpy as np
import torch

from transformer_mt.config import Config
from transformer_mt.data.batching import make_batches, shard_batches
from transformer_mt.data.binarized import BinarizedPair
from transformer_mt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from transformer_mt.training.distributed import DistInfo
from transformer_mt.training.state import TrainState


def collate(data: BinarizedPair, index: np.ndarray) -> tuple[torch.Tensor, ...]:
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
    """This rank's batches, epoch after epoch, from a resumable position (epoch, batch index)."""

    def __init__(self, data: BinarizedPair, cfg: Config, info: DistInfo, state: TrainState):
        self.data, self.cfg, self.info, self.state = data, cfg, info, state
        self.src_lens = data.src_lengths
        self.trg_lens = data.trg_lengths + 1  # + BOS (input) / EOS (output)
        self._epoch_batches: list[np.ndarray] | None = None

    def _batches(self) -> list[np.ndarray]:
        if self._epoch_batches is None:
            t = self.cfg.train
            all_batches = make_batches(
                self.src_lens, self.trg_lens, t.batch_tokens, seed=t.seed, epoch=self.state.epoch
            )
            self._epoch_batches = shard_batches(all_batches, self.info.rank, self.info.world_size)
        return self._epoch_batches

    def __iter__(self) -> Iterator[np.ndarray]:
        while True:
            batches = self._batches()
            if self.state.batch_in_epoch >= len(batches):
                self.state.epoch += 1
                self.state.batch_in_epoch = 0
                self._epoch_batches = None
                continue
            self.state.batch_in_epoch += 1
            yield batches[self.state.batch_in_epoch - 1]
