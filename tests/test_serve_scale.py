"""`mt serve` scaled out and watched: /health/ready (503 until the model is loaded, and while
draining), /health/live, /metrics (read by prometheus-client's own parser; its counters move with
the requests and, with `--workers 2`, are summed over the processes), and `--workers 2` answering
64 concurrent requests with what `mt translate` gives. Servers listen on 127.0.0.1 only.

Skipped where the serve extra (FastAPI, uvicorn, httpx, prometheus-client) is missing.
"""

import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the serve extra is not installed")
pytest.importorskip("prometheus_client", reason="the serve extra is not installed")
uvicorn = pytest.importorskip("uvicorn", reason="the serve extra is not installed")
httpx = pytest.importorskip("httpx", reason="the serve extra is not installed")

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402
from test_serve import running  # noqa: E402  (the one way to run an app in tests)
from typer.testing import CliRunner  # noqa: E402

from transformer_mt.cli import app as cli_app  # noqa: E402
from transformer_mt.engines.torch_engine import TorchEngine  # noqa: E402
from transformer_mt.errors import MTError  # noqa: E402
from transformer_mt.serve.access import SHARED_LIMITS_ENV, SharedRateLimiter  # noqa: E402
from transformer_mt.serve.app import create_app, create_loading_app  # noqa: E402
from transformer_mt.serve.file_store import SHARED_FILES_ENV, FileStore  # noqa: E402
from transformer_mt.serve.metrics import ServerMetrics  # noqa: E402
from transformer_mt.serve.settings import FileSettings, ServeSettings  # noqa: E402
from transformer_mt.serve.state import LOADING, ProcessState, Readiness  # noqa: E402
from transformer_mt.serve.workers import shared_environment  # noqa: E402
from transformer_mt.text.content import has_text  # noqa: E402

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "old_checkpoint"
CKPT = FIXTURE / "old_last.pt"
SRC = FIXTURE / "src.txt"


def metric_samples(text: str) -> dict[tuple, float]:
    """A scrape parsed by prometheus-client's own parser: (sample name, sorted labels) -> value."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def requests_by(samples: dict[tuple, float], route: str, status: str) -> dict[str, float]:
    """``mt_http_requests_total`` of one route and status, by worker."""
    by_worker: dict[str, float] = {}
    for (name, labels), value in samples.items():
        labels = dict(labels)
        if name == "mt_http_requests_total" and (labels["route"], labels["status"]) == (
            route,
            status,
        ):
            by_worker[labels["worker"]] = by_worker.get(labels["worker"], 0.0) + value
    return by_worker


def scrape(url: str) -> dict[tuple, float]:
    """GET /metrics on a connection of its own, parsed."""
    return metric_samples(httpx.get(f"{url}/metrics", timeout=30).text)


def value(samples: dict[tuple, float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


@pytest.fixture(scope="module")
def engine():
    return TorchEngine(CKPT)


@pytest.fixture(scope="module")
def lines() -> list[str]:
    return SRC.read_text(encoding="utf-8").splitlines()


@pytest.fixture(scope="module")
def expected() -> dict[str, list[list[str]]]:
    """`mt translate --beam 3 --nbest 2` of the fixture's lines: per line, (text, score) rows."""
    cli = CliRunner().invoke(
        cli_app, ["translate", "-c", str(CKPT), "-i", str(SRC), "--beam", "3", "--nbest", "2"]
    )
    assert cli.exit_code == 0, cli.output
    rows = [row.split("\t") for row in cli.stdout.splitlines()]
    return {line: rows[2 * i : 2 * i + 2] for i, line in enumerate(SRC.read_text().splitlines())}


