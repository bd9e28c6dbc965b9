"""Batches of a bounded set of shapes (train.pad_to_multiple), the vocabulary padded for the output
projection (train.pad_vocab_to), the loss without host reads, and compiled training meeting each
shape once."""

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from transformer_mt.checkpoint import load_checkpoint
from transformer_mt.config import ModelConfig, load_config
from transformer_mt.data.batching import (
    bucket_length,
    bucket_lengths,
    make_batches,
    padded_shape,
    padding_report,
)
from transformer_mt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from transformer_mt.decoding.text import translate_texts
from transformer_mt.model import Transformer, TransformerConfig
from transformer_mt.training.batches import BatchStream, DeviceBatches, collate
from transformer_mt.training.distributed import DistInfo
from transformer_mt.training.loss import label_smoothed_nll, linear_label_smoothed_nll
from transformer_mt.training.trainer import Trainer


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _lengths(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Multi30k-like (source + EOS, target + BOS) lengths: log-normal around 15, up to 60."""
    rng = np.random.default_rng(seed)
    src = np.clip(np.rint(rng.lognormal(np.log(14), 0.35, n)), 2, 60).astype(np.int64)
    trg = np.clip(np.rint(src * rng.lognormal(0, 0.15, n)), 2, 60).astype(np.int64)
    return src, trg


def test_length_classes_are_few_and_never_add_more_than_a_quarter():
    lengths = np.arange(1, 1025)
    for multiple in (8, 16):
        classes = bucket_lengths(lengths, multiple)
        assert [bucket_length(int(n), multiple) for n in lengths] == classes.tolist()
        assert (classes >= lengths).all() and (classes % multiple == 0).all()
        up_to_8 = sorted(set(classes[lengths <= 8 * multiple].tolist()))
        assert up_to_8 == [multiple * k for k in range(1, 9)]  # every multiple up to 8N
        # then 4 classes a doubling: 8N..16N, 16N..32N, ...
        assert len(set(classes[(lengths > 8 * multiple) & (lengths <= 16 * multiple)])) == 4
        assert len(set(classes[(lengths > 16 * multiple) & (lengths <= 32 * multiple)])) == 4
        longer = lengths > 4 * multiple  # past 4N, at most a quarter is padding
        assert (classes[longer] <= 1.25 * lengths[longer]).all()
    assert bucket_length(13, 0) == 13 and bucket_length(13, 1) == 13


def test_an_epoch_of_bounded_batches_meets_a_handful_of_shapes():
    """Distinct (rows, length) shapes over an epoch: one per length class met, where an epoch cut
    to each batch's longest sentence meets dozens; every example once, every batch in budget."""
    src, trg = _lengths(29_000)
    budget = 4096
    plain = make_batches(src, trg, budget, seed=1, epoch=0)
    bounded = make_batches(src, trg, budget, seed=1, epoch=0, multiple=8)
    plain_shapes = {(len(b), int(src[b].max()), int(trg[b].max())) for b in plain}
    shapes = {
        padded_shape(len(b), int(max(src[b].max(), trg[b].max())), budget, 8) for b in bounded
    }
    classes = set(bucket_lengths(np.maximum(src, trg), 8).tolist())
    assert len(shapes) <= len(classes) <= 8, shapes
    assert len(plain_shapes) > 4 * len(shapes)
    assert sorted(np.concatenate(bounded).tolist()) == list(range(len(src)))
    for rows, length in shapes:
        assert rows == budget // length and rows * length <= budget
    report = padding_report(bounded, src, trg, budget, 8)
    assert sum(report["shapes"].values()) == len(bounded)
    assert set(report["shapes"]) == shapes
    for side in (0, 1):  # padded >= each batch padded to its own longest >= real tokens
        assert report["padded"][side] >= report["plain"][side] >= report["real"][side]


def test_the_stream_collates_bounded_shapes_with_rows_that_predict_nothing(tiny_config):
    cfg = load_config(tiny_config)
    trainer = Trainer(cfg, tiny_config.parent / "run", progress=False)
    trainer.close()
    data, budget = trainer.data.train, cfg.train.batch_tokens
    stream = BatchStream(data, cfg, DistInfo(), multiple=8)
    n = len(stream.report()["shapes"])
    assert "batch shapes (train.pad_to_multiple=8)" in stream.describe()
    seen, tokens = set(), 0
    for _ in range(sum(stream.report()["shapes"].values())):
        src, trg_in, trg_out = next(stream)
        assert src.shape == trg_in.shape == trg_out.shape
        rows, length = src.shape
        assert length % 8 == 0 and (rows == budget // length or rows * length > budget)
        seen.add(tuple(src.shape))
        tokens += int((trg_out != PAD_ID).sum())
        added = (trg_out != PAD_ID).sum(1) == 0  # rows the padder added: no target at all
        assert (src[added, 0] == EOS_ID).all() and (src[added, 1:] == PAD_ID).all()
        assert (trg_in[added, 0] == BOS_ID).all() and (trg_in[added, 1:] == PAD_ID).all()
    assert len(seen) == n <= 8
    assert tokens == int(data.trg_lengths.sum()) + len(data)  # each target + EOS, once
    assert stream.position == (0, sum(stream.report()["shapes"].values()))


def test_device_batches_count_tokens_on_the_host_and_keep_the_taken_position(tiny_config):
    cfg = load_config(tiny_config)
    trainer = Trainer(cfg, tiny_config.parent / "run", progress=False)
    trainer.close()
    stream = BatchStream(trainer.data.train, cfg, DistInfo(), multiple=8)
    batches = DeviceBatches(stream, torch.device("cpu"))
    batches.prepare(3)  # three ahead: the position stays at the batches taken
    assert batches.position == (0, 0) and stream.position == (0, 3)
    (_, _, trg_out), tokens = batches.take()
    assert tokens == int((trg_out != PAD_ID).sum()) and batches.position == (0, 1)


def _tiny_model(drop: float = 0.0, vocab: int = 45) -> Transformer:
    shape = ModelConfig(d_model=32, n_head=4, ffn_hidden=64, n_layers=2, max_len=64,
                        drop_prob=drop, attn_drop_prob=drop, ffn_drop_prob=drop)  # fmt: skip
    config = TransformerConfig.build(shape, vocab, vocab, pad_idx=PAD_ID, bos_idx=BOS_ID)
    torch.manual_seed(0)
    return Transformer(config)


def _pairs(n: int, vocab: int, seed: int = 1) -> list[tuple[list[int], list[int]]]:
    gen = torch.Generator().manual_seed(seed)
    pairs = []
    for _ in range(n):
        s, t = (int(x) for x in torch.randint(3, 15, (2,), generator=gen))
        pairs.append(
            (
                [*torch.randint(4, vocab, (s - 1,), generator=gen).tolist(), EOS_ID],
                torch.randint(4, vocab, (t,), generator=gen).tolist(),
            )
        )
    return pairs


def _loss_and_grads(model: Transformer, batch, right_padded: bool, **loss_args):
    model.zero_grad(set_to_none=True)
    src, trg_in, trg_out = batch
    hidden = model(src, trg_in, features_only=True, right_padded=right_padded)
    loss, nll = linear_label_smoothed_nll(hidden, model.out.weight, trg_out, PAD_ID, 0.1,
                                          **loss_args)  # fmt: skip
    loss.backward()
    return loss.item(), nll.item(), {n: p.grad.clone() for n, p in model.named_parameters()}


def test_padded_batches_give_the_loss_and_gradients_of_unpadded_ones():
    """In fp32, the loss to 1e-5 (the gradients to the rounding of longer sums): a batch padded to
    its length class with rows added (causal self-attention without a mask, as training runs)
    against the same batch as it is, with the padding mask."""
    model = _tiny_model()
    pairs = _pairs(7, 45)
    index = np.arange(len(pairs))
    plain = collate(pairs, index)
    bounded = collate(pairs, index, padded_shape(7, plain[1].size(1), 512, 8))
    assert bounded[0].shape == (512 // 16, 16) and plain[0].shape[0] == 7
    loss, nll, grads = _loss_and_grads(model, plain, right_padded=False)
    for right_padded in (False, True):
        got, got_nll, got_grads = _loss_and_grads(model, bounded, right_padded)
        assert got == pytest.approx(loss, rel=1e-5) and got_nll == pytest.approx(nll, rel=1e-5)
        for name, grad in grads.items():
            torch.testing.assert_close(got_grads[name], grad, rtol=1e-4, atol=1e-5)


def test_causal_attention_without_a_mask_gives_the_masked_outputs_at_real_positions():
    model = _tiny_model().eval()
    pairs = _pairs(6, 45, seed=3)
    src, trg_in, _ = collate(pairs, np.arange(6))
    real = trg_in != PAD_ID
    with torch.no_grad():
        masked = model(src, trg_in)
        causal = model(src, trg_in, right_padded=True)
    torch.testing.assert_close(causal[real], masked[real], rtol=1e-5, atol=1e-5)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        masked = model(src, trg_in)
        causal = model(src, trg_in, right_padded=True)  # the explicit bf16 path
    torch.testing.assert_close(causal[real].float(), masked[real].float(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
def test_the_loss_without_host_reads_and_over_a_padded_vocabulary_equals_the_unfused_pair(
    dtype, bias
):
    """``compact=False`` (a GPU's way: padding rows weighted 0, no count on the host) and
    ``vocab_multiple`` 64 (37 rows padded to 64, logits -inf) change no number."""
    torch.manual_seed(0)
    hidden = torch.randn(3, 7, 16, requires_grad=True)
    weight = torch.randn(37, 16, requires_grad=True)
    b = torch.randn(37, requires_grad=True) if bias else None
    target = torch.randint(1, 37, (3, 7))
    target[0, 4:], target[2, 1:] = PAD_ID, PAD_ID
    params = [hidden, weight] + ([b] if b is not None else [])
    logits = hidden @ weight.T + (b if b is not None else 0)
    ref_loss, ref_nll = label_smoothed_nll(logits, target, PAD_ID, 0.1)
    ref_grads = torch.autograd.grad(ref_loss, params)
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    for multiple, compact in ((1, True), (64, True), (1, False), (64, False)):
        loss, nll = linear_label_smoothed_nll(hidden, weight, target, PAD_ID, 0.1, dtype, b,
                                              vocab_multiple=multiple, compact=compact)  # fmt: skip
        grads = torch.autograd.grad(loss, params)
        assert loss.item() == pytest.approx(ref_loss.item(), rel=tol)
        assert nll.item() == pytest.approx(ref_nll.item(), rel=tol)
        for got, want in zip(grads, ref_grads, strict=True):
            torch.testing.assert_close(got, want, rtol=tol, atol=tol)


def test_vocabulary_padding_leaves_the_loss_checkpoints_and_greedy_decoding_unchanged(
    tiny_config, tmp_path
):
    sets = ["train.max_steps=12", "train.valid_every=12", "train.valid_bleu=false",
            "train.best_metric=loss"]  # fmt: skip
    runs = {}
    for multiple in (1, 64):
        run = tmp_path / f"vocab{multiple}"
        trainer = Trainer(load_config(tiny_config, [*sets, f"train.pad_vocab_to={multiple}"]),
                          run, progress=False)  # fmt: skip
        assert trainer.vocab_multiple == multiple
        vocab = trainer.data.trg_tok.vocab_size
        trainer.run()
        runs[multiple] = trainer, run
    assert vocab % 64, "the tiny vocabulary must not be a multiple of 64 for this test"
    (plain, plain_run), (padded, padded_run) = runs[1], runs[64]
    losses = [[r["loss"] for r in _metrics(run) if "loss" in r] for run in (plain_run, padded_run)]
    assert losses[1] == pytest.approx(losses[0], rel=1e-5)
    ckpt = load_checkpoint(padded_run / "last.pt")
    assert ckpt["model_args"]["dec_voc_size"] == vocab
    assert ckpt["model"]["out.weight"].shape[0] == vocab
    greedy = dataclasses.replace(plain.cfg.decode, beam_size=1, nbest=1, sampling=False)
    lines = plain.data.valid_src[:10]
    outputs = [
        [
            n[0][0]
            for n in translate_texts(t.model.eval(), t.data.src_tok, t.data.trg_tok, lines, greedy)
        ]
        for t in (plain, padded)
    ]
    assert outputs[1] == outputs[0]


def test_pad_to_multiple_and_pad_vocab_to_resolve_by_device_and_compile(tiny_config, tmp_path):
    cases = [([], (0, 1)), (["train.compile=true"], (8, 1)),
             (["train.pad_to_multiple=16", "train.pad_vocab_to=8"], (16, 8))]  # fmt: skip
    for i, (sets, want) in enumerate(cases):
        trainer = Trainer(load_config(tiny_config, sets), tmp_path / str(i), progress=False)
        trainer.close()
        assert (trainer.shape_multiple, trainer.vocab_multiple) == want


def test_resuming_with_other_bounded_shapes_starts_the_next_epoch(tiny_config, tmp_path, caplog):
    sets = ["train.valid_bleu=false", "train.best_metric=loss"]
    run = tmp_path / "run"
    Trainer(load_config(tiny_config, [*sets, "train.max_steps=3"]), run, progress=False).run()
    assert load_checkpoint(run / "last.pt")["train_state"]["pad_to_multiple"] == 0
    with caplog.at_level("WARNING", logger="transformer_mt"):
        other = Trainer(
            load_config(tiny_config, [*sets, "train.max_steps=5", "train.pad_to_multiple=8"]),
            run,
            progress=False,
        )
    assert (other.state.epoch, other.state.batch_in_epoch) == (1, 0)
    assert "train.pad_to_multiple 0 -> 8" in caplog.text
    assert other.run().step == 5


@pytest.mark.slow
def test_compiled_training_meets_a_handful_of_shapes_and_compiles_each_once(tiny_config, tmp_path):
    """200 steps with train.compile (Inductor on the CPU): the graphs compiled are two per batch
    shape (an encoder layer's and a decoder layer's), all within the first epoch, none later."""
    sets = ["train.max_steps=200", "train.compile=true", "train.valid_every=100",
            "train.valid_bleu=false", "train.best_metric=loss", "train.log_every=20"]  # fmt: skip
    trainer = Trainer(load_config(tiny_config, sets), tmp_path / "run", progress=False)
    assert trainer.shape_multiple == 8  # train.pad_to_multiple null: 8 under compile
    shapes = len(
        BatchStream(trainer.data.train, trainer.cfg, DistInfo(), multiple=8).report()["shapes"]
    )
    state = trainer.run()
    assert state.step == 200 and state.epoch >= 5
    counter = trainer.compile_counter
    assert counter is not None and shapes <= 8
    assert counter.graphs == 2 * shapes, counter.shapes
    records = [r for r in _metrics(tmp_path / "run") if "val_loss" in r]
    # The same count at step 100 and at 200: nothing compiled after the first epochs.
    assert [r["compiled_graphs"] for r in records] == [2 * shapes, 2 * shapes]
    assert all(math.isfinite(r["val_loss"]) for r in records)


def test_cuda_graphs_reach_inductor_and_need_compiling(tiny_config, monkeypatch):
    from torch._inductor import compile_fx

    from transformer_mt.errors import MTError
    from transformer_mt.training.compiled import CompileCounter, mark_step

    seen = []
    monkeypatch.setattr(
        compile_fx, "compile_fx", lambda g, inputs, config_patches: seen.append(config_patches) or g
    )
    graph = torch.fx.symbolic_trace(torch.nn.Linear(2, 2))
    CompileCounter(cuda_graphs=True)(graph, [torch.zeros(1, 2)])
    assert seen == [{"triton.cudagraphs": True}]
    CompileCounter("eager", cuda_graphs=True)(graph, [torch.zeros(1, 2)])  # not Inductor: none
    assert len(seen) == 1
    marks = []
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: marks.append(1))
    mark_step(CompileCounter(cuda_graphs=True))
    mark_step(CompileCounter())
    mark_step(None)
    assert marks == [1]
    with pytest.raises(MTError, match=r"train\.cuda_graphs replays compiled layers"):
        load_config(tiny_config, ["train.cuda_graphs=true"])
