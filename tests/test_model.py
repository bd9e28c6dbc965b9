"""Model invariants: masks, causality, padding, shapes, options, cache = no cache; attention
weights; the parameter order and the loading of checkpoints written under older module names."""

import re

import pytest
import torch

from transformer_mt.config import ModelConfig
from transformer_mt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from transformer_mt.model import (
    Transformer,
    make_no_peek_mask,
    make_pad_mask,
    make_trg_mask,
    model_args,
    upgrade_state_dict,
)
from transformer_mt.model.layers import _explicit_is_faster


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


def test_bf16_attention_on_cpu_under_autocast():
    # Under CPU autocast, bf16 queries/keys/values that need gradients (training) are attended
    # explicitly: bf16 products, softmax in fp32. That is fp32 attention up to bf16 rounding of the
    # scores, the weights and the output; gradients come back in bf16. Without gradients, long
    # query blocks are attended by the fused kernel in fp32: exactly fp32 attention on the same
    # rounded inputs, up to the final rounding to bf16.
    from torch.nn import functional

    from transformer_mt.model.layers import _attention

    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 5, 8).bfloat16().requires_grad_() for _ in range(3))
    mask = torch.tensor([True, True, True, False, False])[None, None, None, :].expand(2, 1, 1, 5)
    causal = mask & torch.ones(5, 5, dtype=torch.bool).tril()  # (2, 1, 5, 5)
    for m in (mask, causal, None):
        ref = functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=m)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = _attention(q, k, v, m, 0.0)
        assert y.dtype == torch.bfloat16
        torch.testing.assert_close(y.float(), ref, rtol=0, atol=0.03)
        grads = torch.autograd.grad(y.float().sum(), (q, k, v))
        refs = torch.autograd.grad(ref.sum(), (q, k, v))
        for g, g_ref in zip(grads, refs, strict=True):
            assert g.dtype == torch.bfloat16
            torch.testing.assert_close(g.float(), g_ref.float(), rtol=0.02, atol=0.05)
    long_q, long_k = (torch.randn(2, 4, 65, 8).bfloat16() for _ in range(2))  # > 64 queries
    ref = functional.scaled_dot_product_attention(long_q.float(), long_k.float(), long_k.float())
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        y = _attention(long_q, long_k, long_k, None, 0.0)
    torch.testing.assert_close(y, ref.bfloat16(), rtol=0, atol=0)


def test_cross_attention_weights(tiny_model_args):
    model = _model(tiny_model_args)
    src = torch.tensor([[9, 12, 7, EOS_ID], [15, EOS_ID, PAD_ID, PAD_ID]])
    trg = torch.tensor([[BOS_ID, 20, 21, 22, 23], [BOS_ID, 30, 31, PAD_ID, PAD_ID]])
    with torch.inference_mode():
        memory, src_mask = model.encode(src)
        fused = model.decode(trg, memory, src_mask)
        weights = model.cross_attention(src, trg)  # (L, B, H, T, S)
        assert weights.shape == (2, 2, 4, 5, 4)
        assert torch.allclose(weights.sum(-1), torch.ones(2, 2, 4, 5))
        assert (weights[:, 1, :, :, 2:] == 0).all()  # padded source positions get nothing
        # The explicit path that returns the weights computes what the fused one does.
        explicit, again = model.decode_with_attention(trg, memory, src_mask)
        assert torch.equal(again, weights)
        # Asking for weights leaves no state behind: decoding stays on the fused SDPA path.
        assert torch.equal(model.decode(trg, memory, src_mask), fused)
    assert torch.allclose(fused, explicit, atol=1e-5)


def test_attention_explicit_path_equals_fused_path(tiny_model_args):
    """Self- and cross-attention: ``need_weights=True`` returns weights whose rows sum to 1 and
    the output of the fused kernel (which runs where autograd is on); inference on CPU takes the
    explicit path for short queries, without returning the weights."""
    model = _model(tiny_model_args)
    x = torch.randn(2, 5, 32)
    memory = torch.randn(2, 4, 32)
    trg_mask = make_trg_mask(torch.tensor([[2, 5, 6, 7, 8], [2, 5, 6, 0, 0]]), pad_idx=0)
    src_mask = make_pad_mask(torch.tensor([[5, 6, 7, 3], [5, 3, 0, 0]]), pad_idx=0)
    layer = model.decoder[0]
    for attn, mask, mem in (
        (layer.self_attn, trg_mask, None),
        (layer.cross_attn, src_mask, memory),
    ):
        assert _explicit_is_faster(x.view(2, 1, 5, 32)) is False  # autograd on: fused kernel
        fused, no_weights = attn(x, mask, mem)
        fused = fused.detach()
        with torch.inference_mode():
            assert _explicit_is_faster(x.view(2, 1, 5, 32)) is True
            assert _explicit_is_faster(torch.zeros(1, 1, 65, 8)) is False  # a long query block
            inference, no_weights_either = attn(x, mask, mem)
            explicit, weights = attn(x, mask, mem, need_weights=True)
            assert no_weights is None and no_weights_either is None
            torch.testing.assert_close(inference, explicit, atol=0, rtol=0)
            assert weights.shape == (2, 4, 5, mask.size(-1))
            assert torch.allclose(weights.sum(-1), torch.ones(2, 4, 5))
            assert (weights.masked_select(~mask.expand_as(weights)) == 0).all()
            torch.testing.assert_close(explicit, fused, atol=1e-5, rtol=0)


