"""CPU fp32 inference on oneDNN-packed weights (engines/loading.py, PackedLinear): the same
products as nn.Linear, batch-independent rows, the same translations, and every other path
(training, autocast, int8, copies) left as it was; the feed-forward activation applied by the
block's first layer, in each kind of layer, computes what the block computed."""

import copy
import dataclasses
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn import functional

from transformer_mt.engines import load_for_inference, translate_lines
from transformer_mt.engines.linear_layers import _unfuse_activations, pack_linear_layers, to_bf16
from transformer_mt.engines.loading import (
    Int8Linear,
    PackedLinear,
    _onednn_linear_works,
    quantize,
)
from transformer_mt.model.layers import ACTIVATIONS, FeedForward

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "old_checkpoint"

needs_onednn = pytest.mark.skipif(
    not _onednn_linear_works(), reason="this torch build has no oneDNN linear product"
)


@needs_onednn
@pytest.mark.parametrize("bias", [True, False])
def test_packed_linear_computes_nn_linear_and_a_row_ignores_its_neighbours(bias):
    torch.manual_seed(0)
    plain = nn.Linear(256, 1024, bias=bias)
    packed = PackedLinear(plain)
    x = torch.randn(128, 256)
    with torch.inference_mode():
        out = packed(x)
        torch.testing.assert_close(out, plain(x), rtol=1e-5, atol=1e-4)
        if torch.backends.cpu.get_cpu_capability() == "AVX512":  # what the docstring claims
            for rows in (1, 3, 17, 64):  # the same bits, whatever batch a row sits in
                assert torch.equal(packed(x[:rows].clone()), out[:rows])
        x3 = torch.randn(4, 7, 256)  # (B, T, D) and a transposed (non-contiguous) input
        torch.testing.assert_close(packed(x3), plain(x3), rtol=1e-5, atol=1e-4)
        xt = torch.randn(256, 9).t()
        torch.testing.assert_close(packed(xt), plain(xt), rtol=1e-5, atol=1e-4)
        assert packed._packed is not None, "the packed path ran"


@needs_onednn
def test_training_and_autocast_take_nn_linear_and_the_packed_copy_follows_the_weight():
    torch.manual_seed(0)
    packed = PackedLinear(nn.Linear(16, 8))
    x = torch.randn(5, 16)
    y = packed(x)  # grad enabled: nn.Linear's own product, differentiable
    assert y.grad_fn is not None and torch.equal(
        y, functional.linear(x, packed.weight, packed.bias)
    )
    assert packed._packed is None
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert packed(x).dtype == torch.bfloat16
    with torch.no_grad():
        before = packed(x)
        packed.load_state_dict({"weight": 2 * packed.weight, "bias": 2 * packed.bias})
        torch.testing.assert_close(packed(x), 2 * before)  # repacked after the in-place copy
        packed.double().float()  # another tensor with the same version count: repacked
        torch.testing.assert_close(packed(x), 2 * before)
        packed.weight.data = torch.zeros_like(packed.weight)  # a new tensor, same version
        assert torch.equal(packed(x), packed.bias.expand(5, 8))
    clone = copy.deepcopy(packed)  # the opaque packed tensor is left out, and rebuilt
    assert clone._packed is None
    with torch.no_grad():
        torch.testing.assert_close(clone(x), packed(x))


@needs_onednn
def test_loading_packs_an_fp32_cpu_model_and_it_translates_as_before():
    ckpt = FIXTURE / "old_last.pt"
    packed, plain = load_for_inference(ckpt), load_for_inference(ckpt, pack=False)
    linears = [m for m in packed.model.modules() if isinstance(m, nn.Linear)]
    assert linears and all(type(m) is PackedLinear for m in linears)
    assert not any(isinstance(m, PackedLinear) for m in plain.model.modules())
    assert packed.model.out.weight is packed.model.trg_emb.weight, "still tied"
    state, plain_state = packed.model.state_dict(), plain.model.state_dict()
    assert list(state) == list(plain_state)
    assert all(torch.equal(state[k], plain_state[k]) for k in state)
    lines = (FIXTURE / "src.txt").read_text(encoding="utf-8").splitlines()
    decode = dataclasses.replace(packed.config.decode, beam_size=4, nbest=2)
    got = translate_lines(packed.model, packed.src_tok, packed.trg_tok, lines, decode)
    want = translate_lines(plain.model, plain.src_tok, plain.trg_tok, lines, decode)
    assert [[text for text, _ in t] for t in got] == [[text for text, _ in t] for t in want]
    for t, w in zip(got, want, strict=True):
        assert [s for _, s in t] == pytest.approx([s for _, s in w], abs=1e-4)


