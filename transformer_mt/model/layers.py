"""Building blocks of the Transformer: attention, feed-forward, positions, encoder/decoder layers.

Shapes: B batch, S source length, T target length, D d_model, H heads, Dh = D / H.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn


class MultiHeadAttention(nn.Module):
    """Multi-head attention through ``F.scaled_dot_product_attention``.

    Self-attention projects queries, keys and values with one fused matrix; cross-attention projects
    the queries from the decoder and keys/values (one fused matrix) from the encoder memory, so that
    incremental decoding can compute the memory's keys/values once per sentence.
    """

    def __init__(self, d_model: int, n_head: int, drop_prob: float, cross: bool = False) -> None:
        super().__init__()
        if d_model % n_head != 0:
            raise ValueError(f"d_model={d_model} is not divisible by n_head={n_head}")
        self.n_head = n_head
        self.d_head = d_model // n_head
        self.cross = cross
        self.drop_prob = drop_prob
        if cross:
            self.q_proj = nn.Linear(d_model, d_model)
            self.kv_proj = nn.Linear(d_model, 2 * d_model)
        else:
            self.qkv_proj = nn.Linear(d_model, 3 * d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        # Off by default: SDPA never materializes the weights. When set, forward computes them
        # explicitly and keeps them in ``attn_weights`` (B, H, T, Tk) for attention pictures.
        self.need_weights = False
        self.attn_weights: torch.Tensor | None = None

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        return x.view(b, t, self.n_head, self.d_head).transpose(1, 2)  # (B, H, T, Dh)

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None,
        memory: torch.Tensor | None = None,
        cache: dict[str, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Attend from ``x`` (B, T, D) to itself, or to ``memory`` (B, S, D) when cross.

        ``cache`` (incremental decoding) is a dict this layer fills: self-attention appends this
        step's keys/values to ``k``/``v``; cross-attention computes ``k``/``v`` of the memory once.
        """
        if self.cross:
            q = self._split(self.q_proj(x))
            if cache is not None and "k" in cache:
                k, v = cache["k"], cache["v"]
            else:
                k, v = (self._split(t) for t in self.kv_proj(memory).chunk(2, dim=-1))
                if cache is not None:
                    cache["k"], cache["v"] = k, v
        else:
            q, k, v = (self._split(t) for t in self.qkv_proj(x).chunk(3, dim=-1))
            if cache is not None:
                if "k" in cache:
                    k = torch.cat([cache["k"], k], dim=2)  # (B, H, t_past + T, Dh)
                    v = torch.cat([cache["v"], v], dim=2)
                cache["k"], cache["v"] = k, v
        drop = self.drop_prob if self.training else 0.0
        if self.need_weights:
            scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_head)  # (B, H, T, Tk)
            if mask is not None:
                scores = scores.masked_fill(~mask, float("-inf"))
            weights = scores.softmax(dim=-1)
            self.attn_weights = weights.detach()
            y = F.dropout(weights, drop, self.training) @ v  # (B, H, T, Dh)
        else:  # fused kernel; the weights are never materialized
            y = _sdpa(q, k, v, mask, drop)
        b, _, t, _ = y.shape
        return self.out_proj(y.transpose(1, 2).reshape(b, t, self.n_head * self.d_head))


def _sdpa(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, drop: float
) -> torch.Tensor:
    """``F.scaled_dot_product_attention``, kept in fp32 on CPU.

    On CPU, torch's fused attention in bf16 has a slow backward (about 3x the fp32 time on
    Multi30k-sized batches with a padding mask, torch 2.13), while the projections around it gain
    the most from bf16. So low-precision inputs on CPU are attended in fp32 (with autocast off,
    which would cast them back) and the result is returned in the input dtype. Elsewhere, and for
    fp32 inputs, this is the plain call.
    """
    if q.device.type != "cpu" or q.dtype == torch.float32:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=drop)
    with torch.autocast("cpu", enabled=False):
        y = F.scaled_dot_product_attention(
            q.float(), k.float(), v.float(), attn_mask=mask, dropout_p=drop
        )
    return y.to(q.dtype)


