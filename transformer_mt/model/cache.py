"""Keys and values kept between the steps of incremental decoding.

Search code treats a :class:`DecoderCache` as opaque: it asks the model for one
(``Transformer.new_cache``), passes it to ``Transformer.decode`` and, when rows of the batch change,
tells the cache to follow with :meth:`DecoderCache.select` or :meth:`DecoderCache.reorder_beams`.
"""

import torch


class AttentionCache:
    """Keys and values of one attention module, each (B, H, t, Dh); empty until its first step.

    Self-attention appends one position per step (:meth:`append`); cross-attention stores the
    memory's keys/values once (:meth:`store`) and reuses them.
    """

    def __init__(self) -> None:
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None

    @property
    def empty(self) -> bool:
        return self.keys is None

    def store(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        self.keys, self.values = keys, values

    def append(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Add this step's keys/values (B, H, T, Dh) after the cached ones; returns all of them."""
        if self.keys is not None:
            keys = torch.cat([self.keys, keys], dim=2)  # (B, H, t_past + T, Dh)
            values = torch.cat([self.values, values], dim=2)
        self.store(keys, values)
        return keys, values

    def select(self, index: torch.Tensor) -> None:
        """Keep the batch rows ``index`` (R',), in that order."""
        if self.keys is not None:
            self.keys = self.keys.index_select(0, index)  # (R', H, t, Dh)
            self.values = self.values.index_select(0, index)


class DecoderCache:
    """The decoder's keys and values: per layer, one :class:`AttentionCache` for self-attention
    (grows by one position per step) and one for cross-attention (filled on the first step).

    ``length`` counts the target positions already decoded (the next position's offset).
    """

    def __init__(self, n_layers: int) -> None:
        self.self_attn = [AttentionCache() for _ in range(n_layers)]
        self.cross_attn = [AttentionCache() for _ in range(n_layers)]
        self.length = 0

    def select(self, index: torch.Tensor, memory_index: torch.Tensor | None = None) -> None:
        """Keep or reorder batch rows ``index`` (R',) everywhere: search drops finished sentences
        (and beam search reorders their beams in the same gather).

        ``memory_index`` (M',): the rows of the cross-attention keys/values to keep, when they
        hold one row per sentence for several beam rows (see ``MultiHeadAttention``); None: the
        same ``index``.
        """
        for cache in self.self_attn:
            cache.select(index)
        for cache in self.cross_attn:
            cache.select(index if memory_index is None else memory_index)

    def repeat_rows(self, k: int) -> None:
        """K copies of each self-attention row in a row (row i -> rows i*K .. i*K + K-1), for
        K beams per sentence; the cross-attention keys/values stay one row per sentence."""
        for cache in self.self_attn:
            if not cache.empty:
                cache.store(
                    cache.keys.repeat_interleave(k, dim=0), cache.values.repeat_interleave(k, dim=0)
                )

    def reorder_beams(self, index: torch.Tensor) -> None:
        """Reorder rows ``index`` (R,) that only move beams within their sentence.

        The beams of a sentence share one source and so its cross-attention keys/values, which
        such a reorder leaves as they are: only self-attention is gathered.
        """
        for cache in self.self_attn:
            cache.select(index)
