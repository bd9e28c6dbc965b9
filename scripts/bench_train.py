"""Training throughput: target tokens per second and peak memory of our Transformer beside
torch.nn.Transformer of the same size, in the same process, on the same batches.

    python scripts/bench_train.py                         # Multi30k, the small CPU size, fp32
    python scripts/bench_train.py --runs 3 --steps 10     # quicker
    python scripts/bench_train.py --device cuda --model base --precision bf16 \\
        --batch-tokens 16384 --runs 3 --steps 10
        # a GPU; prints model FLOPs utilization (an epoch of Multi30k holds 41 such batches)
    python scripts/bench_train.py --device cuda --data wmt --model big --precision fp16 \\
        --batch-tokens 16384 --compile on --only ours --json figures.jsonl
        # WMT-shaped batches, the big model, eager against compiled, figures appended as JSON

Data (``--data multi30k``, the default): the Multi30k de->en training set (``$MT_SHARED_DATA`` or
../shared/data/multi30k), cleaned as `mt train` cleans it, with a joint 8k unigram sentencepiece
model (trained once, cached in ``--cache-dir``), cut into length-sorted batches of about
``--batch-tokens`` target tokens; the toy corpus when Multi30k is absent (a note says so).
``--data wmt``: batches shaped like WMT14 en-de's, with random token ids of a 32k vocabulary
(speed depends on shapes, not on which ids): source lengths in subword tokens drawn from a
log-normal distribution with median ``WMT_MEDIAN`` 26 and sigma ``WMT_SIGMA`` 0.55 (mean ~30,
95th percentile ~64), cut to 1..250, and each target length the source's times a log-normal
ratio (median 1.05, sigma 0.15). That approximates newstest2014 under a 32k joint BPE (3,003
sentences of about 22 words, ~1.3 subwords a word, a right-skewed tail past 100 tokens): an
assumed distribution, not one measured here.

One run = ``--warmup`` untimed steps, then ``--steps`` timed optimizer steps on batches no other
run times (training sees a new shape every step, and so does memory reuse); the table shows the
median over ``--runs`` runs, the two models alternating run by run, on the same batches, so that
a noisy neighbour hurts both alike.

Sizes (``--model``): ``small`` the CPU recipe's (d_model 256, 3+3 layers, 4 heads, FFN 1024),
``base`` and ``big`` the paper's (512 / 1024, 6+6 layers, 8 / 16 heads, FFN 2048 / 4096);
``--d-model`` etc. override a preset's value.

The step is `mt train`'s: ours reads its right-padded targets with causal self-attention alone
(SDPA's ``is_causal``), the loss runs over the vocabulary padded to ``--vocab-multiple`` rows
(default as `mt train`: 64 on a GPU, 1 on a CPU), fp16 has a gradient scaler, AdamW is fused, the
batches are copied from pinned memory without waiting, and on a GPU nothing in the step reads
a number back. ``--pad-to-multiple N`` bounds the batch shapes as ``train.pad_to_multiple``
does (lengths padded up to classes of N, rows to what the budget allows); the line about the
batches says what padding that adds.

Both models: shared source/target embeddings tied to a bias-free output Linear, sinusoidal
positions, post-norm layers, the same dropout at the same sites (the residuals, embeddings,
attention weights and FFN inside; ``--attn-dropout 0 --ffn-dropout 0`` drops ours to the first
two, as the figures before 2026-11-23 15:48 ran it), label-smoothed loss (0.1) summed over non-pad
tokens and divided by their count, Adam (0.9, 0.98, 1e-9), the same autocast (``--precision``),
the same loss code (``--loss``: by default the output projection fused into the loss, as `mt
train` runs it) and the same malloc setting. nn.Transformer adds a final LayerNorm to each stack
(it always does); that costs little.

Model FLOPs per target token (printed, with the share of attention's products): 3 x forward FLOPs
(forward + backward ~ 3 forwards) of the matrix products, counted from the real (unpadded)
lengths of each sentence, embeddings excluded (padding and rows added by bounded shapes are work
that counts nothing):
  forward = sum over sentences of
    L_enc * S * (8 d^2 + 4 d f + 4 S d)             encoder: Q,K,V,O; FFN; QK^T and AV
  + L_dec * T * (12 d^2 + 4 d f + 4 T d + 4 S d)    decoder: self Q,K,V,O + cross Q,O; FFN; both
                                                    attentions (causal self-attention counted full)
  + L_dec * S * 4 d^2                               cross-attention K,V of the memory
  + T * 2 d V                                       output projection
with S, T the source and target lengths (EOS/BOS included). That is the usual 6 x (parameters a
token passes through) plus the attention terms. At the small size on Multi30k it is ~0.045 GFLOP
per target token. Utilization = that x tokens/s / peak (``--peak-tflops``; default: H100/H200 bf16
and fp16 dense, 989 TFLOP/s; printed on GPUs, or on any device when the flag is given).

``--compile on|whole|dynamic`` measures ours under torch.compile against ours eager (the same
batches) instead of nn.Transformer: ``on`` as `mt train` compiles (each encoder and decoder
layer, static shapes: one graph per layer kind and batch shape, see
transformer_mt/training/compiled.py), ``whole`` the whole model in one static graph per shape,
``dynamic`` the whole model once for all shapes. ``on`` and ``whole`` bound the shapes
(``--pad-to-multiple``, 8 unless given). Before the runs, the compiled model takes one step on each
shape the runs will see: the graphs and the seconds that took are printed (what a run spends
once on compiling). ``--max-shapes K`` takes the timed batches from the K most frequent shapes
only (both models alike), where the compile time of every shape would not fit a device's time.
The padded positions are PAD: tokens/s counts the same real target tokens for both.

``--json PATH`` appends one JSON line per model measured (its figures and the run's settings).

On a CPU without ``--peak-tflops`` the script measures the ceiling itself, in the same process:
the rate of bare matrix products at the model's own shapes (a batch's target tokens x d_model
into the FFN, out of it, into Q/K/V, and ~500 rows into the vocabulary), in the run's precision;
tokens/s at that rate would be all matrix products and nothing else. It is measured after each
round of runs, so that it alternates with the models as they alternate with each other (this
machine's neighbours move it by up to a fifth from one minute to the next); a model's share of it
is the median over the rounds of its run's rate against that round's ceiling.
"""

