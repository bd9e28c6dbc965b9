"""Search over a trained Transformer, token ids in, token ids out: greedy, beam search and
sampling (:mod:`~transformer_mt.decoding.search`), and many sources at once in length-sorted
batches (:mod:`~transformer_mt.decoding.batched`). No file I/O, no tokenizers."""

from transformer_mt.decoding.batched import BatchCallback, decode_sources
from transformer_mt.decoding.search import (
    DecodeResult,
    Hypothesis,
    beam_search,
    filter_logits,
    greedy_search,
    length_penalty,
    max_target_lengths,
    sample,
    search,
)

__all__ = [
    "BatchCallback",
    "DecodeResult",
    "Hypothesis",
    "beam_search",
    "decode_sources",
    "filter_logits",
    "greedy_search",
    "length_penalty",
    "max_target_lengths",
    "sample",
    "search",
]
