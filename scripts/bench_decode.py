"""Decoding throughput of our search on random weights: greedy and beam, with and without the
key/value cache (median of several runs, CPU).

    python scripts/bench_decode.py                      # random weights, batch 32, 32-piece sources
    python scripts/bench_decode.py --threads 1 --runs 7
    python scripts/bench_decode.py --checkpoint runs/m30k/last.pt   # a trained model's weights

A random-weight model rarely emits EOS, so it decodes close to the length limit (a + b * source
length); that is fine for throughput, and the table reports the tokens actually produced: those of
each sentence's best hypothesis, its EOS counted. Goal: the cache >= 5x faster at beam 4
for sentences of 30 or more tokens.

Real source files, BLEU beside speed, and the comparison with CTranslate2 (each engine alone in a
fresh process, engines alternating): scripts/bench_decode_fair.py.
"""

import argparse
import dataclasses
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from transformer_mt.config import DecodeConfig, ModelConfig
from transformer_mt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from transformer_mt.decoding import DecodeResult, beam_search, greedy_search
from transformer_mt.model import Transformer, model_args


def load_checkpoint_model(path: Path) -> Transformer:
    """A trained model from a checkpoint written by `mt train` (eval mode, CPU)."""
    from transformer_mt.engines import load_for_inference

    return load_for_inference(path).model


def random_model(args: argparse.Namespace) -> Transformer:
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
    return pack_linear_layers(model.eval())  # the products a loaded checkpoint runs


def random_sources(vocab: int, batch: int, src_len: int, seed: int = 0) -> torch.Tensor:
    """``batch`` sources of ``src_len`` random pieces plus EOS: (batch, src_len + 1)."""
    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(EOS_ID + 1, vocab, (batch, src_len + 1), generator=gen)
    src[:, -1] = EOS_ID
    return src


def produced_tokens(results: list[DecodeResult]) -> int:
    """Target tokens of the best hypotheses, EOS included where one was emitted."""
    return sum(len(r.tokens) + int(r.nbest[0].finished) for r in results)


def bench(search: Callable[[], list[DecodeResult]], runs: int) -> tuple[float, int]:
    """Median seconds over ``runs`` timed runs (after one untimed warm-up) and tokens per run."""
    tokens = produced_tokens(search())  # warm-up: allocator, kernels, lazy init
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        search()
        times.append(time.perf_counter() - start)
    return statistics.median(times), tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="timed runs per setting (median)")
    parser.add_argument("--batch", type=int, default=32, help="sentences per batch")
    # Defaults of the options that shape a random-weight model or its search; None until then,
    # so that options a trained checkpoint makes moot can be refused.
    shape_defaults = {"d_model": 256, "layers": 3, "heads": 4, "ffn": 1024, "vocab": 8000}
    search_defaults = {"src_len": 32, "max_len_a": 0.0, "max_len_b": 1.0}
    parser.add_argument("--src-len", type=int, help="source pieces (EOS not counted; default 32)")
    parser.add_argument("--d-model", type=int, help="random weights: model width (default 256)")
    parser.add_argument(
        "--layers", type=int, help="random weights: encoder and decoder layers (default 3)"
    )
    parser.add_argument("--heads", type=int, help="random weights: attention heads (default 4)")
    parser.add_argument("--ffn", type=int, help="random weights: FFN width (default 1024)")
    parser.add_argument("--vocab", type=int, help="random weights: vocabulary (default 8000)")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument(
        "--max-len-a", type=float, help="target limit a + b * src (default a 0, b 1)"
    )
    parser.add_argument("--max-len-b", type=float)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    parser.add_argument("--checkpoint", type=Path, help="a trained model instead of random weights")
    args = parser.parse_args()

    def refuse(names: dict, why: str) -> None:
        given = [f"--{n.replace('_', '-')}" for n in names if getattr(args, n) is not None]
        if given:
            parser.error(f"{', '.join(given)}: {why}")

    if args.checkpoint is not None:
        refuse(shape_defaults, "the model's shape comes from --checkpoint; leave them out")
    for name, value in (shape_defaults | search_defaults).items():
        if getattr(args, name) is None:
            setattr(args, name, value)

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    model = load_checkpoint_model(args.checkpoint) if args.checkpoint else random_model(args)
    model = model.eval().cpu()
    max_len = model.positions.max_len
    if not 0 <= args.src_len < max_len:
        parser.error(
            f"--src-len {args.src_len}: a source of {args.src_len} pieces + EOS must fit the "
            f"model's {max_len} positions (0 to {max_len - 1})"
        )
    cache_table(model, args)


def cache_table(model: Transformer, args: argparse.Namespace) -> None:
    """Greedy and beam search on random sources, with and without the key/value cache: seconds,
    tokens and tokens/s of each, and the cache's speed-up."""
    vocab = model.src_emb.num_embeddings
    src = random_sources(vocab, args.batch, args.src_len)
    greedy = DecodeConfig(beam_size=1, max_len_a=args.max_len_a, max_len_b=args.max_len_b)
    beam = dataclasses.replace(greedy, beam_size=args.beam)
    print(
        f"CPU, {torch.get_num_threads()} threads, torch {torch.__version__}; batch {args.batch}, "
        f"source {args.src_len}+EOS pieces, target limit {args.max_len_a:g} + "
        f"{args.max_len_b:g} * {args.src_len + 1}; median of {args.runs} runs"
    )
    print(f"{'search':<8} {'cache':<6} {'seconds':>8} {'tokens':>7} {'tokens/s':>9}")
    speed: dict[tuple[str, bool], float] = {}
    for name in ("greedy", f"beam {args.beam}"):
        for use_cache in (True, False):
            if name == "greedy":
                run = lambda c=use_cache: greedy_search(model, src, greedy, use_cache=c)  # noqa: E731
            else:
                run = lambda c=use_cache: beam_search(model, src, beam, use_cache=c)  # noqa: E731
            seconds, tokens = bench(run, args.runs)
            speed[name, use_cache] = tokens / seconds
            cache = "yes" if use_cache else "no"
            print(f"{name:<8} {cache:<6} {seconds:8.3f} {tokens:7d} {tokens / seconds:9.1f}")
    for name in ("greedy", f"beam {args.beam}"):
        print(f"cache speed-up, {name}: {speed[name, True] / speed[name, False]:.1f}x")


if __name__ == "__main__":
    main()