def test_decoder_cache_select_and_reorder_beams(tiny_model_args):
    model = _model(tiny_model_args)
    memory, src_mask = model.encode(torch.randint(4, 40, (3, 6)))
    cache = model.new_cache()
    for token in (2, 9, 11):
        model.decode(torch.full((3, 1), token), memory, src_mask, cache)
    assert cache.length == 3
    self_keys = [c.keys for c in cache.self_attn]
    cross_keys = [c.keys for c in cache.cross_attn]
    assert self_keys[0].shape == (3, 4, 3, 8) and cross_keys[0].shape == (3, 4, 6, 8)
    order, keep = torch.tensor([2, 0, 1]), torch.tensor([1])
    cache.reorder_beams(order)  # self-attention only: cross-attention is shared by the beams
    for layer in range(2):
        assert torch.equal(cache.self_attn[layer].keys, self_keys[layer][order])
        assert cache.cross_attn[layer].keys is cross_keys[layer]
    cache.select(keep)  # both parts
    for layer in range(2):
        assert torch.equal(cache.self_attn[layer].keys, self_keys[layer][order][keep])
        assert torch.equal(cache.cross_attn[layer].keys, cross_keys[layer][keep])
    assert all(c.values.size(0) == 1 for c in (*cache.self_attn, *cache.cross_attn))


def test_beam_rows_share_one_memory_row(tiny_model_args):
    """K consecutive target rows reading one memory row each give what K copies of the memory
    give: fused and explicit attention, with and without a cache; uneven sharing is an error."""
    model, k = _model(tiny_model_args), 3
    src = torch.tensor([[9, 12, 7, EOS_ID], [15, EOS_ID, PAD_ID, PAD_ID]])
    trg = torch.randint(4, 40, (2 * k, 5))
    with torch.inference_mode():
        memory, src_mask = model.encode(src)  # (2, S, D)
        copies = memory.repeat_interleave(k, 0), src_mask.repeat_interleave(k, 0)
        torch.testing.assert_close(
            model.decode(trg, memory, src_mask), model.decode(trg, *copies), atol=1e-5, rtol=0
        )
        shared_logits, shared_weights = model.decode_with_attention(trg, memory, src_mask)
        copied_logits, copied_weights = model.decode_with_attention(trg, *copies)
        assert shared_weights.shape == copied_weights.shape == (2, 2 * k, 4, 5, 4)
        torch.testing.assert_close(shared_weights, copied_weights, atol=1e-6, rtol=0)
        torch.testing.assert_close(shared_logits, copied_logits, atol=1e-5, rtol=0)
        shared_cache, copied_cache = model.new_cache(), model.new_cache()
        for t in range(trg.size(1)):
            step = trg[:, t : t + 1]
            shared = model.decode(step, memory, src_mask, shared_cache)
            copied = model.decode(step, *copies, copied_cache)
            torch.testing.assert_close(shared, copied, atol=1e-5, rtol=0)
        assert shared_cache.cross_attn[0].keys.size(0) == 2  # once per sentence, not per beam
        with pytest.raises(ValueError, match="5 query rows cannot share 2 memory rows"):
            model.decode(trg[:5], memory, src_mask)


def test_decoder_cache_select_with_memory_index(tiny_model_args):
    """Dropping a sentence of 2 beams: self-attention keeps its beam rows, cross-attention the
    sentence's one row."""
    model = _model(tiny_model_args)
    memory, src_mask = model.encode(torch.randint(4, 40, (2, 6)))
    cache = model.new_cache()
    model.decode(torch.full((4, 1), BOS_ID), memory, src_mask, cache)  # 2 sentences x 2 beams
    self_keys, cross_keys = cache.self_attn[0].keys, cache.cross_attn[0].keys
    self_values = cache.self_attn[1].values
    rows, sentences = torch.tensor([3, 2]), torch.tensor([1])  # sentence 1, its beams swapped
    cache.select(rows, sentences)
    assert torch.equal(cache.self_attn[0].keys, self_keys[rows])
    assert torch.equal(cache.cross_attn[0].keys, cross_keys[sentences])
    cache.repeat_rows(3)  # 3 beams per row: self-attention copied, cross-attention kept
    assert torch.equal(cache.self_attn[1].values[3:], self_values[[2, 2, 2]])
    assert torch.equal(cache.cross_attn[0].keys, cross_keys[sentences])


