"""The Transformer of "Attention Is All You Need" (Vaswani et al., 2017).

Keyword names follow hyunwoongko/transformer (``src_pad_idx``, ``trg_pad_idx``, ``trg_sos_idx``,
``enc_voc_size``, ``dec_voc_size``, ``d_model``, ``n_head``, ``max_len``, ``ffn_hidden``,
``n_layers``, ``drop_prob``), without ``device``: move the module with ``.to(device)``.

The model knows nothing of losses, optimizers, DDP, AMP or files: it maps token ids to logits.
"""

import math

import torch
from torch import nn

from transformer_mt.model.layers import DecoderLayer, EncoderLayer, SinusoidalPositions
from transformer_mt.model.masks import make_pad_mask, make_trg_mask


class DecoderCache:
    """Keys and values kept between the steps of incremental decoding.

    One dict per decoder layer: ``{"self": {"k", "v"}, "cross": {"k", "v"}}``, each tensor
    (B, H, t, Dh). Self-attention grows by one position per step; cross-attention is filled on the
    first step and reused. ``select`` keeps or reorders batch rows (beam search reorders, finished
    sentences are dropped).
    """

    def __init__(self, n_layers: int) -> None:
        self.layers: list[dict[str, dict[str, torch.Tensor]]] = [{} for _ in range(n_layers)]
        self.length = 0  # target positions already decoded

    def select(self, index: torch.Tensor) -> None:
        for layer in self.layers:
            for part in layer.values():
                for name, t in part.items():
                    part[name] = t.index_select(0, index)


