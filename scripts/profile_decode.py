"""Where a decoding step goes: model time against search bookkeeping, and operators by family.

    python scripts/profile_decode.py --checkpoint runs/m30k40/last.pt \
        --src data/multi30k/test_2016_flickr.de --beam 4 --batch 32 --threads 2

Translates the source file in batches of ``--batch`` lines in file order, or with
``--batch-tokens`` in the batches `mt translate` makes (sorted by length, a budget of padded source
tokens), with our beam search (tokenization excluded), timing each part of a run with a wall
clock:

- encoder: ``ModelState.start`` (embeddings and encoder layers, once per batch);
- decoder: ``Transformer.decode`` inside each step (layers, cache appends, output projection);
- log-softmax: the rest of ``ModelState.log_probs`` (log-softmax, the PAD/BOS mask);
- cache moves: ``ModelState.select`` / ``reorder_beams`` (gathers after beams move or sentences end);
- search: everything else, i.e. the Python and small tensor operations of the search itself.

Then one more run under ``torch.profiler`` gives self CPU time by operator family. Medians of
``--runs`` runs for the wall-clock split; the profiler's own overhead inflates small operators, so
its table says where time goes, not how long a step takes.
"""

import argparse
import dataclasses
import fnmatch
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import torch

from transformer_mt.decoding import beam_search
from transformer_mt.decoding.state import ModelState
from transformer_mt.model import Transformer

PARTS = ("encoder", "decoder", "log-softmax", "cache moves", "search")

# Operator families for the profiler table. An operator's name is reduced to its base (namespace
# and surrounding underscores dropped: "aten::clamp_min_" -> "clamp_min", "aten::__and__" -> "and",
# "mkldnn::_linear_pointwise" -> "linear_pointwise"), which must equal a pattern; a "*" in one
# stands for any characters (fnmatch). The first family with a matching pattern wins.
# A table: one family a line, its op names filled to the width (the formatter would put one name
# a line, 150 lines).
FAMILIES = (
    ("matrix products", ("addmm", "mm", "bmm", "baddbmm", "addbmm", "matmul", "linear",
                         "linear_pointwise", "linear_dynamic*", "linear_prepack*",
                         "reorder_linear_weight", "mkldnn_linear", "mkl_linear")),
    ("attention (SDPA)", ("scaled_dot_product*", "*flash_attention*", "*efficient_attention*")),
    ("softmax / log-softmax", ("softmax", "log_softmax")),
    ("layer norm", ("layer_norm", "native_layer_norm")),
    ("top-k / sort", ("topk", "sort", "argsort")),
    ("gathers / index", ("index_select", "gather", "index", "index_put", "index_fill",
                         "index_copy", "index_add", "scatter*", "take_along_dim", "masked_fill",
                         "masked_select", "masked_scatter", "nonzero", "nonzero_numpy",
                         "where")),
    ("copies / new tensors", ("cat", "stack", "copy", "to_copy", "to", "clone", "contiguous",
                                "repeat", "repeat_interleave", "empty", "empty_like",
                                "empty_strided", "new_empty*", "zeros", "zeros_like", "new_zeros",
                                "ones", "ones_like", "full", "full_like", "new_full", "fill",
                                "zero", "arange", "resize", "lift_fresh")),
    ("elementwise", ("add", "mul", "div", "sub", "rsub", "neg", "abs", "relu", "gelu", "exp",
                     "log", "sqrt", "rsqrt", "pow", "addcmul", "addcdiv", "eq", "ne", "lt",
                     "le", "ge", "gt", "clamp", "clamp_min", "clamp_max", "floor",
                     "floor_divide", "remainder", "fmod", "isfinite", "isnan", "isinf",
                     "logical_*", "bitwise_*", "and", "or", "xor", "invert")),
    ("embedding", ("embedding", "embedding_bag")),
    ("views / metadata", ("view", "view_as", "unsafe_view", "reshape", "reshape_alias",
                          "transpose", "t", "permute", "slice", "select", "split",
                          "split_with_sizes", "unsafe_split", "chunk", "narrow", "unbind",
                          "squeeze", "unsqueeze", "expand", "expand_as", "flatten", "unflatten",
                          "alias", "as_strided", "detach", "resolve_conj", "resolve_neg",
                          "qscheme", "q_per_channel_*", "q_scale", "q_zero_point")),
    ("reductions", ("sum", "max", "min", "amax", "amin", "argmax", "argmin", "any", "all",
                    "mean", "prod", "cumsum", "logsumexp", "norm")),
    ("scalar reads (.item())", ("item", "local_scalar_dense", "is_nonzero")),
)  # fmt: skip


