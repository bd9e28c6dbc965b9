"""Label-smoothed cross entropy, summed over the non-pad target tokens."""

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
