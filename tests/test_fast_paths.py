"""The training fast paths against their plain references: the cheaper CPU dropout mask
(model/dropout.py), the explicit bf16 attention (layers._explicit_attention) and the fused loss's
log-sum-exp fallback (training/loss.py)."""

import pytest
import torch
from torch.nn import functional

from transformer_mt.model.dropout import Dropout, dropout, dropout_add, keep_mask
from transformer_mt.model.layers import _explicit_attention
from transformer_mt.training.loss import label_smoothed_nll, linear_label_smoothed_nll


def test_keep_mask_rate_is_p_rounded_to_a_multiple_of_2_to_the_minus_16():
    torch.manual_seed(0)
    dropped = round(0.3 * 65536)
    mask = keep_mask(torch.Size([1000, 1001]), dropped)  # an odd count: the last word is cut
    assert mask.dtype == torch.bool and mask.shape == (1000, 1001)
    # 1e6 Bernoulli draws: the standard deviation of the rate is 4.6e-4
    assert mask.float().mean().item() == pytest.approx(1 - dropped / 65536, abs=2.5e-3)


def test_dropout_is_unbiased_and_its_gradient_uses_the_same_mask():
    torch.manual_seed(0)
    x = torch.randn(300, 400, requires_grad=True)
    y = dropout(x, 0.3)
    kept = y != 0
    scale = 65536 / (65536 - round(0.3 * 65536))
    torch.testing.assert_close(y[kept], x[kept] * scale)
    (y * 2).sum().backward()
    torch.testing.assert_close(x.grad, kept.float() * 2 * scale)
    torch.manual_seed(1)
    ones = torch.ones(2000, 1000)
    assert dropout(ones, 0.1).mean().item() == pytest.approx(1.0, abs=3e-3)


def test_dropout_follows_the_default_generator_and_keeps_dtype():
    x = torch.randn(64, 32, dtype=torch.bfloat16)
    torch.manual_seed(5)
    a = dropout(x, 0.3)
    torch.manual_seed(5)
    b = dropout(x, 0.3)
    assert torch.equal(a, b) and a.dtype == torch.bfloat16
    assert not torch.equal(a, dropout(x, 0.3)), "the generator moved on"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dropout_applies_keep_mask_with_the_exact_scale_forward_and_backward(dtype):
    dropped = round(0.1 * 65536)
    scale = 65536 / (65536 - dropped)
    x = torch.randn(37, 53).to(dtype).requires_grad_()
    grad = torch.randn(37, 53).to(dtype)
    torch.manual_seed(3)
    y = dropout(x, 0.1)
    torch.manual_seed(3)
    mask = keep_mask(x.shape, dropped).to(dtype)  # the same draws
    y.backward(grad)
    assert y.dtype == dtype and x.grad.dtype == dtype
    # bf16: the scale is a separate product (1 / 0.9 is no bf16 number), rounded once
    torch.testing.assert_close(y, (x.detach() * mask * scale).to(dtype), rtol=0, atol=0)
    torch.testing.assert_close(x.grad, (grad * mask * scale).to(dtype), rtol=0, atol=0)


def test_dropout_add_is_x_plus_dropout_y_in_one_fp32_pass():
    dropped = round(0.3 * 65536)
    scale = 65536 / (65536 - dropped)
    x = torch.randn(6, 7, 16, requires_grad=True)  # the fp32 residual stream under autocast
    y = torch.randn(6, 7, 16).bfloat16().requires_grad_()  # a bf16 sublayer output
    grad = torch.randn(6, 7, 16)
    torch.manual_seed(4)
    out = dropout_add(x, y, 0.3)
    torch.manual_seed(4)
    mask = keep_mask(y.shape, dropped).float()
    out.backward(grad)
    assert out.dtype == torch.float32 and y.grad.dtype == torch.bfloat16
    torch.testing.assert_close(out, x.detach() + y.detach().float() * (mask * scale))
    torch.testing.assert_close(x.grad, grad, rtol=0, atol=0)
    torch.testing.assert_close(y.grad, (grad * mask * scale).bfloat16())
    # and what it stands for: the same sum as x + dropout(y) (bf16 rounds y * scale first)
    torch.manual_seed(4)
    plain = x.detach() + dropout(y.detach(), 0.3)
    torch.testing.assert_close(out.detach(), plain, rtol=1e-2, atol=1e-2)
    assert torch.equal(dropout_add(x, y, 0.3, training=False), x + y)
    assert torch.equal(dropout_add(x, y, 0.0), x + y)


