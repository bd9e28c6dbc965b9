"""The linear layers a loaded model runs on: int8, bf16, or packed fp32 on a CPU.

The linear layers a loaded model runs on: int8 (``--quantize int8``: :class:`Int8Linear`),
bf16 products (``--precision bf16``: :class:`Bf16Linear`) or, fp32 on a CPU,
:class:`PackedLinear` (oneDNN products on weights packed once).

:func:`quantize`, :func:`to_bf16` and :func:`pack_linear_layers` swap them in for a model's
``nn.Linear`` layers. The packed fp32 layers keep the model's parameters, so a state dict or an
export sees no difference; the int8 and bf16 ones hold rounded copies (a copy of the model).

Each also takes over the activation of the feed-forward layer it starts (``fc1``: relu, gelu or
swish), so that no separate pass goes over the widest activation of a decoding step: oneDNN's
fp32 and bf16 products apply it to their result as they write it, and the bf16 layer then hands
its bf16 result straight to the next bf16 product; the int8 layer applies it in place.
"""

import copy
import functools
import logging
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch import nn
from torch.nn import functional

from transformer_mt.errors import MTError
from transformer_mt.model import Transformer
from transformer_mt.model.layers import ACTIVATIONS, FeedForward

logger = logging.getLogger(__name__)


QUANTIZATIONS = ("int8",)

_M = TypeVar("_M", bound=nn.Module)


def quantize(model: Transformer, scheme: str) -> Transformer:
    """A copy of the model with its linear layers in int8; the given model stays as it is.

    ``scheme`` ``int8`` uses :class:`Int8Linear` and runs on the CPU only. Embeddings stay in
    fp32; the output projection, tied to the target embedding in training, becomes an int8 copy.
    """
    if scheme not in QUANTIZATIONS:
        raise MTError(f"--quantize {scheme!r}: expected one of {', '.join(QUANTIZATIONS)}")
    if next(model.parameters()).device.type != "cpu":
        raise MTError("--quantize int8 runs on the CPU: drop --device or use --device cpu")
    return _converted(model, Int8Linear)


class Int8Linear(nn.Module):
    """A linear layer in int8: weights per output row, activations per input row.

    The weight is rounded once, symmetrically, with one scale per output feature. Each input row
    is rounded with its own scale (its largest magnitude), as CTranslate2's int8 does, so a row's
    result depends on that row alone (torch's ``quantize_dynamic`` takes one scale for the whole
    input, so the other sentences of a batch, or another user's request in ``mt serve``, moved a
    sentence's rounding). What is left of the batch is the padding: a longer sentence beside it
    pads the attention, which changes fp32 rounding there (~1e-6) and, through the next layer's
    int8 rounding of its rows, a score by up to ~3e-4 (measured; the texts stayed the same).

    The product is fbgemm's dynamic int8 linear (``quantized::linear_dynamic``, what
    ``quantize_dynamic`` calls), which takes its activation scale from the whole input: the rows
    go in divided by their own largest magnitude, with two rows of +1 and -1 appended, so that
    scale is the same fixed one in every call; the result is multiplied back row by row. torch
    marks its quantized tensors deprecated in favour of torchao, which is not a dependency here;
    those warnings are silenced.
    """

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight = linear.weight.detach().float()
        scales = (weight.abs().amax(dim=1) / 127).clamp_min(1e-12).double()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.qweight = torch.quantize_per_channel(
                weight, scales, torch.zeros_like(scales, dtype=torch.long), 0, torch.qint8
            )
        bias = linear.bias
        self.bias = None if bias is None else bias.detach().float().clone()
        self.activation: str | None = None  # a feed-forward activation applied to the result
        self._packed: Any = None  # fbgemm's packed weight, made on first use

    def __getstate__(self) -> dict[str, Any]:
        """Copies and pickles leave the packed weight out; they pack their own on first use."""
        return {**super().__getstate__(), "_packed": None}

    def extra_repr(self) -> str:
        return _describe(self, "int8")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._packed is None:
            self._packed = torch.ops.quantized.linear_prepack(self.qweight, None)
        rows = x.reshape(-1, self.in_features).float()
        n = rows.size(0)
        scale = rows.abs().amax(dim=1, keepdim=True).clamp_min_(1e-30)  # (n, 1)
        scaled = rows.new_empty((n + 2, self.in_features))
        torch.div(rows, scale, out=scaled[:n])
        scaled[n].fill_(1.0)  # the two fixed rows: the input's range is [-1, 1] in every call
        scaled[n + 1].fill_(-1.0)
        out = torch.ops.quantized.linear_dynamic(scaled, self._packed, True)[:n]
        out = out.mul_(scale) if self.bias is None else torch.addcmul(self.bias, out, scale)
        if self.activation is not None:
            out = _activate_in_place(out, self.activation)
        return out.view(*x.shape[:-1], self.out_features)


