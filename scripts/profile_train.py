"""Where a training step goes: torch.profiler over the step that scripts/bench_train.py times,
summed by operator family (matrix products, attention, loss, LayerNorm, dropout, ...).

    python scripts/profile_train.py                       # Multi30k, the recipe's model, bf16
    python scripts/profile_train.py --steps 20 --dropout 0.1 --precision fp32
    python scripts/profile_train.py --model baseline      # torch.nn.Transformer, same batches

Same data, batches, models, step and malloc setting as bench_train.py (imported from it): the
Multi30k de->en training set, a joint 8k sentencepiece vocabulary, length-sorted batches of
~``--batch-tokens``. The defaults are the shape of configs/multi30k_de_en.yaml (d_model 256,
4 heads, FFN 1024, 3+3 layers, shared and tied embeddings, dropout 0.3 on the residuals and
embeddings, 0.1 on attention weights and inside the FFN, label smoothing 0.1, bf16 autocast).
``--model baseline`` (torch.nn.Transformer) drops at every site with ``--dropout``.
``--warmup`` untimed steps, then ``--steps`` profiled steps on other batches.

Every profiled operator's *self* time (time not spent in a nested operator) goes to one family,
chosen from the operator and the operators around it (an ``aten::mul`` inside dropout counts as
dropout; a cast that autocast makes inside ``aten::linear`` counts as a cast). The fused output
projection + loss (transformer_mt/training/loss.py) counts whole as "loss" (its matrix products
are listed apart as "loss: of it, matrix products"), and the optimizer step and zero_grad as
"optimizer". "untracked" is the step's wall time that no operator accounts for: Python, the
autograd engine between nodes, the profiler itself. Profiling slows a step; the table also
prints the unprofiled step time of batches of the same length distribution (the ones between
the profiled ones), measured just before.
"""

import argparse
import re
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from contextlib import contextmanager, nullcontext
from pathlib import Path

import torch
from bench_train import Contender, baseline, build_batches, cached_tokenizer, load_pairs, ours
from torch.autograd import profiler_util
from torch.profiler import ProfilerActivity, profile, record_function

from transformer_mt.data.tokenizer import PAD_ID
from transformer_mt.host_memory import keep_freed_memory
from transformer_mt.training import loss as loss_module

FAMILIES = (
    "matrix products (linear)",
    "attention (SDPA fwd+bwd)",
    "loss (fused projection + label smoothing)",
    "LayerNorm (fwd+bwd)",
    "dropout (mask + apply, fwd+bwd)",
    "elementwise (add, mul, relu, ...)",
    "dtype casts / copies",
    "embedding (fwd+bwd)",
    "optimizer (step + zero_grad)",
    "other ops (autograd bookkeeping, views, allocation)",
)
MATMUL, ATTENTION, LOSS, NORM, DROPOUT, ELEMENTWISE, CAST, EMBEDDING, OPTIMIZER, OTHER = FAMILIES

# (pattern on an operator or autograd-node name, family), tried in order. A name matches the first
# pattern it contains.
_RULES = [
    (r"^Optimizer\.", OPTIMIZER),
    (r"^train_loss$", LOSS),
    (r"dropout|Dropout|bernoulli", DROPOUT),
    (r"scaled_dot_product|ScaledDotProduct|flash_attention|FlashAttention", ATTENTION),
    # The explicit attention of layers._explicit_attention: batched products (the linear layers
    # use mm/addmm), masking and softmax outside the loss.
    (
        r"^aten::(bmm|_softmax|softmax|_softmax_backward_data|masked_fill)$"
        r"|^(Bmm|Softmax|MaskedFill)Backward",
        ATTENTION,
    ),
    (r"layer_norm|LayerNorm", NORM),
    (r"embedding|Embedding|index_select", EMBEDDING),
    (r"^aten::(to|_to_copy|copy_|clone|contiguous)$|ToCopy|CloneBackward", CAST),
    (r"^aten::(mm|addmm|bmm|matmul|linear|baddbmm)$|^(Mm|Addmm|Bmm|Mv)Backward|mkldnn", MATMUL),
    (
        r"^aten::(add|add_|sub|sub_|mul|mul_|div|div_|relu|relu_|clamp_min|threshold_backward"
        r"|where|masked_fill|masked_fill_|fill_|zero_|sum|cat|neg|rsub|ne|eq|exp|exp_)$"
        r"|^(Add|Sub|Mul|Div|Relu|Threshold|Where|MaskedFill|Sum|Cat|Neg)Backward",
        ELEMENTWISE,
    ),
]
# Families that claim everything nested in them (checked from the outermost operator in); the
# others are decided by the innermost operator that names one, so that autocast's casts inside
# aten::linear count as casts, not as matrix products.
_CLAIMING = (OPTIMIZER, LOSS, DROPOUT, ATTENTION, NORM, EMBEDDING)


