"""Decoding throughput on CPU (median of several runs), in two modes.

What users run: a trained checkpoint and a real source file, translated in batches of --batch
lines by each engine in turn (alternating run by run, each engine in a process of its own), with
BLEU beside tokens/s so that a faster search that translates worse shows: ours in fp32 (as `mt
translate` loads it: linear layers on oneDNN-packed weights), in fp32 by nn.Linear's own products
("unpacked", the baseline of that change) and in int8, and, where ctranslate2 is installed, the
same weights exported to CTranslate2 float32 and int8:

    python scripts/bench_decode.py --checkpoint runs/m30k/last.pt \
        --src data/multi30k/test_2016_flickr.de --ref data/multi30k/test_2016_flickr.en --beam 4

Random weights (no --src), greedy and beam search with and without the key/value cache:

    python scripts/bench_decode.py                      # random weights, batch 32, 32-piece sources
    python scripts/bench_decode.py --threads 1 --runs 7

A random-weight model rarely emits EOS, so it decodes close to the length limit (a + b * source
length); that is fine for throughput, and the table reports the tokens actually produced: those of
each sentence's best hypothesis, its EOS counted. Goal: the cache >= 5x faster at beam 4
for sentences of 30 or more tokens.
"""

import argparse
import dataclasses
import itertools
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
    from transformer_mt.inference import load_for_inference

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
    from transformer_mt.inference.loading import pack_linear_layers

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
    # so that options a trained checkpoint (or a real source file) makes moot can be refused.
    shape_defaults = {"d_model": 256, "layers": 3, "heads": 4, "ffn": 1024, "vocab": 8000}
    search_defaults = {"src_len": 32, "max_len_a": 0.0, "max_len_b": 1.0}
    parser.add_argument("--src-len", type=int, help="source pieces (EOS not counted; default 32)")
    parser.add_argument("--d-model", type=int, help="random weights: model width (default 256)")
    parser.add_argument("--layers", type=int,
                        help="random weights: encoder and decoder layers (default 3)")  # fmt: skip
    parser.add_argument("--heads", type=int, help="random weights: attention heads (default 4)")
    parser.add_argument("--ffn", type=int, help="random weights: FFN width (default 1024)")
    parser.add_argument("--vocab", type=int, help="random weights: vocabulary (default 8000)")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--max-len-a", type=float,
                        help="target limit a + b * src (default a 0, b 1)")  # fmt: skip
    parser.add_argument("--max-len-b", type=float)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    parser.add_argument("--checkpoint", type=Path, help="a trained model instead of random weights")
    parser.add_argument("--src", type=Path, help="with --checkpoint: a source file to translate")
    parser.add_argument("--ref", type=Path, help="with --src: its references (BLEU)")
    parser.add_argument("--no-ct2", action="store_true", help="leave out the CTranslate2 rows")
    parser.add_argument(
        "--continuous",
        action="store_true",
        help="with --src: also ours fp32 with continuous batching, --batch sentences in flight",
    )
    args = parser.parse_args()

    def refuse(names: dict, why: str) -> None:
        given = [f"--{n.replace('_', '-')}" for n in names if getattr(args, n) is not None]
        if given:
            parser.error(f"{', '.join(given)}: {why}")

    if args.checkpoint is not None:
        refuse(shape_defaults, "the model's shape comes from --checkpoint; leave them out")
    if args.src is not None:
        if args.checkpoint is None:
            parser.error("--src needs --checkpoint")
        refuse(
            search_defaults,
            "with --src the sources are the file's lines and the length limit is the "
            "checkpoint's decode setting; leave them out",
        )
    else:
        for flag, given in (("--ref", args.ref is not None), ("--continuous", args.continuous)):
            if given:
                parser.error(f"{flag} needs --src (and --checkpoint)")
    for name, value in (shape_defaults | search_defaults).items():
        if getattr(args, name) is None:
            setattr(args, name, value)

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    if args.src is not None:
        real_data(parser, args)
        return
    model = load_checkpoint_model(args.checkpoint) if args.checkpoint else random_model(args)
    model = model.eval().cpu()
    max_len = model.positions.max_len
    if not 0 <= args.src_len < max_len:
        parser.error(
            f"--src-len {args.src_len}: a source of {args.src_len} pieces + EOS must fit the "
            f"model's {max_len} positions (0 to {max_len - 1})"
        )
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


