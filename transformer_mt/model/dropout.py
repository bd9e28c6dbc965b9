"""Dropout with a cheaper random mask on CPU.

torch's CPU dropout draws its mask with ``bernoulli_``, one 64-bit draw and a double comparison
per element on a single core: about 7.5 ns per element, 7 ms for one (3,600 x 256) activation and
a fifth of a Multi30k training step at the recipe's 17 dropout sites. Here the mask comes from 16
random bits per element: one full-range 64-bit draw of the same generator fills four elements,
and a vectorized comparison turns them into the boolean mask (about 1 ms for the same tensor,
applying it included). The rate is ``p`` rounded to a multiple of 2^-16 (0.3 becomes 0.300003),
and kept elements are scaled by the inverse of the rounded keep rate, so the output is still an
unbiased estimate of the input.

The draws come from torch's default generator, as ``F.dropout``'s do, so ``torch.manual_seed``
and the generator state (saved in checkpoints for an exact resume) govern them the same way; the
masks themselves differ from ``F.dropout``'s. Elsewhere (CUDA's fused dropout is already cheap),
and for rates of 0 or 1, this is ``F.dropout``.
"""

import torch
from torch import nn
from torch.nn import functional

_LEVELS = 1 << 16  # the mask's resolution: 16 random bits per element


def dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """``F.dropout(x, p, training)``, with the cheaper mask on CPU (see the module docstring)."""
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or not 0.0 < p < 1.0 or not x.is_floating_point():
        return functional.dropout(x, p, training)
    dropped = round(p * _LEVELS)  # of the 2^16 equally likely values, those that drop
    if dropped == 0 or dropped == _LEVELS:
        return functional.dropout(x, p, training)
    mask = keep_mask(x.shape, dropped)
    # grad_output * mask * scale in one kernel, and differentiable (its gradient is the same
    # product): the forward and backward of dropout with a given mask.
    return torch.ops.aten.native_dropout_backward(x, mask, _LEVELS / (_LEVELS - dropped))


def keep_mask(shape: torch.Size, dropped: int) -> torch.Tensor:
    """A boolean CPU tensor of ``shape``, each element False with probability dropped / 2^16,
    independently, from 16 bits of torch's default generator each."""
    n = shape.numel()
    words = torch.empty((n + 3) // 4, dtype=torch.int64).random_(-(2**63), None)  # all 64 bits
    bits = words.view(torch.int16)[:n].view(shape)  # uniform over [-2^15, 2^15)
    return bits >= dropped - (_LEVELS >> 1)  # dropped of the 2^16 values fall below


class Dropout(nn.Dropout):
    """``nn.Dropout`` with the cheaper CPU mask of :func:`dropout` (no parameters or state, so
    it replaces ``nn.Dropout`` without changing checkpoints)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)