def test_ready_is_503_until_the_model_is_loaded_and_live_answers_throughout(engine, lines):
    """A load balancer must not send requests before the model is loaded; a liveness probe must
    not kill a server that is still loading."""
    release = threading.Event()

    def load():
        assert release.wait(30), "the test never let the model load"
        return engine

    process = ProcessState(0, Readiness(1), ServerMetrics())
    app = create_loading_app(load, ServeSettings(), process)
    with running(app) as url, httpx.Client(base_url=url, timeout=30) as client:
        assert client.get("/health/live").json() == {"status": "alive"}
        ready = client.get("/health/ready")
        assert ready.status_code == 503 and ready.json()["status"] == "loading", ready.text
        early = client.post("/v1/translate", json={"text": [lines[0]]})
        assert early.status_code == 503 and early.json() == {"error": LOADING}
        assert early.headers["retry-after"] == "1"
        assert client.post("/translate", json={"q": "x", "source": "src", "target": "trg"}
                           ).status_code == 503  # fmt: skip
        assert client.get("/health").status_code == 503
        assert "mt_workers_ready 0.0" in client.get("/metrics").text
        release.set()
        deadline = time.monotonic() + 30
        while (ready := client.get("/health/ready")).status_code != 200:
            assert time.monotonic() < deadline, ready.text
            time.sleep(0.02)
        assert ready.json() == {
            "status": "ready", "workers": 1, "workers_ready": 1, "worker": 0, "pid": os.getpid()
        }  # fmt: skip
        answer = client.post("/v1/translate", json={"text": [lines[0]]})
        assert answer.status_code == 200
        assert (
            answer.json()["translations"][0]["text"]
            == engine.translate([lines[0]], engine.decode)[0].text
        )
        assert client.get("/health/live").status_code == 200
        assert "mt_workers_ready 1.0" in client.get("/metrics").text
    assert process.readiness.status == "loading"  # stopped: its worker is not ready any more


def test_a_model_that_fails_to_load_ends_the_server_with_its_one_line_error(tmp_path):
    """The server answers (503) while it loads; a checkpoint that turns out damaged then ends
    it with the loader's one line and exit code 1, as before it served first."""
    damaged = tmp_path / "damaged.pt"
    damaged.write_bytes(CKPT.read_bytes()[:5000])
    result = CliRunner().invoke(cli_app, ["serve", "-c", str(damaged), "--port", "0"])
    assert result.exit_code == 1, result.output
    last = result.output.strip().splitlines()[-1]
    assert last.startswith("error: ") and str(damaged) in last, result.output
    with pytest.raises(MTError):  # the same error, raised by the loader itself
        TorchEngine(damaged)


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_files_dir_that_cannot_be_made_ends_the_server_with_its_one_line_error(tmp_path, workers):
    """--files-dir under a plain file: the server (one process, or the supervisor of two) ends
    with one line naming --files-dir and exit code 1, instead of answering "loading" for ever."""
    (tmp_path / "plain").write_text("a file, not a directory\n")
    files_dir = tmp_path / "plain" / "downloads"
    result = CliRunner().invoke(
        cli_app,
        ["serve", "-c", str(CKPT), "--port", "0", "--workers", workers, "--files",
         "--files-dir", str(files_dir)],
    )  # fmt: skip
    assert result.exit_code == 1, result.output
    last = result.output.strip().splitlines()[-1]
    assert last.startswith(f"error: --files-dir {files_dir}: cannot keep"), result.output


def _open_shared_files(environment: dict[str, str], barrier, outcomes) -> None:
    """What each worker process opens of the shared files, all at one moment."""
    barrier.wait()
    try:
        SharedRateLimiter(Path(environment[SHARED_LIMITS_ENV]))
        FileStore(FileSettings(), shared=environment[SHARED_FILES_ENV]).close()
        outcomes.put("opened")
    except Exception as err:  # the outcome is the test's subject
        outcomes.put(repr(err))


