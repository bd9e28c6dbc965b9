"""What clients that leave cost the next one: `mt serve` on 127.0.0.1, K clients that each send a
request of many lines at a wide beam and close their connection at once, then one client with a
one-line request; prints that request's latency (median over ``--runs``, each run on a freshly
started server, so that no leftover work carries over) and how many lines the server decoded for
clients that had left (from its /health counters).

A server that decodes requests whose client has gone makes the last client wait for all of them;
one that drops them (queued) or stops them (between decode batches) answers it at once. With
``--baseline DIR`` (a checkout of older code, e.g. ``git worktree add /tmp/old HEAD``), the same
runs start the server from that tree too, alternating with this one (the checkpoint must load
in both):

    python scripts/bench_disconnect.py --checkpoint runs/toy/best.pt \\
        --src data/cache/toy-v3-seed1234-20000-500-500-src-trg/test.src --baseline /tmp/old

Only loopback: the servers listen on 127.0.0.1 and the clients connect there.
"""

import argparse
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

HERE = Path(__file__).resolve().parent.parent  # this checkout


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(tree: Path, checkpoint: Path, extra: list[str], log) -> tuple:
    """`mt serve` run from ``tree`` (its package first on the path) on a free port; returns the
    process and its URL once /health answers."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "transformer_mt", "serve", "-c", str(checkpoint)]
    cmd += ["--host", "127.0.0.1", "--port", str(port), *extra]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=tree)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        if proc.poll() is not None:
            log.flush()
            tail = "\n".join(Path(log.name).read_text(errors="replace").splitlines()[-15:])
            raise SystemExit(f"the server from {tree} exited ({proc.returncode}):\n{tail}")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            raise SystemExit(f"the server from {tree} did not start in 120 s")
        time.sleep(0.2)


def stop_server(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(120)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def send_and_leave(url: str, body: dict) -> None:
    """Send a whole ``POST /v1/translate`` and close the connection without reading."""
    data = json.dumps(body).encode()
    with socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])), timeout=30) as s:
        s.sendall(
            b"POST /v1/translate HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(data) + data
        )


def one_run(tree: Path, args, lines: list[str], log) -> dict:
    """A fresh server; K abandoned requests, then the timed one-line request."""
    proc, url = start_server(tree, args.checkpoint, args.serve_option, log)
    try:
        with httpx.Client(base_url=url, timeout=600) as client:
            client.post("/v1/translate", json={"text": [lines[0]]}).raise_for_status()  # warm
            for _ in range(args.abandoned):
                send_and_leave(url, {"text": lines[: args.lines], "beam": args.beam})
            start = time.perf_counter()
            reply = client.post("/v1/translate", json={"text": [lines[-1]]})
            latency = time.perf_counter() - start
            reply.raise_for_status()
            time.sleep(args.settle)  # let the server finish (or drop) what it was given
            health = client.get("/health").json()
    finally:
        stop_server(proc)
    if "abandoned" in health:  # the server counts the lines it spared
        wasted = health["abandoned"] * args.lines - health["lines_not_decoded"]
    else:  # older code decodes every request it queued: all but the warm-up and timed ones
        wasted = (health["requests"] - 2) * args.lines
    return {"latency_s": latency, "wasted_lines": wasted, **health}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", type=Path, required=True, help="a .pt from `mt train`")
    parser.add_argument("--src", type=Path, required=True, help="sentences, one per line")
    parser.add_argument("--abandoned", type=int, default=5, help="clients that leave (K)")
    parser.add_argument("--lines", type=int, default=64, help="lines per abandoned request")
    parser.add_argument("--beam", type=int, default=16, help="beam of the abandoned requests")
    parser.add_argument("--runs", type=int, default=3, help="runs per tree (median shown)")
    parser.add_argument(
        "--settle", type=float, default=2.0, help="seconds before reading /health, after timing"
    )
    parser.add_argument("--baseline", type=Path, help="a checkout to compare with (alternating)")
    parser.add_argument(
        "--serve-option",
        action="append",
        default=[],
        help="an option for `mt serve` (repeat; e.g. --serve-option=--continuous)",
    )
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    if args.abandoned < 0 or min(args.lines, args.beam, args.runs) < 1:
        parser.error("--lines, --beam and --runs must be positive, --abandoned at least 0")
    args.checkpoint = args.checkpoint.resolve()  # the servers run in their own tree
    sentences = [s.strip() for s in args.src.read_text(encoding="utf-8").splitlines() if s.strip()]
    if not sentences:
        parser.error(f"{args.src} has no sentences")
    lines = (sentences * (1 + args.lines // len(sentences)))[: max(args.lines, 2)]
    trees = {"this checkout": HERE}
    if args.baseline is not None:
        trees["baseline " + str(args.baseline)] = args.baseline.resolve()

    print(
        f"{args.abandoned} clients send {args.lines} lines at beam {args.beam} and leave at once; "
        f"then one line at the model's beam, timed; {args.runs} runs per tree, alternating, "
        f"each on a fresh server; {os.cpu_count()} CPUs",
        flush=True,
    )
    results: dict[str, list[dict]] = {name: [] for name in trees}
    with (
        tempfile.TemporaryDirectory(prefix="bench_disconnect_") as tmp,
        open(Path(tmp) / "server.log", "w") as log,
    ):
        for _ in range(args.runs):
            for name, tree in trees.items():
                results[name].append(one_run(tree, args, lines, log))
    sent = args.abandoned * args.lines
    for name, runs in results.items():
        latencies = [run["latency_s"] * 1000 for run in runs]
        wasted = [run["wasted_lines"] for run in runs]
        print(
            f"{name}: one-line request {statistics.median(latencies):.0f} ms (median; runs "
            f"{', '.join(f'{x:.0f}' for x in latencies)} ms); lines decoded for clients that "
            f"had left, per run: {', '.join(map(str, wasted))} of {sent}",
            flush=True,
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
