"""What the training loop reads: this rank's padded batches, from a resumable position.

:class:`BatchStream` cuts and pads them (bounded shapes with a ``multiple``: see
:mod:`transformer_mt.data.batching`); :class:`DeviceBatches` puts them on the device, the next
ones copied while a step runs (pinned memory, non-blocking copies on a GPU).
"""

from collections import deque
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from transformer_mt.config import Config
from transformer_mt.data.batching import (
    make_batches,
    pad_batch,
    padded_shape,
    padding_report,
    shard_batches,
)
from transformer_mt.data.binarized import BinarizedPair
from transformer_mt.data.mixing import MixedCorpus, MixedEpoch
from transformer_mt.data.sampling import EpochPairs, SampledEpochs
from transformer_mt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from transformer_mt.training.distributed import DistInfo


def collate(
    data: BinarizedPair | EpochPairs | MixedEpoch,
    index: np.ndarray,
    shape: tuple[int, int] | None = None,
) -> tuple[torch.Tensor, ...]:
    """Padded (src, trg_in, trg_out) LongTensors for the examples ``index``.

    Sources already end with EOS; the decoder reads BOS + target and predicts target + EOS.
    ``shape`` (rows, length): every tensor padded to that length, and rows added up to that many
    (bounded shapes). An added row is a source of EOS alone and a target input of BOS alone, and
    predicts nothing (its target output is padding): no loss or gradient reads it, and its
    attention has a key to attend to.
    """
    pairs = [data[int(i)] for i in index]
    sources, targets = [s for s, _ in pairs], [t for _, t in pairs]
    rows, width = shape if shape is not None else (None, None)
    return (
        pad_batch(sources, PAD_ID, width=width, rows=rows, fill=(EOS_ID,)),  # (B, S)
        pad_batch(targets, PAD_ID, bos=BOS_ID, width=width, rows=rows, fill=(BOS_ID,)),  # (B, T+1)
        pad_batch(targets, PAD_ID, eos=EOS_ID, width=width, rows=rows),  # (B, T + 1)
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
        multiple: int = 0,
    ) -> None:
        self.data, self.info, self.sampler = data, info, sampler
        self.batch_tokens, self.seed = cfg.train.batch_tokens, cfg.train.seed
        self.multiple = multiple  # bounded shapes: lengths padded to this multiple's classes
        self._lengths: tuple[np.ndarray, np.ndarray] = (np.zeros(0), np.zeros(0))
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
            pairs.src_lengths,
            trg_lens,
            self.batch_tokens,
            seed=self.seed,
            epoch=self.epoch,
            multiple=self.multiple,
        )
        self._batches = shard_batches(batches, self.info.rank, self.info.world_size)
        self._lengths = np.asarray(pairs.src_lengths), np.asarray(trg_lens)
        self._loaded_epoch = self.epoch

    def _shape(self, index: np.ndarray) -> tuple[int, int] | None:
        """The padded (rows, length) of the batch ``index``; None without bounded shapes."""
        if self.multiple <= 1:
            return None
        src_lens, trg_lens = self._lengths
        longest = int(max(src_lens[index].max(), trg_lens[index].max()))
        return padded_shape(len(index), longest, self.batch_tokens, self.multiple)

    def report(self) -> dict[str, Any]:
        """The current epoch's shapes and padding, over this rank's batches.

        See :func:`~transformer_mt.data.batching.padding_report`."""
        if self._loaded_epoch != self.epoch:
            self._load_epoch()
        src_lens, trg_lens = self._lengths
        return padding_report(self._batches, src_lens, trg_lens, self.batch_tokens, self.multiple)

    def describe(self) -> str:
        """One line for the log: the current epoch's batch shapes and the padding they add."""
        r = self.report()
        shapes, (real_s, real_t), (pad_s, pad_t), (plain_s, plain_t) = (
            r["shapes"],
            r["real"],
            r["padded"],
            r["plain"],
        )

        def share(real: int, padded: int) -> str:
            return f"{1 - real / padded:.1%}" if padded else "0%"

        n = sum(shapes.values())
        if self.multiple > 1:
            listed = ", ".join(f"{rows}x{length}" for rows, length in sorted(shapes))
            return (
                f"batch shapes (train.pad_to_multiple={self.multiple}): epoch {self.epoch} has {n}"
                f" batches in {len(shapes)} shapes (rows x length: {listed}); padding is "
                f"{share(real_s, pad_s)} of the source and {share(real_t, pad_t)} of the target "
                f"tokens ({share(real_s, plain_s)} / {share(real_t, plain_t)} with each batch "
                "padded to its longest sentence)"
            )
        return (
            f"batch shapes: epoch {self.epoch} has {n} batches in {len(shapes)} shapes; padding is"
            f" {share(real_s, pad_s)} of the source and {share(real_t, pad_t)} of the target tokens"
        )

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
        index = self._batches[self.batch_in_epoch - 1]
        return collate(self._pairs, index, self._shape(index))


class DeviceBatches:
    """A :class:`BatchStream`'s batches on ``device``, with their target token counts.

    ``take()`` returns the next batch (src, trg_in, trg_out) on the device and its non-pad
    target tokens, counted on the host before the copy (so that counting needs no wait for the
    device). ``prepare(n)`` readies the next ``n`` batches ahead: on a GPU from pinned memory by
    non-blocking copies, which the training step calls once its work is queued, so that the next
    batch is collated and on its way while the device computes. ``position`` is the stream's
    position after the batches taken (not those prepared): what a checkpoint records.
    """

    def __init__(self, stream: BatchStream, device: torch.device) -> None:
        self.stream, self.device = stream, device
        self.pin = device.type == "cuda"
        self.position = stream.position
        self._ready: deque[tuple[tuple[torch.Tensor, ...], int, tuple[int, int]]] = deque()

    def _fetch(self) -> None:
        batch = next(self.stream)
        tokens = int((batch[2] != PAD_ID).sum())
        if self.pin:
            batch = tuple(x.pin_memory() for x in batch)
        moved = tuple(x.to(self.device, non_blocking=self.pin) for x in batch)
        self._ready.append((moved, tokens, self.stream.position))

    def prepare(self, n: int = 1) -> None:
        """Have the next ``n`` batches ready (collated, and copied or on their way)."""
        while len(self._ready) < n:
            self._fetch()

    def take(self) -> tuple[tuple[torch.Tensor, ...], int]:
        """The next batch on the device and its non-pad target tokens."""
        self.prepare(1)
        batch, tokens, self.position = self._ready.popleft()
        return batch, tokens