import argparse
import hashlib
import json
import math
import os
import resource
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from transformer_mt.config import ModelConfig
from transformer_mt.data.batching import make_batches, pad_batch, padded_shape, padding_report
from transformer_mt.data.corpus import CleanConfig, clean_parallel
from transformer_mt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, Tokenizer, TokenizerSettings
from transformer_mt.host_memory import keep_freed_memory, release_freed_memory
from transformer_mt.model import Transformer, model_args
from transformer_mt.training.compiled import CompileCounter, compile_layers, mark_step
from transformer_mt.training.loss import label_smoothed_nll, linear_label_smoothed_nll

Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # src (B, S), trg_in (B, T), trg_out (B, T)


# ---------------------------------------------------------------------------------------- data
def multi30k_dir() -> Path | None:
    """The shared Multi30k files ($MT_SHARED_DATA or ../shared/data/multi30k), or None."""
    env = os.environ.get("MT_SHARED_DATA")
    candidates = [Path(env), Path(env) / "multi30k"] if env else []
    candidates.append(Path(__file__).resolve().parents[2] / "shared" / "data" / "multi30k")
    return next((c for c in candidates if (c / "train.de.gz").is_file()), None)


def load_pairs() -> tuple[list[str], list[str], str]:
    """(sources, targets, description): Multi30k de->en train, or the toy corpus."""
    where = multi30k_dir()
    if where is not None:
        src, trg, _ = clean_parallel(where / "train.de.gz", where / "train.en.gz", CleanConfig())
        return src, trg, f"Multi30k de->en train ({where})"
    from transformer_mt.data.toy import toy_splits

    print("note: Multi30k not found (set MT_SHARED_DATA); using the toy corpus instead")
    pairs = toy_splits(20000, 10, 10, seed=1234)["train"]
    return [s for s, _ in pairs], [t for _, t in pairs], "toy corpus (20k pairs)"


def cached_tokenizer(src: list[str], trg: list[str], vocab: int, cache: Path) -> Tokenizer:
    """A joint unigram sentencepiece model, trained once per corpus and size."""
    digest = hashlib.sha256()
    for line in src + trg:
        digest.update(line.encode())
        digest.update(b"\n")
    path = cache / f"bench-spm-{vocab}-{digest.hexdigest()[:16]}.model"
    if path.is_file():
        return Tokenizer.load(path)
    print(f"training sentencepiece (joint unigram, {vocab}); cached in {path}")
    tok = Tokenizer.train(src + trg, TokenizerSettings(vocab, "unigram"))
    cache.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tok.save(tmp)
    tmp.replace(path)
    return tok


# WMT-shaped lengths (--data wmt): see the module docstring.
WMT_MEDIAN, WMT_SIGMA = 26.0, 0.55  # source subword tokens: log-normal
WMT_RATIO, WMT_RATIO_SIGMA = 1.05, 0.15  # target length / source length: log-normal
WMT_LONGEST = 250  # as data.max_tokens_per_side 256 leaves room for EOS/BOS
WMT_VOCAB = 32000


def wmt_like(pairs: int, vocab: int, seed: int = 1) -> tuple[list[list[int]], list[list[int]]]:
    """``pairs`` random (source, target) id sequences of WMT-like lengths (ids 4 .. vocab-1)."""
    rng = np.random.default_rng(seed)
    src_lens = np.clip(np.rint(rng.lognormal(math.log(WMT_MEDIAN), WMT_SIGMA, pairs)), 1, None)
    ratio = rng.lognormal(math.log(WMT_RATIO), WMT_RATIO_SIGMA, pairs)
    trg_lens = np.clip(np.rint(src_lens * ratio), 1, WMT_LONGEST)
    src_lens = np.minimum(src_lens, WMT_LONGEST)
    ids = rng.integers(4, vocab, int(src_lens.sum() + trg_lens.sum()))
    out: list[list[list[int]]] = [[], []]
    at = 0
    for side, lens in enumerate((src_lens, trg_lens)):
        for n in lens.astype(int):
            out[side].append(ids[at : at + n].tolist())
            at += n
    return out[0], out[1]