def test_workers_opening_the_shared_files_at_once_all_open_them(tmp_path):
    """The supervisor makes the workers' SQLite files before it starts them: four processes
    that open them at the same moment all succeed. (Two processes that make a new file's WAL
    mode at once fail about half the time with "database is locked", whatever their timeout:
    a worker then never became ready.)"""
    context = multiprocessing.get_context("fork")  # quick to start: the race needs no torch
    for trial in range(10):
        metrics_dir, files_dir = tmp_path / f"metrics{trial}", tmp_path / f"files{trial}"
        metrics_dir.mkdir(), files_dir.mkdir()
        environment = shared_environment(metrics_dir, files_dir)
        barrier, outcomes = context.Barrier(4), context.SimpleQueue()
        processes = [
            context.Process(target=_open_shared_files, args=(environment, barrier, outcomes))
            for _ in range(4)
        ]
        for process in processes:
            process.start()
        for process in processes:
            process.join(60)
        assert [outcomes.get() for _ in processes] == ["opened"] * 4, trial


def test_metrics_parse_and_move_with_requests(engine, lines):
    app = create_app(engine)
    with running(app) as url, httpx.Client(base_url=url, timeout=30) as client:
        before = metric_samples(client.get("/metrics").text)
        for line in lines[:3]:
            assert client.post("/v1/translate", json={"text": [line, line]}).status_code == 200
        assert client.post("/v1/translate", json={"text": "not a list"}).status_code == 400
        assert client.get("/no/such/route").status_code == 404
        reply = client.get("/metrics")
    assert reply.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    after = metric_samples(reply.text)

    def moved(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    ok = {"route": "/v1/translate", "method": "POST", "worker": "0"}
    assert moved("mt_http_requests_total", **ok, status="200") == 3
    assert moved("mt_http_requests_total", **ok, status="400") == 1
    unmatched = {"route": "unmatched", "method": "GET", "status": "404", "worker": "0"}
    assert moved("mt_http_requests_total", **unmatched) == 1
    assert moved("mt_http_request_duration_seconds_count", route="/v1/translate") == 4
    assert moved("mt_translated_lines_total") == 6
    tokens = sum(engine.count_tokens([line, line]) for line in lines[:3])
    assert moved("mt_source_tokens_total") == tokens
    assert moved("mt_batch_tokens_sum") == tokens
    assert moved("mt_batch_requests_count") == moved("mt_batch_decode_seconds_count") == 3
    assert moved("mt_batch_lines_sum") == 6 and moved("mt_batch_decode_seconds_sum") > 0
    assert value(after, "mt_decode_queue_requests") == 0
    assert value(after, "mt_workers_ready") == 1
    assert value(after, "mt_http_requests_in_flight") == 1  # the scrape itself


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def serving(*options: str):
    """`mt serve` of the fixture in a process of its own, on a free port, until ready; yields
    the process and its base URL. The process is stopped (SIGTERM) if still running."""
    port = _free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "transformer_mt", "serve", "-c", str(CKPT), "--port", str(port),
         "--no-files", *options],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(proc, url)
        yield proc, url
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def wait_ready(proc: subprocess.Popen, url: str, workers: int | None = None) -> dict:
    """/health/ready's answer once it is 200 (with ``workers`` ready)."""
    deadline = time.monotonic() + 90
    while True:
        assert proc.poll() is None, proc.stdout.read()
        try:
            reply = httpx.get(f"{url}/health/ready", timeout=5)
            if reply.status_code == 200 and reply.json()["workers_ready"] == (
                workers or reply.json()["workers"]
            ):
                return reply.json()
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:  # stop it, to show what it printed
            proc.terminate()
            raise AssertionError(f"the server did not become ready:\n{proc.communicate(30)[0]}")
        time.sleep(0.1)


@pytest.fixture(scope="module")
def two_workers():
    """`mt serve --workers 2` of the fixture: its process and base URL (the last test of this
    file stops it)."""
    with serving("--workers", "2") as (proc, url):
        yield proc, url


