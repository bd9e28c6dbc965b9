"""Training's fast paths on a CUDA GPU (``make test-gpu``; each test skips without one).

SDPA reaches the flash and memory-efficient kernels, a step queues its work without waiting for
the device, compiled training meets few shapes and compiles each once, and CUDA graphs replay the
compiled layers with the eager losses."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from transformer_mt.config import ModelConfig, load_config
from transformer_mt.data.batching import padded_shape
from transformer_mt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from transformer_mt.model import Transformer, TransformerConfig
from transformer_mt.training.batches import BatchStream, DeviceBatches, collate
from transformer_mt.training.distributed import DistInfo
from transformer_mt.training.loss import linear_label_smoothed_nll
from transformer_mt.training.trainer import Trainer

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available(), reason="no CUDA GPU visible (torch.cuda.is_available())"
    ),
]


def _model(d_model: int = 128, heads: int = 2, drop: float = 0.1) -> Transformer:
    shape = ModelConfig(
        d_model=d_model, n_head=heads, ffn_hidden=4 * d_model, n_layers=2, max_len=128,
        drop_prob=drop, attn_drop_prob=drop, ffn_drop_prob=drop,
    )  # fmt: skip
    config = TransformerConfig.build(shape, 1000, 1000, pad_idx=PAD_ID, bos_idx=BOS_ID)
    torch.manual_seed(0)
    return Transformer(config).cuda().train()


def _batch(rows: int = 24, multiple: int = 8) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(0)
    pairs = []
    for _ in range(rows):
        s, t = (int(x) for x in torch.randint(5, 40, (2,), generator=gen))
        src = [*torch.randint(4, 1000, (s - 1,), generator=gen).tolist(), EOS_ID]
        pairs.append((src, torch.randint(4, 1000, (t,), generator=gen).tolist()))
    longest = max(max(len(s), len(t) + 1) for s, t in pairs)
    shape = padded_shape(rows, longest, 2048, multiple) if multiple else None
    return tuple(x.cuda() for x in collate(pairs, np.arange(rows), shape))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_training_attention_reaches_flash_and_memory_efficient_kernels(dtype):
    """Forward and backward of a training step with SDPA's math kernel ruled out: every attention
    call takes a fused kernel (a call none of them takes raises). The decoder's causal
    self-attention takes flash alone (no mask); the encoder's and cross-attention, with their key
    padding as a float bias, the memory-efficient kernel alone."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from transformer_mt.model.layers import _attention
    from transformer_mt.model.masks import attention_bias, make_pad_mask

    model = _model()
    src, trg_in, trg_out = _batch()
    fused = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION]
    with sdpa_kernel(fused), torch.autocast("cuda", dtype=dtype):
        hidden = model(src, trg_in, features_only=True, right_padded=True)
    loss, _ = linear_label_smoothed_nll(hidden, model.out.weight, trg_out, PAD_ID, 0.1, dtype,
                                        vocab_multiple=64)  # fmt: skip
    with sdpa_kernel(fused):
        loss.backward()
    q = torch.randn(24, 2, 32, 64, device="cuda", dtype=dtype, requires_grad=True)
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        _attention(q, q, q, None, 0.1, causal=True).sum().backward()
    bias = attention_bias(make_pad_mask(src, PAD_ID), dtype)  # (B, 1, 1, S): one row a sentence
    rows = src.size(0)
    with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):
        q = torch.randn(rows, 2, 32, 64, device="cuda", dtype=dtype, requires_grad=True)
        k = torch.randn(rows, 2, src.size(1), 64, device="cuda", dtype=dtype, requires_grad=True)
        _attention(q, k, k, bias, 0.1).sum().backward()


def test_a_training_step_queues_its_work_without_waiting_for_the_device(tiny_config, tmp_path):
    """With CUDA's sync debug mode set to error, a whole step (forward, fused loss, backward,
    gradient norm, AdamW with a non-finite loss skipped on the device) runs up to the one read of
    its numbers, which comes after ``before_read`` (where the next batch's copy starts)."""
    sets = ["train.device=cuda", "train.precision=bf16", "train.max_steps=3",
            "train.valid_bleu=false", "train.best_metric=loss"]  # fmt: skip
    trainer = Trainer(load_config(tiny_config, sets), tmp_path / "run", progress=False)
    trainer.close()
    assert (trainer.shape_multiple, trainer.vocab_multiple) == (8, 64)
    stream = BatchStream(trainer.data.train, trainer.cfg, trainer.info, multiple=8)
    batches = DeviceBatches(stream, trainer.device)
    trainer.model.train()
    for _ in range(3):
        batch, tokens = batches.take()
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            result = trainer.train_step(
                [batch], False, 0.0, tokens=[tokens],
                before_read=lambda: (batches.prepare(1), torch.cuda.set_sync_debug_mode(0)),
            )  # fmt: skip
        finally:
            torch.cuda.set_sync_debug_mode(0)
        assert result.tokens == tokens and result.loss == result.loss and result.grad_norm > 0


def test_the_device_loss_equals_the_cpu_loss():
    torch.manual_seed(0)
    hidden = torch.randn(64, 128)
    weight = torch.randn(1000, 128)
    target = torch.randint(1, 1000, (64,))
    target[::5] = PAD_ID
    cpu = linear_label_smoothed_nll(hidden, weight, target, PAD_ID, 0.1)
    gpu = linear_label_smoothed_nll(hidden.cuda(), weight.cuda(), target.cuda(), PAD_ID, 0.1,
                                    vocab_multiple=64)  # fmt: skip
    for a, b in zip(cpu, gpu, strict=True):
        assert b.item() == pytest.approx(a.item(), rel=1e-4)


def test_compiled_training_on_a_gpu_compiles_each_shape_once(tiny_config, tmp_path):
    sets = ["train.device=cuda", "train.precision=bf16", "train.compile=true",
            "train.pad_to_multiple=32", "train.max_steps=40", "train.valid_every=20",
            "train.valid_bleu=false", "train.best_metric=loss"]  # fmt: skip
    trainer = Trainer(load_config(tiny_config, sets), tmp_path / "run", progress=False)
    shapes = BatchStream(trainer.data.train, trainer.cfg, DistInfo(), multiple=32).report()
    trainer.run()
    assert trainer.compile_counter is not None
    assert trainer.compile_counter.graphs == 2 * len(shapes["shapes"])
    records = [
        json.loads(x) for x in Path(tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    ]
    graphs = [r["compiled_graphs"] for r in records if "val_loss" in r]
    assert graphs == [graphs[0]] * len(graphs) and len(graphs) == 2


def test_cuda_graphs_replay_the_compiled_layers_with_the_eager_losses(tiny_config, tmp_path):
    sets = ["train.device=cuda", "train.precision=fp32", "train.pad_to_multiple=32",
            "train.max_steps=12", "train.valid_every=6", "train.valid_bleu=false",
            "train.best_metric=loss", "train.log_every=1", "model.drop_prob=0",
            "model.attn_drop_prob=0", "model.ffn_drop_prob=0"]  # fmt: skip
    losses = {}
    for name, extra in (
        ("eager", []),
        ("graphs", ["train.compile=true", "train.cuda_graphs=true"]),
    ):
        run = tmp_path / name
        Trainer(load_config(tiny_config, sets + extra), run, progress=False).run()
        records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        losses[name] = [r["loss"] for r in records if "loss" in r and "val_loss" not in r]
    assert len(losses["graphs"]) == len(losses["eager"]) >= 10
    assert losses["graphs"] == pytest.approx(losses["eager"], rel=2e-3)