def _family_of_name(name: str) -> str | None:
    name = name.removeprefix("autograd::engine::evaluate_function: ")
    for pattern, family in _RULES:
        if re.search(pattern, name):
            return family
    return None


def family(event: profiler_util.FunctionEvent) -> str:
    chain = []  # outermost first
    e = event
    while e is not None:
        chain.append(e.name)
        e = e.cpu_parent
    chain.reverse()
    named = [_family_of_name(n) for n in chain]
    for f in named:
        if f in _CLAIMING:
            return f
    for f in reversed(named):
        if f is not None:
            return f
    return OTHER


_STEP = "profiled_step#"


def step_index(event: profiler_util.FunctionEvent) -> int | None:
    """Which profiled step an event belongs to (None: outside every step)."""
    e = event
    while e is not None:
        if e.name.startswith(_STEP):
            return int(e.name[len(_STEP) :])
        e = e.cpu_parent
    return None


def is_loss_matmul(event: profiler_util.FunctionEvent) -> bool:
    """A matrix product inside the fused loss."""
    if _family_of_name(event.name) != MATMUL:
        return False
    e = event.cpu_parent
    while e is not None:
        if e.name == "train_loss":
            return True
        e = e.cpu_parent
    return False


def make_profiled_step(device: torch.device, precision: str):
    """bench_train.make_step's step (chunked loss, as `mt train` runs it) with the loss inside a
    ``train_loss`` profiler range; no other difference."""
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)

    def step(c: Contender, batch) -> None:
        src, trg_in, trg_out = (x.to(device) for x in batch)
        ctx = torch.autocast(device.type, dtype=dtype) if dtype else nullcontext()
        with ctx:
            out = c.model(src, trg_in, features_only=True)
        with record_function("train_loss"):
            loss, _ = loss_module.linear_label_smoothed_nll(
                out, c.model.out.weight, trg_out, PAD_ID, 0.1, dtype
            )
        (loss / (trg_out != PAD_ID).sum()).backward()
        c.optimizer.step()
        c.optimizer.zero_grad(set_to_none=True)

    return step


