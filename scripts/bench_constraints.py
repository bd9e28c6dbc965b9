"""Throughput of lexically constrained beam search: sentences/s with 0, 1, 3 and 10 constraints
a sentence, beside plain beam search on the same sources (median of several runs; CPU, or
``--device cuda``).

    python scripts/bench_constraints.py                     # random weights, batch 32, beam 4
    python scripts/bench_constraints.py --threads 2 --runs 5 --beam 5
    python scripts/bench_constraints.py --checkpoint runs/m30k/last.pt   # a trained model
    python scripts/bench_constraints.py --device cuda --batch 128

Sources are random pieces (``--src-len`` + EOS), the same for every setting; each constraint is
1-3 random target pieces (ids past the specials, language tags excluded), drawn once per setting
with a fixed seed. The baseline is plain beam search (``constraints=None``) on the same batch;
each timed run of a setting alternates baseline and constrained search, so that both see the same
machine. 0 constraints passes empty lists: the plain search's path, so its ratio shows what
the hook costs (nothing but noise). A constrained search raises each sentence's length budget
to fit its constraint tokens and EOS, so with many constraints it may run more steps than the
baseline; the table gives the tokens of each best hypothesis (EOS included) beside the speed.
"""

import argparse
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from transformer_mt.config import DecodeConfig, ModelConfig
from transformer_mt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from transformer_mt.decoding import DecodeResult, search
from transformer_mt.host_memory import keep_freed_memory
from transformer_mt.model import Transformer, model_args

COUNTS = (0, 1, 3, 10)  # constraints per sentence


def random_model(args: argparse.Namespace) -> Transformer:
    """A random-weight model of the shape the options give (eval mode, no dropout); for a CPU,
    its linear layers packed as `mt translate` runs them there."""
    shape = ModelConfig(
        d_model=args.d_model,
        n_head=args.heads,
        ffn_hidden=args.ffn,
        n_layers=args.layers,
        drop_prob=0.0,
        max_len=256,
        tie_embeddings=True,
        share_embeddings=False,
    )
    from transformer_mt.engines.loading import pack_linear_layers

    torch.manual_seed(0)
    model = Transformer(**model_args(shape, args.vocab, args.vocab, pad_idx=PAD_ID, bos_idx=BOS_ID))
    model = model.eval()
    return pack_linear_layers(model) if args.device == "cpu" else model


def checkpoint_model(path: Path, device: str) -> Transformer:
    """A trained model from a checkpoint written by `mt train` (eval mode, on ``device``, its
    products as `mt translate` runs them)."""
    from transformer_mt.engines import load_for_inference

    return load_for_inference(path, device).model


def random_sources(vocab: int, batch: int, src_len: int) -> torch.Tensor:
    """``batch`` sources of ``src_len`` random pieces plus EOS: (batch, src_len + 1)."""
    gen = torch.Generator().manual_seed(0)
    src = torch.randint(EOS_ID + 1, vocab, (batch, src_len + 1), generator=gen)
    src[:, -1] = EOS_ID
    return src


def random_constraints(
    model: Transformer, batch: int, count: int, seed: int = 0
) -> list[list[list[int]]]:
    """``count`` constraints of 1-3 random target pieces for each of ``batch`` sentences."""
    rng = random.Random(seed)
    vocab = model.config.dec_voc_size
    never = set(model.never_emit)
    ids = [i for i in range(EOS_ID + 1, vocab) if i not in never]
    return [
        [[rng.choice(ids) for _ in range(rng.randint(1, 3))] for _ in range(count)]
        for _ in range(batch)
    ]


def produced_tokens(results: list[DecodeResult]) -> int:
    """Target tokens of the best hypotheses, EOS included where one was emitted."""
    return sum(len(r.tokens) + int(r.nbest[0].finished) for r in results)