def build_batches(
    src_ids: list[list[int]],
    trg_ids: list[list[int]],
    batch_tokens: int,
    count: int,
    multiple: int = 0,
    max_shapes: int = 0,
) -> tuple[list[Batch], dict]:
    """The first ``count`` batches of a shuffled epoch of length-sorted, token-budget batches (as
    `mt train` cuts them, shapes bounded by ``multiple``), and their padding report (see
    transformer_mt.data.batching.padding_report). ``max_shapes``: only batches of the most
    frequent shapes of the epoch."""
    src_lens = np.array([len(s) + 1 for s in src_ids])  # + EOS
    trg_lens = np.array([len(t) + 1 for t in trg_ids])  # + BOS (input) / EOS (output)
    index = make_batches(src_lens, trg_lens, batch_tokens, seed=1, epoch=0, multiple=multiple)

    def shape(b: np.ndarray) -> tuple[int, int]:
        longest = int(max(src_lens[b].max(), trg_lens[b].max()))
        return padded_shape(len(b), longest, batch_tokens, multiple)

    if max_shapes:
        counts: dict[tuple[int, int], int] = {}
        for b in index:
            counts[shape(b)] = counts.get(shape(b), 0) + 1
        kept = set(sorted(counts, key=lambda k: -counts[k])[:max_shapes])
        index = [b for b in index if shape(b) in kept]
    index = index[:count]
    if len(index) < count:
        raise SystemExit(
            f"the corpus gives only {len(index)} batches; lower --runs/--steps/--warmup"
        )
    batches = []
    for b in index:
        rows, width = shape(b) if multiple > 1 else (None, None)
        sources = [[*src_ids[i], EOS_ID] for i in b]
        targets = [trg_ids[i] for i in b]
        src = pad_batch(sources, PAD_ID, width=width, rows=rows, fill=(EOS_ID,))
        trg_in = pad_batch(targets, PAD_ID, bos=BOS_ID, width=width, rows=rows, fill=(BOS_ID,))
        trg_out = pad_batch(targets, PAD_ID, eos=EOS_ID, width=width, rows=rows)
        batches.append((src, trg_in, trg_out))
    return batches, padding_report(index, src_lens, trg_lens, batch_tokens, multiple)


# --------------------------------------------------------------------------------------- models
class Sinusoids(nn.Module):
    """The fixed sinusoidal position table of the paper, (max_len, d_model)."""

    def __init__(self, d_model: int, max_len: int = 512) -> None:
        super().__init__()
        pos = torch.arange(max_len, dtype=torch.float32)[:, None]
        div = torch.exp(
            torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(1e4) / d_model)
        )
        table = torch.zeros(max_len, d_model)
        table[:, 0::2] = torch.sin(pos * div)
        table[:, 1::2] = torch.cos(pos * div)
        self.register_buffer("table", table, persistent=False)

    def forward(self, length: int) -> torch.Tensor:
        return self.table[:length]  # (T, D)


class TorchTransformerMT(nn.Module):
    """torch.nn.Transformer with the same embeddings, positions and tied output as ours."""

    def __init__(self, vocab: int, d_model: int, heads: int, ffn: int, layers: int, drop: float):
        super().__init__()
        self.scale = math.sqrt(d_model)
        self.emb = nn.Embedding(vocab, d_model, padding_idx=PAD_ID)
        nn.init.normal_(self.emb.weight, std=d_model**-0.5)
        self.pos = Sinusoids(d_model)
        self.drop = nn.Dropout(drop)
        self.core = nn.Transformer(
            d_model, heads, layers, layers, ffn, drop, batch_first=True, norm_first=False
        )
        self.out = nn.Linear(d_model, vocab, bias=False)
        self.out.weight = self.emb.weight  # tied, as ours

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.drop(self.emb(ids) * self.scale + self.pos(ids.size(1)))  # (B, T, D)

    def forward(
        self, src: torch.Tensor, trg: torch.Tensor, features_only: bool = False
    ) -> torch.Tensor:
        src_pad, trg_pad = src == PAD_ID, trg == PAD_ID  # (B, S), (B, T): True = ignore
        # Boolean like the padding masks (True = may not attend): mixed mask types are deprecated.
        t = trg.size(1)
        causal = torch.ones(t, t, dtype=torch.bool, device=trg.device).triu(1)  # (T, T)
        h = self.core(
            self._embed(src),
            self._embed(trg),
            tgt_mask=causal,
            src_key_padding_mask=src_pad,
            tgt_key_padding_mask=trg_pad,
            memory_key_padding_mask=src_pad,
            tgt_is_causal=True,
        )
        return h if features_only else self.out(h)  # (B, T, D) or (B, T, V)


