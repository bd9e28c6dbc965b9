"""Data preparation on Multi30k de-en: time, peak memory, and the padding that batching leaves.

    python scripts/bench_prepare.py                    # configs/multi30k_de_en.yaml, 4096 tokens
    python scripts/bench_prepare.py --batch-tokens 2048 --vocab-size 1000

Needs the original Multi30k .gz files in ../shared/data/multi30k or $MT_SHARED_DATA (a directory
holding train.de.gz and the others, or its parent); without them it prints "skipped" and exits.
`mt download multi30k` puts them in data/multi30k/ (keeping the .gz beside the unpacked files):

    MT_SHARED_DATA=data/multi30k python scripts/bench_prepare.py

The files are served from a loopback HTTP server, so the cold run goes through the real path of
``mt prepare``: download, checksum, gunzip, clean, train sentencepiece, binarize. The warm run
repeats it with everything in place, which should only hash the inputs and open the caches. Each
run is a fresh process, so its peak resident memory (``ru_maxrss``) is its own; the figure after
imports is printed too, to show how much of the peak preparation itself adds.

Padding: the training batches of one epoch at a token budget (padding included, the trainer's
rule), cut from the length-sorted order by ``make_batches`` against the same greedy cut over a
random order (what batching without bucketing gives). A third row sorts by the longer side first,
a variant of ``make_batches`` shown for comparison. Goal (issue 3): under 10% padding with
bucketing.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import json
import logging
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "multi30k_de_en.yaml"


def shared_multi30k() -> Path | None:
    """The directory of the original Multi30k gzip files, or None when absent."""
    candidates = []
    if env := os.environ.get("MT_SHARED_DATA"):
        candidates += [Path(env), Path(env) / "multi30k"]
    candidates.append(REPO.parent / "shared" / "data" / "multi30k")
    return next((c for c in candidates if (c / "train.de.gz").is_file()), None)


def peak_rss_mib() -> float:
    """Peak resident memory of this process so far, in MiB (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1 << 20) if sys.platform == "darwin" else peak / 1024


def overrides(url: str, work: Path, vocab_size: int) -> list[str]:
    """Config overrides: fetch from the loopback server, keep every file under ``work``."""
    return [
        f"data.base_url={url}",
        f"data.download_dir={work / 'data'}",
        f"data.cache_dir={work / 'cache'}",
        f"tokenizer.vocab_size={vocab_size}",
    ]


# --- one preparation, in a child process ----------------------------------------------------------


def child(url: str, work: Path, vocab_size: int) -> None:
    """Run one preparation and print a JSON line: seconds, peak MiB, MiB after imports."""
    from transformer_mt.config import load_config
    from transformer_mt.data.prepare import prepare

    cfg = load_config(CONFIG, overrides(url, work, vocab_size))
    # The preparation messages, on stderr (shown with --log).
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    baseline = peak_rss_mib()
    start = time.perf_counter()
    data = prepare(cfg, progress=False)
    seconds = time.perf_counter() - start
    result = {"seconds": seconds, "peak_mib": peak_rss_mib(), "imports_mib": baseline}
    result["train_pairs"] = len(data.train)
    print(json.dumps(result))


