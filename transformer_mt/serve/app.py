"""The server's application (FastAPI), and one process serving it with uvicorn.

This module assembles the app and runs it in a process (:mod:`~transformer_mt.serve.launch` binds
the port and starts the processes); the routes live in one module per API:

- :mod:`~transformer_mt.serve.routes_libre`: LibreTranslate's API (``/translate``,
  ``/languages``, ``/detect``, ``/frontend/settings``, ``/suggest``, ``/spec``), and
  :mod:`~transformer_mt.serve.routes_files` its file translation (``/translate_file``,
  ``/download_file/NAME``);
- :mod:`~transformer_mt.serve.routes_v1`: ours (``/v1/translate`` with n-best and
  attention, ``/v1/model``, ``/health``, the page at ``/``; ``/static/...``).

Their parts (engine, decode worker, limits, access checks, downloads: a
:class:`~transformer_mt.serve.state.ServerState`) are injected with FastAPI's
``Depends``; request bodies are read by :mod:`~transformer_mt.serve.forms`; keys and
request limits are :mod:`~transformer_mt.serve.access`'s. Every refused request gets a 4xx
JSON ``{"error": "<one line>"}``; every answer carries LibreTranslate's CORS headers.

Decoding goes through one :class:`~transformer_mt.serve.batcher.Batcher` worker (dynamic
batching). A client that closes its connection before its answer costs at most the decode batch
its request is in: queued, the request is dropped; decoding, it stops after the current batch.
`mt serve` binds its port before it loads the model (:mod:`~transformer_mt.serve.launch`). It
then serves at once while the model loads in a thread of its own: ``/health/live``,
``/health/ready`` (a 503 until the model is loaded) and ``/metrics`` answer, every other route a
503; a model that fails to load stops the server with its one-line error. On SIGTERM the server
is draining (``/health/ready``: 503; with ``drain_s``, it keeps serving that long first, for a
load balancer to notice), then uvicorn stops accepting, lets the requests in flight finish (for
at most the shutdown timeout; the log says how many it cut off), and the decode worker drains
before the process ends.

``--workers N``: N processes (started with ``spawn``), each with its own model, decode worker and
event loop, accept on the one bound socket (the kernel hands each connection to one of them).
This process supervises them: it forwards SIGTERM, restarts a worker that dies after its model
was loaded, and stops the server when one fails to load. They share their readiness
(:class:`~transformer_mt.serve.state.Readiness`) and their metrics' files
(:mod:`~transformer_mt.serve.metrics`), so that every worker answers ``/health/ready`` and
``/metrics`` for the whole server.
"""

import asyncio
import contextlib
import dataclasses
import functools
import logging
import os
import re
import signal
import socket
import threading
import time
import typing
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from transformer_mt.engines.engine import Engine, load_engine
from transformer_mt.errors import MTError
from transformer_mt.serve.batcher import Batcher
from transformer_mt.serve.settings import (
    SHUTDOWN_TIMEOUT_S,
    ApiError,
    BatchSettings,
    Limits,
    ServeSettings,
)

try:
    import uvicorn
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from starlette.exceptions import HTTPException
    from starlette.staticfiles import StaticFiles
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

    from transformer_mt.serve import routes_files, routes_libre, routes_v1
    from transformer_mt.serve.access import Access
    from transformer_mt.serve.cache import TranslationCache
    from transformer_mt.serve.file_store import SHARED_FILES_ENV, FileStore
    from transformer_mt.serve.forms import first_error, json_bytes
    from transformer_mt.serve.metrics import ServerMetrics
    from transformer_mt.serve.state import (
        ProcessState,
        Readiness,
        ServerState,
        close_parsing,
        load_glossaries,
    )
except ImportError as err:  # pragma: no cover - depends on the environment
    raise MTError(
        f"`mt serve` needs FastAPI, uvicorn, python-multipart, langcodes and prometheus-client "
        f"({err.name} is missing): pip install 'transformer-mt[serve]' (in a checkout: pip "
        "install -e '.[serve]')"
    ) from err

__all__ = [
    "SHUTDOWN_TIMEOUT_S",
    "ApiError",
    "BatchSettings",
    "Limits",
    "ServeSettings",
    "create_app",
    "create_loading_app",
]

