"""`mt score` throughput: pairs per second and target tokens per second (medians of --runs).

Two figures per run, on a trained checkpoint and a real file pair:

- ``score_pairs``: the library call that `mt score` makes (tokenize, batch, one teacher-forced
  pass per batch), the model loaded once beforehand;
- ``mt score``: the whole command in a fresh process (start-up, checkpoint load, output
  written), what a user waits for.

Target tokens are those scored: target pieces + EOS of every non-empty pair.

    python scripts/bench_score.py --checkpoint runs/toy/best.pt \
        --src data/test.src --trg data/test.trg --runs 3
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from transformer_mt.decoding.score import score_pairs
from transformer_mt.engines import load_for_inference


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--src", type=Path, required=True)
    parser.add_argument("--trg", type=Path, required=True)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--batch-tokens", type=int, default=None, help="default: the run's")
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch threads, here and (OMP_NUM_THREADS, MKL_NUM_THREADS) in the "
        "`mt score` process; 0 = default",
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--no-cli", action="store_true", help="skip the `mt score` process runs")
    args = parser.parse_args()
    if args.threads < 0:
        parser.error("--threads must be 0 (default) or more")
    if args.threads:
        torch.set_num_threads(args.threads)

    loaded = load_for_inference(args.checkpoint, args.device)
    batch_tokens = args.batch_tokens or loaded.config.decode.batch_tokens
    sources = args.src.read_text(encoding="utf-8").splitlines()
    targets = args.trg.read_text(encoding="utf-8").splitlines()

    def run_library() -> tuple[float, int, int]:
        start = time.perf_counter()
        scores = score_pairs(
            loaded.model,
            loaded.src_tok,
            loaded.trg_tok,
            sources,
            targets,
            batch_tokens=batch_tokens,
        )
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        scored = [s for s in scores if s is not None]
        return seconds, len(sources), sum(s.tokens for s in scored)

    run_library()  # warm-up: allocator, sentencepiece, kernels
    library = [run_library() for _ in range(args.runs)]
    _, pairs, tokens = library[0]
    print(
        f"checkpoint {args.checkpoint}  pairs {pairs}  target tokens {tokens}  "
        f"batch_tokens {batch_tokens}  threads {torch.get_num_threads()}  device {args.device}"
    )
    _report("score_pairs", [s for s, _, _ in library], pairs, tokens)

    if args.no_cli:
        return
    command = [
        sys.executable,
        "-m",
        "transformer_mt",
        "score",
        "-c",
        str(args.checkpoint),
        "--src",
        str(args.src),
        "--trg",
        str(args.trg),
        "--device",
        args.device,
        "--batch-tokens",
        str(batch_tokens),
    ]
    env = dict(os.environ)
    if args.threads:  # `mt score` has no thread option: torch sizes its pool from these
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(args.threads)
    times = []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.runs):
            start = time.perf_counter()
            done = subprocess.run(
                [*command, "-o", str(Path(tmp) / "scores.txt")],
                env=env,
                stderr=subprocess.PIPE,
                text=True,
            )
            times.append(time.perf_counter() - start)
            if done.returncode != 0:
                tail = "\n".join(done.stderr.strip().splitlines()[-15:])
                raise SystemExit(
                    f"`mt score` failed (exit status {done.returncode}): {' '.join(command)}\n"
                    f"{tail}"
                )
    _report("mt score (process)", times, pairs, tokens)


def _report(name: str, seconds: list[float], pairs: int, tokens: int) -> None:
    median = statistics.median(seconds)
    runs = " ".join(f"{s:.3f}" for s in seconds)
    print(
        f"{name:20s} median {median:.3f} s  {pairs / median:9.1f} pairs/s  "
        f"{tokens / median:10.1f} target tokens/s  (runs: {runs})"
    )


if __name__ == "__main__":
    main()