def ours(args: argparse.Namespace, vocab: int) -> nn.Module:
    shape = ModelConfig(
        d_model=args.d_model, n_head=args.heads, ffn_hidden=args.ffn, n_layers=args.layers,
        drop_prob=args.dropout, attn_drop_prob=args.attn_dropout, ffn_drop_prob=args.ffn_dropout,
        max_len=512, pre_norm=False, tie_embeddings=True, share_embeddings=True,
    )  # fmt: skip
    return Transformer(**model_args(shape, vocab, vocab, pad_idx=PAD_ID, bos_idx=BOS_ID))


def baseline(args: argparse.Namespace, vocab: int) -> nn.Module:
    return TorchTransformerMT(vocab, args.d_model, args.heads, args.ffn, args.layers, args.dropout)


# ------------------------------------------------------------------------------------- measuring
def matmul_rate(
    rows: int, d: int, f: int, vocab: int, dtype: torch.dtype, repeats: int = 7
) -> float:
    """FLOP/s of bare CPU matrix products at the model's shapes (see the module docstring): the
    median over ``repeats`` timings of the four products together."""
    shapes = [(rows, d, f), (rows, f, d), (rows, d, 3 * d), (500, d, vocab)]
    pairs = [(torch.randn(m, k).to(dtype), torch.randn(k, n).to(dtype)) for m, k, n in shapes]
    flop = sum(2 * m * k * n for m, k, n in shapes)
    times = []
    for i in range(repeats + 2):  # two untimed rounds first
        start = time.perf_counter()
        for a, b in pairs:
            a @ b
        if i >= 2:
            times.append(time.perf_counter() - start)
    return flop / statistics.median(times)


def flops_per_target_token(
    batches: list[Batch], d: int, f: int, layers: int, vocab: int, attention_only: bool = False
) -> float:
    """Training FLOPs per target token from the model's shape (formula in the module docstring);
    ``attention_only``: the attention products' part (QK^T and AV) alone."""
    total, tokens = 0.0, 0
    for src, _, trg_out in batches:
        real = (trg_out != PAD_ID).any(1)  # rows added by bounded shapes hold no target
        s_len = (src[real] != PAD_ID).sum(1).double()  # (B,) real source lengths
        t_len = (trg_out[real] != PAD_ID).sum(1).double()  # (B,) real target lengths
        enc_attn = layers * s_len * 4 * s_len * d
        dec_attn = layers * t_len * (4 * t_len * d + 4 * s_len * d)
        if attention_only:
            total += 3 * float((enc_attn + dec_attn).sum())
        else:
            enc = layers * s_len * (8 * d * d + 4 * d * f) + enc_attn
            dec = layers * t_len * (12 * d * d + 4 * d * f) + dec_attn
            total += 3 * float(
                (enc + dec + layers * s_len * 4 * d * d + t_len * 2 * d * vocab).sum()
            )
        tokens += int(t_len.sum())
    return total / tokens


class RssSampler:
    """Peak resident memory of this process while a block runs, sampled every few milliseconds
    (``getrusage`` only knows the peak of the whole process life, which the first model sets)."""

    def __init__(self, every_s: float = 0.005) -> None:
        self.every_s, self.peak = every_s, 0
        self._page = os.sysconf("SC_PAGE_SIZE")
        self._stop = threading.Event()

    def _rss(self) -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * self._page

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            self.peak = max(self.peak, self._rss())

    @contextmanager
    def sampling(self) -> Iterator[None]:
        self.peak = max(self.peak, self._rss())
        self._stop.clear()
        thread = threading.Thread(target=self._loop, daemon=True)
        thread.start()
        try:
            yield
        finally:
            self._stop.set()
            thread.join()
            self.peak = max(self.peak, self._rss())


@dataclass
class Contender:
    """One model under test, its optimizer, and what was measured."""

    name: str
    model: nn.Module
    optimizer: torch.optim.Optimizer
    rates: list[float]
    peak_bytes: int = 0
    sampler: RssSampler | None = None
    forward_kwargs: dict | None = None  # ours: right_padded=True, as `mt train` calls it
    scaler: torch.amp.GradScaler | None = None  # fp16
    counter: CompileCounter | None = None  # compiled: the graphs and compile time
    compile_s: float = 0.0  # the steps that compiled, timed


