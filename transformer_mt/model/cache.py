"""Keys and values kept between the steps of incremental decoding.

Search code treats a :class:`DecoderCache` as opaque: it asks the model for one
(``Transformer.new_cache``), passes it to ``Transformer.decode`` and, when rows of the batch change,
tells the cache to follow with :meth:`DecoderCache.select` or :meth:`DecoderCache.reorder_beams`.
"""

from typing import NamedTuple

import torch
from torch.nn import functional


class AttentionCache:
    """Keys and values of one attention module, each (B, H, t, Dh); empty until its first step.

    Self-attention appends one position per step (:meth:`append`); cross-attention stores the
    memory's keys/values once (:meth:`store`) and reuses them.

    Row moves are lazy: :meth:`select` only composes the row index, and the next :meth:`append`
    gathers the cached rows straight into the tensor that also receives the new position. Beam
    search reorders rows after every step, so each step copies the cache once instead of twice
    (a gather, then a concatenation). Rows that join (:meth:`join_later`, continuous batching)
    are copied into that same tensor.
    """

    def __init__(self) -> None:
        # The stored (keys, values); None: empty. The pending moves below exist only beside them.
        self._stored: tuple[torch.Tensor, torch.Tensor] | None = None
        self._rows: torch.Tensor | None = None  # pending row index (R',), None: rows as stored
        # Pending rows to add after the others (keys, values), each side left-padded with zeros
        # to the longer history; None: none.
        self._later: tuple[torch.Tensor, torch.Tensor] | None = None

    @property
    def empty(self) -> bool:
        """Whether nothing is stored yet (before the first step)."""
        return self._stored is None

    @property
    def keys(self) -> torch.Tensor:
        """The keys (B, H, t, Dh), pending row moves done; an empty cache has none (an error)."""
        return self._pending_applied()[0]

    @property
    def values(self) -> torch.Tensor:
        """The values (B, H, t, Dh), pending row moves done; an empty cache has none (an error)."""
        return self._pending_applied()[1]

    def store(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Replace the cache with ``keys`` and ``values`` (B, H, t, Dh); returns them as stored.

        Kept contiguous, so that attention reads them without a copy every step.
        """
        self._stored = keys.contiguous(), values.contiguous()
        self._rows = self._later = None
        return self._stored

    def append(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Add this step's keys/values (B, H, T, Dh) after the cached ones.

        The cached ones move to their rows first, if :meth:`select` moved any. Returns all of them,
        (B, H, t_past + T, Dh)."""
        if self._stored is None:
            return self.store(keys, values)
        later = (None, None) if self._later is None else self._later
        cached_keys, cached_values = self._stored
        self._stored = (
            _gather_and_append(cached_keys, self._rows, keys, later[0]),
            _gather_and_append(cached_values, self._rows, values, later[1]),
        )
        self._rows = self._later = None
        return self._stored

    def join_later(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Add rows (R2, H, t2, Dh) after this cache's rows.

        The shorter history of the two is left-padded with zeros (the decoder cache's key mask hides
        them). Done by the next :meth:`append`, in the copy it makes anyway."""
        if self._stored is None:
            self.store(keys, values)
            return
        self._apply_later()
        self._later = (keys, values)

    def select(self, index: torch.Tensor) -> None:
        """Keep the batch rows ``index`` (R',), in that order."""
        if self._stored is not None:
            self._apply_later()
            self._rows = index if self._rows is None else self._rows.index_select(0, index)

    def drop_first(self, n: int) -> None:
        """Forget the first ``n`` positions of every row (a view; the next append copies)."""
        if self._stored is not None:
            self._apply_later()
            keys, values = self._stored
            self._stored = keys[:, :, n:], values[:, :, n:]

    @property
    def rows(self) -> int:
        """Batch rows once the pending moves are done (without doing them); 0 when empty."""
        if self._stored is None:
            return 0
        own = self._stored[0].size(0) if self._rows is None else self._rows.numel()
        return own + (0 if self._later is None else self._later[0].size(0))

    def _pending_applied(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The stored (keys, values) after the pending row moves; an error when empty."""
        self._apply_rows()
        self._apply_later()
        if self._stored is None:
            raise RuntimeError("an empty attention cache has no keys or values yet")
        return self._stored

    def _apply_rows(self) -> None:
        """Gather the rows that :meth:`select` chose, if it chose any since the last copy."""
        if self._rows is not None and self._stored is not None:
            keys, values = self._stored
            self._stored = keys.index_select(0, self._rows), values.index_select(0, self._rows)
        self._rows = None

    def _apply_later(self) -> None:
        """Add the rows that :meth:`join_later` gave, if any, after the (moved) own rows."""
        if self._later is not None and self._stored is not None:
            self._apply_rows()
            (keys, values), (later_keys, later_values) = self._stored, self._later
            length = max(keys.size(2), later_keys.size(2))
            self._stored = (
                torch.cat([_pad_positions(keys, length), _pad_positions(later_keys, length)]),
                torch.cat([_pad_positions(values, length), _pad_positions(later_values, length)]),
            )
        self._later = None


def _pad_positions(t: torch.Tensor, length: int, *, left: bool = True) -> torch.Tensor:
    """``t`` (R, H, n, X) with ``length - n`` zero positions before (``left``) or after its own."""
    n = length - t.size(2)
    return functional.pad(t, (0, 0, n, 0) if left else (0, 0, 0, n)) if n else t


def _gather_and_append(
    cached: torch.Tensor,
    rows: torch.Tensor | None,
    new: torch.Tensor,
    joined: torch.Tensor | None = None,
) -> torch.Tensor:
    """Concatenate cached, joined and new rows with one copy of each.

    ``cat([cat([cached[rows], joined]), new], dim=2)``: ``cached`` (B', H, t, Dh), ``new`` (B, H, T,
    Dh); ``rows`` None: all rows in order; ``joined`` (B2, H, t2, Dh): rows after them, the shorter
    history of the two left-padded with zeros."""
    if rows is None and joined is None:
        return torch.cat([cached, new], dim=2)
    own = cached.size(2)
    past = own if joined is None else max(own, joined.size(2))
    n_own = cached.size(0) if rows is None else rows.numel()
    out = new.new_empty(new.size(0), new.size(1), past + new.size(2), new.size(3))
    _write_left_padded(out[:n_own, :, :past], cached, rows)
    if joined is not None:
        _write_left_padded(out[n_own:, :, :past], joined, None)
    out[:, :, past:] = new
    return out


def _write_left_padded(out: torch.Tensor, t: torch.Tensor, rows: torch.Tensor | None) -> None:
    """``out`` (R, H, L, Dh) = ``t[rows]`` (R, H, n, Dh) after L - n zero positions."""
    start = out.size(2) - t.size(2)
    if start > 0:
        out[:, :, :start].zero_()
    if rows is None:
        out[:, :, start:].copy_(t)
    else:
        torch.index_select(t, 0, rows, out=out[:, :, start:])


class StaggeredRows(NamedTuple):
    """Where each row of a cache is, once rows started at different steps (after a merge)."""

    positions: torch.Tensor  # (R,): each row's next position
    key_mask: torch.Tensor  # (R, length): the cached positions a row sees; False on padding


class DecoderCache:
    """The decoder's keys and values, per layer.

    One :class:`AttentionCache` for self-attention (grows by one position per step) and one for
    cross-attention (filled on the first step).

    ``length`` counts the target positions already decoded (the next position's offset).
    """

    def __init__(self, n_layers: int) -> None:
        self.self_attn = [AttentionCache() for _ in range(n_layers)]
        self.cross_attn = [AttentionCache() for _ in range(n_layers)]
        self.length = 0
        # Rows that started at different steps (after :meth:`merge`): each row's next position,
        # and which of the ``length`` cached positions each row may attend to (False on the left
        # padding of rows that joined later). None: every row is at position ``length`` and sees
        # every cached position.
        self.staggered: StaggeredRows | None = None

    def select(self, index: torch.Tensor, memory_index: torch.Tensor | None = None) -> None:
        """Keep or reorder batch rows ``index`` (R',) everywhere.

        Search drops finished sentences (and beam search reorders their beams in the same
        gather).

        ``memory_index`` (M',): the rows of the cross-attention keys/values to keep, when they
        hold one row per sentence for several beam rows (see ``MultiHeadAttention``); None: the
        same ``index``.
        """
        for cache in self.self_attn:
            cache.select(index)
        for cache in self.cross_attn:
            cache.select(index if memory_index is None else memory_index)
        if self.staggered is not None:
            positions, key_mask = self.staggered
            self.staggered = StaggeredRows(
                positions.index_select(0, index), key_mask.index_select(0, index)
            )
            self._drop_padding(self.staggered)

    def repeat_rows(self, k: int) -> None:
        """Make K copies of each self-attention row, for K beams per sentence.

        Row i -> rows i*K .. i*K + K-1; the cross-attention keys/values stay one row per
        sentence."""
        if self.staggered is not None:
            positions, key_mask = self.staggered
            self.staggered = StaggeredRows(
                positions.repeat_interleave(k), key_mask.repeat_interleave(k, dim=0)
            )
        for cache in self.self_attn:
            if not cache.empty:
                rows = torch.arange(cache.keys.size(0), device=cache.keys.device)
                cache.select(rows.repeat_interleave(k))

    def step_positions(
        self, rows: int, device: torch.device
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The positions and mask of the next step of ``rows`` rows.

        Those are the position of each row's new token (R,) and the self-attention mask (R, 1, 1,
        length + 1) over the cached positions and the new one; (None, None) while all rows started
        together (position ``length``, no mask needed)."""
        if self.staggered is None:
            return None, None
        positions, key_mask = self.staggered
        new = torch.ones(rows, 1, dtype=torch.bool, device=device)
        key_mask = torch.cat([key_mask, new], dim=1)
        self.staggered = StaggeredRows(positions + 1, key_mask)
        return positions, key_mask[:, None, None, :]

    def merge(self, other: "DecoderCache") -> None:
        """Append the rows of ``other`` after this cache's rows.

        They are sentences that started later, each after at least one step. The shorter
        self-attention history is padded on the left (masked out: :attr:`staggered`), the shorter
        source on the right (the source mask of the merged rows masks it); each row keeps its own
        positions."""
        rows, other_rows = self._rows_and_positions(), other._rows_and_positions()
        length = max(self.length, other.length)
        for mine, theirs in zip(self.self_attn, other.self_attn, strict=True):
            mine.join_later(theirs.keys, theirs.values)  # copied with the next step's append
        for mine, theirs in zip(self.cross_attn, other.cross_attn, strict=True):
            width = max(mine.keys.size(2), theirs.keys.size(2))
            keys, values = (
                torch.cat(
                    [_pad_positions(a, width, left=False), _pad_positions(b, width, left=False)]
                )
                for a, b in ((mine.keys, theirs.keys), (mine.values, theirs.values))
            )
            mine.store(keys, values)
        key_mask = torch.cat(
            [
                functional.pad(mask, (length - mask.size(1), 0))
                for mask in (rows.key_mask, other_rows.key_mask)
            ]
        )
        self.staggered = StaggeredRows(torch.cat([rows.positions, other_rows.positions]), key_mask)
        self.length = length

    def _rows_and_positions(self) -> StaggeredRows:
        """Each row's next position (R,) and key mask (R, length), made explicit."""
        if self.staggered is not None:
            return self.staggered
        rows, device = self.self_attn[0].rows, self.cross_attn[0].keys.device
        positions = torch.full((rows,), self.length, dtype=torch.long, device=device)
        return StaggeredRows(
            positions, torch.ones(rows, self.length, dtype=torch.bool, device=device)
        )

    def _drop_padding(self, staggered: StaggeredRows) -> None:
        """Cut the leading positions that no row attends to any more (``staggered``: the rows').

        Those are padding left by rows that have since gone: the history stays as long as the oldest
        row's, not the uptime."""
        if staggered.key_mask.size(0) == 0:
            return
        used = staggered.key_mask.any(dim=0)  # (length,)
        first = int(used.to(torch.int8).argmax())
        if first > 0:
            for cache in self.self_attn:
                cache.drop_first(first)
            self.staggered = StaggeredRows(staggered.positions, staggered.key_mask[:, first:])
            self.length -= first

    def reorder_beams(self, index: torch.Tensor) -> None:
        """Reorder rows ``index`` (R,) that only move beams within their sentence.

        The beams of a sentence share one source and so its cross-attention keys/values, which
        such a reorder leaves as they are: only self-attention is gathered.
        """
        for cache in self.self_attn:
            cache.select(index)
