"""Pick the beam search's length penalty on a development set: translate it once per alpha with
the same checkpoint (loaded once) and print BLEU, chrF and the output/reference length ratio.

    python scripts/tune_len_penalty.py -c runs/multi30k_de_en/last.pt \\
        --src data/multi30k/val.de --ref data/multi30k/val.en --beam 5 --alphas 0.6 1 1.5 2 3

A model with several targets (one-to-many) needs ``--target-lang``, as `mt evaluate` does.

Tune on the validation set, then score the test set once with the chosen alpha
(`mt evaluate ... --len-penalty A`) or set it as `decode.len_penalty` in the config: choosing
alpha on the test set would overstate the score.
"""

import argparse
import dataclasses
import sys
from pathlib import Path

from tqdm import tqdm

from transformer_mt.config import validate_decode
from transformer_mt.engines import load_for_inference, translate_lines
from transformer_mt.errors import MTError
from transformer_mt.evaluation import check_same_length, score_all
from transformer_mt.fileio import read_lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-c", "--checkpoint", type=Path, required=True)
    parser.add_argument("--src", type=Path, required=True, help="development source file")
    parser.add_argument("--ref", type=Path, required=True, help="its reference translations")
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--alphas", type=float, nargs="+", default=[0.0, 0.6, 1.0, 1.5, 2.0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--precision",
        choices=["auto", "fp32", "bf16"],
        help="the products' precision, as `mt evaluate --precision` (default: the checkpoint's)",
    )
    parser.add_argument(
        "--target-lang",
        help="the target language of a model with several (its tag starts every source)",
    )
    args = parser.parse_args()

    loaded = load_for_inference(args.checkpoint, args.device, precision=args.precision)
    try:
        src_prefix = loaded.source_prefix(args.target_lang)
    except MTError as e:
        sys.exit(f"error: {e}")
    sources, refs = read_lines(args.src), read_lines(args.ref)
    check_same_length(sources, str(args.src), [refs], [str(args.ref)])
    ref_words = sum(len(r.split()) for r in refs)
    rows = []
    for alpha in tqdm(args.alphas, desc="alphas", unit="alpha"):
        # As `mt evaluate --beam B --len-penalty ALPHA` translates.
        decode = dataclasses.replace(
            loaded.config.decode, beam_size=args.beam, nbest=1, len_penalty=alpha
        )
        validate_decode(decode)
        results = translate_lines(
            loaded.model, loaded.src_tok, loaded.trg_tok, sources, decode, src_prefix=src_prefix
        )
        hyps = [r[0][0] for r in results]
        scores = score_all(hyps, [refs])
        ratio = sum(len(h.split()) for h in hyps) / ref_words
        rows.append((alpha, scores.bleu, scores.chrf, ratio))
    print(f"{args.checkpoint}, {args.src}, beam {args.beam}; {scores.bleu_signature}")
    print(f"{'alpha':>6} | {'BLEU':>6} | {'chrF':>6} | words out / ref")
    for alpha, bleu, chrf, ratio in rows:
        print(f"{alpha:>6g} | {bleu:6.2f} | {chrf:6.2f} | {ratio:.3f}")
    best = max(rows, key=lambda r: r[1])
    print(f"best alpha by BLEU: {best[0]:g} ({best[1]:.2f})")


if __name__ == "__main__":
    main()