logger = logging.getLogger(__name__)

# LibreTranslate's CORS headers, on every answer: pages on other origins may call the API.
CORS_HEADERS = [
    (b"access-control-allow-origin", b"*"),
    (b"access-control-allow-headers", b"Authorization, Content-Type"),
    (b"access-control-expose-headers", b"Authorization"),
    (b"access-control-allow-methods", b"GET, POST"),
    (b"access-control-allow-credentials", b"true"),
    (b"access-control-max-age", b"1728000"),
]


@dataclass
class RequestCounts:
    """HTTP requests in flight and those cut off at shutdown.

    HTTP requests being handled, and those cancelled before their answer was sent (by
    uvicorn, when its graceful-shutdown timeout ran out with them still in flight)."""

    in_flight: int = 0
    cancelled: int = 0

    @property
    def unanswered(self) -> int:
        """The requests uvicorn gave up on at shutdown.

        After uvicorn's shutdown: the requests it gave up on. It waits for every request
        until the timeout, then cancels the rest and goes on without waiting for them to
        unwind, so some may still count as in flight."""
        return self.in_flight + self.cancelled


class _CountRequests:
    """ASGI middleware that counts requests and records their metrics.

    ASGI middleware keeping :class:`RequestCounts` and the HTTP metrics (requests by route
    and status, latency, requests in flight)."""

    def __init__(self, app: ASGIApp, counts: RequestCounts, metrics: ServerMetrics) -> None:
        self.app, self.counts, self.metrics = app, counts, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        self.counts.in_flight += 1
        self.metrics.in_flight.inc()
        arrived = time.perf_counter()
        status = 500  # an exception that escapes becomes starlette's 500
        started = False

        async def tracked_send(message: Message) -> None:
            nonlocal started, status
            if message["type"] == "http.response.start":
                started, status = True, message["status"]
            await send(message)

        try:
            await self.app(scope, receive, tracked_send)
        except asyncio.CancelledError:
            # Cut off by uvicorn's shutdown timeout. A request whose answer has not begun still
            # gets a JSON error (uvicorn's own would be a text/plain 500 and a traceback); the
            # task then ends as uvicorn wants it to.
            self.counts.cancelled += 1
            status = status if started else 503
            if started or not await _send_json_error(send, 503, _SHUTTING_DOWN):
                raise
        finally:
            self.counts.in_flight -= 1
            self.metrics.in_flight.dec()
            seconds = time.perf_counter() - arrived
            self.metrics.answered(_route(scope), scope["method"], status, seconds)


def _route(scope: Scope) -> str:
    """The route template a request matched, or "unmatched".

    A template such as ``/download_file/{name}`` is kept as it is, not filled with the name, so
    that a metric's label takes few values."""
    return getattr(scope.get("route"), "path", None) or "unmatched"


_SHUTTING_DOWN = "the server shut down before answering; send the request again"


async def _send_json_error(send: Send, status: int, message: str) -> bool:
    """Send a ``{"error": message}`` answer; False when the client is gone.

    Send a whole ``{"error": message}`` response through ASGI ``send``; False when the
    connection is gone."""
    body = json_bytes({"error": message})
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    try:
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
    except Exception:  # any failure here means the client cannot be told
        return False
    return True


