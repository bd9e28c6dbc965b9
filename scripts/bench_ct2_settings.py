"""What each of `bench_decode_fair.py`'s CTranslate2 settings costs, against CT2 as users run it.

    python scripts/bench_ct2_settings.py --export runs/m30k/ct2 --src test_2016_flickr.de \
        --ref test_2016_flickr.en --len-penalty 1.4 --runs 3

An independent harness: CTranslate2 driven directly (``ctranslate2`` and ``sentencepiece`` only,
never torch or ``transformer_mt``), each run a fresh process alone, variants alternating run by
run. The source is cut into pieces once, outside the timed part; chunks of --batch lines sorted
by length, one ``translate_batch`` per chunk, beam --beam; only the calls are timed. Variants:

- ``user``: what a CT2 user runs: the export's length penalty (the checkpoint's
  ``decode.len_penalty``, in ``transformer_mt.json``), CT2's defaults for the rest
  (``min_decoding_length`` 1, ``max_decoding_length`` 256);
- ``min0``: ``user`` with ``min_decoding_length=0`` (the fair script's: EOS may come first);
- ``alpha``: ``user`` with ``length_penalty`` --len-penalty (the fair script's: chosen on the
  validation set);
- ``limit``: ``user`` with each call's ``max_decoding_length`` from our length rule (``a + b *
  source pieces``, the call's largest: the fair script's);
- ``script``: all three, as `bench_decode_fair.py` calls CT2.

Printed per variant: the median seconds of --runs, target pieces, mean output length and BLEU.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path

VARIANTS = ("user", "min0", "alpha", "limit", "script")


def worker(spec: dict) -> dict:
    """One timed pass of one variant (run in a process of its own)."""
    import ctranslate2
    import sentencepiece

    export = Path(spec["export"])
    settings = json.loads((export / "transformer_mt.json").read_text(encoding="utf-8"))
    src_sp = sentencepiece.SentencePieceProcessor(model_file=str(export / "spm.src.model"))
    trg_name = "spm.src.model" if settings["joint_vocabulary"] else "spm.trg.model"
    trg_sp = sentencepiece.SentencePieceProcessor(model_file=str(export / trg_name))
    translator = ctranslate2.Translator(
        str(export), device="cpu", compute_type="float32", inter_threads=1,
        intra_threads=spec["threads"],
    )  # fmt: skip
    lines = Path(spec["src"]).read_text(encoding="utf-8").splitlines()
    pieces = src_sp.encode([line.strip() for line in lines], out_type=str)
    order = sorted(range(len(lines)), key=lambda i: len(pieces[i]))
    chunks = [order[i : i + spec["batch"]] for i in range(0, len(order), spec["batch"])]
    decode, variant = settings["decode"], spec["variant"]
    options: dict = {"beam_size": spec["beam"], "length_penalty": float(decode["len_penalty"])}
    if variant in ("min0", "script"):
        options["min_decoding_length"] = 0
    if variant in ("alpha", "script"):
        options["length_penalty"] = spec["len_penalty"]
    outputs: list[list[str]] = [[] for _ in lines]
    translator.translate_batch([pieces[i] for i in chunks[0]], **options)  # warm-up, untimed
    start = time.perf_counter()
    for chunk in chunks:
        batch = [pieces[i] for i in chunk]
        extra = {}
        if variant in ("limit", "script"):
            a, b, most = float(decode["max_len_a"]), float(decode["max_len_b"]), settings["max_len"]
            limits = [min(max(math.floor(a + b * (len(p) + 1)), 1), most) for p in batch]
            extra["max_decoding_length"] = max(limits)
        results = translator.translate_batch(batch, **options, **extra)
        for i, result in zip(chunk, results, strict=True):
            outputs[i] = result.hypotheses[0]
    seconds = time.perf_counter() - start
    return {
        "seconds": seconds,
        "pieces": sum(len(o) + 1 for o in outputs),
        "texts": [trg_sp.decode(o) for o in outputs],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--export", required=True, help="an `mt export` CTranslate2 directory")
    parser.add_argument("--src", required=True)
    parser.add_argument("--ref", help="references, for BLEU")
    parser.add_argument("--len-penalty", type=float, required=True, help="the fair script's")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return
    times: dict[str, list[float]] = {v: [] for v in args.variants}
    last: dict[str, dict] = {}
    for run in range(args.runs):
        shift = run % len(args.variants)  # alternate the order run by run
        for variant in args.variants[shift:] + args.variants[:shift]:
            spec = vars(args) | {"variant": variant, "worker": None}
            done = subprocess.run(
                [sys.executable, __file__, "--worker", json.dumps(spec), *_required(args)],
                capture_output=True, text=True, check=True,
            )  # fmt: skip
            last[variant] = json.loads(done.stdout)
            times[variant].append(last[variant]["seconds"])
            print(f"run {run + 1} {variant}: {last[variant]['seconds']:.2f} s", file=sys.stderr)
    refs = Path(args.ref).read_text(encoding="utf-8").splitlines() if args.ref else None
    print(f"variant | median s ({args.runs} runs) | target pieces | BLEU")
    for variant in args.variants:
        bleu = ""
        if refs is not None:
            import sacrebleu

            bleu = f"{sacrebleu.corpus_bleu(last[variant]['texts'], [refs]).score:.2f}"
        median = statistics.median(times[variant])
        print(f"{variant} | {median:.2f} | {last[variant]['pieces']} | {bleu}")


def _required(args: argparse.Namespace) -> list[str]:
    """The required options again (the worker's parser asks for them)."""
    return ["--export", args.export, "--src", args.src, "--len-penalty", str(args.len_penalty)]


if __name__ == "__main__":
    main()
