"""Load test of `mt serve`: N concurrent clients, each sending one sentence at a time.

For each engine (torch: a checkpoint; ct2: an exported directory, or one exported here), a server
is started as its own process on 127.0.0.1 (a free port) in each batching mode: continuous
batching (torch only: requests join the running search between steps), dynamic batching (batch
by batch, a gathering window) and no batching;
for each number of clients, ``--runs`` runs send the sentences of ``--src`` (in order, each
sentence once per run, at most ``--requests`` of them, at most ``--max-seconds`` seconds). Prints
sentences/s, target tokens/s (pieces of the translations, EOS not counted), p50/p95/p99 latency and
the mean requests per decode batch (the server's /metrics, summed over its worker processes;
continuous batching: per group of requests that joined the search at one step) and the cores the load
generator itself kept busy (its CPU time / wall time: what the server did not get), medians over
the runs, beside the offline throughput of the same engine on the same sentences (``translate_lines`` /
``translate_lines_ct2``, one call, the model's decode settings) and beside its ceiling: the same
sentences decoded in this process in batches of the size the server formed (its mean requests per
batch, in the order the clients sent them), the work the server's batches leave to do without
HTTP, queues or tokenizing on the event loop.

    python scripts/bench_serve.py --checkpoint runs/toy/best.pt --src test.src \\
        --clients 32 8 --engines torch ct2 --ct2-export int8 --runs 3

``--workers 1 2`` measures each setting with `mt serve --workers 1` and ``--workers 2`` (N
processes behind one port, the CPUs split among them); ``--modes`` picks batching modes.

Only loopback: the servers listen on 127.0.0.1 and the clients connect there.
"""

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