class FeedForward(nn.Module):
    """Position-wise feed-forward network: Linear -> ReLU -> (dropout) -> Linear.

    The inner dropout is not in the paper (the Annotated Transformer adds it): it is off unless
    ``drop_prob`` > 0, and then costs a random mask over the widest activation of the layer.
    """

    def __init__(self, d_model: int, ffn_hidden: int, drop_prob: float) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_model, ffn_hidden)
        self.fc2 = nn.Linear(ffn_hidden, d_model)
        self.dropout = nn.Dropout(drop_prob) if drop_prob > 0 else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.dropout(F.relu(self.fc1(x))))


class SinusoidalPositions(nn.Module):
    """Fixed sinusoidal position encodings of the paper, added to the scaled embeddings."""

    def __init__(self, d_model: int, max_len: int) -> None:
        super().__init__()
        pos = torch.arange(max_len, dtype=torch.float32)[:, None]  # (L, 1)
        inv_freq = torch.exp(torch.arange(0, d_model, 2).float() * (-math.log(10000.0) / d_model))
        table = torch.zeros(max_len, d_model)
        table[:, 0::2] = torch.sin(pos * inv_freq)
        table[:, 1::2] = torch.cos(pos * inv_freq)
        # Not a parameter and not saved: it is a pure function of (max_len, d_model).
        self.register_buffer("table", table, persistent=False)
        self.max_len = max_len

    def forward(self, length: int, offset: int = 0) -> torch.Tensor:
        """Encodings for positions offset .. offset + length - 1, shape (length, D)."""
        if offset + length > self.max_len:
            raise ValueError(
                f"sequence of {offset + length} positions exceeds model max_len={self.max_len}"
            )
        return self.table[offset : offset + length]


class Sublayer(nn.Module):
    """Residual connection around a sublayer, with LayerNorm after (post-norm, the paper) or
    before (pre-norm, the Annotated Transformer; trains more stably in deep stacks)."""

    def __init__(self, d_model: int, drop_prob: float, pre_norm: bool) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(drop_prob)
        self.pre_norm = pre_norm

    def forward(self, x: torch.Tensor, fn) -> torch.Tensor:
        if self.pre_norm:
            return x + self.dropout(fn(self.norm(x)))
        return self.norm(x + self.dropout(fn(x)))


class EncoderLayer(nn.Module):
    def __init__(
        self,
        d_model: int,
        n_head: int,
        ffn_hidden: int,
        drop_prob: float,
        pre_norm: bool,
        attn_drop_prob: float = 0.0,
        ffn_drop_prob: float = 0.0,
    ) -> None:
        super().__init__()
        self.attn = MultiHeadAttention(d_model, n_head, attn_drop_prob)
        self.ffn = FeedForward(d_model, ffn_hidden, ffn_drop_prob)
        self.sub1 = Sublayer(d_model, drop_prob, pre_norm)
        self.sub2 = Sublayer(d_model, drop_prob, pre_norm)

    def forward(self, x: torch.Tensor, src_mask: torch.Tensor) -> torch.Tensor:
        x = self.sub1(x, lambda h: self.attn(h, src_mask))
        return self.sub2(x, self.ffn)


class DecoderLayer(nn.Module):
    def __init__(
        self,
        d_model: int,
        n_head: int,
        ffn_hidden: int,
        drop_prob: float,
        pre_norm: bool,
        attn_drop_prob: float = 0.0,
        ffn_drop_prob: float = 0.0,
    ) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, n_head, attn_drop_prob)
        self.cross_attn = MultiHeadAttention(d_model, n_head, attn_drop_prob, cross=True)
        self.ffn = FeedForward(d_model, ffn_hidden, ffn_drop_prob)
        self.sub1 = Sublayer(d_model, drop_prob, pre_norm)
        self.sub2 = Sublayer(d_model, drop_prob, pre_norm)
        self.sub3 = Sublayer(d_model, drop_prob, pre_norm)

    def forward(
        self,
        x: torch.Tensor,
        memory: torch.Tensor,
        trg_mask: torch.Tensor | None,
        src_mask: torch.Tensor,
        cache: dict[str, dict[str, torch.Tensor]] | None = None,
    ) -> torch.Tensor:
        self_cache = cross_cache = None
        if cache is not None:
            self_cache = cache.setdefault("self", {})
            cross_cache = cache.setdefault("cross", {})
        x = self.sub1(x, lambda h: self.self_attn(h, trg_mask, cache=self_cache))
        x = self.sub2(x, lambda h: self.cross_attn(h, src_mask, memory, cache=cross_cache))
        return self.sub3(x, self.ffn)