def test_two_workers_answer_64_concurrent_requests_as_mt_translate_does(
    two_workers, lines, expected
):
    """64 requests at once on one port, spread by the kernel over 2 processes (each its own
    model): each answer equals `mt translate`'s, and /metrics, whichever process answers it,
    counts all 64 (the sum over the two workers, each of which answered some)."""
    _, url = two_workers
    before = scrape(url)
    done_before = requests_by(before, "/v1/translate", "200")
    asked = (lines * 3)[:64]

    def ask(line: str) -> dict:
        reply = httpx.post(  # a connection of its own: the kernel picks the worker
            f"{url}/v1/translate", json={"text": [line], "beam": 3, "nbest": 2}, timeout=60
        )
        assert reply.status_code == 200, reply.text
        return reply.json()["translations"][0]

    with ThreadPoolExecutor(64) as pool:
        answers = list(pool.map(ask, asked))
    for line, answer in zip(asked, answers, strict=True):
        want = expected[line]
        assert [h["text"] for h in answer["nbest"]] == [text for text, _ in want], line
        for h, (_, score) in zip(answer["nbest"], want, strict=True):
            assert abs(h["score"] - float(score)) < 1e-3
    deadline = time.monotonic() + 10  # each worker counts a request once it has answered it
    while sum(requests_by(scrape(url), "/v1/translate", "200").values()) < 64 + sum(
        done_before.values()
    ):
        assert time.monotonic() < deadline, "the 64 requests were not all counted"
    scrapes = Counter()
    for _ in range(6):  # fresh connections: scrapes answered by either worker
        samples = scrape(url)
        by_worker = requests_by(samples, "/v1/translate", "200")
        moved = {w: n - done_before.get(w, 0.0) for w, n in by_worker.items()}
        assert sum(moved.values()) == 64, moved
        lines_decoded = value(samples, "mt_translated_lines_total") - value(
            before, "mt_translated_lines_total"
        )
        assert lines_decoded == sum(has_text(line) for line in asked)  # empty lines: never
        assert value(samples, "mt_workers_ready") == 2
        scrapes[tuple(sorted(by_worker.items()))] += 1
    assert len(scrapes) == 1, scrapes  # every scrape says the same
    assert min(moved.get("0", 0), moved.get("1", 0)) > 0, moved  # both workers answered


def test_a_dead_worker_is_replaced_and_its_counts_stay(two_workers, lines):
    """SIGKILL one of two workers: the server is not ready until its replacement has loaded its
    model, then serves with both; what the dead one counted is still in /metrics. Then SIGTERM
    stops the server (exit code 0). The last test of the two-worker server."""
    proc, url = two_workers
    assert httpx.post(f"{url}/v1/translate", json={"text": [lines[0]]}).status_code == 200
    pids = {}
    deadline = time.monotonic() + 30
    while len(pids) < 2:  # fresh connections until each worker has answered once
        ready = httpx.get(f"{url}/health/ready", timeout=5).json()
        pids[ready["worker"]] = ready["pid"]
        assert time.monotonic() < deadline, pids
    counted = scrape(url)
    os.kill(pids[0], signal.SIGKILL)
    deadline = time.monotonic() + 60
    while True:
        ready = httpx.get(f"{url}/health/ready", timeout=5).json()
        if ready["worker"] == 0 and ready["pid"] != pids[0] and ready["status"] == "ready":
            break
        assert time.monotonic() < deadline, ready
        time.sleep(0.1)
    samples = scrape(url)
    route = ("/v1/translate", "200")
    assert sum(requests_by(samples, *route).values()) == sum(requests_by(counted, *route).values())
    assert value(samples, "mt_workers_ready") == 2
    assert httpx.post(f"{url}/v1/translate", json={"text": [lines[0]]}).status_code == 200
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    log = proc.stdout.read()
    assert f"worker 0 (pid {pids[0]}) died (exit code -9); starting another" in log, log


