"""Label-smoothed cross entropy, summed over the non-pad target tokens: the one home of the loss.

``label_smoothed_nll`` scores given logits (validation, benchmarks). Training uses
``linear_label_smoothed_nll``, which fuses the output projection into the loss so that the
(tokens, V) logits, the largest tensor of a small model's step, never exist whole.

The contract between the model and the fused loss (what the trainer's step relies on)::

    hidden = model(src, trg_in, features_only=True)        # (B, T, D), after the final norm
    loss, nll = linear_label_smoothed_nll(hidden, model.out.weight, trg_out, pad, eps)
    # == label_smoothed_nll(model(src, trg_in), trg_out, pad, eps), with the same gradients for
    #    every parameter (``model.out`` is bias-free and may be tied to the target embedding)

``tests/test_training.py`` checks this equality in fp32 and bf16, chunked and whole.
"""

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


class _LinearLabelSmoothedNLL(torch.autograd.Function):
    """The output projection and the label-smoothed loss together, a block of rows at a time.

    The (N, V) logits never exist whole: each block of rows is projected, scored, and turned at
    once into its gradient ``softmax(z) - q``, which is multiplied back into the gradients of the
    hidden states and of the weight. Backward then only scales those by the incoming gradient.
    Matrix products run in ``dtype`` (bf16 under autocast), everything else in fp32.
    """

    @staticmethod
    def forward(ctx, hidden, weight, target, pad_idx: int, epsilon: float, dtype):  # type: ignore[override]
        n, vocab = hidden.size(0), weight.size(0)
        need_grad = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
        with torch.autocast(hidden.device.type, enabled=False):
            h, w = hidden.to(dtype), weight.to(dtype)
            keep = target != pad_idx
            grad_h = torch.empty_like(h) if need_grad else None
            grad_w = torch.zeros_like(weight, dtype=torch.float32) if need_grad else None
            nll = hidden.new_zeros((), dtype=torch.float32)
            smooth = nll.clone()
            budget = _CHUNK_BYTES if hidden.device.type == "cpu" else _GPU_CHUNK_BYTES
            rows = max(1, budget // (4 * vocab))
            for i in range(0, n, rows):
                hc, tc, kc = h[i : i + rows], target[i : i + rows], keep[i : i + rows]
                z = (hc @ w.T).float()  # (rows, V)
                lse = torch.logsumexp(z, dim=-1)
                nll += ((lse - z.gather(1, tc[:, None]).squeeze(1)) * kc).sum()
                smooth += ((lse - z.mean(dim=-1)) * kc).sum()
                if need_grad:
                    z.sub_(lse[:, None]).exp_().sub_(epsilon / vocab)  # softmax - epsilon / V
                    z.scatter_add_(1, tc[:, None], lse.new_full((len(tc), 1), epsilon - 1.0))
                    g = z.mul_(kc[:, None]).to(dtype)  # d(loss sum) / d(logits), (rows, V)
                    torch.mm(g, w, out=grad_h[i : i + rows])
                    grad_w += (g.T @ hc).float()
        ctx.save_for_backward(grad_h, grad_w)
        ctx.dtypes = hidden.dtype, weight.dtype
        return (1.0 - epsilon) * nll + epsilon * smooth, nll

    @staticmethod
    def backward(ctx, grad_loss, _grad_nll):  # type: ignore[override]
        grad_h, grad_w = ctx.saved_tensors
        h_dtype, w_dtype = ctx.dtypes
        return (  # scaled in fp32: grad_loss may carry an fp16 loss scale
            grad_h.float().mul_(grad_loss).to(h_dtype),
            (grad_w * grad_loss).to(w_dtype),
            None,
            None,
            None,
            None,
        )


def linear_label_smoothed_nll(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    pad_idx: int,
    epsilon: float,
    dtype: torch.dtype | None = None,
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
    """
    d = hidden.size(-1)
    loss, nll = _LinearLabelSmoothedNLL.apply(
        hidden.reshape(-1, d), weight, target.reshape(-1), pad_idx, epsilon, dtype or hidden.dtype
    )
    return loss, nll.detach()
