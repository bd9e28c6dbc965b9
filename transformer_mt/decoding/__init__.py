"""Search over a trained Transformer: token ids in, token ids out.

Search over a trained Transformer, token ids in, token ids out: greedy, beam search and
sampling (:mod:`~transformer_mt.decoding.search`), optionally from forced target prefixes or
with lexical constraints (:mod:`~transformer_mt.decoding.constraints`), over
one model or an ensemble (:mod:`~transformer_mt.decoding.ensemble`), and many sources at once in
length-sorted batches (:mod:`~transformer_mt.decoding.batched`). No file I/O."""

from transformer_mt.decoding.batched import BatchCallback, decode_sources
from transformer_mt.decoding.constraints import Constraints
from transformer_mt.decoding.ensemble import Ensemble, SearchModel, check_ensemble
from transformer_mt.decoding.prefixes import Prefixes
from transformer_mt.decoding.search import (
    DecodeResult,
    Hypothesis,
    beam_search,
    constrained_beam_search,
    filter_logits,
    greedy_search,
    length_penalty,
    max_target_lengths,
    sample,
    search,
)

__all__ = [
    "BatchCallback",
    "Constraints",
    "DecodeResult",
    "Ensemble",
    "Hypothesis",
    "Prefixes",
    "SearchModel",
    "beam_search",
    "check_ensemble",
    "constrained_beam_search",
    "decode_sources",
    "filter_logits",
    "greedy_search",
    "length_penalty",
    "max_target_lengths",
    "sample",
    "search",
]
