"""Label-smoothed cross entropy, summed over the non-pad target tokens: the one home of the loss.

``label_smoothed_nll`` scores given logits (validation, benchmarks). Training uses
``linear_label_smoothed_nll``, which fuses the output projection into the loss so that the
(tokens, V) logits, the largest tensor of a small model's step, never exist whole.

The contract between the model and the fused loss (what the trainer's step relies on)::

    hidden = model(src, trg_in, features_only=True)        # (B, T, D), after the final norm
    loss, nll = linear_label_smoothed_nll(hidden, model.out.weight, trg_out, pad, eps,
                                          bias=model.out.bias)
    # == label_smoothed_nll(model(src, trg_in), trg_out, pad, eps), with the same gradients for
    #    every parameter (``model.out`` may be tied to the target embedding; its bias, which
    #    only imported models have, is None otherwise)

``tests/test_training.py`` checks this equality in fp32 and bf16, chunked and whole.
"""

from typing import Any

import torch
import torch.nn.functional as F


def label_smoothed_nll(
    logits: torch.Tensor, target: torch.Tensor, pad_idx: int, epsilon: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed label-smoothed loss and summed plain NLL over non-pad positions.

    With V classes and log-probabilities ``lp``, each non-pad position contributes
    ``(1 - epsilon) * -lp[y] + epsilon * mean_j(-lp[j])``: the target keeps 1 - epsilon of the mass
    and epsilon is spread evenly over all V classes (torch's ``label_smoothing`` definition).
    Padding positions contribute nothing. Returning sums lets the trainer divide by the global
    number of target tokens across micro-batches and ranks. One log-softmax serves both sums: over
    a large vocabulary it is among the costliest parts of a training step.

    Args:
        logits: (B, T, V); target: (B, T) ids.
    """
    lprobs = F.log_softmax(logits.float(), dim=-1).view(-1, logits.size(-1))  # (B*T, V) in fp32
    target = target.reshape(-1)  # (B*T,)
    keep = target != pad_idx
    nll = -lprobs.gather(1, target[:, None]).squeeze(1)  # (B*T,)
    nll = nll.masked_fill(~keep, 0.0).sum()
    if epsilon == 0.0:
        return nll, nll.detach()
    smooth = -lprobs.mean(dim=-1).masked_fill(~keep, 0.0).sum()
    return (1.0 - epsilon) * nll + epsilon * smooth, nll.detach()


# Size of the (rows, V) fp32 logits block the chunked loss holds at a time. On CPU ~16 MiB keeps it
# in malloc's reusable heap (below the 32 MiB mmap limit) and close to the caches; a GPU wants
# fewer, larger blocks (fewer kernel launches) and has the memory for them.
_CHUNK_BYTES = 16 << 20
_GPU_CHUNK_BYTES = 1 << 30
# Size of the (rows, V) block of gradients in bf16/fp16 that one weight-gradient product takes:
# several fp32 blocks' worth, under glibc's 32 MiB mmap limit on a CPU.
_GROUP_BYTES = 24 << 20
# Below this, a softmax probability has lost fp32 precision (subnormal or zero); log p_y is then
# not a safe way to the row's log-sum-exp.
_TINY = 1e-30


class _LinearLabelSmoothedNLL(torch.autograd.Function):
    """The output projection and the label-smoothed loss together, a block of rows at a time.

    The (N, V) logits never exist whole: each block of rows is projected, scored, and turned at
    once into its gradient ``softmax(z) - q``, which is multiplied back into the gradients of the
    hidden states and of the weight. Backward then only scales those by the incoming gradient.
    Matrix products run in ``dtype`` (bf16 under autocast), everything else in fp32.

    Few passes over a block: the product, one row-wise softmax (fp32, written over the logits), a
    cast of the softmax to ``dtype``, and the two products of the gradient. The log-sum-exp of a
    row comes from its target's probability (``lse = z_y - log p_y``; rows where ``p_y``
    underflows take torch's logsumexp over their logits, computed again); the mean of a row's
    logits, which the smoothing term needs, is the row's hidden state times the mean of the
    weight's rows (plus the bias's mean), one small product for all rows instead of a pass over
    every block; and the ``epsilon / V`` that the smoothed target ``q`` gives every class is
    applied as a rank-one correction to the two gradient products instead of a pass over the
    block. Padding rows are left out before the first product.

    In bf16 (or fp16) the weight's gradient is one product per group of blocks (up to
    ``_GROUP_BYTES`` of the gradients ``softmax - q`` kept in ``dtype``), each cast to fp32 and
    added: a cast and an add of the whole (V, D) gradient per group instead of per block.

    ``vocab_multiple``: the products run over the weight's rows padded with zero rows to a
    multiple of it (tensor cores' tile sizes on a GPU), whose logits are set to -inf: they get
    no probability, no loss and no gradient, and the results are those of the V real rows.

    ``compact`` (the CPU's way, the default there): padding rows are left out before the first
    product, which takes a count of them on the host. Otherwise (a GPU's default) every row goes
    through the products, padding rows zeroed and weighted 0, and each row's log-sum-exp is taken
    from its logits before the softmax: no step of the loss waits for the device.
    """

    @staticmethod
    def forward(
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        target: torch.Tensor,
        pad_idx: int,
        epsilon: float,
        dtype: torch.dtype,
        vocab_multiple: int = 1,
        compact: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Loss and NLL of the rows, with the gradients of ``hidden``, ``weight`` and ``bias``.

        Length: one loop over the blocks, whose buffers are reused from block to block; split
        into functions, each would take and return the same half-dozen buffers.
        """
        n, vocab = hidden.size(0), weight.size(0)
        wide = -(-vocab // vocab_multiple) * vocab_multiple  # the rows the products run over
        need_grad = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
        # The output projection's bias (an imported Marian model's), added to each block of
        # logits in fp32; its gradient is the sum of the rows' softmax - q. Padded rows of the
        # weight get -inf here (or a fill of their columns where there is no bias).
        b = None if bias is None else bias.detach().float()
        grad_b = torch.zeros(wide, device=hidden.device) if need_grad and b is not None else None
        if b is not None and wide > vocab:
            b = torch.cat([b, b.new_full((wide - vocab,), float("-inf"))])
        with torch.autocast(hidden.device.type, enabled=False):
            h, w = hidden.to(dtype), _padded_rows(weight, dtype, wide)
            keep = target != pad_idx  # the rows that count
            kept = weights = None
            if compact:
                kept = keep.nonzero().squeeze(1)
                if len(kept) < n:
                    h, target = h.index_select(0, kept), target.index_select(0, kept)
            else:  # padding rows zeroed: their logits are the bias alone, their gradients 0
                h = h.masked_fill(keep.logical_not()[:, None], 0.0)
                weights = keep.to(torch.float32)
            grad_h = torch.empty_like(h) if need_grad else None
            grad_w = (
                weight.new_zeros((wide, weight.size(1)), dtype=torch.float32) if need_grad else None
            )
            nll = hidden.new_zeros((), dtype=torch.float32)
            smooth = nll.clone()
            w_sum = w.float().sum(0)  # (D,) (padded rows are zeros)
            # The mean of each row's logits (the smoothing term's), from the hidden states.
            z_mean = h.float() @ (w_sum / vocab)  # (n',)
            if bias is not None:
                z_mean += bias.detach().float().mean()
            # -epsilon / V times the sum of the weight's rows: what the uniform part of q adds to
            # each row of the hidden states' gradient (bias of the product below).
            uniform_h = (w_sum * (-epsilon / vocab)).to(dtype) if need_grad else None
            budget = _CHUNK_BYTES if hidden.device.type == "cpu" else _GPU_CHUNK_BYTES
            rows = max(1, budget // (4 * wide))
            low = h.dtype in (torch.float16, torch.bfloat16)
            # Blocks per weight-gradient product: several in bf16/fp16 (see the class docstring).
            group = max(1, _GROUP_BYTES // (2 * wide * rows)) if low else 1
            # One set of block buffers for all blocks (fresh memory costs page faults on a CPU).
            full = min(rows, len(h))
            # The products in dtype (when low), then the gradients of a group of blocks.
            z_low = h.new_empty((min(group * rows, len(h)) if low else 0, wide))
            # The block's logits in fp32, then (in place) their softmax.
            z_buf = h.new_empty((full, wide), dtype=torch.float32 if low else h.dtype)
            for i in range(0, len(h), rows):
                hc, tc = h[i : i + rows], target[i : i + rows, None]
                z = z_buf[: len(hc)]  # (rows, V)
                start = i % (group * rows)  # this block's rows in the group's buffer
                z_lc = z_low[start : start + len(hc)]
                if low:
                    z.copy_(torch.mm(hc, w.T, out=z_lc))
                else:
                    torch.mm(hc, w.T, out=z)
                if b is not None:
                    z.add_(b)
                elif wide > vocab:
                    z[:, vocab:] = float("-inf")
                z_y = z.gather(1, tc).squeeze(1)
                if weights is not None:  # the log-sum-exp from the logits: no host check
                    lse = torch.logsumexp(z, dim=-1)
                p = torch.ops.aten._softmax.out(z, -1, False, out=z)  # over the logits
                if weights is None:
                    p_y = p.gather(1, tc).squeeze(1)
                    lse = z_y - p_y.log()
                    lost = p_y < _TINY  # p_y underflowed (z_y far below the row's maximum)
                    if lost.any():  # their logits again (the softmax took their place)
                        z_lost = (hc[lost] @ w[:vocab].T).float()
                        lse[lost] = torch.logsumexp(
                            z_lost if b is None else z_lost + b[:vocab], dim=-1
                        )
                    nll += (lse - z_y).sum()
                    smooth += (lse - z_mean[i : i + rows]).sum()
                else:
                    wc = weights[i : i + rows]
                    nll += ((lse - z_y) * wc).sum()
                    smooth += ((lse - z_mean[i : i + rows]) * wc).sum()
                if grad_h is not None and grad_w is not None and uniform_h is not None:
                    # softmax - q, without the epsilon / V of q (rank-one terms below and above)
                    if weights is None:
                        p.scatter_add_(1, tc, p.new_full(tc.shape, epsilon - 1.0))
                    else:
                        p.scatter_add_(1, tc, (epsilon - 1.0) * wc[:, None])
                    # d(loss sum) / d(logits) + epsilon / V, (rows, V), in the product's buffer
                    g = z_lc.copy_(p) if low else p
                    torch.addmm(uniform_h, g, w, out=grad_h[i : i + rows])
                    end = i + len(hc)
                    if not low:
                        grad_w += g.T @ hc
                    elif end == len(h) or end % (group * rows) == 0:  # the group is complete
                        first = i - start  # the group's first row
                        grad_w += (z_low[: end - first].T @ h[first:end]).float()
                    if grad_b is not None:
                        grad_b += g.float().sum(0) if weights is None else wc @ g.float()
            if grad_h is not None and grad_w is not None:  # need_grad
                grad_w -= (epsilon / vocab) * h.float().sum(0)  # the uniform part of q, all rows
                if grad_b is not None:
                    counted = len(h) if weights is None else weights.sum()
                    grad_b -= (epsilon / vocab) * counted
                if kept is not None and len(kept) < n:  # padding rows get no gradient
                    grad_h = grad_h.new_zeros((n, grad_h.size(1))).index_copy_(0, kept, grad_h)
                elif kept is None:
                    grad_h.masked_fill_(keep.logical_not()[:, None], 0.0)
        if grad_b is not None:
            grad_b = grad_b[:vocab]
        ctx.save_for_backward(grad_h, None if grad_w is None else grad_w[:vocab], grad_b)
        ctx.dtypes = hidden.dtype, weight.dtype, None if bias is None else bias.dtype
        return (1.0 - epsilon) * nll + epsilon * smooth, nll

    @staticmethod
    def backward(ctx: Any, grad_loss: torch.Tensor, _grad_nll: torch.Tensor) -> tuple[Any, ...]:
        grad_h, grad_w, grad_b = ctx.saved_tensors
        h_dtype, w_dtype, b_dtype = ctx.dtypes
        return (  # scaled in fp32: grad_loss may carry an fp16 loss scale
            grad_h.float().mul_(grad_loss).to(h_dtype),
            (grad_w * grad_loss).to(w_dtype),
            None if grad_b is None else (grad_b * grad_loss).to(b_dtype),
            None,
            None,
            None,
            None,
            None,
            None,
        )


def _padded_rows(weight: torch.Tensor, dtype: torch.dtype, rows: int) -> torch.Tensor:
    """``weight`` (V, D) in ``dtype``, with zero rows after its own up to ``rows``."""
    if rows == weight.size(0):
        return weight.to(dtype)
    out = weight.new_zeros((rows, weight.size(1)), dtype=dtype)
    out[: weight.size(0)].copy_(weight)
    return out


def linear_label_smoothed_nll(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    pad_idx: int,
    epsilon: float,
    dtype: torch.dtype | None = None,
    bias: torch.Tensor | None = None,
    *,
    vocab_multiple: int = 1,
    compact: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``label_smoothed_nll(hidden @ weight.T, ...)`` without the (B, T, V) logits in memory.

    The same sums, computed block by block (see ``_LinearLabelSmoothedNLL``): the output
    projection and the loss are the costliest part of a small model's training step, and most of
    it is memory traffic over the logits. Gradients reach ``hidden`` and ``weight`` (a tied
    embedding included) as from the unfused pair of operations.

    Args:
        hidden: (B, T, D) decoder states before the output projection; weight: (V, D), the
            bias-free output projection; target: (B, T) ids.
        dtype: the matrix-product dtype (the autocast dtype under mixed precision); default: the
            dtype of ``hidden``.
        bias: (V,) the output projection's bias, where it has one (an imported model's); its
            gradient comes back as the unfused pair's would.
        vocab_multiple: the products run over the vocabulary padded to a multiple of this
            (``train.pad_vocab_to``); the results are the same.
        compact: leave padding rows out before the products (default: on a CPU); otherwise
            no step waits for the device (see ``_LinearLabelSmoothedNLL``).
    """
    d = hidden.size(-1)
    loss, nll = _LinearLabelSmoothedNLL.apply(
        hidden.reshape(-1, d),
        weight,
        bias,
        target.reshape(-1),
        pad_idx,
        epsilon,
        dtype or hidden.dtype,
        vocab_multiple,
        hidden.device.type == "cpu" if compact is None else compact,
    )
    return loss, nll.detach()
