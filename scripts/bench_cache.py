"""The server's translation cache: a repeated request's latency, against the first (decoded) one.

    python scripts/bench_cache.py -c runs/m30k/best.pt --src de --trg en --repeats 200

Starts `mt serve -c CKPT --cache-lines 10000` on a free 127.0.0.1 port in its own process, sends
one LibreTranslate /translate request (two sentences: decoded, then kept), then the same request
--repeats times from one client (each answered from the cache), and prints the first request's
time and the repeats' median and 90th percentile, as the client measures them (HTTP included),
then the server's cache counters from /metrics. Beside each repeat, GET /health/live: what any
request costs here (the client, HTTP, the app's middleware), the floor under the cache's figure.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

TEXT = "Ein Mann sitzt auf einer Bank. Zwei Hunde spielen im Schnee."


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-c", "--checkpoint", type=Path, required=True)
    parser.add_argument("--src", default="de")
    parser.add_argument("--trg", default="en")
    parser.add_argument("--text", default=TEXT)
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    port = free_port()
    command = [sys.executable, "-m", "transformer_mt", "serve", "-c", str(args.checkpoint)]
    server = subprocess.Popen([*command, "--port", str(port), "--cache-lines", "10000"])
    url = f"http://127.0.0.1:{port}"
    body = {"q": args.text, "source": args.src, "target": args.trg}
    try:
        with httpx.Client(base_url=url, timeout=120) as client:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                try:
                    if client.get("/health/ready").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                time.sleep(0.2)
            start = time.perf_counter()
            first = client.post("/translate", json=body)
            first_s = time.perf_counter() - start
            times, floor = [], []
            for _ in range(args.repeats):  # alternating with the floor: the same moments
                start = time.perf_counter()
                again = client.post("/translate", json=body)
                times.append(time.perf_counter() - start)
                assert again.json() == first.json(), "a cached answer differs"
                start = time.perf_counter()
                client.get("/health/live")
                floor.append(time.perf_counter() - start)
            counters = [
                line
                for line in client.get("/metrics").text.splitlines()
                if line.startswith("mt_translation_cache") and "_total" in line
            ]
    finally:
        server.terminate()
        server.wait(timeout=60)
    times.sort()
    floor.sort()
    print(f"first request (decoded): {1000 * first_s:.1f} ms")
    print(
        f"repeats from the cache: median {1000 * statistics.median(times):.2f} ms, "
        f"p90 {1000 * times[int(0.9 * len(times))]:.2f} ms over {len(times)}"
    )
    print(
        f"the floor, GET /health/live (HTTP, the app's middleware, no translation): median "
        f"{1000 * statistics.median(floor):.2f} ms, p90 {1000 * floor[int(0.9 * len(floor))]:.2f} ms"
    )
    print("\n".join(counters))


if __name__ == "__main__":
    main()