class Clock:
    """Seconds spent per part, with nesting: a part's time excludes the parts inside it."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self._stack: list[list] = []

    def wrap(self, part: str, fn: Callable) -> Callable:
        def timed(*args, **kwargs):
            start = time.perf_counter()
            self._stack.append([part, 0.0])
            try:
                return fn(*args, **kwargs)
            finally:
                _, inner = self._stack.pop()
                elapsed = time.perf_counter() - start
                self.seconds[part] += elapsed - inner
                if self._stack:
                    self._stack[-1][1] += elapsed

        return timed


def instrument(clock: Clock) -> None:
    """Wrap the model and decoder-state methods that the parts are made of (this process only)."""
    ModelState.start = classmethod(clock.wrap("encoder", ModelState.start.__func__))
    ModelState.log_probs = clock.wrap("log-softmax", ModelState.log_probs)
    Transformer.decode = clock.wrap("decoder", Transformer.decode)
    ModelState.select = clock.wrap("cache moves", ModelState.select)
    ModelState.reorder_beams = clock.wrap("cache moves", ModelState.reorder_beams)


def family(name: str) -> str:
    """The family of a profiler event key such as "aten::index_select" ("other" if none)."""
    base = name.rsplit("::", 1)[-1].strip("_").lower()
    for label, patterns in FAMILIES:
        if any(fnmatch.fnmatchcase(base, p) for p in patterns):
            return label
    return "other"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--src", type=Path, required=True, help="source file, one line each")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--batch", type=int, default=32, help="lines per batch, in file order")
    parser.add_argument(
        "--batch-tokens",
        type=int,
        help="batches as `mt translate` makes them instead: sorted by length, this many padded "
        "source tokens each (the checkpoint's decode.batch_tokens: 4,096 in the recipes)",
    )
    parser.add_argument("--runs", type=int, default=3, help="timed runs (median)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    parser.add_argument("--quantize", choices=["int8"], help="dynamic int8 linear layers")
    parser.add_argument(
        "--precision",
        choices=["auto", "fp32", "bf16"],
        help="the linear layers' products (default: the checkpoint's decode.precision)",
    )
    parser.add_argument(
        "--no-pack",
        action="store_true",
        help="fp32 by nn.Linear's own products, not oneDNN's packed ones",
    )
    args = parser.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)

    from transformer_mt.data.batching import longest_first_batches, pad_batch
    from transformer_mt.decoding.text import encode_sources
    from transformer_mt.engines import load_for_inference
    from transformer_mt.fileio import read_lines

    loaded = load_for_inference(
        args.checkpoint, quantization=args.quantize, pack=not args.no_pack, precision=args.precision
    )
    model = loaded.model
    decode = dataclasses.replace(loaded.config.decode, beam_size=args.beam, nbest=1)
    lines = read_lines(args.src)
    sources = list(encode_sources(loaded.src_tok, lines, model.positions.max_len).values())
    if args.batch_tokens:
        lengths = [len(ids) for ids in sources]
        order = [b.tolist() for b in longest_first_batches(lengths, args.batch_tokens)]
        how = f"batches of {args.batch_tokens} source tokens, sorted by length"
    else:
        order = [
            list(range(i, min(i + args.batch, len(sources))))
            for i in range(0, len(sources), args.batch)
        ]
        how = f"batches of {args.batch} lines in file order"
    batches = [pad_batch([sources[i] for i in rows], model.src_pad_idx) for rows in order]

    def run() -> int:
        tokens = 0
        for src in batches:
            for result in beam_search(model, src, decode):
                tokens += len(result.tokens) + int(result.nbest[0].finished)
        return tokens

    tokens = run()  # warm-up
    clock = Clock()
    instrument(clock)
    totals, splits = [], []
    for _ in range(args.runs):
        clock.seconds.clear()
        start = time.perf_counter()
        run()
        total = time.perf_counter() - start
        split = dict(clock.seconds)
        split["search"] = total - sum(split.values())
        totals.append(total)
        splits.append(split)
    total = statistics.median(totals)
    print(
        f"{args.checkpoint}, {args.src} ({len(lines)} lines), beam {args.beam}, {how}, "
        f"linear layers in {loaded.precision} ({loaded.precision_why}), "
        f"{torch.get_num_threads()} threads, median of {args.runs} runs"
    )
    print(f"total {total:.2f} s, {tokens} target tokens, {tokens / total:.0f} tokens/s")
    print(f"{'part':<14} {'seconds':>8} {'share':>7}")
    for part in PARTS:
        seconds = statistics.median(s.get(part, 0.0) for s in splits)
        print(f"{part:<14} {seconds:8.2f} {100 * seconds / total:6.1f}%")

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        run()
    by_family: dict[str, float] = defaultdict(float)
    for event in prof.key_averages():
        by_family[family(event.key)] += event.self_cpu_time_total / 1e6
    profiled = sum(by_family.values())
    print(f"\nprofiler: self CPU time by operator family ({profiled:.2f} s under the profiler)")
    print(f"{'family':<24} {'seconds':>8} {'share':>7}")
    for label, seconds in sorted(by_family.items(), key=lambda kv: -kv[1]):
        print(f"{label:<24} {seconds:8.2f} {100 * seconds / profiled:6.1f}%")
    print("\ntop operators (self CPU):")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))


if __name__ == "__main__":
    main()