def _unpacked(packed: "PackedLinear") -> nn.Linear:
    """A plain ``nn.Linear`` with ``packed``'s parameters."""
    if packed.activation is not None:
        raise ValueError("unfuse the feed-forward activations first (_unfuse_activations)")
    plain = nn.Linear(packed.in_features, packed.out_features, device="meta")
    plain.weight, plain.bias = packed.weight, packed.bias
    return plain.train(packed.training)


class PackedLinear(nn.Linear):
    """``nn.Linear`` that multiplies on a copy of its weight packed once for oneDNN.

    Where it
    can: CPU fp32 inputs with autograd and autocast off (inference). Anything else, training
    included, takes ``nn.Linear``'s own path.

    Why: on this project's CPU (AMD EPYC, AVX-512), torch's fp32 ``F.linear`` goes to MKL's
    sgemm, which runs far below the core's speed; oneDNN's product on a prepacked weight, the one
    torch.compile's CPU freezing uses, computes the same fp32 product 2-3x faster at decoding's
    shapes (2 threads, 128 x 256 by 1,024: 492 -> 161 us; by 8,000: 3,169 -> 1,168 us;
    ``scripts/bench_decode.py`` shows it end to end). On this CPU a row's result does not depend
    on the rows beside it, as it may with MKL at small row counts.

    The parameters are the wrapped layer's own (a state dict and an export see no difference);
    the packed copy costs as much memory again as the weight. It is rebuilt when the weight is
    another tensor or was changed in place through autograd's view of it (``load_state_dict``,
    ``.to()``); a write through ``weight.data`` is not seen.
    """

    def __init__(self, linear: nn.Linear) -> None:
        nn.Module.__init__(self)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        self.train(linear.training)
        self.activation: str | None = None  # a feed-forward activation applied to the result
        # ((weight storage, weight version), packed weight), made on first use
        self._packed: tuple[tuple[int, int], torch.Tensor] | None = None

    def __getstate__(self) -> dict[str, Any]:
        """The state to copy or pickle: the packed weight left out.

        Copies and pickles leave the packed weight out (an opaque oneDNN tensor neither
        copies nor pickles); they pack their own on first use."""
        return {**super().__getstate__(), "_packed": None}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.weight
        if (
            x.dtype != torch.float32
            or x.device.type != "cpu"
            or weight.device.type != "cpu"
            or weight.dtype != torch.float32
            or torch.is_grad_enabled()
            or torch.is_autocast_enabled("cpu")
        ):
            out = super().forward(x)
            return out if self.activation is None else ACTIVATIONS[self.activation](out)
        key = weight.data_ptr(), weight._version
        packed = self._packed
        if packed is None or packed[0] != key:
            packed = self._packed = key, torch.ops.mkldnn._reorder_linear_weight(weight.detach())
        return _onednn_product(x, packed[1], self.bias, self.activation)

    def extra_repr(self) -> str:
        return _describe(self, "fp32 packed")


