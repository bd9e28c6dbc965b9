"""Decoding speed of our engine against CTranslate2 on equal terms, BLEU beside each figure.

    python scripts/bench_decode_fair.py --checkpoint runs/m30k/best.pt \
        --src test_2016_flickr.de --ref test_2016_flickr.en \
        --valid-src val.de --valid-ref val.en --beam 4 --batch 32 --threads 2 --runs 3

The CTranslate2 models are the checkpoint's `mt export` (float32 weights; each engine's
``compute_type`` at load). Every run of every engine is a process of its own, started for that run
and gone after it, holding nothing but its engine:

- ours: ``transformer_mt`` and torch; the checkpoint loaded as `mt translate` loads it (``--precision
  fp32`` for ours-fp32, ``bf16`` for ours-bf16, ``--quantize int8`` for ours-int8),
  ``torch.set_num_threads(--threads)``, lines through ``translate_lines``;
- CTranslate2: ``ctranslate2`` and ``sentencepiece`` only (never torch, never ``transformer_mt``:
  its report lists the packages it imported), ``Translator(inter_threads=1,
  intra_threads=--threads)``, lines through ``translate_batch``.

Engines alternate run by run (A B C D, then B C D A, ...), with a pause (--pause) before each run;
model loading (imports included) is outside the timed part and reported beside it. Each process
first translates the first --warmup lines untimed, then the whole --src file timed: sentencepiece
encoding, search and decoding to text, the same work for every engine. With --warm-pass it
translates the whole file once untimed before the timed pass: the steady state of a process that
has run a while (a server, a long file), where every kernel for the batch shapes of the file has
been built (oneDNN builds one per shape of a product, on first use) and its memory touched.

Two batchings, each its own table:

- chunks: the same chunks for every engine: lines sorted by source length (pieces), --batch lines a
  chunk, one call per chunk;
- preferred: each engine as its users run it on a file: ours with the checkpoint's
  ``decode.batch_tokens`` or --batch-tokens (our batcher, as `mt translate`), CTranslate2 with one
  ``translate_batch`` over the whole file, ``max_batch_size`` --ct2-batch-tokens (default: ours)
  and ``batch_type="tokens"``. Run it at a few sizes to find each engine's best.

Our length penalty is the checkpoint's ``decode.len_penalty`` (GNMT's); CTranslate2's is ``length **
alpha``, so the same alpha means other lengths: its alpha is the best BLEU of CTranslate2 float32
on the validation set over --len-penalty-grid (or --ct2-len-penalty, which skips the search).
Each sentence's length limit is ours (``a + b * source length``, capped by the position table);
CTranslate2 takes one limit per call (the call's largest) and its outputs are cut to their own.
Target tokens count the pieces of each output plus its EOS, alike for every engine.
"""

import argparse
import importlib.util
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