def run_child(url: str, work: Path, vocab_size: int, show_log: bool) -> dict[str, float]:
    """Run :func:`child` in a fresh interpreter (so ru_maxrss is this run's alone)."""
    proc = subprocess.run(
        [sys.executable, __file__, "--child", url, "--work", str(work)]
        + ["--vocab-size", str(vocab_size)],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        sys.exit(f"preparation failed:\n{proc.stderr}")
    if show_log:
        print(proc.stderr.rstrip())
    return json.loads(proc.stdout.strip().splitlines()[-1])


# --- batching ---------------------------------------------------------------------------------


def random_batches(
    src_lens: np.ndarray, trg_lens: np.ndarray, max_tokens: int, seed: int
) -> list[np.ndarray]:
    """The baseline without bucketing: a random order, cut under the same budget."""
    order = np.random.default_rng(seed).permutation(len(src_lens))
    from transformer_mt.data.batching import cut_batches  # the rule make_batches cuts with

    return cut_batches(order, src_lens, trg_lens, max_tokens)


def max_side_batches(
    src_lens: np.ndarray, trg_lens: np.ndarray, max_tokens: int, seed: int
) -> list[np.ndarray]:
    """A variant of ``make_batches`` measured for comparison: sorted first by the longer side
    (the length the budget charges), then target, then source length, ties broken randomly."""
    tiebreak = np.random.default_rng(seed).permutation(len(src_lens))
    order = np.lexsort((tiebreak, src_lens, trg_lens, np.maximum(src_lens, trg_lens)))
    from transformer_mt.data.batching import cut_batches  # the rule make_batches cuts with

    return cut_batches(order, src_lens, trg_lens, max_tokens)


def padding_row(name: str, batches: list[np.ndarray], src: np.ndarray, trg: np.ndarray) -> str:
    """One table row: batch count, sentences per batch, padding share per side and overall."""
    from transformer_mt.data.batching import padding_fraction

    real = sum(int(src[b].sum()) + int(trg[b].sum()) for b in batches)
    padded = sum(len(b) * (int(src[b].max()) + int(trg[b].max())) for b in batches)
    pad_src, pad_trg = padding_fraction(batches, src), padding_fraction(batches, trg)
    return (
        f"{name:<24} {len(batches):>8,} {np.mean([len(b) for b in batches]):>10.1f} "
        f"{100 * pad_src:>8.1f}% {100 * pad_trg:>8.1f}% {100 * (1 - real / padded):>8.1f}%"
    )


def padding_report(url: str, work: Path, vocab_size: int, batch_tokens: int, seed: int) -> None:
    from transformer_mt.config import load_config
    from transformer_mt.data.batching import make_batches
    from transformer_mt.data.prepare import prepare

    cfg = load_config(CONFIG, overrides(url, work, vocab_size))
    train = prepare(cfg, progress=False).train  # quiet: no log handler in this process
    # The trainer's lengths: source ids already end with EOS; targets gain BOS (input) or EOS
    # (output), one token either way.
    src, trg = train.src_lengths, train.trg_lengths + 1
    bucketed = make_batches(src, trg, batch_tokens, seed=seed, epoch=0)
    baseline = random_batches(src, trg, batch_tokens, seed)
    print(
        f"\ntraining batches of one epoch at batch_tokens={batch_tokens} "
        f"({len(train):,} pairs; mean length {src.mean():.1f} source, {trg.mean():.1f} target)"
    )
    print(f"{'':<24} {'batches':>8} {'sent/batch':>10} {'src pad':>9} {'trg pad':>9} {'both':>9}")
    print(padding_row("bucketed (make_batches)", bucketed, src, trg))
    print(padding_row("random order", baseline, src, trg))
    variant = max_side_batches(src, trg, batch_tokens, seed)
    print(padding_row("sorted by longer side", variant, src, trg))


# --- main -----------------------------------------------------------------------------------------


def serve(root: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    """Serve ``root`` on 127.0.0.1 (a free port) from a daemon thread; return (server, base URL)."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Quiet, directory=str(root))
    )
    threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True).start()
    return httpd, f"http://127.0.0.1:{httpd.server_address[1]}/"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch-tokens", type=int, default=4096, help="token budget per batch")
    parser.add_argument("--vocab-size", type=int, default=8000, help="sentencepiece vocabulary")
    parser.add_argument("--seed", type=int, default=1, help="batch order seed")
    parser.add_argument("--log", action="store_true", help="show the preparation messages")
    parser.add_argument("--child", metavar="URL", help=argparse.SUPPRESS)
    parser.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.work, args.vocab_size)
        return

    shared = shared_multi30k()
    if shared is None:
        print("skipped: the original Multi30k files are absent (../shared/data/multi30k; set ")
        print("MT_SHARED_DATA to a directory holding train.de.gz and the others)")
        return
    for var in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        os.environ.pop(var, None)  # the children must reach 127.0.0.1 directly
    with tempfile.TemporaryDirectory(prefix="bench_prepare-") as tmp:
        work = Path(tmp)
        raw = work / "www" / "data" / "task1" / "raw"
        raw.mkdir(parents=True)
        for gz in shared.glob("*.gz"):
            (raw / gz.name).symlink_to(gz)
        httpd, url = serve(work / "www")
        try:
            cold = run_child(url, work, args.vocab_size, args.log)
            warm = run_child(url, work, args.vocab_size, args.log)
            print(f"Multi30k de-en, {CONFIG.name}, vocab {args.vocab_size}, {os.cpu_count()} CPUs")
            print(f"{'':<44} {'seconds':>8} {'peak MiB':>9} {'after imports':>14}")
            for name, r in (
                ("cold (download, sentencepiece, binarize)", cold),
                ("warm (all cached)", warm),
            ):
                print(
                    f"{name:<44} {r['seconds']:>8.2f} {r['peak_mib']:>9.0f} "
                    f"{r['imports_mib']:>14.0f}"
                )
            padding_report(url, work, args.vocab_size, args.batch_tokens, args.seed)
        finally:
            httpd.shutdown()
            httpd.server_close()


if __name__ == "__main__":
    main()
