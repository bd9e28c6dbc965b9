"""Data preparation on Multi30k de-en: time, peak memory, and the padding that batching leaves.

    python scripts/bench_prepare.py                    # configs/multi30k_de_en.yaml, 4096 tokens
    python scripts/bench_prepare.py --batch-tokens 2048 --vocab-size 1000
    python scripts/bench_prepare.py --sources 20000000 # several sources at scale (see below)

``--sources N``: a generated corpus of N pairs (Multi30k's training pairs, repeated, each copy
numbered so that no two lines are equal) written as three sources (a gzipped text pair, a TSV,
a plain text pair) is prepared as a weighted mix (``data.train``), side by side with the same N
pairs as one local file pair (the single-source path); then a fourth source is added, with
``tokenizer.train_on`` naming the first three, and prepared again: only the new source should
be read and binarized. Each preparation runs in a fresh process: seconds, seconds per million
pairs, peak resident memory.

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
a variant of ``make_batches`` shown for comparison. Goal: under 10% padding with
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
    args = ["--child", url, "--work", str(work), "--vocab-size", str(vocab_size)]
    return child_result(args, show_log)


def child_result(args: list[str], show_log: bool) -> dict[str, float]:
    """Run this script with ``args`` in a fresh interpreter; the JSON line it prints last."""
    proc = subprocess.run(
        [sys.executable, __file__, *args], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        sys.exit(f"preparation failed:\n{proc.stderr}")
    if show_log:
        print(proc.stderr.rstrip())
    return json.loads(proc.stdout.strip().splitlines()[-1])


# --- several sources at scale ---------------------------------------------------------------------


def write_sources(shared: Path, work: Path, total: int) -> dict[str, Path]:
    """Four generated sources (three of ``total // 3`` pairs, a fourth of ``total // 10``) and
    the first three again as one file pair; returns the config fragments' files."""
    import gzip

    sides = []
    for lang in ("de", "en"):
        with gzip.open(shared / f"train.{lang}.gz", "rt", encoding="utf-8") as f:
            sides.append(f.read().splitlines())
    base = list(zip(*sides, strict=True))
    work.mkdir(parents=True, exist_ok=True)
    sizes = [total // 3] * 3 + [total // 10]
    files = {
        "s1": (work / "s1.de.gz", work / "s1.en.gz"),
        "s2": (work / "s2.tsv",),
        "s3": (work / "s3.de", work / "s3.en"),
        "s4": (work / "s4.de", work / "s4.en"),
        "all": (work / "all.de", work / "all.en"),
    }
    for side, path in enumerate((work / "valid.de", work / "valid.en")):
        path.write_text("".join(pair[side] + "\n" for pair in base[:1000]), encoding="utf-8")
    joined = [p.open("w", encoding="utf-8") for p in files["all"]]
    for offset, (name, size) in enumerate(zip(("s1", "s2", "s3", "s4"), sizes, strict=True)):
        opener = gzip.open if name == "s1" else open
        outs = [opener(p, "wt", encoding="utf-8") for p in files[name]]
        for i in range(size):
            de, en = base[i % len(base)]
            de, en = f"{de} {offset}{i}", f"{en} {offset}{i}"
            if name == "s2":
                outs[0].write(f"{de}\t{en}\n")
            else:
                outs[0].write(de + "\n")
                outs[1].write(en + "\n")
            if name != "s4":
                joined[0].write(de + "\n")
                joined[1].write(en + "\n")
        for f in outs:
            f.close()
    for f in joined:
        f.close()
    return {name: pair[0] for name, pair in files.items()}


def sources_config(work: Path, which: str, vocab_size: int) -> Path:
    """A config over the generated files: "single" (one pair), "mix3" or "mix4" (sources)."""
    text = [
        "name: scale",
        "data:",
        "  src_lang: de",
        "  trg_lang: en",
        # the single pair in a cache of its own: nothing of the mix's is reused
        f"  cache_dir: {work / ('cache-single' if which == 'single' else 'cache')}",
    ]
    valid = f"{{src: {work}/valid.de, trg: {work}/valid.en}}"
    if which == "single":
        text += [
            "  corpus: local",
            f"  train_src: {work}/all.de",
            f"  train_trg: {work}/all.en",
            f"  valid_src: {work}/valid.de",
            f"  valid_trg: {work}/valid.en",
        ]
    else:
        text += [
            "  train:",
            f"    - {{src: {work}/s1.de.gz, trg: {work}/s1.en.gz, name: s1}}",
            f"    - {{tsv: {work}/s2.tsv, name: s2}}",
            f"    - {{src: {work}/s3.de, trg: {work}/s3.en, name: s3}}",
        ]
        if which == "mix4":
            text.append(f"    - {{src: {work}/s4.de, trg: {work}/s4.en, name: s4, weight: 2}}")
        text.append(f"  valid: {valid}")
    text += ["tokenizer:", f"  vocab_size: {vocab_size}"]
    if which != "single":
        text.append("  train_on: [s1, s2, s3]")
    path = work / f"{which}.yaml"
    path.write_text("\n".join(text) + "\n")
    return path


def child_config(config: Path) -> None:
    """Prepare ``config`` and print a JSON line (seconds, peak MiB, training pairs)."""
    from transformer_mt.config import load_config
    from transformer_mt.data.prepare import prepare

    cfg = load_config(config)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    start = time.perf_counter()
    data = prepare(cfg, progress=False)
    result = {"seconds": time.perf_counter() - start, "peak_mib": peak_rss_mib()}
    result["train_pairs"] = len(data.train)
    print(json.dumps(result))


def run_config(config: Path, show_log: bool) -> dict[str, float]:
    """Run :func:`child_config` in a fresh interpreter."""
    return child_result(["--child-config", str(config)], show_log)


def sources_report(shared: Path, total: int, vocab_size: int, show_log: bool) -> None:
    """Three sources of ``total`` pairs against one file pair of the same pairs, then a 4th;
    each row printed as its preparation ends."""
    with tempfile.TemporaryDirectory(prefix="bench_sources-") as tmp:
        work = Path(tmp)
        start = time.perf_counter()
        write_sources(shared, work, total)
        print(f"generated {total:,} pairs in {time.perf_counter() - start:.0f} s ({work})")
        print(f"{'':<22} {'pairs':>12} {'seconds':>8} {'s / M pairs':>12} {'peak MiB':>9}")
        for label, which in (
            ("3 sources, cold", "mix3"),
            ("1 file pair, cold", "single"),
            ("4th source added", "mix4"),
        ):
            r = run_config(sources_config(work, which, vocab_size), show_log)
            pairs = r["train_pairs"]
            print(
                f"{label:<22} {pairs:>12,} {r['seconds']:>8.1f} "
                f"{r['seconds'] / pairs * 1e6:>12.1f} {r['peak_mib']:>9.0f}",
                flush=True,
            )


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
    parser.add_argument("--sources", type=int, metavar="N", help="several sources of N pairs")
    parser.add_argument("--child", metavar="URL", help=argparse.SUPPRESS)
    parser.add_argument("--child-config", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.work, args.vocab_size)
        return
    if args.child_config:
        child_config(args.child_config)
        return

    shared = shared_multi30k()
    if shared is None:
        print("skipped: the original Multi30k files are absent (../shared/data/multi30k; set ")
        print("MT_SHARED_DATA to a directory holding train.de.gz and the others)")
        return
    if args.sources:
        sources_report(shared, args.sources, args.vocab_size, args.log)
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
