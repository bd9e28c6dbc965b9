"""Dropout with a cheaper random mask on CPU.

torch's CPU dropout draws its mask with ``bernoulli_``, one 64-bit draw and a double comparison
per element on a single core: about 7.5 ns per element, 7 ms for one (3,600 x 256) activation and
a fifth of a Multi30k training step at the recipe's 17 dropout sites. Here the mask comes from 16
random bits per element: one full-range 64-bit draw of the same generator fills four elements,
and a vectorized comparison turns them into the mask (about 1 ms for the same tensor, applying
it included). The rate is ``p`` rounded to a multiple of 2^-16 (0.3 becomes 0.300003), and kept
elements are scaled by the inverse of the rounded keep rate, so the output is still an unbiased
estimate of the input.

The comparison writes the mask in the activation's own dtype (0 or 1), so applying it is one
product with no cast: torch's ``native_dropout_backward`` casts a boolean mask to the
activation's dtype on every use, forward and backward, which cost as much as the product itself
(bf16, 4,096 x 1,024: 10-12 ms a site forward and backward before, 5-7 after). In fp32 the mask
holds the scale too (one product per direction); in bf16 the scale stays a separate factor,
because 1 / 0.9 is not a bf16 number, and one ``addcmul`` computes ``x * mask * scale`` in fp32
and rounds it once (the same bits as two products, in half the passes). :func:`dropout_add` also
folds the residual add of ``x + dropout(y)`` into the same pass.

The draws come from torch's default generator, as ``F.dropout``'s do, so ``torch.manual_seed``
and the generator state (saved in checkpoints for an exact resume) govern them the same way; the
masks themselves differ from ``F.dropout``'s. Elsewhere (CUDA's fused dropout is already cheap),
for rates of 0 or 1, and under torch.compile, this is ``F.dropout``.
"""

from typing import Any

import torch
from torch import nn
from torch.autograd.function import once_differentiable
from torch.nn import functional

_LEVELS = 1 << 16  # the mask's resolution: 16 random bits per element
_EXACT_SCALE = (torch.float32, torch.float64)  # dtypes that hold 1 / keep rate closely enough


def dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """``F.dropout(x, p, training)``, with the cheaper mask on CPU (see the module docstring)."""
    if not training or p == 0.0:
        return x
    dropped = _dropped(x, p)
    if dropped is None:
        return functional.dropout(x, p, training)
    return _Dropout.apply(x, dropped)


def dropout_add(x: torch.Tensor, y: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """Return ``x + dropout(y, p, training)``.

    On CPU, when the sum is fp32 (the residual stream under autocast: fp32 ``x``, bf16 ``y``), in
    one pass with the scaled mask in fp32."""
    if not training or p == 0.0:
        return x + y
    dropped = _dropped(y, p)
    if (
        dropped is None
        or torch.promote_types(x.dtype, y.dtype) not in _EXACT_SCALE
        or x.shape != y.shape
    ):
        return x + dropout(y, p, training)
    return _DropoutAdd.apply(x, y, dropped)


def _dropped(x: torch.Tensor, p: float) -> int | None:
    """How many of the 2^16 equally likely mask values drop.

    None where the cheap mask does not apply (not CPU, not floating point, a rate that rounds to 0
    or 1), and under torch.compile, whose code generation draws its own dropout masks inside the
    fused kernels (this mask's bit tricks would split the graph)."""
    if x.device.type != "cpu" or not 0.0 < p < 1.0 or not x.is_floating_point():
        return None
    if torch.compiler.is_compiling():
        return None
    dropped = round(p * _LEVELS)
    return dropped if 0 < dropped < _LEVELS else None


def keep_mask(shape: torch.Size, dropped: int, dtype: torch.dtype = torch.bool) -> torch.Tensor:
    """A random keep mask: a CPU tensor of ``shape`` and ``dtype``.

    Each element is 0 (False) with probability dropped / 2^16 and 1 (True) otherwise, independently,
    from 16 bits of torch's default generator each."""
    n = shape.numel()
    words = torch.empty((n + 3) // 4, dtype=torch.int64).random_(-(2**63), None)  # all 64 bits
    bits = words.view(torch.int16)[:n].view(shape)  # uniform over [-2^15, 2^15)
    # dropped of the 2^16 values fall below the threshold
    return torch.ge(bits, dropped - (_LEVELS >> 1), out=torch.empty(shape, dtype=dtype))


def _scale_by_mask(x: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    """``x * mask * scale`` in ``x``'s dtype, in one pass.

    With a scale, ``addcmul`` onto a zero scalar: computed in fp32 and rounded once, as
    ``(x * mask).mul_(scale)`` rounds (the first product is exact), without its second pass."""
    if scale == 1.0:
        return torch.mul(x, mask)
    zero = torch.zeros((), dtype=x.dtype, device=x.device)
    return torch.addcmul(zero, x, mask, value=scale)


class _Dropout(torch.autograd.Function):
    """Dropout of ``x``, ``dropped`` of 2^16 draws dropping.

    ``x * mask * scale``, forward and backward alike. In fp32 the mask holds the scale (one
    product), in bf16 it is 0 or 1 and the scale a second, exact product."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, dropped: int) -> torch.Tensor:
        scale = _LEVELS / (_LEVELS - dropped)
        mask = keep_mask(x.shape, dropped, x.dtype)
        if x.dtype in _EXACT_SCALE:
            mask, scale = mask.mul_(scale), 1.0
        ctx.save_for_backward(mask)
        ctx.scale = scale
        return _scale_by_mask(x, mask, scale)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        (mask,) = ctx.saved_tensors
        return _scale_by_mask(grad, mask, ctx.scale), None


class _DropoutAdd(torch.autograd.Function):
    """Compute ``x + dropout(y)`` in the sum's dtype (fp32 or fp64).

    One ``addcmul`` with the scaled mask. ``y``'s gradient is the output's times the mask, cast to
    ``y``'s dtype."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, y: torch.Tensor, dropped: int) -> torch.Tensor:
        dtype = torch.promote_types(x.dtype, y.dtype)
        mask = keep_mask(y.shape, dropped, dtype).mul_(_LEVELS / (_LEVELS - dropped))
        ctx.save_for_backward(mask)
        ctx.dtypes = x.dtype, y.dtype
        return torch.addcmul(x, y, mask)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        (mask,) = ctx.saved_tensors
        x_dtype, y_dtype = ctx.dtypes
        # Computed in the sum's dtype and rounded to y's as it is written: one pass.
        grad_y = torch.mul(
            grad, mask, out=torch.empty(grad.shape, dtype=y_dtype, device=grad.device)
        )
        return grad.to(x_dtype), grad_y, None


class Dropout(nn.Dropout):
    """``nn.Dropout`` with the cheaper CPU mask of :func:`dropout`.

    No parameters or state, so it replaces ``nn.Dropout`` without changing checkpoints.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)