def make_step(
    device: torch.device, precision: str, loss_kind: str, vocab_multiple: int = 1
) -> Callable[[Contender, Batch], None]:
    """One optimizer step, identical for both models: ``chunked`` is what `mt train` runs (the
    output projection fused into the loss, block by block, over the vocabulary padded to
    ``vocab_multiple`` rows), ``logits`` the usual full logits and loss. Nothing in it reads a
    number from the device (fp16's scaler skips and rescales on the device)."""
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)

    def step(c: Contender, batch: Batch) -> None:
        mark_step(c.counter)  # as mt train's step (train.cuda_graphs)
        src, trg_in, trg_out = (x.to(device, non_blocking=True) for x in batch)
        ctx = torch.autocast(device.type, dtype=dtype) if dtype else nullcontext()
        with ctx:
            out = c.model(
                src, trg_in, features_only=loss_kind == "chunked", **(c.forward_kwargs or {})
            )
        if loss_kind == "chunked":
            weight = c.model.out.weight
            loss, _ = linear_label_smoothed_nll(
                out, weight, trg_out, PAD_ID, 0.1, dtype, vocab_multiple=vocab_multiple
            )
        else:
            loss, _ = label_smoothed_nll(out, trg_out, PAD_ID, 0.1)
        loss = loss / (trg_out != PAD_ID).sum()
        if c.scaler is not None:
            c.scaler.scale(loss).backward()
            c.scaler.step(c.optimizer)
            c.scaler.update()
        else:
            loss.backward()
            c.optimizer.step()
        c.optimizer.zero_grad(set_to_none=True)

    return step


def batch_shape(batch: Batch) -> tuple[int, ...]:
    return (*batch[0].shape, batch[1].size(1))


def compile_steps(c: Contender, batches: list[Batch], step, device: torch.device) -> None:
    """One step of the compiled model on each shape the runs will see (its graphs), timed: what
    compiling costs a run before its steps run at the compiled speed."""
    seen: dict[tuple[int, ...], Batch] = {}
    for batch in batches:
        seen.setdefault(batch_shape(batch), batch)
    sync(device)
    started = time.perf_counter()
    for b in seen.values():
        step(c, b)
    sync(device)
    c.compile_s = time.perf_counter() - started
    graphs = f"{c.counter.graphs} graphs, " if c.counter else ""
    print(
        f"  compile: {len(seen)} batch shapes, {graphs}{c.compile_s:.0f} s (one step each, "
        "compiling included)",
        flush=True,
    )


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_run(
    c: Contender, warm: list[Batch], timed: list[Batch], step, device: torch.device
) -> None:
    """Warm-up steps, then the timed steps; appends target tokens/s and updates the peak memory.
    On a CPU the heap the other model freed goes back to the kernel first (kept freed memory
    would otherwise count in this model's peak)."""
    if device.type == "cpu":
        release_freed_memory()
    for batch in warm:
        step(c, batch)
    tokens = sum(int((out != PAD_ID).sum()) for _, _, out in timed)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    sampler = c.sampler.sampling() if c.sampler else nullcontext()
    with sampler:
        sync(device)
        start = time.perf_counter()
        for batch in timed:
            step(c, batch)
        sync(device)
        elapsed = time.perf_counter() - start
    c.rates.append(tokens / elapsed)
    if device.type == "cuda":
        c.peak_bytes = max(c.peak_bytes, torch.cuda.max_memory_allocated(device))
    elif c.sampler:
        c.peak_bytes = c.sampler.peak


