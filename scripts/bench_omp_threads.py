"""Why `mt serve` loads the model in a thread of its own: torch ops in a worker thread, with and
without an OpenMP team left in the main thread.

Every thread that starts torch's parallel (OpenMP) work keeps a team of threads while it lives.
When the main thread has one (it loaded the model) and the decode worker starts another, libgomp
counts more of its threads than CPUs and stops spin-waiting between parallel regions, so each small
op pays a wake-up. Each case runs in a fresh process, because a team, once made, stays:

- ``main``: everything in the main thread (what `mt translate` does);
- ``worker, model loaded in main``: the model loaded and warmed up in the main thread, the work
  done in a second thread (the server before the fix);
- ``worker, model loaded in a thread``: the model loaded in a thread that has ended, the work done
  in a second thread (`mt serve` now, ``server._in_own_thread``).

Printed: the median time of a small add (160 x 256) and a linear layer (160 x 256 -> 1024), and,
with ``--checkpoint`` and ``--src``, sentences/s translating the file in batches of 32 lines in
order (what the server's decode worker does), medians of ``--runs``.

    python scripts/bench_omp_threads.py --checkpoint runs/m30k40/last.pt \\
        --src data/multi30k/test_2016_flickr.de --lines 300 --runs 3
"""

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

CASES = ["main", "worker, model loaded in main", "worker, model loaded in a thread"]


def op_times(runs: int = 300) -> dict[str, float]:
    import torch

    a, w = torch.randn(160, 256), torch.randn(1024, 256)
    ops = {"add us": lambda: a + a, "linear us": lambda: torch.nn.functional.linear(a, w)}
    out = {}
    with torch.inference_mode():
        for name, op in ops.items():
            for _ in range(10):
                op()
            times = []
            for _ in range(runs):
                start = time.perf_counter()
                op()
                times.append(time.perf_counter() - start)
            out[name] = 1e6 * statistics.median(times)
    return out


def one_case(case: str, checkpoint: str | None, src: str | None, lines: int, runs: int) -> dict:
    import torch

    torch.set_num_threads(2 if torch.get_num_threads() >= 2 else 1)
    engine = None

    def load():
        nonlocal engine
        if checkpoint is None:  # no model: one op stands in for loading it
            torch.randn(2048, 2048).sum()
            return
        from transformer_mt.engines.engine import load_engine

        engine = load_engine("torch", checkpoint, "cpu", None)
        engine.translate(["ein Test ."], engine.decode, False)  # warm-up

    def work() -> dict:
        figures = op_times()
        if engine is not None:
            text = Path(src).read_text(encoding="utf-8").splitlines()[:lines]
            rates = []
            for _ in range(runs):
                start = time.perf_counter()
                for i in range(0, len(text), 32):
                    engine.translate(text[i : i + 32], engine.decode, False)
                rates.append(len(text) / (time.perf_counter() - start))
            figures["sentences/s"] = statistics.median(rates)
        return figures

    if case == "main":
        load()
        return work()
    if case == "worker, model loaded in main":
        load()
    else:
        with ThreadPoolExecutor(1) as pool:
            pool.submit(load).result()
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(work()))
    thread.start()
    thread.join()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", help="a .pt from `mt train` (with --src: decode too)")
    parser.add_argument("--src", help="sentences, one per line")
    parser.add_argument("--lines", type=int, default=300)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--case", choices=CASES, help=argparse.SUPPRESS)  # one case, JSON out
    args = parser.parse_args()
    if args.case:
        print(json.dumps(one_case(args.case, args.checkpoint, args.src, args.lines, args.runs)))
        return
    if (args.checkpoint is None) != (args.src is None):
        parser.error("--checkpoint and --src go together")
    for flag, path in (("--checkpoint", args.checkpoint), ("--src", args.src)):
        if path is not None and not Path(path).is_file():
            parser.error(f"{flag} {path}: not a file")
    if args.lines < 1 or args.runs < 1:
        parser.error("--lines and --runs must be at least 1")
    extra = ["--checkpoint", args.checkpoint, "--src", args.src] if args.checkpoint else []
    extra += ["--lines", str(args.lines), "--runs", str(args.runs)]
    print(f"{'case':<36}{'add us':>9}{'linear us':>11}{'sentences/s':>13}")
    for case in CASES:
        proc = subprocess.run(
            [sys.executable, __file__, "--case", case, *extra], capture_output=True, text=True
        )
        if proc.returncode != 0:
            tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
            raise SystemExit(f"case {case!r} failed (exit status {proc.returncode}):\n{tail}")
        figures = json.loads(proc.stdout.strip().splitlines()[-1])
        rate = f"{figures['sentences/s']:>13.1f}" if "sentences/s" in figures else ""
        print(f"{case:<36}{figures['add us']:>9.1f}{figures['linear us']:>11.1f}{rate}")


if __name__ == "__main__":
    main()