class Transformer(nn.Module):
    """Encoder-decoder Transformer.

    Args:
        src_pad_idx, trg_pad_idx: padding ids of the source and target vocabularies.
        trg_sos_idx: the id that starts every target sequence (BOS); used by search.
        enc_voc_size, dec_voc_size: vocabulary sizes.
        d_model: model width. n_head: attention heads. ffn_hidden: feed-forward width.
        max_len: longest sequence the position table covers.
        n_layers: encoder layers (and decoder layers unless ``n_dec_layers`` is given).
        drop_prob: dropout on the embeddings and on each sublayer's output (the paper's residual
            dropout).
        attn_drop_prob: dropout on attention weights (not in the paper; off by default).
        ffn_drop_prob: dropout inside the feed-forward sublayer (not in the paper; off by default).
        pre_norm: LayerNorm before each sublayer (plus a final norm) instead of after it.
        tie_embeddings: share the decoder's input embedding with the output projection.
        share_embeddings: share source and target embeddings (needs a joint vocabulary).
    """

    def __init__(
        self,
        src_pad_idx: int,
        trg_pad_idx: int,
        trg_sos_idx: int,
        enc_voc_size: int,
        dec_voc_size: int,
        d_model: int = 512,
        n_head: int = 8,
        max_len: int = 256,
        ffn_hidden: int = 2048,
        n_layers: int = 6,
        drop_prob: float = 0.1,
        *,
        n_dec_layers: int | None = None,
        pre_norm: bool = False,
        attn_drop_prob: float = 0.0,
        ffn_drop_prob: float = 0.0,
        tie_embeddings: bool = True,
        share_embeddings: bool = False,
    ) -> None:
        super().__init__()
        if share_embeddings and enc_voc_size != dec_voc_size:
            raise ValueError("share_embeddings needs enc_voc_size == dec_voc_size (a joint vocab)")
        self.src_pad_idx = src_pad_idx
        self.trg_pad_idx = trg_pad_idx
        self.trg_sos_idx = trg_sos_idx
        self.d_model = d_model
        self.emb_scale = math.sqrt(d_model)

        self.src_emb = nn.Embedding(enc_voc_size, d_model, padding_idx=src_pad_idx)
        if share_embeddings:
            self.trg_emb = self.src_emb
        else:
            self.trg_emb = nn.Embedding(dec_voc_size, d_model, padding_idx=trg_pad_idx)
        self.positions = SinusoidalPositions(d_model, max_len)
        self.dropout = nn.Dropout(drop_prob)
        n_dec = n_layers if n_dec_layers is None else n_dec_layers
        self.encoder = nn.ModuleList(
            EncoderLayer(
                d_model, n_head, ffn_hidden, drop_prob, pre_norm, attn_drop_prob, ffn_drop_prob
            )
            for _ in range(n_layers)
        )
        self.decoder = nn.ModuleList(
            DecoderLayer(
                d_model, n_head, ffn_hidden, drop_prob, pre_norm, attn_drop_prob, ffn_drop_prob
            )
            for _ in range(n_dec)
        )
        # Pre-norm leaves the residual stream unnormalized: a final LayerNorm closes each stack.
        self.enc_norm = nn.LayerNorm(d_model) if pre_norm else nn.Identity()
        self.dec_norm = nn.LayerNorm(d_model) if pre_norm else nn.Identity()
        self.out = nn.Linear(d_model, dec_voc_size, bias=False)
        self._init_weights()
        if tie_embeddings:
            self.out.weight = self.trg_emb.weight

    def _init_weights(self) -> None:
        for name, p in self.named_parameters():
            if p.dim() > 1 and "emb" not in name:
                nn.init.xavier_uniform_(p)
            elif name.endswith("bias"):
                nn.init.zeros_(p)
        # Embeddings are multiplied by sqrt(d_model); std d_model^-0.5 keeps their scale near 1, which
        # also suits a tied output projection.
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
        for layer in self.encoder:
            x = layer(x, src_mask)
        return self.enc_norm(x), src_mask

    def decode(
        self,
        trg: torch.Tensor,
        memory: torch.Tensor,
        src_mask: torch.Tensor,
        cache: DecoderCache | None = None,
        features_only: bool = False,
    ) -> torch.Tensor:
        """Target ids (B, T) and memory (B, S, D) to logits (B, T, dec_voc_size), or with
        ``features_only`` to the decoder states (B, T, D) that the output projection ``out`` maps
        to logits (a trainer can fuse that projection into its loss).

        Without ``cache``, ``trg`` is the whole prefix and a pad + no-peek mask applies. With a
        ``cache``, ``trg`` holds only the new positions (usually one per step): they may attend to
        everything cached plus themselves, so no mask is needed for a single step.
        """
        if cache is None:
            trg_mask = make_trg_mask(trg, self.trg_pad_idx)  # (B, 1, T, T)
            offset = 0
        else:
            if trg.size(1) != 1:
                raise ValueError("incremental decoding takes one target position per step")
            trg_mask = None
            offset = cache.length
        x = self._embed(self.trg_emb, trg, offset)
        for i, layer in enumerate(self.decoder):
            x = layer(x, memory, trg_mask, src_mask, None if cache is None else cache.layers[i])
        if cache is not None:
            cache.length += trg.size(1)
        x = self.dec_norm(x)
        return x if features_only else self.out(x)

    def new_cache(self) -> DecoderCache:
        return DecoderCache(self.n_dec_layers)

    def cross_attention(self, src: torch.Tensor, trg: torch.Tensor) -> torch.Tensor:
        """Cross-attention weights of a teacher-forced pass: src (B, S), trg (B, T).

        Returns (n_dec_layers, B, H, T, S): row t is what the decoder attended to while predicting
        the token after ``trg[:, t]``. Search runs without weights (fast SDPA); a picture comes
        afterwards from this one extra pass over the chosen hypothesis, which gives the same
        weights.
        """
        attns = [layer.cross_attn for layer in self.decoder]
        for attn in attns:
            attn.need_weights = True
        try:
            memory, src_mask = self.encode(src)
            self.decode(trg, memory, src_mask)
            return torch.stack([attn.attn_weights for attn in attns])  # (L, B, H, T, S)
        finally:
            for attn in attns:
                attn.need_weights = False
                attn.attn_weights = None

    def forward(
        self, src: torch.Tensor, trg: torch.Tensor, features_only: bool = False
    ) -> torch.Tensor:
        """Teacher-forced logits: src (B, S), trg (B, T) -> (B, T, dec_voc_size); with
        ``features_only``, the decoder states (B, T, D) before the output projection."""
        memory, src_mask = self.encode(src)
        return self.decode(trg, memory, src_mask, features_only=features_only)