class Bf16Linear(nn.Module):
    """A linear layer whose product runs in bf16: the weight rounded to bf16 once, fp32 around it.

    It computes what autocast's bf16 linear computes: input, weight and bias rounded to bf16,
    products accumulated in fp32, the result rounded to bf16; that is returned in fp32, so
    everything around the products (layer norms, softmax, the search's scores) stays fp32.
    Unlike autocast the weight is not cast again on every call. With a feed-forward
    :attr:`activation` (the first layer of a feed-forward block) the result stays bf16, for the
    next layer, a bf16 product too, which would round it to bf16 anyway; oneDNN applies the
    activation before the rounding, elsewhere it is applied to the bf16 result, as autocast
    would. On a CPU the product runs on a copy of the weight packed once for
    oneDNN, as :class:`PackedLinear` packs fp32 (on this project's EPYC, AVX512-BF16: 1.2-1.9x
    faster than packed fp32 at decoding's shapes, one thread); elsewhere a plain bf16 product.
    """

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight.detach().to(torch.bfloat16)
        bias = linear.bias
        self.bias = None if bias is None else bias.detach().to(torch.bfloat16)
        self.activation: str | None = None  # a feed-forward activation applied to the result
        self._packed: Any = None  # oneDNN's packed copy of the weight, made on first use

    def __getstate__(self) -> dict[str, Any]:
        """Copies and pickles leave the packed weight out; they pack their own on first use."""
        return {**super().__getstate__(), "_packed": None}

    def extra_repr(self) -> str:
        return _describe(self, "bf16")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.to(torch.bfloat16)
        if self.weight.device.type == "cpu" and _onednn_linear_works(torch.bfloat16):
            if self._packed is None:
                self._packed = torch.ops.mkldnn._reorder_linear_weight(self.weight)
            out = _onednn_product(rows, self._packed, self.bias, self.activation)
        else:
            out = functional.linear(rows, self.weight, self.bias)
            if self.activation is not None:
                out = ACTIVATIONS[self.activation](out)
        return out if self.activation is not None else out.float()


def to_bf16(model: Transformer) -> Transformer:
    """A copy of the model with its linear layers as :class:`Bf16Linear` (products in bf16)."""
    return _converted(model, Bf16Linear)


def _converted(model: Transformer, make: Callable[[nn.Linear], nn.Module]) -> Transformer:
    """A copy of the model whose linear layers are ``make(layer)``; the model stays as it is.

    The copy's packed layers first go back to the ``nn.Linear`` they are (activations handed back
    to their blocks); the new layers then take the activations over again."""
    model = _replace_linears(_unfuse_activations(copy.deepcopy(model)), PackedLinear, _unpacked)
    return _fuse_activations(_replace_linears(model, nn.Linear, make))


def pack_linear_layers(model: nn.Module) -> nn.Module:
    """Turn ``model``'s ``nn.Linear`` layers into :class:`PackedLinear` where that helps.

    It helps for an fp32 model on a CPU whose torch has oneDNN, enabled; any other model is left as
    it is. Works in place and returns ``model``."""
    first = next(model.parameters(), None)
    if first is None or first.device.type != "cpu" or first.dtype != torch.float32:
        return model
    if not torch.backends.mkldnn.enabled or not _onednn_linear_works():
        return model
    return _fuse_activations(_replace_linears(model, nn.Linear, PackedLinear))


_FUSING = (PackedLinear, Bf16Linear, Int8Linear)  # the layers that apply an activation themselves


def _fuse_activations(model: _M) -> _M:
    """Hand each feed-forward block's activation to its first linear layer, in place.

    Where that layer is one of this module's (see the module docstring); the block itself then
    applies none. Its inner dropout sits after the activation, so the order is kept."""
    for block in model.modules():
        if isinstance(block, FeedForward) and isinstance(block.fc1, _FUSING):
            name = _activation_name(block.activation)
            if name is not None and block.fc1.activation is None:
                block.fc1.activation = name
                block.activation = _no_activation
    return model


def _unfuse_activations(model: _M) -> _M:
    """Give each feed-forward block its activation back from its first layer, in place."""
    for block in model.modules():
        fc1 = getattr(block, "fc1", None)
        if isinstance(block, FeedForward) and isinstance(fc1, _FUSING) and fc1.activation:
            block.activation = ACTIVATIONS[fc1.activation]
            fc1.activation = None
    return model


def _no_activation(x: torch.Tensor) -> torch.Tensor:
    """The activation of a feed-forward block whose first layer applies the real one."""
    return x


def _activation_name(fn: Callable[[torch.Tensor], torch.Tensor]) -> str | None:
    """The name in ACTIVATIONS of the function ``fn``; None when it is none of them."""
    return next((name for name, known in ACTIVATIONS.items() if known is fn), None)


# The model's activations as oneDNN's fused post-ops (attribute, algorithm): gelu is the exact
# (erf) one, as torch's default; swish is x * sigmoid(x).
_ONEDNN_POST_OPS = {"relu": ("relu", ""), "gelu": ("gelu", "none"), "swish": ("swish", "")}