def test_sigterm_drains_ready_503_while_requests_are_still_answered(lines):
    """With --drain-seconds, SIGTERM first turns /health/ready to 503 ("draining") while the
    server goes on answering (a second SIGTERM changes nothing), so that a load balancer can
    take it out of rotation; then it stops with exit code 0."""
    with serving("--drain-seconds", "3") as (proc, url):
        proc.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        while (ready := httpx.get(f"{url}/health/ready", timeout=5)).status_code == 200:
            assert time.monotonic() - signalled < 1, "still ready 1 s after SIGTERM"
        assert ready.status_code == 503 and ready.json()["status"] == "draining", ready.text
        proc.send_signal(signal.SIGTERM)  # another (a service manager's and a supervisor's)
        answer = httpx.post(f"{url}/v1/translate", json={"text": [lines[0]]}, timeout=30)
        assert answer.status_code == 200, answer.text  # after the drain: no connection
        assert proc.wait(30) == 0
        took = time.monotonic() - signalled
        log = proc.stdout.read()
    assert 2.5 < took < 20, took
    assert "draining: /health/ready answers 503; stopping in 3 s" in log, log
    assert "stopped (SIGTERM); every request in flight was answered" in log, log


def test_the_request_limit_counts_every_workers_requests(tmp_path):
    """`--req-limit 4` with two workers: one client's fifth request in the minute gets the 429,
    whichever worker each request reaches (each on a connection of its own); the workers share
    their counts through one SQLite file (SharedRateLimiter). Two limiters on one file, as two
    processes open it, admit 3 requests between them at a limit of 3, per client."""
    shared = tmp_path / "limits.sqlite3"
    first, second = SharedRateLimiter(shared), SharedRateLimiter(shared)
    answers = [limiter.admit("a", 3) for limiter in (first, second, first, second)]
    assert answers[:3] == [None, None, None] and 0 < answers[3] <= 60
    assert second.admit("b", 3) is None, "another client counts apart"
    quick = SharedRateLimiter(shared, window_s=0.2)
    assert quick.admit("c", 1) is None and quick.admit("c", 1) is not None
    time.sleep(0.3)
    assert quick.admit("c", 1) is None, "a request leaves the count after the window"

    with serving("--workers", "2", "--req-limit", "4") as (_, url):
        codes: list[int] = []
        answered: dict[str, float] = {}  # /translate requests answered, by worker
        while len(codes) < 8 or len(answered) < 2:  # until both workers have answered some
            assert len(codes) < 64, f"one worker took every connection: {answered}"
            reply = httpx.post(f"{url}/translate", json={"q": "eni bistor .", "source": "src",
                                                        "target": "trg"}, timeout=60)  # fmt: skip
            codes.append(reply.status_code)
            deadline = time.monotonic() + 10  # a worker counts a request once it has answered
            while sum(answered.values()) < len(codes):
                samples = scrape(url)
                answered = {}
                for status in ("200", "429"):
                    for worker, n in requests_by(samples, "/translate", status).items():
                        answered[worker] = answered.get(worker, 0.0) + n
                assert time.monotonic() < deadline, answered
    assert codes[:4] == [200] * 4 and set(codes[4:]) == {429}, codes


def test_a_file_translated_by_one_worker_downloads_from_either(tmp_path):
    """`--workers 2` with file translation on: /translate_file answers on one worker, and its
    download answers 200 on fresh connections until both workers have served it (the workers
    share one store of downloads); the store's directory is gone when the server stops."""
    with serving("--workers", "2", "--files", "--files-dir", str(tmp_path)) as (proc, url):
        reply = httpx.post(
            f"{url}/translate_file",
            data={"source": "src", "target": "trg"},
            files={"file": ("notes.txt", b"eni bistor .\n")},
            timeout=60,
        )
        assert reply.status_code == 200, reply.text
        download = reply.json()["translatedFileUrl"]
        served: set[str] = set()
        for _ in range(40):  # fresh connections: the kernel picks the worker
            before = scrape(url)
            got = httpx.get(download, timeout=30)
            assert got.status_code == 200, got.text
            assert got.content.strip() and b"eni" not in got.content
            after = scrape(url)
            for worker, n in requests_by(after, "/download_file/{name}", "200").items():
                if n > requests_by(before, "/download_file/{name}", "200").get(worker, 0.0):
                    served.add(worker)
            if len(served) == 2:
                break
        assert served == {"0", "1"}, served
        assert len(list(tmp_path.iterdir())) == 1, "one store for both workers"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    assert list(tmp_path.iterdir()) == [], "the server removed its store"
