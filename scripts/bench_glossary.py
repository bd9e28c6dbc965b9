"""Glossary terms through the constrained beam search: kept, at what BLEU, at what speed.

    python scripts/bench_glossary.py -c runs/m30k/best.pt                 # ../shared Multi30k
    python scripts/bench_glossary.py -c CKPT --data DIR --src de --trg en --sentences 500 --runs 3

Held-out sentences (the first --sentences of Multi30k test_2016) each get 1-3 terms taken from
their own reference: words of 4 or more letters, not among the most frequent words of the
training references (so content words, as a glossary holds), drawn with --seed. Each sentence is
translated unconstrained and with its terms as constraints (`mt translate --glossary` passes a
glossary's matched terms the same way); printed: the share of terms whose text appears in the
output, the BLEU and chrF of both, and sentences/s for 0, 1, 3 and 10 terms a sentence (10: as
many as the reference has, up to 10; median of --runs), unconstrained first, alternating.
"""

from __future__ import annotations

import argparse
import gzip
import platform
import random
import re
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from transformer_mt.engines.engine import load_engine  # noqa: E402
from transformer_mt.engines.options import TranslateExtras  # noqa: E402
from transformer_mt.evaluation import score_all  # noqa: E402

COMMON = 200  # the training references' most frequent words are no glossary terms


def read(path: Path) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def candidate_words(reference: str, common: set[str]) -> list[str]:
    """The reference's content words, each once, in order."""
    words = re.findall(r"[^\W\d_]{4,}", reference)
    return list(dict.fromkeys(w for w in words if w.lower() not in common))


def terms_for(references: list[str], common: set[str], count: int, seed: int) -> list[list[str]]:
    """Per reference, ``count`` of its content words (1-3 drawn when count is 0)."""
    rng = random.Random(seed)
    out = []
    for ref in references:
        words = candidate_words(ref, common)
        n = rng.randint(1, 3) if count == 0 else count
        out.append(rng.sample(words, min(n, len(words))))
    return out


def timed(engine, lines, decode, terms) -> tuple[list[str], float]:
    extras = TranslateExtras(terms=terms) if terms is not None else TranslateExtras()
    start = time.perf_counter()
    results = engine.translate(lines, decode, extras=extras)
    return [r.text for r in results], time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-c", "--checkpoint", type=Path, required=True)
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared/data/multi30k")
    parser.add_argument("--src", default="de")
    parser.add_argument("--trg", default="en")
    parser.add_argument("--sentences", type=int, default=500)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    sources = read(args.data / f"test_2016_flickr.{args.src}.gz")[: args.sentences]
    refs = read(args.data / f"test_2016_flickr.{args.trg}.gz")[: args.sentences]
    counts = Counter(
        w.lower() for line in read(args.data / f"train.{args.trg}.gz") for w in line.split()
    )
    common = {w for w, _ in counts.most_common(COMMON)}
    engine = load_engine("torch", args.checkpoint)
    decode = engine.run_decode
    print(f"{len(sources)} sentences, beam {decode.beam_size}; {platform.processor() or 'cpu'}")
    terms = terms_for(refs, common, 0, args.seed)
    plain, _ = timed(engine, sources, decode, None)
    kept, _ = timed(engine, sources, decode, terms)
    total = sum(len(t) for t in terms)
    found = sum(term in out for out, ts in zip(kept, terms, strict=True) for term in ts)
    before = sum(term in out for out, ts in zip(plain, terms, strict=True) for term in ts)
    print(
        f"terms: {total} ({total / len(terms):.2f} a sentence); in the output: "
        f"{100 * found / total:.2f} % constrained, {100 * before / total:.2f} % unconstrained"
    )
    for name, hyps in (("unconstrained", plain), ("constrained", kept)):
        scores = score_all(hyps, [refs], "13a")
        print(f"{name:14s} BLEU {scores.bleu:6.2f}  chrF {scores.chrf:6.2f}")
    print("terms a sentence: sentences/s (median of runs; unconstrained: 0)")
    for count in (0, 1, 3, 10):
        chosen = None if count == 0 else terms_for(refs, common, count, args.seed)
        times = [timed(engine, sources, decode, chosen)[1] for _ in range(args.runs)]
        rate = len(sources) / statistics.median(times)
        print(
            f"  {count:2d}: {rate:7.1f} sentences/s  (runs: {', '.join(f'{t:.1f}s' for t in times)})"
        )


if __name__ == "__main__":
    main()
