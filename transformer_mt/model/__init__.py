"""The Transformer model, built from its config.

Masks, layers, the decoder cache, the encoder-decoder and its config.
"""

from transformer_mt.model.cache import AttentionCache, DecoderCache
from transformer_mt.model.masks import make_no_peek_mask, make_pad_mask, make_trg_mask
from transformer_mt.model.transformer import Transformer, model_args, upgrade_state_dict
from transformer_mt.model.transformer_config import TransformerConfig

__all__ = [
    "AttentionCache",
    "DecoderCache",
    "Transformer",
    "TransformerConfig",
    "make_no_peek_mask",
    "make_pad_mask",
    "make_trg_mask",
    "model_args",
    "upgrade_state_dict",
]