class _Cors:
    """ASGI middleware: LibreTranslate's CORS headers and preflight answers.

    The headers go on every answer; a browser's preflight (OPTIONS with
    Access-Control-Request-Method) is answered at once."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers", ()))
        if scope["method"] == "OPTIONS" and b"access-control-request-method" in headers:
            await send({"type": "http.response.start", "status": 200, "headers": CORS_HEADERS})
            await send({"type": "http.response.body", "body": b""})
            return

        async def with_cors(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), *CORS_HEADERS]}
            await send(message)

        await self.app(scope, receive, with_cors)


def create_app(
    engine: Engine,
    limits: Limits | None = None,
    batching: BatchSettings | None = None,
    settings: ServeSettings | None = None,
) -> FastAPI:
    """The FastAPI app over a loaded ``engine``, by ``settings``.

    ``limits`` and ``batching``, where given, replace those of ``settings``. The app's decode
    worker runs while its lifespan does; ``app.state.requests`` (:class:`RequestCounts`) says what
    a shutdown left unanswered."""
    settings = settings or ServeSettings()
    settings = dataclasses.replace(
        settings, limits=limits or settings.limits, batching=batching or settings.batching
    )
    app = _new_app(settings, ProcessState(0, Readiness(1), ServerMetrics()))
    _install(app, engine)
    return app


def create_loading_app(
    load: Callable[[], Engine], settings: ServeSettings, process: ProcessState, where: str = ""
) -> FastAPI:
    """The app over an engine still to load, loaded once the app starts.

    The app over the engine that ``load()`` returns, called in a thread of its own once the
    app starts (its lifespan). Until it returns, /health/live, /health/ready (a 503) and
    /metrics answer, every other route a 503; then the model and ``where`` it is served are
    logged. If it raises, ``app.state.load_error`` keeps the error and ``app.state.stop()`` is
    called."""
    app = _new_app(settings, process)
    app.state.load, app.state.where = load, where
    return app


def _new_app(settings: ServeSettings, process: ProcessState) -> FastAPI:
    """The app without its engine: routes, error handlers, middleware, the process's parts."""
    # python-multipart logs every malformed body it meets: a client could fill the server's log.
    logging.getLogger("python_multipart").setLevel(logging.ERROR)
    app = FastAPI(title="transformer-mt", lifespan=_lifespan)
    app.state.settings, app.state.process, app.state.requests = settings, process, RequestCounts()
    app.state.server = app.state.batcher = app.state.load = app.state.load_error = None
    app.state.stop = lambda: None  # what stops the server (set where it runs)
    for router in (routes_libre.router, routes_files.router, routes_v1.router):
        app.include_router(router)
    app.mount("/static", StaticFiles(directory=routes_v1.STATIC_DIR, check_dir=False), "static")
    app.exception_handler(ApiError)(_api_error)
    app.exception_handler(HTTPException)(_http_error)
    app.exception_handler(RequestValidationError)(_validation_error)
    app.add_middleware(_CountRequests, counts=app.state.requests, metrics=process.metrics)
    app.add_middleware(_Cors)
    return app


