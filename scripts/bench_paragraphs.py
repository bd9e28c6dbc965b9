"""Pasted paragraphs: translated whole, cut into sentences, or one sentence at a time.

    python scripts/bench_paragraphs.py -c runs/m30k/best.pt              # ../shared Multi30k
    python scripts/bench_paragraphs.py -c CKPT --data DIR --src de --trg en --seed 1

Multi30k test_2016 (DIR/test_2016_flickr.{src,trg}.gz) is cut into paragraphs of 3-6 consecutive
sentences (in order; sizes drawn with --seed), each the sentences joined by one space, and the
references likewise. Three ways to translate them, each scored with paragraph-level sacrebleu
BLEU and chrF against the joined references, with its time:

- ``whole``: each paragraph as one segment (`mt translate --no-split`: what `mt` did before it
  split paragraphs);
- ``split``: each paragraph cut into sentences, translated, joined back (`mt translate`'s
  default, and the server's);
- ``sentences``: the original sentences translated one by one and joined (the ceiling: a
  perfect splitter).

The goal: ``split`` within 0.5 BLEU of ``sentences``. Decoding: the checkpoint's own settings
(beam, length penalty), one engine loaded once, the three passes in this process one after the
other.
"""

from __future__ import annotations

import argparse
import gzip
import platform
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from transformer_mt.engines.engine import load_engine  # noqa: E402
from transformer_mt.engines.options import TranslateExtras  # noqa: E402
from transformer_mt.evaluation import score_all  # noqa: E402


def paragraphs(n: int, seed: int) -> list[range]:
    """Consecutive runs of 3-6 sentence indices covering 0..n-1 (the last may be shorter)."""
    rng, out, start = random.Random(seed), [], 0
    while start < n:
        size = rng.randint(3, 6)
        out.append(range(start, min(n, start + size)))
        start += size
    return out


def read(path: Path) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-c", "--checkpoint", type=Path, required=True)
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared/data/multi30k")
    parser.add_argument("--src", default="de")
    parser.add_argument("--trg", default="en")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    sources = read(args.data / f"test_2016_flickr.{args.src}.gz")
    references = read(args.data / f"test_2016_flickr.{args.trg}.gz")
    groups = paragraphs(len(sources), args.seed)
    joined_src = [" ".join(sources[i] for i in g) for g in groups]
    joined_ref = [" ".join(references[i] for i in g) for g in groups]
    engine = load_engine("torch", args.checkpoint)
    decode = engine.run_decode
    cpu = platform.processor() or platform.machine()
    print(f"{len(groups)} paragraphs of {len(sources)} sentences; beam {decode.beam_size}; {cpu}")
    runs = {
        "whole": (joined_src, TranslateExtras()),
        "split": (joined_src, TranslateExtras(split=True, source_lang=args.src)),
        "sentences": (sources, TranslateExtras()),
    }
    for name, (lines, extras) in runs.items():
        start = time.perf_counter()
        results = engine.translate(lines, decode, extras=extras)
        seconds = time.perf_counter() - start
        texts = [r.text for r in results]
        if name == "sentences":
            texts = [" ".join(texts[i] for i in g) for g in groups]
        scores = score_all(texts, [joined_ref], "13a")
        print(f"{name:10s} BLEU {scores.bleu:6.2f}  chrF {scores.chrf:6.2f}  {seconds:6.1f} s")


if __name__ == "__main__":
    main()