def test_dropout_add_gradients_in_fp64_are_those_of_its_formula():
    # The fp32/fp64 path (fp32 CPU training): both inputs full precision, the same mask for every
    # evaluation (the generator is reseeded), so gradcheck compares analytic and numeric slopes.
    x = torch.randn(5, 6, dtype=torch.float64, requires_grad=True)
    y = torch.randn(5, 6, dtype=torch.float64, requires_grad=True)

    def reseeded(a, b):
        torch.manual_seed(7)
        return dropout_add(a, b, 0.4)

    assert torch.autograd.gradcheck(reseeded, (x, y))
    torch.manual_seed(7)
    mask = keep_mask(y.shape, round(0.4 * 65536)).double()
    scale = 65536 / (65536 - round(0.4 * 65536))
    torch.testing.assert_close(reseeded(x, y), x + y * mask * scale)


def test_dropout_off_cases_and_module():
    x = torch.randn(8, 8)
    assert dropout(x, 0.3, training=False) is x
    assert dropout(x, 0.0) is x
    assert (dropout(x, 1.0) == 0).all()
    module = Dropout(0.3)
    assert isinstance(module, torch.nn.Dropout) and module.p == 0.3
    assert torch.equal(module.eval()(x), x)
    assert list(module.state_dict()) == []


@pytest.mark.parametrize("masked", ["pad", "causal", "none", "blind"])
def test_explicit_attention_equals_sdpa_in_fp32_and_close_in_bf16(masked):
    """With "blind", a sentence with no key to attend to (all padding): zeros from both."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(3, 4, 6, 8, dtype=torch.float64) for _ in range(3))
    lengths = torch.tensor([6, 4, 0 if masked == "blind" else 1])
    mask = (torch.arange(6)[None] < lengths[:, None])[:, None, None, :]  # (3, 1, 1, 6)
    if masked == "causal":
        mask = mask & torch.ones(6, 6, dtype=torch.bool).tril()
    m = None if masked == "none" else mask
    ref = functional.scaled_dot_product_attention(q, k, v, attn_mask=m)
    if masked == "blind":
        assert ref[2].abs().sum() == 0, "the fused kernel gives a blind query zeros"
    torch.testing.assert_close(_explicit_attention(q, k, v, m, 0.0)[0], ref)
    low = _explicit_attention(*(t.bfloat16() for t in (q, k, v)), m, 0.0)[0]
    assert low.dtype == torch.bfloat16
    torch.testing.assert_close(low.double(), ref, rtol=0, atol=0.05)


def test_fused_loss_where_the_target_probability_underflows():
    # A target logit 200 below the row's maximum: softmax gives p_y = 0 in fp32, so the loss
    # takes the log-sum-exp from torch's logsumexp for that row; loss and gradients still equal
    # the unfused pair.
    torch.manual_seed(0)
    hidden = torch.randn(5, 4, dtype=torch.float32)
    weight = torch.randn(7, 4, dtype=torch.float32)
    hidden[2] = torch.tensor([50.0, 0.0, 0.0, 0.0])
    weight[:, 0] = torch.tensor([0.0, 4.0, 0.0, 0.0, 0.0, 0.0, 0.0])  # class 1 far ahead in row 2
    target = torch.tensor([3, 5, 3, 0, 6])  # row 2's target (3) scores 200 below class 1
    h = hidden.clone().requires_grad_()
    w = weight.clone().requires_grad_()
    ours, nll = linear_label_smoothed_nll(h, w, target, pad_idx=0, epsilon=0.1)
    assert torch.isfinite(ours)
    h2 = hidden.clone().requires_grad_()
    w2 = weight.clone().requires_grad_()
    ref, ref_nll = label_smoothed_nll(h2 @ w2.T, target, pad_idx=0, epsilon=0.1)
    assert ours.item() == pytest.approx(ref.item(), rel=1e-5)
    assert nll.item() == pytest.approx(ref_nll.item(), rel=1e-5)
    ours.backward()
    ref.backward()
    torch.testing.assert_close(h.grad, h2.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(w.grad, w2.grad, rtol=1e-4, atol=1e-5)
