"""Building blocks of the Transformer: attention, feed-forward, positions, encoder/decoder layers.

Shapes: B batch, S source length, T target length, D d_model, H heads, Dh = D / H.
"""

import math
from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional

from transformer_mt.config import ModelConfig
from transformer_mt.model.cache import AttentionCache
from transformer_mt.model.dropout import Dropout, dropout, dropout_add


class MultiHeadAttention(nn.Module):
    """Multi-head attention through ``F.scaled_dot_product_attention``.

    Self-attention projects queries, keys and values with one fused matrix; cross-attention projects
    the queries from the decoder and keys/values (one fused matrix) from the encoder memory, so that
    incremental decoding can compute the memory's keys/values once per sentence.
    """

    def __init__(self, d_model: int, n_head: int, *, drop_prob: float, cross: bool) -> None:
        super().__init__()
        if d_model % n_head != 0:
            raise ValueError(f"d_model={d_model} is not divisible by n_head={n_head}")
        self.n_head = n_head
        self.d_head = d_model // n_head
        self.cross = cross
        self.drop_prob = drop_prob  # dropout on the attention weights
        # Created in this order (the random init draws follow it): q/kv or qkv, then out.
        if cross:
            self.q_proj = nn.Linear(d_model, d_model)
            self.kv_proj = nn.Linear(d_model, 2 * d_model)
        else:
            self.qkv_proj = nn.Linear(d_model, 3 * d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        return x.view(batch, length, self.n_head, self.d_head).transpose(1, 2)  # (B, H, T, Dh)

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None,
        memory: torch.Tensor | None = None,
        cache: AttentionCache | None = None,
        *,
        need_weights: bool = False,
        causal: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Attend from ``x`` (B, T, D) to itself, or to ``memory`` (M, S, D) when cross.

        ``mask`` is True where a query may attend to a key (bool, broadcasting to (B, H, T, Tk)),
        or the same as an additive float bias (0 or -inf); None: every key. ``causal``: each
        query attends to itself and the keys before it, and to no others, without a mask (SDPA's
        ``is_causal``, which flash kernels take); ``mask`` must then be None.

        Cross-attention allows M < B with B = G * M: each memory row serves G consecutive rows of
        ``x`` (beam search's G beams of one sentence), whose queries attend to it together as
        one block of G * T queries. The memory, its keys/values and the mask (M, 1, 1, S) then
        exist once per sentence instead of once per beam.

        ``cache`` (incremental decoding): self-attention appends this step's keys/values to it;
        cross-attention computes the memory's keys/values on the first step and reuses them after.

        Returns the output (B, T, D) and, with ``need_weights``, the attention weights
        (B, H, T, Tk), else None. ``need_weights`` takes the explicit path; otherwise
        :func:`_attention` picks the faster one for where it runs (same result up to rounding).
        """
        batch, length, _ = x.shape
        if self.cross:
            q = self._split(self.q_proj(x))  # (B, H, T, Dh)
            if cache is not None and not cache.empty:
                k, v = cache.keys, cache.values  # (M, H, S, Dh)
            else:
                k, v = (self._split(part) for part in self.kv_proj(memory).chunk(2, dim=-1))
                if cache is not None:
                    k, v = cache.store(
                        k, v
                    )  # contiguous: every later step reads them without a copy
            group = _group_size(batch, k.size(0))
            q = _merge_groups(q, group)  # (M, H, G*T, Dh)
        else:
            group = 1
            q, k, v = (self._split(part) for part in self.qkv_proj(x).chunk(3, dim=-1))
            if cache is not None:
                k, v = cache.append(k, v)  # (B, H, t_past + T, Dh)
        drop = self.drop_prob if self.training else 0.0
        weights = None
        if need_weights:
            # (M, H, G*T, Dh / Tk)
            y, weights = _explicit_attention(q, k, v, mask, drop, causal=causal)
            weights = _split_groups(weights, group)  # (B, H, T, Tk)
        else:
            y = _attention(q, k, v, mask, drop, causal=causal)  # (M, H, G*T, Dh)
        y = y.unflatten(2, (group, length)).permute(0, 2, 3, 1, 4)  # (M, G, T, H, Dh)
        y = y.reshape(batch, length, self.n_head * self.d_head)  # (B, T, D)
        return self.out_proj(y), weights


def _group_size(rows: int, memory_rows: int) -> int:
    """How many query rows share each memory row: ``rows / memory_rows``, a whole number."""
    if memory_rows == 0 or rows % memory_rows != 0:
        raise ValueError(f"{rows} query rows cannot share {memory_rows} memory rows evenly")
    return rows // memory_rows


def _merge_groups(t: torch.Tensor, group: int) -> torch.Tensor:
    """(G*M, H, T, X) -> (M, H, G*T, X): the G consecutive rows of each group side by side."""
    if group == 1:
        return t
    rows, heads, length, width = t.shape
    t = t.view(rows // group, group, heads, length, width).transpose(1, 2)
    return t.reshape(rows // group, heads, group * length, width)


def _split_groups(t: torch.Tensor, group: int) -> torch.Tensor:
    """The inverse of :func:`_merge_groups`: (M, H, G*T, X) -> (G*M, H, T, X)."""
    if group == 1:
        return t
    rows, heads, length, width = t.shape
    t = t.view(rows, heads, group, length // group, width).transpose(1, 2)
    return t.reshape(rows * group, heads, length // group, width)


# Inference on CPU attends query blocks up to this long by the explicit path (torch 2.13, d_head 64,
# 2 threads: one query per row over 20 keys 85 us against the fused kernel's 117 us; 4 queries 61
# against 211; 64 over 64 keys 580 against 637).
_EXPLICIT_MAX_QUERIES = 64


def _explicit_is_faster(q: torch.Tensor) -> bool:
    """Whether attention for queries ``q`` (.., T, Dh) should take the explicit path.

    :func:`_explicit_attention` rather than torch's fused kernel: on CPU, in low-precision training
    (the fused bf16 backward takes about 5x the fp32 time on Multi30k-sized batches; the explicit
    path takes 1.6-2x less than the fused kernel in fp32 with its casts), and in inference for short
    query blocks (search steps, sentences of Multi30k length)."""
    if q.device.type != "cpu":
        return False
    if torch.is_grad_enabled():
        return q.dtype != torch.float32
    return q.size(-2) <= _EXPLICIT_MAX_QUERIES


def _attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    drop: float,
    *,
    causal: bool = False,
) -> torch.Tensor:
    """Compute softmax(q k^T / sqrt(Dh), masked) v by the faster path for where it runs.

    See :func:`_explicit_is_faster`. On the fused path, low-precision inputs on CPU are attended in
    fp32 (with autocast off, which would cast them back) and the result returned in their dtype.
    ``mask``: bool (True: may attend) or an additive float bias; ``causal``: no mask, each query
    attends to the keys up to its own position (SDPA's ``is_causal``)."""
    if causal and mask is not None:
        raise ValueError("causal attention takes no mask")
    if _explicit_is_faster(q):
        return _explicit_attention(q, k, v, mask, drop, causal=causal)[0]
    if mask is not None and mask.dtype != torch.bool and mask.dtype != q.dtype:
        mask = mask.to(q.dtype)  # a float bias in the products' dtype (SDPA's kernels want it)
    if q.device.type != "cpu" or q.dtype in (torch.float32, torch.float64):
        return functional.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=drop, is_causal=causal
        )
    with torch.autocast("cpu", enabled=False):
        y = functional.scaled_dot_product_attention(
            q.float(),
            k.float(),
            v.float(),
            attn_mask=None if mask is None else mask if mask.dtype == torch.bool else mask.float(),
            dropout_p=drop,
            is_causal=causal,
        )
    return y.to(q.dtype)


def _explicit_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    drop: float,
    *,
    causal: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Compute softmax(q k^T / sqrt(Dh), masked) v, and the weights (fp32, before dropout).

    The products in the dtype of ``q``, ``k``, ``v``, the scores and softmax in fp32 (as autocast
    would on a GPU; float64 inputs: in float64), the weights cast back for the second product;
    ``drop`` is dropout on the weights, as in the fused kernel. The one explicit path: attention
    pictures, and where :func:`_explicit_is_faster`. ``mask`` and ``causal`` as in
    :func:`_attention` (causal: query i attends to keys 0..i, as SDPA's ``is_causal``)."""
    if torch.is_autocast_enabled(q.device.type):
        with torch.autocast(q.device.type, enabled=False):
            return _explicit_attention(q, k, v, mask, drop, causal=causal)
    if causal:
        if mask is not None:
            raise ValueError("causal attention takes no mask")
        queries, keys = q.size(-2), k.size(-2)
        mask = torch.ones(queries, keys, dtype=torch.bool, device=q.device).tril()
    # In place where autograd allows it (no backward needs these scores): fewer allocations.
    scores = (q @ k.transpose(-2, -1)).to(torch.promote_types(q.dtype, torch.float32))
    scores.mul_(1.0 / math.sqrt(q.size(-1)))
    if mask is not None and mask.dtype != torch.bool:
        scores.add_(mask)  # an additive bias: 0, or -inf where a key is masked
        mask = ~torch.isneginf(mask)
    elif mask is not None:
        scores.masked_fill_(mask.logical_not(), float("-inf"))
    weights = scores.softmax(dim=-1)
    if mask is not None and not causal:  # a causal query always has its own key
        # A query with no key to attend to gets zeros, as from the fused kernel (softmax over
        # -inf alone is NaN); no input the CLI builds has one (every source ends with EOS).
        blind = mask.logical_not().all(dim=-1, keepdim=True)
        # Under torch.compile the fill runs always (a no-op without blind queries): a test of
        # the data would split the graph.
        if torch.compiler.is_compiling() or blind.any():
            weights = weights.masked_fill(blind, 0.0)
    return dropout(weights, drop).to(q.dtype) @ v, weights


# The feed-forward activations by name (ModelConfig.activation). swish is x * sigmoid(x), torch's
# SiLU: what OPUS-MT models use (Marian's and Hugging Face's name for it).
ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "relu": functional.relu,
    "gelu": functional.gelu,
    "swish": functional.silu,
}


class FeedForward(nn.Module):
    """Position-wise feed-forward network: Linear -> activation -> (dropout) -> Linear.

    ``activation`` names one of :data:`ACTIVATIONS` (ReLU: the paper's). The inner dropout is
    not in the paper (the Annotated Transformer adds it): it is off unless ``drop_prob`` > 0,
    and then costs a random mask over the widest activation of the layer.
    """

    def __init__(self, d_model: int, ffn_hidden: int, *, drop_prob: float, activation: str) -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation {activation!r}: expected one of {', '.join(ACTIVATIONS)}")
        self.fc1 = nn.Linear(d_model, ffn_hidden)
        self.fc2 = nn.Linear(ffn_hidden, d_model)
        self.dropout = Dropout(drop_prob) if drop_prob > 0 else nn.Identity()
        self.activation = ACTIVATIONS[activation]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.dropout(self.activation(self.fc1(x))))


POSITION_LAYOUTS = ("interleaved", "halves")


class SinusoidalPositions(nn.Module):
    """Fixed sinusoidal position encodings of the paper, added to the scaled embeddings.

    Frequency k (k = 0 .. D/2 - 1) of position p is p / 10000^(2k / D). ``layout`` places its
    sine and cosine: ``interleaved`` at columns 2k and 2k + 1 (the paper's, this project's
    models), ``halves`` at columns k and D/2 + k (Marian's; computed in float64 as Hugging Face
    computes it, so that an imported model's table is its own to the last bit).
    """

    table: torch.Tensor  # (max_len, D), a buffer: row p encodes position p

    def __init__(self, d_model: int, max_len: int, layout: str) -> None:
        super().__init__()
        if layout not in POSITION_LAYOUTS:
            raise ValueError(
                f"position layout {layout!r}: expected one of {', '.join(POSITION_LAYOUTS)}"
            )
        if layout == "halves":
            table = _halves_table(d_model, max_len)
        else:
            pos = torch.arange(max_len, dtype=torch.float32)[:, None]  # (L, 1)
            inv_freq = torch.exp(
                torch.arange(0, d_model, 2).float() * (-math.log(10000.0) / d_model)
            )
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

    def at(self, positions: torch.Tensor) -> torch.Tensor:
        """Encodings (R, D) of one position per row, ``positions`` (R,).

        A position past the table is an index error (no check that would wait for a GPU every
        step).
        """
        return self.table.index_select(0, positions)


def _halves_table(d_model: int, max_len: int) -> torch.Tensor:
    """The (max_len, D) table with all sines first, then all cosines, from float64 angles.

    An odd D has one sine more.
    """
    pos = torch.arange(max_len, dtype=torch.float64)[:, None]  # (L, 1)
    wavelengths = 10000.0 ** (torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    angles = pos / wavelengths  # (L, ceil(D / 2)), divided as Hugging Face divides
    table = torch.cat([angles.sin(), angles[:, : d_model // 2].cos()], dim=1)
    return table.float()


class Residual(nn.Module):
    """Residual connection around a sublayer, with its LayerNorm after or before it.

    After: post-norm, the paper's; before: pre-norm, the Annotated Transformer's (trains more
    stably in deep stacks):

        post-norm: norm(x + dropout(sublayer(x)))      pre-norm: x + dropout(sublayer(norm(x)))

    Used in two halves, so that a sublayer may return more than its output (attention weights)::

        y = sublayer(residual.sublayer_input(x))
        x = residual.add(x, y)
    """

    def __init__(self, d_model: int, *, drop_prob: float, pre_norm: bool) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.dropout = Dropout(drop_prob)
        self.pre_norm = pre_norm

    def sublayer_input(self, x: torch.Tensor) -> torch.Tensor:
        """What the sublayer reads: ``norm(x)`` (pre-norm) or ``x`` itself (post-norm)."""
        return self.norm(x) if self.pre_norm else x

    def add(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The residual stream after the sublayer's output ``y``: dropout, add, (post-)norm."""
        x = dropout_add(x, y, self.dropout.p, self.training)
        return x if self.pre_norm else self.norm(x)


def _attention_block(cfg: ModelConfig, *, cross: bool) -> MultiHeadAttention:
    """An attention sublayer of the model ``cfg`` (self-attention, or cross-attention)."""
    return MultiHeadAttention(cfg.d_model, cfg.n_head, drop_prob=cfg.attn_drop_prob, cross=cross)


def _feed_forward(cfg: ModelConfig) -> FeedForward:
    """The feed-forward sublayer of the model ``cfg``."""
    return FeedForward(
        cfg.d_model, cfg.ffn_hidden, drop_prob=cfg.ffn_drop_prob, activation=cfg.activation
    )


def _residual(cfg: ModelConfig) -> Residual:
    """A residual connection of the model ``cfg`` (its residual dropout and norm placement)."""
    return Residual(cfg.d_model, drop_prob=cfg.drop_prob, pre_norm=cfg.pre_norm)


class EncoderLayer(nn.Module):
    """Self-attention, then feed-forward, each inside a :class:`Residual`.

    Sized and set by the model's settings ``cfg``.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        # Registration order = parameter order (optimizer state in checkpoints is indexed by it)
        # and init order (random draws): attention, feed-forward, then the residual norms.
        self.self_attn = _attention_block(cfg, cross=False)
        self.ffn = _feed_forward(cfg)
        self.self_attn_residual = _residual(cfg)
        self.ffn_residual = _residual(cfg)

    def forward(self, x: torch.Tensor, src_mask: torch.Tensor) -> torch.Tensor:
        """``x`` (B, S, D) with the source pad mask (B, 1, 1, S) -> (B, S, D)."""
        y, _ = self.self_attn(self.self_attn_residual.sublayer_input(x), src_mask)
        x = self.self_attn_residual.add(x, y)
        y = self.ffn(self.ffn_residual.sublayer_input(x))
        return self.ffn_residual.add(x, y)


class DecoderLayer(nn.Module):
    """Masked self-attention, cross-attention to the memory, then feed-forward.

    Each inside a :class:`Residual`, sized and set by the model's settings ``cfg``.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        # Registration order = parameter order and init order, as in EncoderLayer.
        self.self_attn = _attention_block(cfg, cross=False)
        self.cross_attn = _attention_block(cfg, cross=True)
        self.ffn = _feed_forward(cfg)
        self.self_attn_residual = _residual(cfg)
        self.cross_attn_residual = _residual(cfg)
        self.ffn_residual = _residual(cfg)

    def forward(
        self,
        x: torch.Tensor,
        memory: torch.Tensor,
        trg_mask: torch.Tensor | None,
        src_mask: torch.Tensor,
        self_cache: AttentionCache | None = None,
        cross_cache: AttentionCache | None = None,
        *,
        need_weights: bool = False,
        causal: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Decode ``x`` (B, T, D) against itself and ``memory`` (B, S, D) -> (B, T, D).

        ``x`` attends to itself under ``trg_mask`` (or, ``causal``, to its positions up to each
        query's, with ``trg_mask`` None) and to ``memory`` under ``src_mask``; with
        ``need_weights`` the cross-attention weights (B, H, T, S), else None. The caches are given
        in incremental decoding."""
        y, _ = self.self_attn(
            self.self_attn_residual.sublayer_input(x), trg_mask, cache=self_cache, causal=causal
        )
        x = self.self_attn_residual.add(x, y)
        y, weights = self.cross_attn(
            self.cross_attn_residual.sublayer_input(x),
            src_mask,
            memory,
            cache=cross_cache,
            need_weights=need_weights,
        )
        x = self.cross_attn_residual.add(x, y)
        y = self.ffn(self.ffn_residual.sublayer_input(x))
        return self.ffn_residual.add(x, y), weights