# The `mt serve` options of each batching mode.
MODES = {
    "continuous": ["--batching", "--continuous"],
    "batching": ["--batching", "--no-continuous"],
    "no-batching": ["--no-batching"],
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`mt serve` in a child process on a free loopback port."""

    def __init__(
        self,
        engine: str,
        path: Path,
        mode: str,
        window_ms: float,
        max_wait_ms: float,
        log: Path,
        workers: int = 1,
    ):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [
            sys.executable, "-m", "transformer_mt", "serve", "-c", str(path), "--engine", engine,
            "--host", "127.0.0.1", "--port", str(self.port),
            *MODES[mode],
            "--batch-window-ms", str(window_ms), "--batch-max-wait-ms", str(max_wait_ms),
            "--workers", str(workers), "--no-files",
        ]  # fmt: skip
        self.log = open(log, "a")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while True:
            if self.proc.poll() is not None:
                self.log.close()
                tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
                raise SystemExit(f"the server exited ({self.proc.returncode}):\n{tail}")
            try:
                if httpx.get(f"{self.url}/health/ready", timeout=1).status_code == 200:
                    return  # every worker's model is loaded
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise SystemExit(f"the server did not start in 120 s; see {log}")
            time.sleep(0.2)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


async def load_run(url: str, sentences: list[str], clients: int, max_seconds: float, count):
    """Each client sends the next unsent sentence and waits for its answer; stops when all are
    sent or ``max_seconds`` passed. Returns per request (latency s, target tokens)."""
    next_index = 0
    done: list[tuple[float, int]] = []
    deadline = time.perf_counter() + max_seconds
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)

    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:

        async def one_client() -> None:
            nonlocal next_index
            while next_index < len(sentences) and time.perf_counter() < deadline:
                line = sentences[next_index]
                next_index += 1
                start = time.perf_counter()
                reply = await client.post("/v1/translate", json={"text": [line]})
                latency = time.perf_counter() - start
                reply.raise_for_status()
                done.append((latency, count(reply.json()["translations"][0]["text"])))

        before = batch_counts((await client.get("/metrics")).text)
        start, cpu_start = time.perf_counter(), time.process_time()
        await asyncio.gather(*(one_client() for _ in range(clients)))
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
        after = batch_counts((await client.get("/metrics")).text)
    batches = max(1.0, after[0] - before[0])
    return done, elapsed, (after[1] - before[1]) / batches, cpu / elapsed


def batch_counts(metrics: str) -> tuple[float, float]:
    """(decode batches, requests in them) from a /metrics scrape (all worker processes)."""
    values = {
        sample.name: sample.value
        for family in text_string_to_metric_families(metrics)
        for sample in family.samples
        if not sample.labels
    }
    return values["mt_batch_requests_count"], values["mt_batch_requests_sum"]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def summarize(
    done: list[tuple[float, int]], elapsed: float, per_batch: float, client_cores: float
) -> dict[str, float]:
    latencies = [lat for lat, _ in done]
    return {
        "requests_per_batch": per_batch,
        "client_cores": client_cores,  # CPU time of this load generator / wall time
        "sentences": len(done),
        "sent_s": len(done) / elapsed,
        "tok_s": sum(tok for _, tok in done) / elapsed,
        "p50_ms": 1000 * percentile(latencies, 50),
        "p95_ms": 1000 * percentile(latencies, 95),
        "p99_ms": 1000 * percentile(latencies, 99),
    }


def median_of(runs: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(run[key] for run in runs) for key in runs[0]}


def offline(
    engine: str, path: Path, sentences: list[str], runs: int, count, batch: int = 0
) -> dict[str, float]:
    """The same sentences through the library in this process (median of ``runs``): one call, or
    with ``batch`` one call per ``batch`` consecutive sentences, each call one decode batch."""
    import dataclasses

    results = []
    chunks = [sentences[i : i + batch] for i in range(0, len(sentences), batch)] if batch else None
    if engine == "torch":
        from transformer_mt.engines import load_for_inference, translate_lines

        loaded = load_for_inference(path)
        decode = dataclasses.replace(loaded.config.decode, nbest=1, sampling=False)
        if batch:
            decode = dataclasses.replace(decode, batch_tokens=10**9)
        prefix = loaded.source_prefix(None)  # as the server: a multilingual model's one target

        def lines(todo: list[str]) -> list[str]:
            results = translate_lines(
                loaded.model, loaded.src_tok, loaded.trg_tok, todo, decode, src_prefix=prefix
            )
            return [r[0][0] for r in results]
    else:
        from transformer_mt.engines.ct2 import load_ct2, translate_lines_ct2

        model = load_ct2(path)
        decode = dataclasses.replace(model.decode, nbest=1, sampling=False)
        if batch:
            decode = dataclasses.replace(decode, batch_tokens=10**9)
        prefix = model.source_prefix(None)

        def lines(todo: list[str]) -> list[str]:
            return [r[0][0] for r in translate_lines_ct2(model, todo, decode, 1, prefix)]

    def translate() -> list[str]:
        return lines(sentences) if chunks is None else [t for c in chunks for t in lines(c)]

    translate()  # warm-up
    for _ in range(runs):
        start = time.perf_counter()
        texts = translate()
        elapsed = time.perf_counter() - start
        results.append(
            {
                "sentences": len(texts),
                "sent_s": len(texts) / elapsed,
                "tok_s": sum(count(t) for t in texts) / elapsed,
            }
        )
    return median_of(results)


def measure(engine, path, modes, args, sentences, count, log) -> dict[tuple, dict]:
    """Medians of ``args.runs`` load runs per (mode, workers, clients), a server per (mode,
    workers), in the order they are printed."""
    served: dict[tuple, dict] = {}
    for mode in modes:
        for workers in args.workers:
            server = Server(
                engine, path, mode, args.window_ms, args.max_wait_ms, log, workers=workers
            )
            try:
                for clients in args.clients:
                    # warm-up: every worker's first requests
                    asyncio.run(load_run(server.url, sentences[: 2 * clients], clients, 30, count))
                    runs = [
                        summarize(
                            *asyncio.run(
                                load_run(server.url, sentences, clients, args.max_seconds, count)
                            )
                        )
                        for _ in range(args.runs)
                    ]
                    served[mode, workers, clients] = median_of(runs)
            finally:
                server.stop()
    order = {mode: i for i, mode in enumerate(modes)}
    return dict(sorted(served.items(), key=lambda kv: (kv[0][2], kv[0][1], order[kv[0][0]])))


def parse_args() -> argparse.Namespace:
    """The command line, checked."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", type=Path, required=True, help="a .pt from `mt train`")
    parser.add_argument("--src", type=Path, required=True, help="sentences, one per line")
    parser.add_argument("--clients", type=int, nargs="+", default=[32, 8])
    parser.add_argument("--runs", type=int, default=3, help="runs per setting (medians shown)")
    parser.add_argument("--requests", type=int, default=500, help="sentences per run, at most")
    parser.add_argument("--max-seconds", type=float, default=60.0, help="per run, at most")
    parser.add_argument("--window-ms", type=float, default=20.0, help="batching window")
    parser.add_argument(
        "--max-wait-ms", type=float, default=50.0, help="longest gathering (>= --window-ms)"
    )
    parser.add_argument("--engines", nargs="+", default=["torch"], choices=["torch", "ct2"],
                        help="engines to measure (default torch); ct2 needs --ct2 or "
                        "--ct2-export")  # fmt: skip
    parser.add_argument("--ct2", type=Path,
                        help="an exported directory for the ct2 engine (with --engines ct2)")  # fmt: skip
    parser.add_argument(
        "--ct2-export",
        metavar="QUANTIZATION",
        help="export --checkpoint to a temporary directory with this quantization (e.g. int8) "
        "for the ct2 engine (with --engines ct2)",
    )
    parser.add_argument("--workers", type=int, nargs="+", default=[1],
                        help="`mt serve --workers` values to measure (default 1)")  # fmt: skip
    parser.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES),
                        help="batching modes to measure (default all; no-batching is the "
                        "/no-batch column's baseline)")  # fmt: skip
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    if args.requests < 1 or args.max_seconds <= 0 or min(args.clients) < 1 or args.runs < 1:
        parser.error("--requests, --max-seconds, --clients and --runs must be positive")
    if min(args.workers) < 1:
        parser.error("--workers must be positive")
    if not 0 <= args.window_ms <= args.max_wait_ms:
        parser.error("--window-ms must be between 0 and --max-wait-ms (mt serve refuses others)")
    ct2_source = args.ct2 is not None or args.ct2_export is not None
    if "ct2" in args.engines and not ct2_source:
        parser.error(
            "--engines ct2 needs --ct2 DIR (an exported model) or --ct2-export QUANTIZATION"
        )
    if ct2_source and "ct2" not in args.engines:
        parser.error("--ct2/--ct2-export are for the ct2 engine: add ct2 to --engines")
    if args.ct2 is not None and args.ct2_export is not None:
        parser.error("--ct2 and --ct2-export both name the ct2 model: give one")
    return args