@contextmanager
def timer(out: list[float]):
    start = time.perf_counter()
    yield
    out.append(time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=10, help="profiled steps")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    parser.add_argument("--batch-tokens", type=int, default=4096)
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--ffn", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--dropout", type=float, default=0.3, help="the recipe's 0.3")
    # The recipe's dropout rates (an earlier published profile ran with 0 for both).
    parser.add_argument("--attn-dropout", type=float, default=0.1)
    parser.add_argument("--ffn-dropout", type=float, default=0.1)
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="bf16")
    parser.add_argument("--model", choices=["ours", "baseline"], default="ours")
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--top", type=int, default=15, help="also list the costliest N operators")
    parser.add_argument(
        "--cache-dir", type=Path, default=Path(tempfile.gettempdir()) / "transformer-mt-bench"
    )
    args = parser.parse_args()
    keep_freed_memory()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    device = torch.device("cpu")

    src, trg, corpus = load_pairs()
    tok = cached_tokenizer(src, trg, args.vocab, args.cache_dir)
    batches, _ = build_batches(
        tok.encode_batch(src), tok.encode_batch(trg), args.batch_tokens,
        args.warmup + 2 * args.steps,
    )  # fmt: skip
    warm = batches[: args.warmup]
    plain, profiled = batches[args.warmup :: 2], batches[args.warmup + 1 :: 2]
    torch.manual_seed(0)
    model = (ours if args.model == "ours" else baseline)(args, tok.vocab_size).to(device).train()
    opt = torch.optim.AdamW(  # as `mt train` builds it (weight decay 0: Adam)
        model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9, weight_decay=0.0, fused=True
    )
    c = Contender(args.model, model, opt, [])
    step = make_profiled_step(device, args.precision)

    for b in warm:
        step(c, b)
    # Unprofiled step time: the batches between the profiled ones (same length distribution).
    plain_s: list[float] = []
    for b in plain:
        with timer(plain_s):
            step(c, b)
    wall_s: list[float] = []
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for i, b in enumerate(profiled):
            with timer(wall_s), record_function(f"{_STEP}{i}"):
                step(c, b)
    n = len(profiled)
    tokens = sum(int((out != PAD_ID).sum()) for _, _, out in profiled) / n

    # Self time per (step, family): the table shows each family's median over the steps (this
    # machine's neighbours slow some steps down; a median keeps one slow step from moving a row).
    per_step: list[dict[str, float]] = [defaultdict(float) for _ in range(n)]
    loss_mm = [0.0] * n
    by_op: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for e in prof.events():
        self_us = e.self_cpu_time_total
        i = step_index(e)
        if self_us <= 0 or i is None or e.name.startswith(_STEP):
            continue  # the step range's own self time is what no operator accounts for
        per_step[i][family(e)] += self_us / 1e3
        if is_loss_matmul(e):
            loss_mm[i] += self_us / 1e3
        by_op[e.name][0] += self_us
        by_op[e.name][1] += 1
    step_ms = 1e3 * statistics.median(wall_s)
    rows = [(f, statistics.median(s.get(f, 0.0) for s in per_step)) for f in FAMILIES]
    untracked = [1e3 * w - sum(s.values()) for w, s in zip(wall_s, per_step, strict=True)]
    rows.append(("untracked (Python, autograd engine, profiler)", statistics.median(untracked)))

    print(f"data: {corpus}; {n} profiled steps of ~{tokens:,.0f} target tokens")
    print(
        f"model: {args.model}, d_model {args.d_model}, {args.layers}+{args.layers} layers, "
        f"{args.heads} heads, ffn {args.ffn}, dropout {args.dropout} (attention "
        f"{args.attn_dropout}, ffn {args.ffn_dropout}), {args.precision}; "
        f"{torch.get_num_threads()} threads; torch {torch.__version__}"
    )
    plain_ms = 1e3 * statistics.median(plain_s)
    plain_tokens = sum(int((out != PAD_ID).sum()) for _, _, out in plain) / len(plain)
    print(
        f"unprofiled step: median {plain_ms:.0f} ms, {plain_tokens / statistics.mean(plain_s):,.0f}"
        f" target tok/s; profiled step: median {step_ms:.0f} ms"
    )
    width = max(len(f) for f, _ in rows)
    print(f"\n{'family':<{width}} | ms/step | % of step")
    print("-" * (width + 22))
    for f, ms in rows:
        print(f"{f:<{width}} | {ms:7.1f} | {100 * ms / step_ms:8.1f}%")
        if f == LOSS and any(loss_mm):
            sub = statistics.median(loss_mm)
            label = "  of it: matrix products"
            print(f"{label:<{width}} | {sub:7.1f} | {100 * sub / step_ms:8.1f}%")
    print(f"{'step (profiled wall time, median)':<{width}} | {step_ms:7.1f} | {100.0:8.1f}%")
    print(f"(rows: medians over the {n} profiled steps, so they need not add up to the step)")
    if args.top:
        print(f"\ncostliest {args.top} operators by self time (ms/step, calls/step):")
        ops = sorted(by_op.items(), key=lambda kv: -kv[1][0])[: args.top]
        for name, (us, calls) in ops:
            print(f"  {us / 1e3 / n:7.1f}  {calls / n:6.0f}  {name}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
