"""The Transformer of "Attention Is All You Need" (Vaswani et al., 2017), built from its config.

``Transformer(config)`` takes a :class:`~transformer_mt.model.transformer_config.TransformerConfig`
(the run's ModelConfig and what its vocabularies decide). The seeds' constructor stays as the
other entry: ``Transformer(src_pad_idx, trg_pad_idx, trg_sos_idx, enc_voc_size, dec_voc_size,
d_model, n_head, max_len, ffn_hidden, n_layers, drop_prob, **settings)`` (hyunwoongko/transformer's
names, without ``device``: move the module with ``.to(device)``), the keywords of a checkpoint's
``model_args``.

The model knows nothing of losses, optimizers, DDP, AMP or files: it maps token ids to logits.
"""

import math
import re
from collections.abc import Mapping
from typing import Any, overload

import torch
from torch import nn

from transformer_mt.config import ModelConfig
from transformer_mt.model.cache import DecoderCache
from transformer_mt.model.dropout import Dropout
from transformer_mt.model.layers import DecoderLayer, EncoderLayer, SinusoidalPositions
from transformer_mt.model.masks import attention_bias, make_pad_mask, make_trg_mask
from transformer_mt.model.transformer_config import TransformerConfig


def model_args(
    model_cfg: ModelConfig,
    src_vocab_size: int,
    trg_vocab_size: int,
    *,
    pad_idx: int,
    bos_idx: int,
) -> dict[str, Any]:
    """The seeds' keyword arguments of the model ``model_cfg`` builds over these vocabularies.

    As checkpoints store them: :meth:`TransformerConfig.build`, then
    :meth:`TransformerConfig.to_args`.
    """
    config = TransformerConfig.build(
        model_cfg, src_vocab_size, trg_vocab_size, pad_idx=pad_idx, bos_idx=bos_idx
    )
    return config.to_args()


# Module names of the checkpoints written before the residual blocks were named by what they wrap.
_OLD_NAMES = (
    (re.compile(r"^encoder\.(\d+)\.attn\."), r"encoder.\1.self_attn."),
    (re.compile(r"^encoder\.(\d+)\.sub1\."), r"encoder.\1.self_attn_residual."),
    (re.compile(r"^encoder\.(\d+)\.sub2\."), r"encoder.\1.ffn_residual."),
    (re.compile(r"^decoder\.(\d+)\.sub1\."), r"decoder.\1.self_attn_residual."),
    (re.compile(r"^decoder\.(\d+)\.sub2\."), r"decoder.\1.cross_attn_residual."),
    (re.compile(r"^decoder\.(\d+)\.sub3\."), r"decoder.\1.ffn_residual."),
)