SIZES = {  # --model: d_model, heads, FFN, layers (each stack)
    "small": (256, 4, 1024, 3),
    "base": (512, 8, 2048, 6),
    "big": (1024, 16, 4096, 6),
}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="timed runs per model (median)")
    parser.add_argument("--steps", type=int, default=20, help="timed optimizer steps per run")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps before each run")
    parser.add_argument("--batch-tokens", type=int, default=4096, help="token budget per batch")
    parser.add_argument("--data", choices=["multi30k", "wmt"], default="multi30k",
                        help="Multi30k's batches, or WMT-shaped ones (see the docstring)")  # fmt: skip
    parser.add_argument("--vocab", type=int, default=None,
                        help="vocabulary: Multi30k's joint sentencepiece (default 8000), or "
                        "--data wmt's (default 32000)")  # fmt: skip
    parser.add_argument("--model", choices=list(SIZES), default="small",
                        help="size preset: small (the CPU recipe's), base, big")  # fmt: skip
    parser.add_argument("--d-model", type=int, default=None)
    parser.add_argument("--heads", type=int, default=None)
    parser.add_argument("--ffn", type=int, default=None)
    parser.add_argument("--layers", type=int, default=None, help="encoder and decoder layers each")
    parser.add_argument("--dropout", type=float, default=0.1, help="residual/embedding dropout")
    parser.add_argument(
        "--attn-dropout", type=float, default=None,
        help="ours: dropout on attention weights; default --dropout, where nn.Transformer "
        "always applies it (0: ours drops out at fewer sites, an unequal comparison)",
    )  # fmt: skip
    parser.add_argument(
        "--ffn-dropout", type=float, default=None,
        help="ours: dropout inside the FFN; default --dropout, as nn.Transformer",
    )  # fmt: skip
    parser.add_argument("--precision", choices=["fp32", "bf16", "fp16"], default="fp32",
                        help="fp32, or autocast to bf16/fp16 (fp16 with a gradient scaler)")  # fmt: skip
    parser.add_argument("--loss", choices=["chunked", "logits"], default="chunked",
                        help="chunked: output projection fused into the loss, as `mt train` does; "
                        "logits: full (B, T, V) logits, then the loss")  # fmt: skip
    parser.add_argument("--vocab-multiple", type=int, default=None,
                        help="the loss's products over the vocabulary padded to this many rows "
                        "(train.pad_vocab_to); default 64 on a GPU, 1 on a CPU")  # fmt: skip
    parser.add_argument("--pad-to-multiple", type=int, default=None,
                        help="bounded batch shapes, as train.pad_to_multiple (0: off); default 8 "
                        "with --compile on/whole, else 0")  # fmt: skip
    parser.add_argument("--max-shapes", type=int, default=0,
                        help="time batches of the K most frequent shapes only (0: all)")  # fmt: skip
    parser.add_argument("--threads", type=int, default=0, help="torch threads; 0 = its default")
    parser.add_argument("--malloc-default", action="store_true",
                        help="leave glibc malloc as it is (default: keep freed memory, as `mt train` "
                        "does on CPU; see transformer_mt/host_memory.py)")  # fmt: skip
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help="device peak for utilization; default on GPUs: 989 (H100/H200 "
                        "bf16/fp16 dense)")  # fmt: skip
    parser.add_argument("--only", choices=["ours", "baseline", "compiled"], default=None,
                        help="measure one model only (with --compile: ours compiled is kept;"
                        " compiled: ours compiled alone)")  # fmt: skip
    parser.add_argument("--compile", choices=["off", "on", "whole", "dynamic"], default="off",
                        help="ours under torch.compile against ours eager (see the docstring)")  # fmt: skip
    parser.add_argument("--cuda-graphs", action="store_true",
                        help="with --compile on: Inductor's CUDA graphs (train.cuda_graphs)")  # fmt: skip
    parser.add_argument("--compile-backend", default="inductor",
                        help="torch.compile's backend (aot_eager: tracing without code generation,"
                        " for a quick check that compiling works)")  # fmt: skip
    parser.add_argument("--json", type=Path, default=None,
                        help="append one JSON line per model measured to this file")  # fmt: skip
    parser.add_argument("--cache-dir", type=Path,
                        default=Path(tempfile.gettempdir()) / "transformer-mt-bench",
                        help="where the sentencepiece model is cached")  # fmt: skip
    args = parser.parse_args()
    for name, lowest in (("runs", 1), ("steps", 1), ("warmup", 0), ("batch_tokens", 256)):
        if getattr(args, name) < lowest:
            parser.error(f"--{name.replace('_', '-')} must be at least {lowest}")
    for name, value in zip(("d_model", "heads", "ffn", "layers"), SIZES[args.model], strict=True):
        if getattr(args, name) is None:
            setattr(args, name, value)
    for name in ("attn_dropout", "ffn_dropout"):  # default: the sites nn.Transformer drops at
        if getattr(args, name) is None:
            setattr(args, name, args.dropout)
    if args.pad_to_multiple is None:
        args.pad_to_multiple = 8 if args.compile in ("on", "whole") else 0
    if args.vocab is None:
        args.vocab = WMT_VOCAB if args.data == "wmt" else 8000
    return args