def _install(app: FastAPI, engine: Engine) -> None:
    """Give ``app`` its engine and a decode worker over it (started by :func:`_start`)."""
    settings: ServeSettings = app.state.settings
    metrics = app.state.process.metrics
    batcher = Batcher(engine, settings.batching, settings.limits.max_waiting, observer=metrics)
    access = Access(settings.access)
    glossaries = load_glossaries(settings.glossaries)
    cache = TranslationCache(settings.cache_lines, metrics.cache_lookup)
    app.state.server = ServerState(
        engine, batcher, settings.limits, settings, access, None, glossaries, cache
    )
    app.state.batcher = batcher
    app.summary = f"Translate {engine.src_lang} -> {engine.trg_lang} ({engine.name} engine)"


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Run the decode worker and the downloads while the app serves.

    The decode worker and the downloads live while the app serves; a model still to load
    loads meanwhile."""
    loading = None
    if app.state.load is None:
        _start(app)
    else:
        loading = asyncio.create_task(_load(app))
    try:
        yield
    finally:
        if loading is not None:
            loading.cancel()  # stopped while loading: the thread's model goes nowhere
        _stop(app)


async def _load(app: FastAPI) -> None:
    """Load the model off the event loop, then install and start it.

    On failure, keep the error and stop the server."""
    try:
        engine = await _in_own_thread(app.state.load)
        _install(app, engine)
        _start(app)
    except Exception as err:  # not "loading" for ever: the server stops with the error
        app.state.load_error = err
        app.state.stop()
        return
    if app.state.where:
        kind = engine.name
        if "precision" in engine.info:  # the torch engine: what its linear layers multiply in
            precision, why = engine.info["precision"], engine.info["precision_why"]
            kind += f" engine, linear layers in {precision}: {why}"
        else:
            kind += " engine"
        message = "loaded %s -> %s (%s); serving on http://%s (API docs at /docs)"
        logger.info(message, engine.src_lang, engine.trg_lang, kind, app.state.where)


def _start(app: FastAPI) -> None:
    """Start the decode worker and the downloads; this worker is ready."""
    state: ServerState = app.state.server
    files = state.settings.files
    shared = os.environ.get(SHARED_FILES_ENV)  # the workers of `mt serve --workers N` share one
    state.files = FileStore(files, shared) if files.enabled else None
    state.batcher.start()
    process: ProcessState = app.state.process
    process.readiness.set_loaded(process.worker)
    process.metrics.ready.set(1)


def _stop(app: FastAPI) -> None:
    """Not ready; the decode worker answers every request already submitted, then stops."""
    state: ServerState | None = app.state.server
    process: ProcessState = app.state.process
    process.readiness.set_loaded(process.worker, False)
    process.metrics.ready.set(0)
    if state is None:
        return
    state.batcher.close()
    if state.files is not None:
        state.files.close()
    close_parsing()


async def _in_own_thread(work: Callable[[], Engine]) -> Engine:
    """Run ``work()`` in a thread of its own and await its result.

    ``work()`` (loading the model) in a thread that ends when it returns, awaited: neither
    the event loop's thread nor a pooled one ever runs torch's parallel (OpenMP) work.

    Each thread that starts OpenMP work keeps a team of threads for as long as it lives. With two
    such teams (the loading thread's and the decode worker's) libgomp sees more of its threads
    than CPUs and stops spin-waiting between parallel regions: every small op of a search step
    then pays a futex wake-up (a 160 x 256 add, 2 threads: 3 us alone, 14-57 us beside a second
    team), and decoding in the worker ran about 25 % slower than the same calls in a lone
    thread (docs/BENCHMARKS.md, "Serving: one OpenMP team"). Loaded here, the worker's team is
    the only one.
    """
    loop = asyncio.get_running_loop()
    done: asyncio.Future = loop.create_future()

    def settle(outcome: Callable[[], None]) -> None:
        if not done.cancelled():
            outcome()

    def run() -> None:
        try:
            engine = work()
            outcome = functools.partial(done.set_result, engine)
        except Exception as err:
            outcome = functools.partial(done.set_exception, err)
        with contextlib.suppress(RuntimeError):  # the loop closed: stopped while loading
            loop.call_soon_threadsafe(settle, outcome)

    threading.Thread(target=run, name="mt-load", daemon=True).start()
    return await done


async def _api_error(_request: Request, err: ApiError) -> JSONResponse:
    body = (
        {"error": err.message}
        if err.detail is None
        else {"error": err.message, "detail": err.detail}
    )
    return JSONResponse(body, status_code=err.status, headers=err.headers)


async def _http_error(_request: Request, err: HTTPException) -> JSONResponse:
    # err.headers: e.g. the Allow header of a 405
    return JSONResponse(
        {"error": str(err.detail)}, status_code=err.status_code, headers=err.headers
    )


async def _validation_error(_request: Request, err: RequestValidationError) -> JSONResponse:
    return JSONResponse({"error": first_error(list(err.errors()))}, status_code=422)


def serve_process(
    path: Path | str, settings: ServeSettings, sockets: list[socket.socket], process: ProcessState
) -> None:
    """Serve on the bound ``sockets`` at once, while the model loads.

    The model's load error is raised here once the server has stopped."""
    load = functools.partial(
        load_engine, settings.engine, path, settings.device, settings.quantize, settings.precision
    )
    port = sockets[0].getsockname()[1]  # the one the system chose for port 0
    host = settings.host
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    app = create_loading_app(load, settings, process, where)
    _run_uvicorn(app, sockets, settings)
    if app.state.load_error is not None:
        raise app.state.load_error


_KEY_IN_QUERY = re.compile(r"(api_key=)[^&\s]*")


def redact_keys(record: logging.LogRecord) -> bool:
    """Hide API keys in uvicorn's access log.

    A logging filter for uvicorn's access log: an ``api_key`` in a request's query string
    is written as ``***`` (keys are never logged)."""
    if isinstance(record.args, tuple):
        record.args = tuple(
            _KEY_IN_QUERY.sub(r"\1***", arg) if isinstance(arg, str) else arg for arg in record.args
        )
    return True


