"""The Transformer model: masks, layers and the encoder-decoder."""

from transformer_mt.model.masks import make_no_peek_mask, make_pad_mask, make_trg_mask
from transformer_mt.model.transformer import DecoderCache, Transformer

__all__ = ["DecoderCache", "Transformer", "make_no_peek_mask", "make_pad_mask", "make_trg_mask"]