def load_ids(
    args: argparse.Namespace, count: int
) -> tuple[list[list[int]], list[list[int]], int, str]:
    """(source ids, target ids, vocabulary, description) of --data."""
    if args.data == "wmt":
        # Enough pairs for ``count`` batches of the budget, several times over (each run draws
        # its batches from a shuffled epoch of them).
        pairs = max(2_000, 4 * count * args.batch_tokens // 30)
        src_ids, trg_ids = wmt_like(pairs, args.vocab)
        what = (
            f"WMT-shaped random ids: {pairs:,} pairs, source lengths log-normal (median "
            f"{WMT_MEDIAN:g}, sigma {WMT_SIGMA:g}), target/source log-normal (median {WMT_RATIO:g}, "
            f"sigma {WMT_RATIO_SIGMA:g}), at most {WMT_LONGEST}"
        )
        return src_ids, trg_ids, args.vocab, what
    src, trg, corpus = load_pairs()
    tok = cached_tokenizer(src, trg, args.vocab, args.cache_dir)
    return (
        tok.encode_batch(src),
        tok.encode_batch(trg),
        tok.vocab_size,
        f"{corpus}: {len(src):,} pairs",
    )


def main() -> None:
    args = parse_args()
    kept = False if args.malloc_default else keep_freed_memory()

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda but no CUDA GPU is visible")
    peak_tflops = args.peak_tflops or (989.0 if device.type == "cuda" else None)
    vocab_multiple = args.vocab_multiple or (64 if device.type == "cuda" else 1)

    # Every run times different batches (as training does: shapes vary from step to step); both
    # models see the same ones.
    count = args.warmup + args.runs * args.steps
    src_ids, trg_ids, vocab, corpus = load_ids(args, count)
    batches, report = build_batches(
        src_ids, trg_ids, args.batch_tokens, count, args.pad_to_multiple, args.max_shapes
    )
    if device.type == "cuda":  # copied without waiting, as mt train's batches are
        batches = [(a.pin_memory(), b.pin_memory(), c.pin_memory()) for a, b, c in batches]
    shape_args = (args.d_model, args.ffn, args.layers, vocab)
    flops = flops_per_target_token(batches[args.warmup :], *shape_args)
    attn_flops = flops_per_target_token(batches[args.warmup :], *shape_args, attention_only=True)

    step = make_step(device, args.precision, args.loss, vocab_multiple)
    contenders = []
    builds: tuple[tuple[str, Callable[..., nn.Module]], ...] = (
        ("ours", ours),
        ("nn.Transformer", baseline),
    )
    if args.compile != "off":
        builds = (("ours", ours), (f"ours compiled ({args.compile})", ours))
    for name, build in builds:
        compiled = name.startswith("ours compiled")
        if args.only == "compiled" and not compiled:
            continue
        if args.only and not compiled and (name == "ours") != (args.only == "ours"):
            continue
        torch.manual_seed(0)
        model = build(args, vocab).to(device).train()
        counter = None
        if compiled:
            counter = CompileCounter(args.compile_backend, cuda_graphs=args.cuda_graphs)
            if args.compile == "on":
                compile_layers(model, counter)  # as mt train compiles
            else:
                # one graph per batch shape, not torch's default of at most 8 (then it runs eager)
                torch._dynamo.config.recompile_limit = 256
                model = torch.compile(model, backend=counter, dynamic=args.compile == "dynamic")
        opt = torch.optim.AdamW(  # as `mt train` builds it (weight decay 0: Adam)
            model.parameters(),
            lr=1e-4,
            betas=(0.9, 0.98),
            eps=1e-9,
            weight_decay=0.0,
            fused=device.type in ("cpu", "cuda"),
        )
        sampler = RssSampler() if device.type == "cpu" else None
        scaler = torch.amp.GradScaler(device.type) if args.precision == "fp16" else None
        kwargs = {"right_padded": True} if name.startswith("ours") else {}
        contenders.append(
            Contender(name, model, opt, [], sampler=sampler, forward_kwargs=kwargs,
                      scaler=scaler, counter=counter)
        )  # fmt: skip

    timed = batches[args.warmup :]
    n_sent = sum(int((b[2] != PAD_ID).any(1).sum()) for b in timed) / len(timed)
    n_tok = sum(int((b[2] != PAD_ID).sum()) for b in timed) / len(timed)
    (real_s, real_t), (pad_s, pad_t) = report["real"], report["padded"]
    shapes = report["shapes"]
    print(f"data: {corpus}, vocab {vocab}")
    bounded = (
        f"; shapes bounded (--pad-to-multiple {args.pad_to_multiple}): {len(shapes)} in the "
        f"batches cut, {len({batch_shape(b) for b in batches})} among those used"
        if args.pad_to_multiple > 1
        else ""
    )
    print(
        f"batches: ~{args.batch_tokens} tokens budget; timed ones average {n_sent:.0f} sentences, "
        f"{n_tok:.0f} target tokens, {1 - real_t / pad_t:.1%} target padding "
        f"({1 - real_s / pad_s:.1%} source){bounded}"
    )
    print(
        f"model: d_model {args.d_model}, {args.layers}+{args.layers} layers, {args.heads} heads, "
        f"ffn {args.ffn}, dropout {args.dropout} (ours: attention {args.attn_dropout}, "
        f"FFN {args.ffn_dropout}; nn.Transformer: {args.dropout} everywhere), {args.precision}, "
        f"loss {args.loss} (vocabulary padded to {vocab_multiple}); device {device}, "
        f"{torch.get_num_threads()} threads; torch {torch.__version__}; glibc malloc "
        f"{'keeps freed memory' if kept else 'default'}"
    )
    for c in contenders:
        n = sum(p.numel() for p in c.model.parameters())
        print(f"  {c.name}: {n:,} parameters")
    print(
        f"model FLOPs per target token: {flops / 1e9:.4f} GFLOP, attention's products "
        f"{attn_flops / flops:.1%} of it (formula: see --help / docstring)"
    )
    print(f"runs: {args.runs} x ({args.warmup} warm-up + {args.steps} timed steps)", flush=True)
    for c in contenders:
        if c.name.startswith("ours compiled"):
            compile_steps(c, batches, step, device)

    measure_ceiling = device.type == "cpu" and not args.peak_tflops
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.precision, torch.float32)
    ceilings: list[float] = []  # FLOP/s of the bare products, one per round of runs
    for run in range(args.runs):
        for c in contenders:
            first = args.warmup + run * args.steps
            timed = batches[first : first + args.steps]
            timed_run(c, batches[: args.warmup], timed, step, device)
            print(f"  run {run + 1}: {c.name:>15} {c.rates[-1]:9,.0f} tok/s", flush=True)
        if measure_ceiling:
            ceilings.append(matmul_rate(round(n_tok), args.d_model, args.ffn, vocab, dtype))
            print(
                f"  run {run + 1}: {'ceiling':>15} {ceilings[-1] / flops:9,.0f} tok/s", flush=True
            )

    mem = "peak GPU MiB" if device.type == "cuda" else "peak RSS MiB"
    header = f"{'model':>15} | {'tgt tok/s':>10} | {'min..max':>15} | {'GFLOP/s':>8} | {mem:>12}"
    if peak_tflops:
        header += " | MFU"
    print("\n" + header)
    print("-" * len(header))
    for c in contenders:
        med = statistics.median(c.rates)
        line = (
            f"{c.name:>15} | {med:10,.0f} | {min(c.rates):7,.0f}..{max(c.rates):<7,.0f} | "
            f"{med * flops / 1e9:8,.1f} | {c.peak_bytes / 2**20:12,.0f}"
        )
        if peak_tflops:
            line += f" | {med * flops / (peak_tflops * 1e12):.1%}"
        print(line)
    if len(contenders) == 2:
        ratio = statistics.median(contenders[0].rates) / statistics.median(contenders[1].rates)
        print(f"\n{contenders[0].name} / {contenders[1].name} throughput: {ratio:.2f}x")
    if ceilings:
        rate = statistics.median(ceilings)

        def share(c: Contender) -> str:
            shares = [r * flops / top for r, top in zip(c.rates, ceilings, strict=True)]
            low, mid, high = min(shares), statistics.median(shares), max(shares)
            return f"{c.name} at {mid:.0%} ({low:.0%}..{high:.0%})"

        print(
            f"ceiling: bare {args.precision} matrix products at the model's shapes run "
            f"{rate / 1e9:,.0f} GFLOP/s here (median of {len(ceilings)} rounds, "
            f"{min(ceilings) / 1e9:,.0f}..{max(ceilings) / 1e9:,.0f}), i.e. {rate / flops:,.0f} "
            "target tok/s if a step were nothing else; each model's share of its round's "
            "ceiling, median (range): " + ", ".join(share(c) for c in contenders)
        )
    if device.type == "cpu":
        whole = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
        print(
            f"peak RSS of the whole process (getrusage): {whole:,.0f} MiB; per-model figures are "
            "sampled during that model's steps, after freed heap went back to the kernel, and "
            "include the other model's weights and optimizer state (--only MODEL: one alone)"
        )
    if peak_tflops:
        print(f"MFU against {peak_tflops:g} TFLOP/s peak (--peak-tflops)")
    if args.json:
        write_json(args, contenders, device, vocab, vocab_multiple, flops, attn_flops,
                   peak_tflops, report, batches)  # fmt: skip
    sys.stdout.flush()


