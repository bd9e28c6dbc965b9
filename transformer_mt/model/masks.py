"""Attention masks built from token ids.

Convention: a mask is a bool tensor that broadcasts to the attention scores (B, H, Tq, Tk) and is
True where a query may attend to a key. This is what
``torch.nn.functional.scaled_dot_product_attention`` takes as ``attn_mask``. On a GPU the model
hands its layers the same mask as an additive float bias (:func:`attention_bias`), made once per
pass instead of by SDPA in every layer, and no mask at all for causal self-attention over a
right-padded target (SDPA's ``is_causal``: flash kernels take no mask).
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


def attention_bias(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``mask`` (bool, True: may attend) as an additive bias of ``dtype``.

    0 where a query may attend, -inf where not; the same shape."""
    zero = torch.zeros((), dtype=dtype, device=mask.device)
    return zero.masked_fill(mask.logical_not(), float("-inf"))
