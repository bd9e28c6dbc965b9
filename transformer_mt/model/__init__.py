"""The Transformer model: masks, layers, the decoder cache and the encoder-decoder."""

from transformer_mt.model.cache import AttentionCache, DecoderCache
from transformer_mt.model.masks import make_no_peek_mask, make_pad_mask, make_trg_mask
from transformer_mt.model.transformer import Transformer, model_args, upgrade_state_dict

__all__ = [
    "AttentionCache",
    "DecoderCache",
    "Transformer",
    "make_no_peek_mask",
    "make_pad_mask",
    "make_trg_mask",
    "model_args",
    "upgrade_state_dict",
]