def write_json(
    args: argparse.Namespace,
    contenders: list[Contender],
    device: torch.device,
    vocab: int,
    vocab_multiple: int,
    flops: float,
    attn_flops: float,
    peak_tflops: float | None,
    report: dict,
    batches: list[Batch],
) -> None:
    """Append one JSON line per contender to ``args.json``: its figures and the settings."""
    (real_s, real_t), (pad_s, pad_t) = report["real"], report["padded"]
    common = {
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "data": args.data,
        "model": args.model,
        "d_model": args.d_model,
        "layers": args.layers,
        "heads": args.heads,
        "ffn": args.ffn,
        "vocab": vocab,
        "vocab_multiple": vocab_multiple,
        "precision": args.precision,
        "batch_tokens": args.batch_tokens,
        "pad_to_multiple": args.pad_to_multiple,
        "shapes_used": len({batch_shape(b) for b in batches}),
        "padding_source": round(1 - real_s / pad_s, 4),
        "padding_target": round(1 - real_t / pad_t, 4),
        "runs": args.runs,
        "steps": args.steps,
        "gflop_per_target_token": round(flops / 1e9, 5),
        "attention_share_of_flops": round(attn_flops / flops, 4),
        "peak_tflops": peak_tflops,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    with args.json.open("a", encoding="utf-8") as f:
        for c in contenders:
            med = statistics.median(c.rates)
            record = {
                **common,
                "name": c.name,
                "compile": (
                    args.compile + ("+cuda-graphs" if args.cuda_graphs else "")
                    if c.name.startswith("ours compiled")
                    else "off"
                ),
                "tokens_per_s": round(med),
                "tokens_per_s_min": round(min(c.rates)),
                "tokens_per_s_max": round(max(c.rates)),
                "tflops": round(med * flops / 1e12, 2),
                "mfu": round(med * flops / (peak_tflops * 1e12), 4) if peak_tflops else None,
                "peak_mib": round(c.peak_bytes / 2**20),
                "compiled_graphs": c.counter.graphs if c.counter else None,
                "compile_s": round(c.compile_s, 1) if c.counter else None,
            }
            f.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
