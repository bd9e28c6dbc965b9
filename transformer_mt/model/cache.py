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

    Row moves are lazy: :meth:`select` only composes the row index, and the next :meth:`append`
    gathers the cached rows straight into the tensor that also receives the new position. Beam
    search reorders rows after every step, so each step copies the cache once instead of twice
    (a gather, then a concatenation).
    """

    def __init__(self) -> None:
        self._keys: torch.Tensor | None = None
        self._values: torch.Tensor | None = None
        self._rows: torch.Tensor | None = None  # pending row index (R',), None: rows as stored

    @property
    def empty(self) -> bool:
        return self._keys is None

    @property
    def keys(self) -> torch.Tensor | None:
        self._apply_rows()
        return self._keys

    @property
    def values(self) -> torch.Tensor | None:
        self._apply_rows()
        return self._values

    def store(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Replace the cache with ``keys`` and ``values`` (B, H, t, Dh), kept contiguous so that
        attention reads them without a copy every step."""
        self._keys, self._values, self._rows = keys.contiguous(), values.contiguous(), None

    def append(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Add this step's keys/values (B, H, T, Dh) after the cached ones (moved to their rows
        first, if :meth:`select` moved any); returns all of them, (B, H, t_past + T, Dh)."""
        if self._keys is None:
            self.store(keys, values)
        else:
            self._keys = _gather_and_append(self._keys, self._rows, keys)
            self._values = _gather_and_append(self._values, self._rows, values)
            self._rows = None
        return self._keys, self._values

    def select(self, index: torch.Tensor) -> None:
        """Keep the batch rows ``index`` (R',), in that order."""
        if self._keys is not None:
            self._rows = index if self._rows is None else self._rows.index_select(0, index)

    def _apply_rows(self) -> None:
        if self._rows is not None:
            self._keys = self._keys.index_select(0, self._rows)
            self._values = self._values.index_select(0, self._rows)
            self._rows = None


def _gather_and_append(
    cached: torch.Tensor, rows: torch.Tensor | None, new: torch.Tensor
) -> torch.Tensor:
    """``cat([cached[rows], new], dim=2)`` with one copy of ``cached`` (B', H, t, Dh), ``new``
    (B, H, T, Dh); ``rows`` None: all rows in order."""
    if rows is None:
        return torch.cat([cached, new], dim=2)
    past = cached.size(2)
    out = new.new_empty(new.size(0), new.size(1), past + new.size(2), new.size(3))
    torch.index_select(cached, 0, rows, out=out[:, :, :past])
    out[:, :, past:] = new
    return out


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
                rows = torch.arange(cache.keys.size(0), device=cache.keys.device)
                cache.select(rows.repeat_interleave(k))

    def reorder_beams(self, index: torch.Tensor) -> None:
        """Reorder rows ``index`` (R,) that only move beams within their sentence.

        The beams of a sentence share one source and so its cross-attention keys/values, which
        such a reorder leaves as they are: only self-attention is gathered.
        """
        for cache in self.self_attn:
            cache.select(index)
