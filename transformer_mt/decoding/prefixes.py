"""Forced target prefixes: outputs that start with given target ids.

Forced target prefixes: each sentence's output starts with given target ids, and search goes
on from there.

While a sentence's prefix lasts, every one of its rows (its one hypothesis, or each of its beams)
gets -inf for every token but the prefix's next one, which keeps its log-probability: greedy
picks it, sampling draws it, beam search extends with it, and the score counts it like any other
token. Rows past their prefix (or with none) are left exactly as they were.
"""

from collections.abc import Sequence

import torch

Prefixes = Sequence[Sequence[int]]  # per sentence, the target ids its output must start with


class ForcedPrefixes:
    """The prefixes of a batch as tensors: ids (B, L) padded with 0 and lengths (B,)."""

    def __init__(self, prefixes: Prefixes, device: torch.device) -> None:
        self.length = max((len(p) for p in prefixes), default=0)  # L, the longest
        self.lens = torch.tensor([len(p) for p in prefixes], device=device)  # (B,)
        ids = torch.zeros(len(prefixes), max(self.length, 1), dtype=torch.long)  # (B, L)
        for i, prefix in enumerate(prefixes):
            ids[i, : len(prefix)] = torch.tensor(prefix, dtype=torch.long)
        self.ids = ids.to(device)

    @classmethod
    def of(
        cls,
        prefixes: Prefixes | None,
        src: torch.Tensor,
        *,
        banned: set[int],
        table: int,
    ) -> "ForcedPrefixes | None":
        """The checked prefixes of the sentences of ``src``.

        The prefixes of the sentences of ``src`` (B, S), checked: one per sentence, none
        holding a ``banned`` id (PAD, BOS, EOS), each leaving one of the ``table`` positions free
        (so that every hypothesis, finished or not, holds its whole prefix). None when
        no sentence has one: search then runs exactly as without prefixes."""
        if prefixes is None:
            return None
        if len(prefixes) != src.size(0):
            raise ValueError(f"{len(prefixes)} prefixes for {src.size(0)} sentences: one each")
        for i, prefix in enumerate(prefixes):
            if banned.intersection(prefix):
                raise ValueError(f"prefix {i} holds PAD, BOS or EOS ({sorted(banned)})")
            if len(prefix) >= table:
                raise ValueError(
                    f"prefix {i}: {len(prefix)} ids leave no room in the position table "
                    f"({table}): at most {table - 1}"
                )
        if not any(len(p) for p in prefixes):
            return None
        return cls(prefixes, src.device)

    def min_lens(self) -> torch.Tensor:
        """The smallest token budget (B,) that holds each prefix and one more token."""
        return self.lens + 1

    def force(self, log_probs: torch.Tensor, sent: torch.Tensor, step: int) -> torch.Tensor:
        """Force each row's prefix token at ``step`` onto ``log_probs``.

        ``log_probs`` (R, V) of rows of sentences ``sent`` (R,) with, where a row's prefix
        covers ``step``, -inf everywhere but at its prefix token (which keeps its log-prob)."""
        if step >= self.length:
            return log_probs
        tok = self.ids[sent, step, None]  # (R, 1)
        inside = (self.lens[sent] > step)[:, None]  # (R, 1)
        only = torch.full_like(log_probs, float("-inf")).scatter_(1, tok, log_probs.gather(1, tok))
        return torch.where(inside, only, log_probs)  # (R, V)