# Each engine: (kind of worker, what it loads as). "ours-continuous" runs in the preferred batching
# only: the whole file through one continuous search with --batch sentences in flight.
ENGINES = {
    "ours-fp32": ("ours", "fp32"),
    "ours-bf16": ("ours", "bf16"),
    "ours-int8": ("ours", "int8"),
    "ours-fp32-unpacked": ("ours", "unpacked"),
    "ours-continuous": ("ours", "continuous"),
    "ct2-float32": ("ct2", "float32"),
    "ct2-int8": ("ct2", "int8"),
    "ct2-int8_float32": ("ct2", "int8_float32"),
    "ct2-int8_bfloat16": ("ct2", "int8_bfloat16"),
    "ct2-bfloat16": ("ct2", "bfloat16"),
}
DEFAULT_ENGINES = [
    "ours-fp32",
    "ours-bf16",
    "ours-int8",
    "ct2-float32",
    "ct2-int8",
    "ct2-int8_float32",
]
BATCHINGS = ("chunks", "preferred")
BASELINE = "ct2-float32"
SCRIPT = Path(__file__).resolve()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, checked: files that exist, counts that make sense."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--checkpoint", type=Path, required=True, help="a checkpoint written by `mt train`")
    add("--src", type=Path, required=True, help="source file to translate, one line each")
    add("--ref", type=Path, help="its references (BLEU)")
    add("--valid-src", type=Path, help="validation sources: CTranslate2's length penalty search")
    add("--valid-ref", type=Path, help="validation references")
    add("--ct2-len-penalty", type=float, help="CTranslate2's length_penalty; skips the search")
    add("--len-penalty-grid", type=float, nargs="+", default=[0.6, 1.0, 1.4, 2.0])
    add("--beam", type=int, default=4, help="beam size (default 4)")
    add("--batch", type=int, default=32, help="lines per chunk in the chunks batching")
    add(
        "--batch-tokens",
        type=int,
        help="preferred batching: our decode.batch_tokens (default: the checkpoint's)",
    )
    add(
        "--ct2-batch-tokens",
        type=int,
        help="preferred batching: CTranslate2's max_batch_size in tokens (default: our batch_tokens)",
    )
    add("--threads", type=int, default=2, help="threads per engine (default 2)")
    add("--runs", type=int, default=3, help="timed runs per engine and batching (median)")
    add("--warmup", type=int, default=32, help="lines translated untimed before the timed run")
    add("--pause", type=float, default=2.0, help="seconds of rest before each run")
    add("--warm-pass", action="store_true",
        help="translate the whole file once untimed before the timed pass (steady state)")  # fmt: skip
    add("--engines", nargs="+", choices=list(ENGINES), default=DEFAULT_ENGINES)
    add("--batching", nargs="+", choices=BATCHINGS, default=list(BATCHINGS))
    add("--json", type=Path, help="also write every figure, output and worker report here")
    args = parser.parse_args(argv)
    for flag in ("checkpoint", "src", "ref", "valid_src", "valid_ref"):
        path = getattr(args, flag)
        if path is not None and not path.is_file():
            parser.error(f"--{flag.replace('_', '-')} {path}: no such file")
    uses_ct2 = any(ENGINES[e][0] == "ct2" for e in args.engines)
    if uses_ct2 and args.ct2_len_penalty is None and None in (args.valid_src, args.valid_ref):
        parser.error(
            "give --valid-src and --valid-ref (CTranslate2's length penalty is "
            "chosen on them), or --ct2-len-penalty"
        )
    if uses_ct2 and importlib.util.find_spec("ctranslate2") is None:
        parser.error(
            "ctranslate2 is not installed: pip install 'transformer-mt[ct2]' (in a checkout: "
            "pip install -e '.[ct2]'), or leave the ct2-* engines out of --engines"
        )
    for flag in ("beam", "batch", "threads", "runs", "batch_tokens", "ct2_batch_tokens"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            parser.error(f"--{flag} {getattr(args, flag)}: expected 1 or more")
    return args


# ----------------------------------------------------------------------------- workers


def worker_main(spec_path: str, report_path: str) -> None:
    """Run one engine as ``spec_path`` says and write its report (JSON) to ``report_path``."""
    spec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    started = time.perf_counter()
    if spec["kind"] == "prepare":
        report = prepare(spec)
    else:
        worker = ours_worker if spec["kind"] == "ours" else ct2_worker
        report = worker(spec, started)
    # The packages this process imported, by top-level name (private ones left out).
    report["packages"] = sorted({m.split(".")[0] for m in sys.modules if not m.startswith("_")})
    Path(report_path).write_text(json.dumps(report), encoding="utf-8")


def timed_run(translate, lines: list[str], spec: dict, started: float) -> dict:
    """Warm up on the first ``spec["warmup"]`` lines, then time ``translate`` over the run's
    work (``spec["chunks"]``: one call per chunk of line indices; else one call over all). With
    ``spec["warm_pass"]`` that work runs once untimed first; ``warmup_s`` counts it."""
    loaded = time.perf_counter()
    if spec["warmup"]:
        translate(lines[: spec["warmup"]])
    chunks = spec["chunks"] or [list(range(len(lines)))]
    for _ in range(1 + int(spec.get("warm_pass", False))):  # the last pass is the timed one
        warmed = time.perf_counter()
        outputs = [""] * len(lines)
        for chunk in chunks:
            for i, text in zip(chunk, translate([lines[i] for i in chunk]), strict=True):
                outputs[i] = text
        done = time.perf_counter()
    return {
        "load_s": loaded - started,
        "warmup_s": warmed - loaded,
        "seconds": done - warmed,
        "outputs": outputs,
    }


def ours_worker(spec: dict, started: float) -> dict:
    """Our engine: the checkpoint loaded as `mt translate` loads it, lines through
    ``translate_lines`` (or, for "continuous", one continuous search)."""
    import dataclasses

    import torch

    from transformer_mt.config import apply_overrides
    from transformer_mt.engines import load_for_inference, translate_lines

    torch.set_num_threads(spec["threads"])
    mode = spec["mode"]
    loaded = load_for_inference(
        spec["checkpoint"],
        quantization="int8" if mode == "int8" else None,
        pack=mode != "unpacked",
        precision=None if mode == "int8" else "bf16" if mode == "bf16" else "fp32",
    )
    settings = {"beam_size": spec["beam"], "nbest": 1, "batch_tokens": spec["batch_tokens"]}
    decode = apply_overrides(loaded.config.decode, settings)
    if spec["chunks"]:  # one batch per chunk: the chunks are the batches
        decode = dataclasses.replace(decode, batch_tokens=10**9)
    lines = read_plain_lines(spec["src"])

    def translate(todo: list[str]) -> list[str]:
        if mode == "continuous":
            return continuous_translate(loaded, todo, decode, spec["in_flight"])
        results = translate_lines(loaded.model, loaded.src_tok, loaded.trg_tok, todo, decode)
        return [nbest[0][0] for nbest in results]

    report = timed_run(translate, lines, spec, started)
    report["version"] = f"torch {torch.__version__}"
    report["threads"] = torch.get_num_threads()
    report["batch_tokens"] = decode.batch_tokens
    return report


def continuous_translate(loaded, lines: list[str], decode, in_flight: int) -> list[str]:
    """``lines`` through one continuous search that keeps ``in_flight`` sentences decoding: each
    sentence that is done is replaced by the next at the following step, as a server with
    ``in_flight`` clients sees them; texts by line."""
    from transformer_mt.decoding.continuous import ContinuousSearch
    from transformer_mt.decoding.text import encode_sources
    from transformer_mt.text.content import untranslatable

    sources = encode_sources(loaded.src_tok, lines, loaded.model.positions.max_len)
    texts = [""] * len(lines)
    for i, text in untranslatable(lines).items():
        texts[i] = text
    search = ContinuousSearch(loaded.model, decode.beam_size)
    todo = iter(sources.items())
    for _, (first, ids) in zip(range(in_flight), todo, strict=False):
        search.add(first, ids, decode)
    while search.running or search.queued:
        for line, result in search.step():
            assert isinstance(line, int)  # the tags given to add(): line indices
            texts[line] = loaded.trg_tok.decode(result.tokens)
            nxt = next(todo, None)
            if nxt is not None:
                search.add(nxt[0], nxt[1], decode)
    return texts


def ct2_worker(spec: dict, started: float) -> dict:
    """CTranslate2 as its users run it: ``ctranslate2`` and ``sentencepiece``, nothing else."""
    import ctranslate2
    import sentencepiece

    directory = Path(spec["model"])
    settings = json.loads((directory / "transformer_mt.json").read_text(encoding="utf-8"))
    src_sp = sentencepiece.SentencePieceProcessor(model_file=str(directory / "spm.src.model"))
    trg_file = directory / ("spm.src.model" if settings["joint_vocabulary"] else "spm.trg.model")
    trg_sp = sentencepiece.SentencePieceProcessor(model_file=str(trg_file))
    translator = ctranslate2.Translator(
        str(directory),
        device="cpu",
        compute_type=spec["mode"],
        inter_threads=1,
        intra_threads=spec["threads"],
    )
    blank = set(spec["blank"])  # lines with nothing to translate: passed through unchanged
    lines = [("" if i in blank else line) for i, line in enumerate(read_plain_lines(spec["src"]))]
    limits = Limits(settings["decode"], int(settings["max_len"]))
    options = {"beam_size": spec["beam"], "length_penalty": spec["len_penalty"]}
    if spec["chunks"] is None:  # preferred batching: CTranslate2 batches the whole file itself
        options |= {"max_batch_size": spec["batch_tokens"], "batch_type": "tokens"}

    def translate(todo: list[str]) -> list[str]:
        return ct2_translate(translator, src_sp, trg_sp, todo, limits, options)

    report = timed_run(translate, lines, spec, started)
    for i, text in enumerate(read_plain_lines(spec["src"])):
        if i in blank:
            report["outputs"][i] = text.strip()
    report["version"] = f"ctranslate2 {ctranslate2.__version__}"
    report["threads"] = spec["threads"]
    return report


class Limits:
    """Our length rule: a sentence of n source pieces (EOS included) may have
    ``min(max(floor(a + b * n), 1), max_len)`` target pieces, EOS not counted."""

    def __init__(self, decode: dict, max_len: int) -> None:
        self.a = float(decode["max_len_a"])
        self.b = float(decode["max_len_b"])
        self.max_len = max_len

    def of(self, pieces: int) -> int:
        """The target limit of a source of ``pieces`` pieces plus EOS."""
        return min(max(math.floor(self.a + self.b * (pieces + 1)), 1), self.max_len)


def ct2_translate(
    translator, src_sp, trg_sp, lines: list[str], limits: Limits, options
) -> list[str]:
    """``lines`` through one ``translate_batch`` call; empty lines stay empty."""
    texts = [line.strip() for line in lines]
    todo = [i for i, text in enumerate(texts) if text]
    pieces = dict(zip(todo, src_sp.encode([texts[i] for i in todo], out_type=str), strict=True))
    pieces = {i: p[: limits.max_len - 1] for i, p in pieces.items() if p}  # CT2 appends EOS
    outputs = [""] * len(lines)
    if not pieces:
        return outputs
    budgets = {i: limits.of(len(p)) for i, p in pieces.items()}
    results = translator.translate_batch(
        list(pieces.values()),
        max_decoding_length=max(budgets.values()),
        min_decoding_length=0,  # EOS may come first, as in our search
        **options,
    )
    for i, result in zip(pieces, results, strict=True):
        ids = [trg_sp.piece_to_id(p) for p in result.hypotheses[0][: budgets[i]]]
        outputs[i] = trg_sp.decode([t for t in ids if t > 3])  # special ids 0-3 dropped, as ours
    return outputs


def read_plain_lines(path: str) -> list[str]:
    """A UTF-8 file's lines without line endings (the byte-order mark dropped)."""
    text = Path(path).read_text(encoding="utf-8").removeprefix("\ufeff")
    return text.splitlines()


def prepare(spec: dict) -> dict:
    """The CTranslate2 export (as `mt export` writes it), every line's source length in pieces,
    the lines with nothing to translate, and the checkpoint's decode settings."""
    import dataclasses

    from transformer_mt.convert.ctranslate2 import export_ctranslate2
    from transformer_mt.engines import load_for_inference
    from transformer_mt.errors import MTError
    from transformer_mt.fileio import read_lines
    from transformer_mt.text.content import untranslatable

    loaded = load_for_inference(spec["checkpoint"])
    if loaded.lang_tags:
        raise MTError(
            f"{spec['checkpoint']}: a multilingual model; this benchmark runs one-pair models"
        )
    if spec["export"]:
        export_ctranslate2(loaded, Path(spec["export"]), "float32", spec["checkpoint"])
    report: dict = {"decode": dataclasses.asdict(loaded.config.decode), "files": {}}
    for name in spec["files"]:
        lines = read_lines(Path(name))
        report["files"][name] = {
            "lengths": [
                len(ids) for ids in loaded.src_tok.encode_batch([t.strip() for t in lines])
            ],
            "blank": sorted(untranslatable(lines)),
        }
    return report


# ----------------------------------------------------------------------------- the parent


class Bench:
    """What every run shares: the options, a work directory, the export and the chunks."""

    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args, self.work, self.export = args, work, work / "ct2"
        files = [str(args.src)] + ([str(args.valid_src)] if args.valid_src else [])
        prepared = self.run_worker(
            {
                "kind": "prepare",
                "checkpoint": str(args.checkpoint),
                "export": str(self.export),
                "files": files,
                "engine": "prepare (export)",
            }
        )
        self.decode = prepared["decode"]
        self.files = prepared["files"]
        if args.batch_tokens:
            self.decode["batch_tokens"] = args.batch_tokens
        self.batch_tokens = args.ct2_batch_tokens or int(self.decode["batch_tokens"])

    def chunks(self, path: Path) -> list[list[int]]:
        """Line indices of ``path`` sorted by source length in pieces (ties in file order), cut
        into chunks of --batch lines."""
        lengths = self.files[str(path)]["lengths"]
        order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
        return [order[i : i + self.args.batch] for i in range(0, len(order), self.args.batch)]

    def spec(self, engine: str, batching: str, len_penalty: float, src: Path | None = None) -> dict:
        """What one run of ``engine`` in ``batching`` does (on ``src``, default --src)."""
        args = self.args
        src = src or args.src
        kind, mode = ENGINES[engine]
        spec = {
            "kind": kind,
            "mode": mode,
            "engine": engine,
            "threads": args.threads,
            "beam": args.beam,
            "src": str(src),
            "warmup": args.warmup if src == args.src else 0,
            "warm_pass": args.warm_pass and src == args.src,
            "chunks": self.chunks(src) if batching == "chunks" else None,
        }
        if kind == "ours":
            ours = {"batch_tokens": int(self.decode["batch_tokens"]), "in_flight": args.batch}
            return spec | ours | {"checkpoint": str(args.checkpoint)}
        blank = self.files[str(src)]["blank"]
        return spec | {
            "model": str(self.export),
            "blank": blank,
            "len_penalty": len_penalty,
            "batch_tokens": self.batch_tokens,
        }

    def run_worker(self, spec: dict) -> dict:
        """One fresh process for ``spec``; its report. A failed worker ends the benchmark with
        the last lines of its error output."""
        name = f"{time.monotonic_ns()}"
        spec_path, report_path = self.work / f"{name}.spec.json", self.work / f"{name}.report.json"
        spec_path.write_text(json.dumps(spec), encoding="utf-8")
        threads = str(self.args.threads)
        env = os.environ | {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
        command = [sys.executable, str(SCRIPT), "_worker", str(spec_path), str(report_path)]
        started = time.perf_counter()
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
            sys.exit(f"{SCRIPT.name}: the {spec['engine']} worker failed: {last}")
        report = json.loads(report_path.read_text(encoding="utf-8"))
        report["process_s"] = time.perf_counter() - started
        return report


def choose_len_penalty(bench: Bench, grid: list[float]) -> tuple[float, dict[float, float]]:
    """CTranslate2 float32's best-BLEU length penalty on the validation set (the first of equal
    ones), and the BLEU of each value tried."""
    from transformer_mt.evaluation import corpus_bleu
    from transformer_mt.fileio import read_lines

    refs = read_lines(bench.args.valid_ref)
    scores = {}
    for alpha in grid:
        spec = bench.spec(BASELINE, "chunks", alpha, src=bench.args.valid_src)
        scores[alpha] = corpus_bleu(bench.run_worker(spec)["outputs"], refs)
        print(
            f"CTranslate2 length_penalty {alpha:g}: validation BLEU {scores[alpha]:.2f}",
            file=sys.stderr,
            flush=True,
        )
    return max(grid, key=lambda alpha: scores[alpha]), scores


def schedule(engines: list[str], batchings: list[str], runs: int) -> list[tuple[int, str, str]]:
    """(run, batching, engine) in the order they run: within a run each batching's engines in
    turn, the turn rotated by one engine each run (A B C D, then B C D A, ...)."""
    order = []
    for run in range(runs):
        for batching in batchings:
            todo = [e for e in engines if batching == "preferred" or ENGINES[e][1] != "continuous"]
            k = run % len(todo)
            order += [(run, batching, engine) for engine in todo[k:] + todo[:k]]
    return order


def measure(bench: Bench, len_penalty: float) -> dict[str, dict[str, list[dict]]]:
    """Every timed run, one process each, a pause before each: reports by batching and engine."""
    args = bench.args
    reports: dict[str, dict[str, list[dict]]] = {b: {} for b in args.batching}
    for run, batching, engine in schedule(args.engines, args.batching, args.runs):
        time.sleep(args.pause)
        report = bench.run_worker(bench.spec(engine, batching, len_penalty))
        reports[batching].setdefault(engine, []).append(report)
        print(
            f"run {run + 1}/{args.runs} {batching:<9} {engine:<18} {report['seconds']:7.2f} s "
            f"(load {report['load_s']:.2f} s)",
            file=sys.stderr,
            flush=True,
        )
    return reports


def summarize(bench: Bench, reports: dict[str, list[dict]], refs: list[str] | None) -> list[dict]:
    """One row per engine: median and every run's seconds, load seconds, target tokens and
    tokens/s, BLEU, speed against CTranslate2 float32 (or the first engine)."""
    import sentencepiece

    from transformer_mt.evaluation import corpus_bleu

    settings = json.loads((bench.export / "transformer_mt.json").read_text(encoding="utf-8"))
    trg = "spm.src.model" if settings["joint_vocabulary"] else "spm.trg.model"
    trg_sp = sentencepiece.SentencePieceProcessor(model_file=str(bench.export / trg))
    rows = []
    for engine, runs in reports.items():
        outputs = runs[-1]["outputs"]
        tokens = sum(len(trg_sp.encode(text)) + 1 for text in outputs if text)
        median = statistics.median(r["seconds"] for r in runs)
        rows.append(
            {
                "engine": engine,
                "median_s": median,
                "runs_s": [r["seconds"] for r in runs],
                "load_s": statistics.median(r["load_s"] for r in runs),
                "tokens": tokens,
                "tokens_per_s": tokens / median,
                "bleu": corpus_bleu(outputs, refs) if refs is not None else None,
                "same_outputs": all(r["outputs"] == outputs for r in runs),
                "version": runs[-1]["version"],
                "packages": runs[-1]["packages"],
            }
        )
    base = next((r for r in rows if r["engine"] == BASELINE), rows[0])
    for row in rows:
        row["speed_vs_base"] = base["median_s"] / row["median_s"]
    return rows


def print_table(batching: str, rows: list[dict], bench: Bench) -> None:
    """One batching's table, with a line saying how its batches were made."""
    args = bench.args
    if batching == "chunks":
        how = (
            f"the same chunks for every engine: lines sorted by source length, {args.batch} a chunk"
        )
    else:
        how = f"each engine's own: ours decode.batch_tokens {bench.decode['batch_tokens']}"
        if any(ENGINES[r["engine"]][0] == "ct2" for r in rows):
            how += f"; CTranslate2 max_batch_size {bench.batch_tokens}, batch_type tokens"
        if any(ENGINES[r["engine"]][1] == "continuous" for r in rows):
            how += f"; ours-continuous {args.batch} sentences in flight"
    base = next((r["engine"] for r in rows if r["engine"] == BASELINE), rows[0]["engine"])
    print(f"\nbatching: {batching} ({how})")
    print(
        f"| engine | median s | runs (s) | load s | target tokens | tokens/s | BLEU | "
        f"speed vs {base} |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        bleu = f"{r['bleu']:.2f}" if r["bleu"] is not None else "-"
        runs = " ".join(f"{s:.3f}" for s in r["runs_s"])
        flag = "" if r["same_outputs"] else " (outputs differ between runs)"
        print(
            f"| {r['engine']}{flag} | {r['median_s']:.3f} | {runs} | {r['load_s']:.2f} | "
            f"{r['tokens']} | {r['tokens_per_s']:.1f} | {bleu} | {r['speed_vs_base']:.2f}x |"
        )


def load_average() -> str:
    """The 1, 5 and 15 minute load averages: other work on the machine shows there."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def machine_line(args: argparse.Namespace, versions: list[str], load_before: str) -> str:
    """CPU model (and whether it has AVX512-BF16), threads, load averages (``load_before``: at
    the start), versions, date."""
    model, bf16 = "unknown CPU", False
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8")
        model = next(
            ln.split(":", 1)[1].strip()
            for ln in cpuinfo.splitlines()
            if ln.startswith("model name")
        )
        bf16 = "avx512_bf16" in cpuinfo.split()
    except (OSError, StopIteration):
        pass
    engines = ", ".join(sorted(set(versions)))
    return (
        f"CPU: {model} ({os.cpu_count()} logical cores), avx512_bf16 "
        f"{'present' if bf16 else 'absent'}; {args.threads} threads per engine; load average "
        f"{load_before} at the start, {load_average()} at the end; {engines}; "
        f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC"
    )


def penalty_line(ours: float, ct2: float | None, grid: dict[float, float]) -> str:
    """Each engine's length penalty, and the validation BLEU of CTranslate2's candidates."""
    line = f"length penalty: ours the checkpoint's (GNMT) {ours:g}"
    if ct2 is not None:
        line += f"; CTranslate2 length_penalty {ct2:g}"
    if grid:
        tried = ", ".join(f"{alpha:g}: {bleu:.2f}" for alpha, bleu in grid.items())
        line += f" (best validation BLEU of CTranslate2 float32 among {tried})"
    return line


def main() -> None:
    """Parse, prepare (export, chunks), choose CTranslate2's length penalty, measure, report."""
    if len(sys.argv) == 4 and sys.argv[1] == "_worker":
        worker_main(sys.argv[2], sys.argv[3])
        return
    args = parse_args()
    load_before = load_average()
    from transformer_mt.fileio import read_lines

    refs = read_lines(args.ref) if args.ref else None
    n_lines = len(read_lines(args.src))
    for src, ref in ((args.src, args.ref), (args.valid_src, args.valid_ref)):
        if src is not None and ref is not None and len(read_lines(ref)) != len(read_lines(src)):
            sys.exit(f"{ref} and {src} differ in line count: give one reference per source line")
    with tempfile.TemporaryDirectory(prefix="bench_decode_fair.") as tmp:
        bench = Bench(args, Path(tmp))
        uses_ct2 = any(ENGINES[e][0] == "ct2" for e in args.engines)
        len_penalty: float | None = args.ct2_len_penalty
        grid: dict[float, float] = {}
        if uses_ct2 and len_penalty is None:
            len_penalty, grid = choose_len_penalty(bench, args.len_penalty_grid)
        reports = measure(bench, len_penalty if len_penalty is not None else 0.0)
        tables = {b: summarize(bench, reports[b], refs) for b in args.batching}
    versions = [row["version"] for rows in tables.values() for row in rows]
    print(
        f"{args.checkpoint}, {args.src} ({n_lines} lines), beam {args.beam}; median of "
        f"{args.runs} runs, each engine run in a fresh process, engines alternating, "
        f"{args.pause:g} s pause before each run, {args.warmup} lines of warm-up untimed"
        + (", then the whole file once untimed (--warm-pass)" if args.warm_pass else "")
    )
    print(machine_line(args, versions, load_before))
    print(penalty_line(bench.decode["len_penalty"], len_penalty if uses_ct2 else None, grid))
    for batching, rows in tables.items():
        print_table(batching, rows, bench)
    if args.json:
        dump = {
            "settings": {k: str(v) for k, v in vars(args).items()},
            "len_penalty_grid": grid,
            "ct2_len_penalty": len_penalty,
            "tables": tables,
            "reports": reports,
        }
        args.json.write_text(json.dumps(dump, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