def _run_uvicorn(app: FastAPI, sockets: list[socket.socket], settings: ServeSettings) -> None:
    """Serve ``app`` on the bound ``sockets`` until it is told to stop.

    SIGINT/SIGTERM or ``app.state.stop()`` tells it; the stop is logged once."""
    # uvicorn shuts down gracefully on SIGINT/SIGTERM, then raises the signal again for the
    # handler it found: a quiet one here, so that a requested stop ends with exit code 0.
    quiet = threading.current_thread() is threading.main_thread()
    stops = (signal.SIGINT, signal.SIGTERM)

    logged: list[str] = []  # uvicorn raises each signal it caught again: log the stop once

    def stopped(signum: int, _frame: FrameType | None) -> None:
        if not logged:
            logged.append(signal.Signals(signum).name)
            _log_stop(logged[0], app.state.requests, settings.shutdown_timeout_s)

    previous = {sig: signal.signal(sig, stopped) for sig in stops} if quiet else {}
    access = logging.getLogger("uvicorn.access")
    if redact_keys not in access.filters:
        access.addFilter(redact_keys)
    config = uvicorn.Config(
        app,
        access_log=settings.access_log,
        log_level="info",
        # X-Forwarded-For is read by the app, from the proxies --forwarded-allow-ips names only
        # (uvicorn's default trusts 127.0.0.1, and FORWARDED_ALLOW_IPS from the environment).
        proxy_headers=False,
        # Annotated int, read as asyncio.wait_for's timeout: seconds as a float.
        timeout_graceful_shutdown=typing.cast(int, settings.shutdown_timeout_s),
    )
    server = _Server(config, app.state.process.readiness, settings.drain_s)
    app.state.stop = server.stop
    try:
        server.run(sockets=sockets)
    except KeyboardInterrupt:  # as uvicorn.run: a second Ctrl-C during the shutdown
        pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class _Server(uvicorn.Server):
    """uvicorn's server, draining first when told to stop.

    uvicorn's server, whose stop on SIGINT/SIGTERM begins by marking the server draining
    (/health/ready: 503). With ``drain_s``, it keeps serving that long before uvicorn's own
    graceful shutdown (so that a load balancer's health checks see the 503 and send no more);
    another SIGTERM meanwhile changes nothing (a supervisor and a service manager may both send
    one), a SIGINT (a second Ctrl-C) stops at once."""

    def __init__(self, config: uvicorn.Config, readiness: Readiness, drain_s: float) -> None:
        super().__init__(config)
        self.readiness, self.drain_s = readiness, drain_s
        self._timer: threading.Timer | None = None  # set when draining begins
        self._drained = False  # the drain time is over (or was cut short)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """Drain first, then uvicorn's graceful shutdown.

        Drain first (see the class docstring), then uvicorn's graceful shutdown. A signal
        handler: another signal may interrupt it, so each state is set before anything else."""
        self.readiness.drain()
        if self._timer is None and self.drain_s > 0 and not self.should_exit:
            self._timer = threading.Timer(self.drain_s, self._drain_over, (sig, frame))
            self._timer.daemon = True
            self._timer.start()
            logger.info("draining: /health/ready answers 503; stopping in %g s", self.drain_s)
            return
        if self._timer is not None and not self._drained:
            if sig != signal.SIGINT:
                return
            self._timer.cancel()
            self._drained = True
        super().handle_exit(sig, frame)

    def _drain_over(self, sig: int, frame: FrameType | None) -> None:
        """The drain time has passed: uvicorn's graceful shutdown."""
        self._drained = True
        super().handle_exit(sig, frame)

    def stop(self) -> None:
        """Stop without a signal (the model failed to load)."""
        self.should_exit = True


def _log_stop(signal_name: str, counts: RequestCounts, shutdown_timeout_s: float) -> None:
    """What a stop did to the requests in flight (uvicorn has finished shutting down)."""
    if counts.unanswered:
        logger.warning(
            "stopped (%s); %d request(s) still in flight were cut off (after the shutdown "
            "timeout of %g s, or a second signal): those whose answer had not begun got a JSON "
            "503",
            signal_name,
            counts.unanswered,
            shutdown_timeout_s,
        )
    else:
        logger.info("stopped (%s); every request in flight was answered", signal_name)