def main() -> None:
    """Measure every setting the command line names; print the table (and write --json)."""
    args = parse_args()
    sentences = [
        line.strip() for line in args.src.read_text(encoding="utf-8").splitlines() if line.strip()
    ][: args.requests]
    from transformer_mt.engines import load_for_inference

    trg_tok = load_for_inference(args.checkpoint).trg_tok
    count = lambda text: len(trg_tok.encode(text))  # noqa: E731

    tmp = tempfile.TemporaryDirectory(prefix="bench_serve_")
    engines: list[tuple[str, Path]] = []
    if "torch" in args.engines:
        engines.append(("torch", args.checkpoint))
    if "ct2" in args.engines:
        ct2_dir = args.ct2
        if ct2_dir is None:
            from transformer_mt.convert.ctranslate2 import export_ctranslate2

            loaded = load_for_inference(args.checkpoint)
            ct2_dir = export_ctranslate2(loaded, Path(tmp.name) / "ct2", args.ct2_export)
        engines.append(("ct2", ct2_dir))
    log = Path(tmp.name) / "server.log"

    print(
        f"{len(sentences)} sentences from {args.src}; {args.runs} runs per setting (medians); "
        f"batching window {args.window_ms:g} ms, gathering at most {args.max_wait_ms:g} ms; "
        f"{os.cpu_count()} CPUs",
        flush=True,
    )
    header = f"{'engine':<7}{'mode':<13}{'workers':>8}{'clients':>8}{'sent/s':>9}{'tok/s':>9}"
    header += f"{'p50 ms':>9}{'p95 ms':>9}{'p99 ms':>9}{'/offline':>10}{'/no-batch':>11}"
    header += f"{'req/batch':>11}{'/same batches':>15}{'client CPU':>12}"
    figures: dict = {"sentences": len(sentences), "runs": args.runs, "results": []}
    for engine, path in engines:
        base = offline(engine, path, sentences, args.runs, count)
        print(f"\n{header}", flush=True)
        print(
            f"{engine:<7}{'offline':<13}{'-':>8}{'-':>8}{base['sent_s']:>9.1f}"
            f"{base['tok_s']:>9.0f}",
            flush=True,
        )
        figures["results"].append({"engine": engine, "mode": "offline", **base})
        modes = [m for m in args.modes if engine == "torch" or m != "continuous"]
        served = measure(engine, path, modes, args, sentences, count, log)
        ceilings: dict[int, dict[str, float]] = {}  # batch size -> in-process figures
        for (mode, workers, clients), m in served.items():
            no_batch = served.get(("no-batching", workers, clients))
            vs_nb = f"{m['sent_s'] / no_batch['sent_s']:>10.2f}x" if no_batch else f"{'-':>11}"
            # Continuous batching counts requests per group joining the search, not per batch:
            # it has no batches of its own to decode in-process.
            ceiling = None
            if mode != "continuous":
                size = max(1, round(m["requests_per_batch"]))
                if size not in ceilings:
                    ceilings[size] = offline(engine, path, sentences, args.runs, count, size)
                ceiling = ceilings[size]["sent_s"]
            vs_same = f"{m['sent_s'] / ceiling:>14.2f}x" if ceiling else f"{'-':>15}"
            print(
                f"{engine:<7}{mode:<13}{workers:>8}{clients:>8}{m['sent_s']:>9.1f}"
                f"{m['tok_s']:>9.0f}{m['p50_ms']:>9.0f}{m['p95_ms']:>9.0f}{m['p99_ms']:>9.0f}"
                f"{m['sent_s'] / base['sent_s']:>9.2f}x{vs_nb}"
                f"{m['requests_per_batch']:>11.1f}{vs_same}"
                f"{m['client_cores']:>11.2f}c",
                flush=True,
            )
            figures["results"].append(
                {
                    "engine": engine,
                    "mode": mode,
                    "workers": workers,
                    "clients": clients,
                    **m,
                    "same_batches_sent_s": ceiling,
                }
            )
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
    tmp.cleanup()


if __name__ == "__main__":
    main()