def timed(run: Callable[[], list[DecodeResult]]) -> float:
    """Seconds one call of ``run`` takes."""
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def bench_pair(
    base: Callable[[], list[DecodeResult]], constrained: Callable[[], list[DecodeResult]], runs: int
) -> tuple[float, float, int, int]:
    """Median seconds of ``base`` and ``constrained`` over ``runs`` alternating timed runs
    (after one untimed warm-up of each), and the tokens of each one's output."""
    base_tokens, cons_tokens = produced_tokens(base()), produced_tokens(constrained())
    base_times, cons_times = [], []
    for _ in range(runs):
        base_times.append(timed(base))
        cons_times.append(timed(constrained))
    return statistics.median(base_times), statistics.median(cons_times), base_tokens, cons_tokens


def cpu_name() -> str:
    """The CPU's model name (Linux), else "CPU"."""
    try:
        with open("/proc/cpuinfo") as info:
            return next(line.split(":", 1)[1].strip() for line in info if "model name" in line)
    except (OSError, StopIteration):
        return "CPU"


def table(model: Transformer, args: argparse.Namespace) -> None:
    """One line per constraint count: sentences/s of plain and constrained beam search."""
    src = random_sources(model.src_emb.num_embeddings, args.batch, args.src_len).to(args.device)
    decode = DecodeConfig(beam_size=args.beam, max_len_a=args.max_len_a, max_len_b=args.max_len_b)
    where = cpu_name() if args.device == "cpu" else torch.cuda.get_device_name(args.device)
    print(
        f"{where}, {torch.get_num_threads()} CPU threads, torch {torch.__version__}; batch "
        f"{args.batch}, source {args.src_len}+EOS random pieces, beam {args.beam}, target limit "
        f"{args.max_len_a:g} + {args.max_len_b:g} * {args.src_len + 1}; median of {args.runs} runs"
    )
    print(
        f"{'constraints':>11} {'plain sent/s':>12} {'constr. sent/s':>14} {'ratio':>6} "
        f"{'plain tok':>9} {'constr. tok':>11}"
    )
    n = src.size(0)
    for count in COUNTS:
        terms = random_constraints(model, n, count)

        def base() -> list[DecodeResult]:
            return search(model, src, decode)

        def constrained(terms: list[list[list[int]]] = terms) -> list[DecodeResult]:
            return search(model, src, decode, constraints=terms)

        base_s, cons_s, base_tok, cons_tok = bench_pair(base, constrained, args.runs)
        print(
            f"{count:>11} {n / base_s:12.1f} {n / cons_s:14.1f} {base_s / cons_s:6.2f} "
            f"{base_tok:9d} {cons_tok:11d}"
        )
        sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="timed runs per setting (median)")
    parser.add_argument("--batch", type=int, default=32, help="sentences per batch")
    parser.add_argument("--src-len", type=int, default=20, help="source pieces, EOS not counted")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--max-len-a", type=float, default=0.0, help="target limit a + b * src")
    parser.add_argument("--max-len-b", type=float, default=1.0)
    parser.add_argument("--d-model", type=int, default=256, help="random weights: model width")
    parser.add_argument("--layers", type=int, default=3, help="random weights: layers per stack")
    parser.add_argument("--heads", type=int, default=4, help="random weights: attention heads")
    parser.add_argument("--ffn", type=int, default=1024, help="random weights: FFN width")
    parser.add_argument("--vocab", type=int, default=8000, help="random weights: vocabulary")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    parser.add_argument("--checkpoint", type=Path, help="a trained model instead of random weights")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    args = parser.parse_args()
    if args.beam < 2:
        parser.error("--beam: constrained search needs a beam of at least 2")
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    # As `mt translate` runs (engines.load_for_inference): freed memory is kept for reuse. Without
    # it, glibc's threshold for returning memory rises with the largest search so far, and the
    # baseline ran faster after a run with many constraints than before it.
    keep_freed_memory()
    if args.checkpoint:
        model = checkpoint_model(args.checkpoint, args.device)
    else:
        model = random_model(args).to(args.device)
    if not 0 < args.src_len < model.positions.max_len:
        parser.error(f"--src-len {args.src_len}: 1 to {model.positions.max_len - 1} pieces")
    table(model, args)


if __name__ == "__main__":
    main()