# The parameters of one layer in the order ``model.parameters()`` yields them: old checkpoints
# index their Adam moments by this position, so it must never change (d_model 32, ffn 64).
ENCODER_LAYER = [
    ("self_attn.qkv_proj.weight", (96, 32)), ("self_attn.qkv_proj.bias", (96,)),
    ("self_attn.out_proj.weight", (32, 32)), ("self_attn.out_proj.bias", (32,)),
    ("ffn.fc1.weight", (64, 32)), ("ffn.fc1.bias", (64,)),
    ("ffn.fc2.weight", (32, 64)), ("ffn.fc2.bias", (32,)),
    ("self_attn_residual.norm.weight", (32,)), ("self_attn_residual.norm.bias", (32,)),
    ("ffn_residual.norm.weight", (32,)), ("ffn_residual.norm.bias", (32,)),
]  # fmt: skip
DECODER_LAYER = [
    ("self_attn.qkv_proj.weight", (96, 32)), ("self_attn.qkv_proj.bias", (96,)),
    ("self_attn.out_proj.weight", (32, 32)), ("self_attn.out_proj.bias", (32,)),
    ("cross_attn.q_proj.weight", (32, 32)), ("cross_attn.q_proj.bias", (32,)),
    ("cross_attn.kv_proj.weight", (64, 32)), ("cross_attn.kv_proj.bias", (64,)),
    ("cross_attn.out_proj.weight", (32, 32)), ("cross_attn.out_proj.bias", (32,)),
    ("ffn.fc1.weight", (64, 32)), ("ffn.fc1.bias", (64,)),
    ("ffn.fc2.weight", (32, 64)), ("ffn.fc2.bias", (32,)),
    ("self_attn_residual.norm.weight", (32,)), ("self_attn_residual.norm.bias", (32,)),
    ("cross_attn_residual.norm.weight", (32,)), ("cross_attn_residual.norm.bias", (32,)),
    ("ffn_residual.norm.weight", (32,)), ("ffn_residual.norm.bias", (32,)),
]  # fmt: skip


@pytest.mark.parametrize("pre_norm", [False, True])
def test_parameter_order_is_pinned(tiny_model_args, pre_norm):
    model = _model(tiny_model_args, pre_norm=pre_norm, tie_embeddings=False)
    want = [("src_emb.weight", (40, 32)), ("trg_emb.weight", (40, 32))]
    for stack, layer in (("encoder", ENCODER_LAYER), ("decoder", DECODER_LAYER)):
        want += [(f"{stack}.{i}.{name}", shape) for i in range(2) for name, shape in layer]
    if pre_norm:
        want += [
            (f"{norm}.{p}", (32,)) for norm in ("enc_norm", "dec_norm") for p in ("weight", "bias")
        ]
    want.append(("out.weight", (40, 32)))
    assert [(name, tuple(p.shape)) for name, p in model.named_parameters()] == want


# The module names of checkpoints written before the residual blocks were named by what they wrap.
OLD_NAMES = [
    (r"^encoder\.(\d+)\.self_attn\.", r"encoder.\1.attn."),
    (r"^encoder\.(\d+)\.self_attn_residual\.", r"encoder.\1.sub1."),
    (r"^encoder\.(\d+)\.ffn_residual\.", r"encoder.\1.sub2."),
    (r"^decoder\.(\d+)\.self_attn_residual\.", r"decoder.\1.sub1."),
    (r"^decoder\.(\d+)\.cross_attn_residual\.", r"decoder.\1.sub2."),
    (r"^decoder\.(\d+)\.ffn_residual\.", r"decoder.\1.sub3."),
]


def _old_key(key: str) -> str:
    for new, old in OLD_NAMES:
        key = re.sub(new, old, key)
    return key


