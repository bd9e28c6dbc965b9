"""Attention masks built from token ids.

Convention: a mask is a bool tensor that broadcasts to the attention scores (B, H, Tq, Tk) and is
True where a query may attend to a key. This is what
``torch.nn.functional.scaled_dot_product_attention`` takes as ``attn_mask``.
"""

import torch


def make_pad_mask(keys: torch.Tensor, pad_idx: int) -> torch.Tensor:
    """Mask out padded key positions.

    Args:
        keys: token ids (B, Tk).
        pad_idx: the id of the padding token.

    Returns:
        bool (B, 1, 1, Tk): True for real tokens, False for padding. Broadcasts over heads and
        queries, so every query ignores padded keys.
    """
    return (keys != pad_idx)[:, None, None, :]


def make_no_peek_mask(length: int, device: torch.device | None = None) -> torch.Tensor:
    """Causal (no-peek) mask: position i may attend to positions <= i only.

    Returns:
        bool (1, 1, T, T), lower triangular.
    """
    ones = torch.ones(length, length, dtype=torch.bool, device=device)
    return torch.tril(ones)[None, None]


def make_trg_mask(trg: torch.Tensor, pad_idx: int) -> torch.Tensor:
    """Decoder self-attention mask: no peeking ahead and no attending to padding.

    Returns:
        bool (B, 1, T, T).
    """
    return make_pad_mask(trg, pad_idx) & make_no_peek_mask(trg.size(1), trg.device)