@needs_onednn
def test_int8_quantizes_the_packed_layers_and_leaves_the_fp32_model_packed():
    loaded = load_for_inference(FIXTURE / "old_last.pt")
    quantized = quantize(loaded.model, "int8")
    assert not any(isinstance(m, nn.Linear) for m in quantized.modules())
    assert sum(isinstance(m, Int8Linear) for m in quantized.modules()) == sum(
        isinstance(m, PackedLinear) for m in loaded.model.modules()
    )
    assert type(loaded.model.out) is PackedLinear, "the fp32 model is not touched"
    direct = load_for_inference(FIXTURE / "old_last.pt", quantization="int8")
    assert not any(isinstance(m, nn.Linear) for m in direct.model.modules())
    assert isinstance(direct.model.out, Int8Linear)


@pytest.mark.parametrize("failure", [RuntimeError, NotImplementedError, AttributeError])
def test_a_torch_without_the_packed_product_keeps_nn_linear_and_says_why(
    monkeypatch, caplog, failure
):
    """Each way a build without the product answers the probe: oneDNN refusing the CPU, no
    kernel for the backend, the op missing."""
    probe = _onednn_linear_works.__wrapped__  # uncached: the process's answer stays as it is

    def broken(*args):
        raise failure("no oneDNN kernel for this CPU")

    monkeypatch.setattr(torch.ops.mkldnn, "_reorder_linear_weight", broken)
    with caplog.at_level("INFO", logger="transformer_mt"):
        assert probe() is False
    assert "run unpacked" in caplog.text and "no oneDNN kernel" in caplog.text
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    assert probe() is False


@needs_onednn
@pytest.mark.parametrize("activation", ["relu", "gelu", "swish"])
def test_each_linear_kind_applies_its_feed_forward_blocks_activation_and_computes_the_same(
    activation,
):
    """pack_linear_layers, to_bf16 and quantize move the activation into the block's first layer
    (one pass fewer); the block computes what it computed with the activation of its own."""
    torch.manual_seed(0)
    block = FeedForward(32, 128, drop_prob=0.1, activation=activation).eval()
    x = torch.randn(2, 9, 32)
    packed = pack_linear_layers(copy.deepcopy(block))
    assert packed.fc1.activation == activation and packed.fc2.activation is None
    assert packed.activation is not block.activation, "the block applies none itself"
    bf16 = to_bf16(packed)  # from the packed (fused) block: unfused, copied, fused again
    assert bf16.fc1.activation == activation and packed.fc1.activation == activation
    int8 = quantize(packed, "int8")
    unfused = _unfuse_activations(quantize(packed, "int8"))  # the same rounding, unfused
    assert int8.fc1.activation == activation and unfused.fc1.activation is None
    assert unfused.activation is block.activation
    with torch.inference_mode():
        want = block(x)
        torch.testing.assert_close(packed(x), want, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(bf16(x), want, rtol=0.05, atol=0.02)  # bf16 rounding
        assert torch.equal(int8(x), unfused(x)), "in place, the same bits"
    y = packed(x)  # grad enabled: nn.Linear's own product, then the activation
    assert y.grad_fn is not None
    torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-5)


@needs_onednn
def test_a_loaded_model_runs_fused_blocks_and_an_unpacked_one_its_own():
    loaded = load_for_inference(FIXTURE / "old_last.pt")
    blocks = [m for m in loaded.model.modules() if isinstance(m, FeedForward)]
    assert blocks and all(b.fc1.activation == loaded.model.activation for b in blocks)
    plain = load_for_inference(FIXTURE / "old_last.pt", pack=False)
    own = ACTIVATIONS[plain.model.activation]
    assert all(b.activation is own for b in plain.model.modules() if isinstance(b, FeedForward))


@needs_onednn
def test_a_training_block_keeps_dropout_after_the_activation_its_first_layer_applies():
    torch.manual_seed(0)
    block = FeedForward(32, 128, drop_prob=0.5, activation="relu")
    packed = pack_linear_layers(copy.deepcopy(block))
    assert packed.fc1.activation == "relu"
    x = torch.randn(4, 32)
    torch.manual_seed(1)
    want = block(x)  # training: dropout on, grad on
    torch.manual_seed(1)
    got = packed(x)
    assert torch.equal(got, want), "the same product, activation and dropout mask"
    with torch.no_grad():
        assert not torch.allclose(want, block.eval()(x)), "dropout ran"


@needs_onednn
def test_without_onednns_post_op_the_activation_is_a_pass_of_its_own(monkeypatch):
    import transformer_mt.engines.linear_layers as layers

    torch.manual_seed(0)
    block = FeedForward(32, 128, drop_prob=0.0, activation="gelu").eval()
    packed, x = pack_linear_layers(copy.deepcopy(block)), torch.randn(5, 32)
    monkeypatch.setattr(layers, "_onednn_post_op_works", lambda dtype, name: False)
    with torch.inference_mode():
        torch.testing.assert_close(packed(x), block(x), rtol=1e-5, atol=1e-5)