@pytest.mark.parametrize("pre_norm", [False, True])
def test_state_dict_with_old_names_loads_strictly(tiny_model_args, pre_norm):
    model = _model(tiny_model_args, pre_norm=pre_norm)
    old = {_old_key(k): v for k, v in model.state_dict().items()}
    assert "encoder.1.attn.qkv_proj.weight" in old and "decoder.0.sub3.norm.bias" in old
    assert not any("residual" in k or "self_attn" in k for k in old if k.startswith("encoder."))
    upgraded, current = upgrade_state_dict(old), model.state_dict()
    assert list(upgraded) == list(current)  # same names, same order
    assert all(upgraded[k] is old[_old_key(k)] for k in current)  # same tensors
    keys = list(old)
    upgrade_state_dict(old)  # pure: the input stays as it was
    assert list(old) == keys

    torch.manual_seed(1)
    fresh = Transformer(**{**tiny_model_args, "pre_norm": pre_norm}).eval()
    fresh.load_state_dict(old)  # strict: every key matched
    src, trg = torch.randint(4, 40, (2, 6)), torch.randint(4, 40, (2, 5))
    assert torch.equal(fresh(src, trg), model(src, trg))
    # Under a wrapper (DDP's ``module.``), the prefix is respected.
    wrapped = torch.nn.ModuleDict(
        {"module": Transformer(**{**tiny_model_args, "pre_norm": pre_norm})}
    )
    wrapped.load_state_dict({f"module.{k}": v for k, v in old.items()})
    assert torch.equal(wrapped["module"].eval()(src, trg), model(src, trg))


def test_model_args_maps_the_model_config():
    cfg = ModelConfig(d_model=32, n_head=4, ffn_hidden=64, n_layers=2, n_dec_layers=1)
    args = model_args(cfg, 300, 200, pad_idx=PAD_ID, bos_idx=BOS_ID)
    assert args == dict(
        src_pad_idx=PAD_ID, trg_pad_idx=PAD_ID, trg_sos_idx=BOS_ID, enc_voc_size=300,
        dec_voc_size=300, d_model=32, n_head=4, max_len=cfg.max_len, ffn_hidden=64, n_layers=2,
        drop_prob=cfg.drop_prob, n_dec_layers=1, pre_norm=cfg.pre_norm,
        attn_drop_prob=cfg.attn_drop_prob, ffn_drop_prob=cfg.ffn_drop_prob,
        tie_embeddings=cfg.tie_embeddings, share_embeddings=True,
    )  # fmt: skip
    assert cfg.share_embeddings  # the default: a joint vocabulary, the larger size on both sides
    cfg.share_embeddings = False
    separate = model_args(cfg, 300, 200, pad_idx=PAD_ID, bos_idx=BOS_ID)
    assert (separate["enc_voc_size"], separate["dec_voc_size"]) == (300, 200)
    model = Transformer(**separate)
    assert (model.src_emb.num_embeddings, model.out.out_features, model.n_dec_layers) == (
        300,
        200,
        1,
    )


def test_attention_cache_moves_rows_before_the_next_append():
    """Selections compose and are applied by the next append: the cache then holds exactly
    cat([old rows, in the selected order], new keys), and its keys are contiguous."""
    from transformer_mt.model import AttentionCache

    cache, old = AttentionCache(), torch.randn(4, 2, 3, 5)
    cache.store(old, -old)
    cache.select(torch.tensor([3, 1, 1, 0]))
    cache.select(torch.tensor([2, 0, 1]))  # rows 1, 3, 1 of the stored ones
    new = torch.randn(3, 2, 1, 5)
    keys, values = cache.append(new, -new)
    rows = torch.tensor([1, 3, 1])
    assert torch.equal(keys, torch.cat([old[rows], new], dim=2)) and keys.is_contiguous()
    assert torch.equal(values, -keys)
    cache.select(torch.tensor([1]))
    assert torch.equal(cache.keys, keys[1:2]) and torch.equal(cache.values, -keys[1:2])


@pytest.mark.parametrize("dtype", [None, torch.bfloat16])
def test_a_training_step_compiles_as_one_graph(tiny_model_args, dtype):
    """Under torch.compile the model's training forward is one graph, fp32 or under bf16
    autocast: the CPU's cheap dropout mask and the explicit attention's test for queries with no
    key give way to code torch.compile can trace (a graph break costs a compiled graph per
    piece, and more recompiles)."""
    model = Transformer(**{**tiny_model_args, "drop_prob": 0.1, "attn_drop_prob": 0.1}).train()
    src = torch.tensor([[5, 6, 7, EOS_ID], [8, 9, EOS_ID, PAD_ID]])
    trg = torch.tensor([[BOS_ID, 5, 6], [BOS_ID, 7, PAD_ID]])
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype is not None):
        explained = torch._dynamo.explain(model)(src, trg)
    assert explained.graph_break_count == 0, explained.break_reasons
    assert explained.graph_count == 1