def _onednn_product(
    x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, activation: str | None
) -> torch.Tensor:
    """oneDNN's product of ``x`` and a packed weight, plus ``bias``, then ``activation``.

    The activation is oneDNN's post-op where this torch build runs it right (checked once per
    dtype and activation), else a pass of its own."""
    if activation is not None and _onednn_post_op_works(x.dtype, activation):
        attr, algorithm = _ONEDNN_POST_OPS[activation]
        return torch.ops.mkldnn._linear_pointwise(x, packed, bias, attr, [], algorithm)
    out = torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
    return out if activation is None else _activate_in_place(out, activation)


@functools.cache
def _onednn_post_op_works(dtype: torch.dtype, activation: str) -> bool:
    """Whether oneDNN's packed product applies ``activation`` as torch's function does."""
    x, w, b = _probe_inputs(dtype)
    attr, algorithm = _ONEDNN_POST_OPS[activation]
    try:
        packed = torch.ops.mkldnn._reorder_linear_weight(w)
        y = torch.ops.mkldnn._linear_pointwise(x, packed, b, attr, [], algorithm)
    except (AttributeError, RuntimeError) as err:
        logger.info("%s runs as a pass of its own: oneDNN's post-op failed (%s)", activation, err)
        return False
    want = ACTIVATIONS[activation](functional.linear(x.float(), w.float(), b.float()))
    return torch.allclose(y.float(), want, atol=1e-5 if dtype == torch.float32 else 5e-2)


def _probe_inputs(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Small fixed inputs, weight and bias for the oneDNN probes, in ``dtype``.

    Fixed, so that no draw from the global generator that seeds training and sampling is taken."""
    x = torch.arange(15, dtype=torch.float32).view(3, 5).sin()
    w = torch.arange(20, dtype=torch.float32).view(4, 5).cos()
    b = torch.arange(4, dtype=torch.float32).sub(1.5)
    return x.to(dtype), w.to(dtype), b.to(dtype)


def _activate_in_place(x: torch.Tensor, name: str) -> torch.Tensor:
    """``ACTIVATIONS[name](x)``, written over ``x`` where torch can."""
    if name == "relu":
        return x.relu_()
    if name == "swish":
        return functional.silu(x, inplace=True)
    return ACTIVATIONS[name](x)


def _describe(layer: Any, kind: str) -> str:
    """The ``extra_repr`` of one of this module's layers."""
    fused = "" if layer.activation is None else f", then {layer.activation}"
    return f"in_features={layer.in_features}, out_features={layer.out_features}, {kind}{fused}"


def _replace_linears(model: _M, kind: type[nn.Linear], make: Callable[[Any], nn.Module]) -> _M:
    """Replace every child module of exactly type ``kind`` by ``make(child)``, in place."""
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if type(child) is kind:
                setattr(module, name, make(child))
    return model


@functools.cache
def _onednn_linear_works(dtype: torch.dtype = torch.float32) -> bool:
    """Whether this torch build runs oneDNN's packed linear product in ``dtype``, and right.

    Checked once per process and dtype. Builds without it (torch built without oneDNN, some
    non-x86 CPUs) lack the ops or raise in them; their linear layers stay unpacked, and the log
    says why. The probe's exceptions are its answers: a missing op raises AttributeError; a
    backend without the kernel, or oneDNN refusing the CPU, a RuntimeError (or a subclass)."""
    name = "fp32" if dtype == torch.float32 else "bf16"
    if not torch.backends.mkldnn.is_available():
        logger.info("%s linear layers run unpacked: this torch has no oneDNN", name)
        return False
    x, w, b = _probe_inputs(dtype)
    try:
        packed = torch.ops.mkldnn._reorder_linear_weight(w)
        y = torch.ops.mkldnn._linear_pointwise(x, packed, b, "none", [], "")
    except (AttributeError, RuntimeError) as err:
        logger.info("%s linear layers run unpacked: oneDNN's packed product failed (%s)", name, err)
        return False
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    want = functional.linear(x.float(), w.float(), b.float())
    if not torch.allclose(y.float(), want, atol=tolerance):
        logger.warning("%s linear layers run unpacked: oneDNN's packed product is wrong here", name)
        return False
    return True
