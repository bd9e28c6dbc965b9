"""`GET /metrics`: what the server has done, in Prometheus's text format (prometheus-client).

One :class:`ServerMetrics` per server. With `mt serve --workers N` every process writes its
values to files in one directory (prometheus-client's multiprocess mode, chosen by the
``PROMETHEUS_MULTIPROC_DIR`` environment variable that the supervising process sets before it
starts the workers), and whichever process answers a scrape reads them all: counters and
histograms are summed over the processes, gauges as their ``multiprocess_mode`` says (the
queue: the sum over the live processes). Single-process, the values live in this process's own
registry (one per app: tests build many apps in one process).

What the metrics say (all prefixed ``mt_``):

- ``http_requests_total{route, method, status, worker}``: answered requests, by route template
  and HTTP status (errors are the 4xx and 5xx ones); ``worker`` is the process's index, 0..N-1;
- ``http_request_duration_seconds{route}``: latency, from the request's arrival to its answer;
- ``http_requests_in_flight``, ``decode_queue_requests``: requests being handled, and those
  submitted to a decode worker and not yet answered (queued or decoding);
- ``batch_requests`` / ``batch_lines`` / ``batch_tokens``: the size of each decode batch
  (engine call), in requests, lines and source pieces; ``batch_decode_seconds``: its time;
- ``translated_lines_total``, ``source_tokens_total``: lines and source pieces decoded, so that
  ``rate(mt_source_tokens_total[1m])`` is the tokens per second translated, and
  ``rate(mt_source_tokens_total[1m]) / rate(mt_batch_decode_seconds_sum[1m])`` the decode
  workers' speed while busy;
- ``abandoned_requests_total``: requests whose client left before their answer;
- ``translation_cache_hits_total`` / ``translation_cache_misses_total``: lines answered from the
  translation cache, and lines looked up there and decoded (the hit rate: hits / both);
- ``workers_ready``: processes whose model is loaded (the sum over live processes).
"""

import os
from pathlib import Path

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

from transformer_mt.serve.batcher import BatchObserver

__all__ = ["CONTENT_TYPE", "MULTIPROC_ENV", "ServerMetrics", "process_ended"]

# prometheus-client reads it when it is imported: the supervisor sets it before it starts the
# worker processes (which import it afresh).
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

# The text format that generate_latest writes (what Prometheus 2 and 3 read alike).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)


def multiprocess_dir() -> Path | None:
    """The directory the processes of one server write their values to; None: one process."""
    directory = os.environ.get(MULTIPROC_ENV)
    return Path(directory) if directory else None


def process_ended(pid: int) -> None:
    """Drop the live gauges of a worker process that has ended (its counters stay counted)."""
    directory = multiprocess_dir()
    if directory is not None:
        mark_process_dead(pid, str(directory))


class ServerMetrics(BatchObserver):
    """The server's counters, histograms and gauges, and their text for a scrape.

    As the decode
    worker's :class:`BatchObserver`, it counts the batches."""

    def __init__(self, worker: int = 0) -> None:
        self.worker = str(worker)
        directory = multiprocess_dir()
        self.registry = CollectorRegistry()
        if directory is not None:  # values go to the directory's files; a scrape reads them all
            MultiProcessCollector(self.registry, str(directory))
        own = None if directory is not None else self.registry
        self.requests = Counter(
            "mt_http_requests_total",
            "HTTP requests answered, by route template, method and status",
            ["route", "method", "status", "worker"],
            registry=own,
        )
        self.latency = Histogram(
            "mt_http_request_duration_seconds",
            "Time from a request's arrival to the end of its answer",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=own,
        )
        self.in_flight = _gauge("mt_http_requests_in_flight", "HTTP requests being handled", own)
        self.queue = _gauge(
            "mt_decode_queue_requests",
            "Requests submitted to the decode worker and not yet answered (queued or decoding)",
            own,
        )
        self.ready = _gauge("mt_workers_ready", "Server processes whose model is loaded", own)
        self.batch_requests = _sizes("mt_batch_requests", "Requests per decode batch", own)
        self.batch_lines = _sizes("mt_batch_lines", "Lines per decode batch", own)
        self.batch_tokens = _sizes("mt_batch_tokens", "Source pieces per decode batch", own)
        self.decode_seconds = Histogram(
            "mt_batch_decode_seconds",
            "Time of each engine call (continuous batching: each search step)",
            buckets=LATENCY_BUCKETS,
            registry=own,
        )
        self.lines = Counter("mt_translated_lines_total", "Lines decoded", registry=own)
        self.tokens = Counter("mt_source_tokens_total", "Source pieces decoded", registry=own)
        self.cache_hits = Counter(
            "mt_translation_cache_hits_total", "Lines answered from the cache", registry=own
        )
        self.cache_misses = Counter(
            "mt_translation_cache_misses_total", "Lines looked up, not cached", registry=own
        )
        self.abandoned_requests = Counter(
            "mt_abandoned_requests_total",
            "Requests whose client left before their answer",
            registry=own,
        )

    def scrape(self) -> bytes:
        """The text a ``GET /metrics`` answers (of every process of the server)."""
        return generate_latest(self.registry)

    def answered(self, route: str, method: str, status: int, seconds: float) -> None:
        """Count one answered HTTP request."""
        self.requests.labels(route, method, str(status), self.worker).inc()
        self.latency.labels(route).observe(seconds)

    # -- BatchObserver: what the decode worker reports ------------------------------------------

    def waiting(self, delta: int) -> None:
        self.queue.inc(delta)

    def batch(self, requests: int, lines: int, tokens: int) -> None:
        self.batch_requests.observe(requests)
        self.batch_lines.observe(lines)
        self.batch_tokens.observe(tokens)
        self.lines.inc(lines)
        self.tokens.inc(tokens)

    def decoded(self, seconds: float) -> None:
        self.decode_seconds.observe(seconds)

    def cache_lookup(self, hit: bool) -> None:
        """A line looked up in the translation cache: found, or not."""
        (self.cache_hits if hit else self.cache_misses).inc()

    def abandoned(self) -> None:
        self.abandoned_requests.inc()


def _gauge(name: str, documentation: str, registry: CollectorRegistry | None) -> Gauge:
    """A gauge that, across processes, is the sum over the live ones."""
    return Gauge(name, documentation, registry=registry, multiprocess_mode="livesum")


def _sizes(name: str, documentation: str, registry: CollectorRegistry | None) -> Histogram:
    return Histogram(name, documentation, buckets=SIZE_BUCKETS, registry=registry)