def upgrade_state_dict(state_dict: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A copy of a Transformer's ``state_dict`` with older checkpoints' key names renamed.

    The current names replace the old ones; current keys pass unchanged, in their order.

    The old names: ``encoder.N.attn`` (now ``self_attn``), ``encoder.N.sub1``/``sub2`` (now
    ``self_attn_residual``/``ffn_residual``), ``decoder.N.sub1``/``sub2``/``sub3`` (now
    ``self_attn_residual``/``cross_attn_residual``/``ffn_residual``). Only keys under ``prefix``
    (the model's own, e.g. ``"module."`` when wrapped) are looked at. The tensors and the order of
    parameters are unchanged, so optimizer state saved by old code maps to the same tensors.
    :class:`Transformer` applies this in ``load_state_dict``, so old checkpoints load as they are.
    """
    upgraded = {}
    for key, value in state_dict.items():
        if key.startswith(prefix):
            name = key[len(prefix) :]
            for old, new in _OLD_NAMES:
                name = old.sub(new, name)
            key = prefix + name
        upgraded[key] = value
    return upgraded


class Transformer(nn.Module):
    """Encoder-decoder Transformer, built from a :class:`TransformerConfig`.

    Two entries build the same model: ``Transformer(config)``, and the seeds' constructor
    ``Transformer(src_pad_idx, trg_pad_idx, trg_sos_idx, enc_voc_size, dec_voc_size, d_model,
    n_head, max_len, ffn_hidden, n_layers, drop_prob, **settings)`` whose arguments (positional
    or by name; a checkpoint's ``model_args``) :meth:`TransformerConfig.from_args` reads: the
    data's five are required, every other setting is a ModelConfig field under its own name,
    with its default there (``share_embeddings`` false).

    What each setting does is declared with its ModelConfig field (docs/CONFIG.md). The data's:
    ``src_pad_idx``/``trg_pad_idx`` pad each side, ``trg_sos_idx`` (BOS) starts every target
    sequence, ``enc_voc_size``/``dec_voc_size`` are the vocabulary sizes.
    """

    config: TransformerConfig

    @overload
    def __init__(self, config: TransformerConfig, /) -> None: ...

    @overload
    def __init__(
        self,
        src_pad_idx: int,
        trg_pad_idx: int,
        trg_sos_idx: int,
        enc_voc_size: int,
        dec_voc_size: int,
        *settings: Any,
        **named_settings: Any,
    ) -> None: ...

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """``Transformer(config)``, or the seeds' arguments (see the class)."""
        super().__init__()
        if len(args) == 1 and not kwargs and isinstance(args[0], TransformerConfig):
            config = args[0]
        else:
            config = TransformerConfig.from_args(*args, **kwargs)
        self.config = config
        cfg = config.model  # the settings
        self.src_pad_idx = config.src_pad_idx
        self.trg_pad_idx = config.trg_pad_idx
        self.trg_sos_idx = config.trg_sos_idx
        # Target ids that search must never emit besides PAD and BOS (a multilingual model's
        # language tags): set by whoever knows them, read by decoding's ModelState.
        self.never_emit: tuple[int, ...] = ()
        self.d_model = cfg.d_model
        self.emb_scale = math.sqrt(cfg.d_model) if cfg.scale_embeddings else 1.0
        self.activation = cfg.activation  # the feed-forward's (exporters read it)

        self.src_emb = nn.Embedding(config.enc_voc_size, cfg.d_model, padding_idx=self.src_pad_idx)
        if cfg.share_embeddings:
            self.trg_emb = self.src_emb
        else:
            self.trg_emb = nn.Embedding(
                config.dec_voc_size, cfg.d_model, padding_idx=self.trg_pad_idx
            )
        self.positions = SinusoidalPositions(cfg.d_model, cfg.max_len, cfg.position_layout)
        self.dropout = Dropout(cfg.drop_prob)
        self.encoder = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.n_layers))
        self.decoder = nn.ModuleList(DecoderLayer(cfg) for _ in range(config.n_dec_layers))
        # Pre-norm leaves the residual stream unnormalized: a final LayerNorm closes each stack.
        self.enc_norm = nn.LayerNorm(cfg.d_model) if cfg.pre_norm else nn.Identity()
        self.dec_norm = nn.LayerNorm(cfg.d_model) if cfg.pre_norm else nn.Identity()
        self.out = nn.Linear(cfg.d_model, config.dec_voc_size, bias=cfg.logits_bias)
        self._init_weights()
        if cfg.tie_embeddings:
            self.out.weight = self.trg_emb.weight
        # Checkpoints written before the residual blocks were renamed load as they are.
        self.register_load_state_dict_pre_hook(_upgrade_old_keys)

    def _init_weights(self) -> None:
        # Xavier over each whole matrix, the fused ones included: self-attention's (3D, D)
        # Q/K/V matrix and cross-attention's (2D, D) K/V start sqrt(2) and sqrt(3/2) smaller
        # than a D x D projection would, as torch's nn.MultiheadAttention initialises its fused
        # in_proj_weight. Every figure in docs/BENCHMARKS.md trained with this; a per-block
        # Xavier would be another recipe, to be judged on its own seeds.
        for name, p in self.named_parameters():
            if p.dim() > 1 and "emb" not in name:
                nn.init.xavier_uniform_(p)
            elif name.endswith("bias"):
                nn.init.zeros_(p)
        # Embeddings are multiplied by sqrt(d_model); std d_model^-0.5 keeps their scale near 1,
        # which also suits a tied output projection.
        for emb, pad in ((self.src_emb, self.src_pad_idx), (self.trg_emb, self.trg_pad_idx)):
            nn.init.normal_(emb.weight, mean=0.0, std=self.d_model**-0.5)
            with torch.no_grad():
                emb.weight[pad].zero_()

    @property
    def n_dec_layers(self) -> int:
        return len(self.decoder)

    def _embed(self, emb: nn.Embedding, ids: torch.Tensor, offset: int = 0) -> torch.Tensor:
        x = emb(ids) * self.emb_scale  # (B, T, D)
        return self.dropout(x + self.positions(ids.size(1), offset))

    def encode(self, src: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Encode source ids (B, S) into memory (B, S, D); also returns the source pad mask."""
        src_mask = make_pad_mask(src, self.src_pad_idx)  # (B, 1, 1, S)
        x = self._embed(self.src_emb, src)
        key_mask = self._key_mask(src_mask)
        for layer in self.encoder:
            x = layer(x, key_mask)
        return self.enc_norm(x), src_mask

    def _key_mask(self, mask: torch.Tensor) -> torch.Tensor:
        """A key mask as the layers take it.

        On a GPU an additive bias in the products' dtype
        (:func:`~transformer_mt.model.masks.attention_bias`), made once for all layers (SDPA
        would turn a bool mask into one in each); elsewhere the bool mask itself (the CPU's
        kernels and explicit path are tuned for it)."""
        if mask.device.type != "cuda" or mask.dtype != torch.bool:
            return mask
        dtype = (
            torch.get_autocast_dtype("cuda")
            if torch.is_autocast_enabled("cuda")
            else self.src_emb.weight.dtype
        )
        return attention_bias(mask, dtype)

    def decode(
        self,
        trg: torch.Tensor,
        memory: torch.Tensor,
        src_mask: torch.Tensor,
        cache: DecoderCache | None = None,
        features_only: bool = False,
        *,
        right_padded: bool = False,
    ) -> torch.Tensor:
        """Target ids (B, T) and memory (M, S, D) to logits (B, T, dec_voc_size).

        With ``features_only``: to the decoder states (B, T, D) that the output projection ``out``
        maps to logits (a trainer can fuse that projection into its loss).

        ``right_padded`` (no cache): the caller's word that each row of ``trg`` is its tokens
        followed by padding, as in training. Self-attention then needs the causal mask alone
        (SDPA's ``is_causal``, no mask made: flash kernels on a GPU): a token never sees the
        padding after it, so every real position's output is what the padding mask gives; the
        padded positions' outputs (which no loss reads) differ.

        Usually M = B. Beam search passes one memory row (and ``src_mask`` row) per sentence for
        its K beams: B = M * K, rows i*K .. i*K + K-1 reading memory row i.

        Without ``cache``, ``trg`` is the whole prefix and a pad + no-peek mask applies. With a
        ``cache``, ``trg`` holds only the new position of each row (one per step; more is an
        error): it attends to everything cached plus itself, so no mask is needed.
        """
        x, _ = self._decoder_stack(
            trg, memory, src_mask, cache, need_weights=False, right_padded=right_padded
        )
        x = self.dec_norm(x)
        return x if features_only else self.out(x)

    def decode_with_attention(
        self, trg: torch.Tensor, memory: torch.Tensor, src_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Like :meth:`decode` (whole prefix, no cache), with the cross-attention weights.

        The weights are (n_dec_layers, B, H, T, S); they take an explicit attention path, slower
        than the fused kernel that :meth:`decode` uses; the logits agree up to rounding."""
        x, weights = self._decoder_stack(trg, memory, src_mask, None, need_weights=True)
        return self.out(self.dec_norm(x)), torch.stack(weights)  # (L, B, H, T, S)

    def _decoder_stack(
        self,
        trg: torch.Tensor,
        memory: torch.Tensor,
        src_mask: torch.Tensor,
        cache: DecoderCache | None,
        *,
        need_weights: bool,
        right_padded: bool = False,
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Embeddings and decoder layers: states (B, T, D) before the final norm.

        With ``need_weights``, also each layer's cross-attention weights (B, H, T, S).
        ``right_padded``: see :meth:`decode`.
        """
        trg_mask: torch.Tensor | None
        causal = cache is None and right_padded
        if cache is None:
            # (B, 1, T, T), or none for causal attention
            trg_mask = None if causal else make_trg_mask(trg, self.trg_pad_idx)
            x = self._embed(self.trg_emb, trg)
        else:
            if trg.size(1) != 1:
                raise ValueError("incremental decoding takes one target position per step")
            positions, trg_mask = cache.step_positions(trg.size(0), trg.device)
            if positions is None:  # all rows at position cache.length, nothing to mask
                x = self._embed(self.trg_emb, trg, cache.length)
            else:  # rows that joined at different steps: each at its own position
                x = self.trg_emb(trg) * self.emb_scale + self.positions.at(positions)[:, None]
                x = self.dropout(x)
        weights = []
        key_mask = self._key_mask(src_mask)
        for i, layer in enumerate(self.decoder):
            caches = (None, None) if cache is None else (cache.self_attn[i], cache.cross_attn[i])
            x, layer_weights = layer(
                x, memory, trg_mask, key_mask, *caches, need_weights=need_weights, causal=causal
            )
            if need_weights:
                weights.append(layer_weights)
        if cache is not None:
            cache.length += trg.size(1)
        return x, weights

    def new_cache(self) -> DecoderCache:
        return DecoderCache(self.n_dec_layers)

    def cross_attention(self, src: torch.Tensor, trg: torch.Tensor) -> torch.Tensor:
        """Cross-attention weights of a teacher-forced pass: src (B, S), trg (B, T).

        Returns (n_dec_layers, B, H, T, S): row t is what the decoder attended to while predicting
        the token after ``trg[:, t]``. Search runs without weights (fast SDPA); a picture comes
        afterwards from this one extra pass over the chosen hypothesis, which gives the same
        weights.
        """
        memory, src_mask = self.encode(src)
        _, weights = self.decode_with_attention(trg, memory, src_mask)
        return weights.detach()

    def forward(
        self,
        src: torch.Tensor,
        trg: torch.Tensor,
        features_only: bool = False,
        *,
        right_padded: bool = False,
    ) -> torch.Tensor:
        """Teacher-forced logits: src (B, S), trg (B, T) -> (B, T, dec_voc_size).

        With ``features_only``, the decoder states (B, T, D) before the output projection.
        ``right_padded``: each row of ``trg`` is its tokens, then padding (see :meth:`decode`).
        """
        memory, src_mask = self.encode(src)
        return self.decode(
            trg, memory, src_mask, features_only=features_only, right_padded=right_padded
        )


def _upgrade_old_keys(module: nn.Module, state_dict: dict[str, Any], prefix: str, *_: Any) -> None:
    """``load_state_dict`` pre-hook: rename old keys in place (see :func:`upgrade_state_dict`)."""
    upgraded = upgrade_state_dict(state_dict, prefix)
    if list(upgraded) != list(state_dict):
        state_dict.clear()
        state_dict.update(upgraded)
