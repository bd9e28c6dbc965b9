"""Decode many sources: batch them by length within a token budget, search, restore input order.

Longest first: the first batch is the most expensive one, so a source too long for the memory
fails at once, and a progress bar's estimate only improves.
"""

from collections.abc import Callable, Sequence

import torch

from transformer_mt.config import DecodeConfig
from transformer_mt.data.batching import longest_first_batches, pad_batch
from transformer_mt.decoding.constraints import Constraints, Words
from transformer_mt.decoding.ensemble import SearchModel
from transformer_mt.decoding.search import DecodeResult, search

# Called after each batch with the batch's positions in ``sources``, its padded source tensor
# (B, S) on the model's device, and its results in the same order.
BatchCallback = Callable[[list[int], torch.Tensor, list[DecodeResult]], None]


def decode_sources(
    model: SearchModel,
    sources: Sequence[Sequence[int]],
    decode: DecodeConfig,
    *,
    line_keys: Sequence[int] | None = None,
    on_batch: BatchCallback | None = None,
    prefixes: Sequence[Sequence[int]] | None = None,
    constraints: Constraints | None = None,
    words: Words | None = None,
) -> list[DecodeResult]:
    """Search every source with the settings of ``decode``; one result per source, in input order.

    Args:
        model: the Transformer (or :class:`~transformer_mt.decoding.ensemble.Ensemble`) in eval
            mode; batches go to the device of its (first model's) parameters.
        sources: token ids, each non-empty and ending with EOS.
        decode: the search (beam size, n-best, sampling), length rule and ``batch_tokens``, the
            budget of padded source tokens per batch (a longer source gets a batch of its own).
        line_keys: with ``decode.sampling``, one integer per source that keys its draws (with
            ``decode.sample_seed``, see :class:`~transformer_mt.decoding.search.LineDraws`):
            a source's sample depends on its key, not on the batch it lands in. None: the
            positions in ``sources``.
        on_batch: called after each batch (progress bars, attention pictures), see
            :data:`BatchCallback`.
        prefixes: target ids (no BOS/EOS, possibly empty) that each source's output must start
            with, one per source (see :mod:`~transformer_mt.decoding.search`); None: none.
        constraints: per source, its lexical constraints (lists of target ids, see
            :mod:`~transformer_mt.decoding.constraints`; an empty list for none): every
            finished hypothesis contains them. None: none.
        words: the target vocabulary's word starts, for the constraints' word rules (see
            :mod:`~transformer_mt.decoding.constraints`).
    """
    if prefixes is not None and len(prefixes) != len(sources):
        raise ValueError(f"{len(prefixes)} prefixes for {len(sources)} sources: one each")
    if constraints is not None and len(constraints) != len(sources):
        raise ValueError(
            f"{len(constraints)} constraint lists for {len(sources)} sources: one each"
        )
    if line_keys is not None and len(line_keys) != len(sources):
        raise ValueError(f"{len(line_keys)} line keys for {len(sources)} sources: one each")
    device = next(model.parameters()).device
    results: list[DecodeResult | None] = [None] * len(sources)
    for batch in longest_first_batches([len(ids) for ids in sources], decode.batch_tokens):
        positions = batch.tolist()
        src = pad_batch([sources[i] for i in positions], model.src_pad_idx).to(device)  # (B, S)
        forced = None if prefixes is None else [prefixes[i] for i in positions]
        keys = positions if line_keys is None else [line_keys[i] for i in positions]
        terms = None if constraints is None else [constraints[i] for i in positions]
        decoded = search(
            model,
            src,
            decode,
            line_keys=keys,
            prefixes=forced,
            constraints=terms,
            words=words,
        )
        for i, result in zip(positions, decoded, strict=True):
            results[i] = result
        if on_batch is not None:
            on_batch(positions, src, decoded)
    decoded_all = [r for r in results if r is not None]
    assert len(decoded_all) == len(results), "the batches cover every source"
    return decoded_all
