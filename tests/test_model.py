"""Model invariants: masks, causality, padding, shapes, options, cache = no cache."""

import pytest
import torch

from transformer_mt.model import Transformer, make_no_peek_mask, make_pad_mask, make_trg_mask


def test_pad_mask_marks_only_real_tokens():
    ids = torch.tensor([[5, 6, 0, 0], [7, 0, 0, 0]])
    mask = make_pad_mask(ids, pad_idx=0)
    assert mask.shape == (2, 1, 1, 4)
    assert mask.dtype == torch.bool
    assert mask[:, 0, 0].tolist() == [[True, True, False, False], [True, False, False, False]]


def test_no_peek_mask_is_lower_triangular():
    mask = make_no_peek_mask(4)[0, 0]
    for i in range(4):
        for j in range(4):
            assert bool(mask[i, j]) == (j <= i)


def test_trg_mask_combines_causality_and_padding():
    mask = make_trg_mask(torch.tensor([[2, 8, 0]]), pad_idx=0)[0, 0]
    assert mask.tolist() == [[True, False, False], [True, True, False], [True, True, False]]


def _model(args, **kw) -> Transformer:
    torch.manual_seed(0)
    return Transformer(**{**args, **kw}).eval()


@pytest.mark.parametrize("pre_norm", [False, True])
def test_forward_shapes(tiny_model_args, pre_norm):
    model = _model(tiny_model_args, pre_norm=pre_norm, dec_voc_size=50, tie_embeddings=True)
    logits = model(torch.randint(4, 40, (3, 7)), torch.randint(4, 50, (3, 5)))
    assert logits.shape == (3, 5, 50)
    memory, src_mask = model.encode(torch.randint(4, 40, (3, 7)))
    assert memory.shape == (3, 7, 32) and src_mask.shape == (3, 1, 1, 7)


@pytest.mark.parametrize("pre_norm", [False, True])
def test_changing_a_future_token_leaves_earlier_logits_unchanged(tiny_model_args, pre_norm):
    model = _model(tiny_model_args, pre_norm=pre_norm)
    src = torch.randint(4, 40, (2, 6))
    trg = torch.randint(4, 40, (2, 8))
    base = model(src, trg)
    for t in range(1, 8):
        changed = trg.clone()
        changed[:, t] = (changed[:, t] + 7) % 36 + 4
        out = model(src, changed)
        assert torch.equal(out[:, :t], base[:, :t]), f"position < {t} saw token {t}"
        assert not torch.allclose(out[:, t], base[:, t]), "the changed token itself must matter"


def test_padded_batch_equals_each_sentence_alone(tiny_model_args):
    model = _model(tiny_model_args)
    srcs = [torch.randint(4, 40, (n,)) for n in (3, 7, 5)]
    trgs = [torch.randint(4, 40, (n,)) for n in (6, 2, 4)]
    src = torch.nn.utils.rnn.pad_sequence(srcs, batch_first=True, padding_value=0)
    trg = torch.nn.utils.rnn.pad_sequence(trgs, batch_first=True, padding_value=0)
    batched = model(src, trg)
    for i, (s, t) in enumerate(zip(srcs, trgs, strict=True)):
        alone = model(s[None], t[None])[0]
        torch.testing.assert_close(batched[i, : len(t)], alone, atol=1e-5, rtol=0)


def test_tied_and_shared_embeddings_are_one_tensor(tiny_model_args):
    model = _model(tiny_model_args, tie_embeddings=True, share_embeddings=True)
    assert model.out.weight is model.trg_emb.weight is model.src_emb.weight
    untied = _model(tiny_model_args, tie_embeddings=False)
    assert untied.out.weight is not untied.trg_emb.weight
    with pytest.raises(ValueError, match="joint"):
        Transformer(**{**tiny_model_args, "dec_voc_size": 41}, share_embeddings=True)


def test_incremental_decoding_matches_full_prefix(tiny_model_args):
    model = _model(tiny_model_args)
    src = torch.randint(4, 40, (2, 6))
    trg = torch.randint(4, 40, (2, 7))
    full = model(src, trg)
    memory, src_mask = model.encode(src)
    cache = model.new_cache()
    steps = [model.decode(trg[:, t : t + 1], memory, src_mask, cache) for t in range(7)]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=0)


def test_too_long_input_is_an_error(tiny_model_args):
    model = _model(tiny_model_args)
    with pytest.raises(ValueError, match="max_len"):
        model(torch.randint(4, 40, (1, 65)), torch.randint(4, 40, (1, 3)))


def test_tiny_model_overfits_a_handful_of_pairs(tiny_model_args):
    torch.manual_seed(0)
    model = Transformer(**{**tiny_model_args, "drop_prob": 0.0})
    src = torch.randint(4, 40, (6, 5))
    trg = torch.cat([torch.full((6, 1), 2), torch.randint(4, 40, (6, 6))], 1)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(300):
        logits = model(src, trg[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 40), trg[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.02
    assert torch.equal(model.eval()(src, trg[:, :-1]).argmax(-1), trg[:, 1:])


def test_bf16_attention_on_cpu_runs_in_fp32_under_autocast():
    # Under CPU autocast, bf16 queries/keys/values are attended in fp32 (the bf16 kernel's backward
    # is slow): the result equals fp32 attention on the same rounded inputs, up to the final
    # rounding to bf16, and gradients come back in bf16.
    import torch.nn.functional as F

    from transformer_mt.model.layers import _sdpa

    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 5, 8).bfloat16().requires_grad_() for _ in range(3))
    mask = torch.tensor([True, True, True, False, False])[None, None, None, :].expand(2, 1, 1, 5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = _sdpa(q, k, v, mask, 0.0)
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask)
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y, ref.bfloat16(), rtol=0, atol=0)
    y.float().sum().backward()
    assert q.grad.dtype == torch.bfloat16 and torch.isfinite(q.grad.float()).all()