def real_data(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Each engine translates ``args.src`` in batches of ``args.batch`` lines, in turn per run.

    Every engine runs in a process of its own (started once, warmed up, then asked for one run at
    a time, in turn): CTranslate2 and torch each bring an OpenMP thread pool, and in one process
    they slow each other down. Measured here (2 threads, beam 4): ours fp32 took 8.65 s alone and
    10.0-10.6 s with CTranslate2 models in the same process; ours int8 3.89 s against 6.0-6.8 s.
    """
    import multiprocessing
    import tempfile

    from transformer_mt.errors import MTError
    from transformer_mt.evaluation import check_same_length, score_all
    from transformer_mt.fileio import read_lines
    from transformer_mt.inference import load_for_inference

    try:
        lines = read_lines(args.src)
        refs = read_lines(args.ref) if args.ref else None
        if refs is not None:  # before any decoding: BLEU pairs lines up one to one
            check_same_length(lines, str(args.src), [refs], [str(args.ref)])
    except MTError as err:
        parser.error(str(err))
    loaded = load_for_inference(args.checkpoint)
    # int8: `mt translate --quantize int8`; "unpacked": fp32 by nn.Linear's own products, as
    # before the packed oneDNN ones (transformer_mt/inference/loading.py, PackedLinear)
    names = ["ours fp32", "ours fp32 unpacked", "ours int8"]
    if args.continuous:
        names.insert(1, "ours continuous")
    context = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory() as tmp:
        if not args.no_ct2:
            names += export_ct2(loaded, Path(tmp))
        workers = {}
        for name in names:
            parent, child = context.Pipe()
            process = context.Process(target=engine_worker, args=(child, name, args, Path(tmp)))
            process.start()
            workers[name] = (process, parent)
        seconds: dict[str, list[float]] = {name: [] for name in names}
        outputs: dict[str, list[str]] = {}
        try:
            for _ in range(args.runs + 1):  # the first run of each engine is an untimed warm-up
                for name, (_, conn) in workers.items():
                    conn.send("run")
                    elapsed, outputs[name] = conn.recv()
                    seconds[name].append(elapsed)
        finally:
            for process, conn in workers.values():
                conn.send("stop")
                process.join()
    print(
        f"{args.checkpoint}, {args.src} ({len(lines)} lines), beam {args.beam}, batches of "
        f"{args.batch} lines, CPU, {args.threads or 'default'} threads, one process per engine, "
        f"median of {args.runs} runs"
    )
    print(f"{'engine':<18} {'seconds':>8} {'tokens':>7} {'tokens/s':>9} {'vs ours':>8} {'BLEU':>6}")
    base = None
    for name, times in seconds.items():
        median = statistics.median(times[1:])
        # Target pieces of each output plus its EOS, counted alike for every engine.
        tokens = sum(len(loaded.trg_tok.encode(h)) + 1 for h in outputs[name] if h)
        rate = tokens / median
        base = base or rate
        bleu = f"{score_all(outputs[name], [refs]).bleu:6.2f}" if refs else "     -"
        print(f"{name:<18} {median:8.2f} {tokens:7d} {rate:9.1f} {rate / base:7.2f}x {bleu}")


def export_ct2(loaded, directory: Path) -> list[str]:
    """CTranslate2 float32 and int8 exports of the same weights under ``directory``; their engine
    names (none without the ct2 extra)."""
    try:
        from transformer_mt.inference.export import export_ctranslate2, import_ctranslate2

        import_ctranslate2()
    except Exception as err:  # the ct2 extra is optional
        print(f"(no CTranslate2 rows: {err})")
        return []
    for quantization in ("float32", "int8"):
        export_ctranslate2(loaded, directory / quantization, quantization)
    return ["ct2 float32", "ct2 int8"]


def engine_worker(conn, name: str, args: argparse.Namespace, directory: Path) -> None:
    """One engine in its own process: translate the chunks of ``args.src`` whenever asked "run",
    answering (seconds, outputs); stop at "stop"."""
    from transformer_mt.fileio import read_lines
    from transformer_mt.inference import load_for_inference, translate_lines

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    quantization = "int8" if name == "ours int8" else None
    loaded = load_for_inference(
        args.checkpoint, quantization=quantization, pack=name != "ours fp32 unpacked"
    )
    # One batch per chunk of lines, for every engine: the chunks are the batches.
    decode = dataclasses.replace(
        loaded.config.decode, beam_size=args.beam, nbest=1, batch_tokens=10**9
    )
    lines = read_lines(args.src)
    chunks = [lines[i : i + args.batch] for i in range(0, len(lines), args.batch)]
    if name.startswith("ct2"):
        from transformer_mt.inference.ct2 import load_ct2, translate_lines_ct2

        model = load_ct2(directory / name.split()[1], threads=torch.get_num_threads())

        def translate(chunk: list[str]) -> list[str]:
            return [r[0][0] for r in translate_lines_ct2(model, chunk, decode)]
    elif name == "ours continuous":
        from transformer_mt.decoding.text import encode_sources

        sources = encode_sources(loaded.src_tok, lines, loaded.model.positions.max_len)
        chunks = [list(sources.items())]  # one run: the whole file through one search

        def translate(chunk: list[tuple[int, list[int]]]) -> list[str]:
            return continuous_run(loaded, chunk, decode, args.batch, len(lines))
    else:
        ours = loaded.model

        def translate(chunk: list[str]) -> list[str]:
            src_tok, trg_tok = loaded.src_tok, loaded.trg_tok
            return [r[0][0] for r in translate_lines(ours, src_tok, trg_tok, chunk, decode)]

    while conn.recv() == "run":
        start = time.perf_counter()
        outputs = [hyp for chunk in chunks for hyp in translate(chunk)]
        conn.send((time.perf_counter() - start, outputs))


def continuous_run(loaded, sources, decode, in_flight: int, n_lines: int) -> list[str]:
    """Translate ``sources`` ((line, ids) pairs) through one continuous search that keeps
    ``in_flight`` sentences decoding: each sentence that is done is replaced by the next one at
    the following step, as a server with ``in_flight`` clients would see them; texts by line."""
    from transformer_mt.decoding.continuous import ContinuousSearch

    search = ContinuousSearch(loaded.model, decode.beam_size)
    texts = [""] * n_lines
    todo = iter(sources)
    for line, ids in itertools.islice(todo, in_flight):
        search.add(line, ids, decode)
    while search.running or search.queued:
        for line, result in search.step():
            texts[line] = loaded.trg_tok.decode(result.tokens)
            nxt = next(todo, None)
            if nxt is not None:
                search.add(nxt[0], nxt[1], decode)
    return texts


if __name__ == "__main__":
    main()
