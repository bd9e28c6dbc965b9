"""What the routes share: the server's parts, its readiness, the decode call.

What the routes share: the server's parts (injected with ``Depends(server_state)``), what
answers before the model is loaded (``Depends(process_state)``: readiness, metrics), the
one way a route has lines decoded, and documents' segments decoded sentence by sentence
(:func:`decode_segments`), parsed, split and joined off the event loop (:func:`parse`)."""

import asyncio
import dataclasses
import logging
import multiprocessing
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request

from transformer_mt.config import DecodeConfig, apply_overrides
from transformer_mt.documents.limits import (
    DocumentLimits,
    DocumentTooLarge,
    parse_call,
    parse_worker_init,
)
from transformer_mt.engines.engine import Engine
from transformer_mt.engines.paragraphs import line_languages, split_lines
from transformer_mt.engines.results import LineResult, empty_result
from transformer_mt.errors import MTError
from transformer_mt.serve.access import Access
from transformer_mt.serve.batcher import Batcher, Busy, ClientGone, Closed
from transformer_mt.serve.cache import TranslationCache
from transformer_mt.serve.file_store import FileStore
from transformer_mt.serve.languages import is_toy, language_name
from transformer_mt.serve.metrics import ServerMetrics
from transformer_mt.serve.settings import ApiError, FileSettings, Limits, ServeSettings
from transformer_mt.text.content import has_text
from transformer_mt.text.glossary import Entry, Glossary, read_glossary

logger = logging.getLogger(__name__)


@dataclass
class ServerState:
    """The parts of one server: its engine, decode worker, limits, access checks, downloads."""

    engine: Engine
    batcher: Batcher
    limits: Limits
    settings: ServeSettings
    access: Access
    files: FileStore | None  # None: file translation is off
    glossaries: dict[str, Glossary] = field(default_factory=dict)  # mt serve --glossary NAME=FILE
    cache: TranslationCache = field(default_factory=lambda: TranslationCache(0))
    parsing: "Parsing" = field(default_factory=lambda: Parsing())  # documents parsed: parse()

    def check_access(self, request: Request, api_key: str | None, texts: list[str]) -> None:
        """The access checks (:class:`Access`) of a request from its key, Origin and address.

        The address is the connection's peer, or the client that X-Forwarded-For (or else
        Forwarded) names where that peer is a trusted proxy (:meth:`Access.client`; uvicorn's
        own reading of the header is off)."""
        peer = request.client.host if request.client else "unknown"
        headers = request.headers
        client = self.access.client(
            peer, headers.getlist("x-forwarded-for"), headers.getlist("forwarded")
        )
        self.access.check(api_key, request.headers.get("origin", ""), client, texts)


def load_glossaries(given: tuple[str, ...] | None) -> dict[str, Glossary]:
    """The server's named glossaries from ``mt serve --glossary NAME=FILE`` options.

    A one-line MTError for an option without ``=``, a name given twice, or a bad file (its
    line)."""
    glossaries: dict[str, Glossary] = {}
    for option in given or ():
        name, equals, path = option.partition("=")
        if not equals or not name.strip() or not path:
            raise MTError(f"--glossary {option!r}: give NAME=FILE, e.g. --glossary it=terms.tsv")
        if name in glossaries:
            raise MTError(f"--glossary {name}: given twice; give each name once")
        glossaries[name] = read_glossary(path)
    return glossaries


class Readiness:
    """Whether a server takes requests: its model loading, ready, or draining (stopping).

    The processes of `mt serve --workers N` share one (in shared memory: a flag per worker, set
    while its model is loaded and its decode worker runs, and one for draining), so that each of
    them answers /health/ready alike: ready when every worker is and the server is not
    draining. A load balancer then sends requests only where each process can answer them.
    """

    def __init__(self, workers: int = 1) -> None:
        context = multiprocessing.get_context("spawn")  # how the workers are started
        self.workers = workers
        self._loaded = context.RawArray("b", workers)  # one byte per worker: no lock needed
        self._draining = context.RawValue("b", 0)

    def set_loaded(self, worker: int, loaded: bool = True) -> None:
        """Worker ``worker`` has loaded its model (or, False, stopped or died)."""
        self._loaded[worker] = int(loaded)

    def worker_loaded(self, worker: int) -> bool:
        """Whether worker ``worker`` has its model loaded."""
        return bool(self._loaded[worker])

    def drain(self) -> None:
        """The server is stopping: not ready from now on."""
        self._draining.value = 1

    @property
    def workers_ready(self) -> int:
        """Workers whose model is loaded."""
        return sum(self._loaded)

    @property
    def status(self) -> str:
        """ "ready", "loading" (a worker's model is not loaded yet) or "draining"."""
        if self._draining.value:
            return "draining"
        return "ready" if self.workers_ready == self.workers else "loading"


@dataclass
class ProcessState:
    """What a server process has from its start, before its model is loaded.

    That is its index among the workers (0..N-1), the server's readiness and its metrics."""

    worker: int
    readiness: Readiness
    metrics: ServerMetrics


LOADING = "the model is still loading; try again in a moment"


async def server_state(request: Request) -> ServerState:
    """The server's parts, a route's dependency; a 503 while the model loads.

    The dependency a route takes its server's parts from (``app.state.server``); a 503 while
    the model loads. A coroutine, so that FastAPI resolves it on the event loop: a plain
    function would go through a worker thread first, and a client that sends its request and
    leaves at once would be gone before its body is read (then nothing tells the decode worker)."""
    state = request.app.state.server
    if state is None:
        raise ApiError(503, LOADING, {"Retry-After": "1"})
    return state


async def process_state(request: Request) -> ProcessState:
    """The dependency of the routes that answer before the model is loaded (health, metrics)."""
    return request.app.state.process


def check_lines(lines: list[str], limits: Limits, field: str, engine: Engine) -> None:
    """A 413 naming the first limit that ``lines`` exceed.

    The limits, in order: lines per request, characters per line, source pieces per line (the
    model's positions)."""
    if len(lines) > limits.max_lines:
        raise ApiError(
            413, f"{field}: {len(lines)} lines exceed max_lines={limits.max_lines} per request"
        )
    for i, line in enumerate(lines):
        if len(line) > limits.max_chars:
            raise ApiError(
                413,
                f"{field}[{i}]: {len(line)} characters exceed max_chars={limits.max_chars} per line",
            )
    too_long = engine.too_long(lines)
    if too_long is not None:
        i, pieces = too_long
        raise ApiError(
            413,
            f"{field}[{i}]: {pieces} source pieces (with EOS) exceed the model's "
            f"max_len={engine.max_src_len}; split the line",
        )


def request_decode(
    model: DecodeConfig,
    overrides: Mapping[str, Any],
    limits: Limits,
    names: Mapping[str, str],
) -> DecodeConfig:
    """The model's decode settings with a request's ``overrides``, or a 400.

    The one override path the command line takes (:func:`config.apply_overrides`), under the
    server's limits; errors call the keys by the request's ``names``. A request that names no
    beam gets the model's, capped at ``max_beam`` (not refused)."""
    served = dataclasses.replace(model, beam_size=min(model.beam_size, limits.max_beam), nbest=1)
    try:
        return apply_overrides(served, overrides, limits.decode_limits(), names)
    except MTError as err:
        raise ApiError(400, str(err)) from None


def request_glossary(state: ServerState, given: str | dict[str, str] | None) -> Glossary | None:
    """A request's glossary: one of the server's by name, or its own terms; None for none.

    Its own terms are checked as a glossary file's lines are (whitespace around each dropped),
    and are at most 1,000: a glossary is built for each request, on the event loop, where a
    server's (``mt serve --glossary NAME=FILE``) is built once at start. An unknown name, too
    many terms or a bad term is an ApiError (400) saying which."""
    if given is None:
        return None
    if isinstance(given, str):
        if given not in state.glossaries:
            have = ", ".join(sorted(state.glossaries)) or "none (mt serve --glossary NAME=FILE)"
            raise ApiError(
                400, f"Invalid request: no glossary named {given!r} (glossaries: {have})"
            )
        return state.glossaries[given]
    most = 1_000
    if len(given) > most:
        raise ApiError(
            400,
            f"Invalid request: glossary: {len(given)} terms, more than {most} in a request; "
            "give a big glossary to the server (mt serve --glossary NAME=FILE) and name it",
        )
    try:
        return Glossary([Entry(source.strip(), target.strip()) for source, target in given.items()])
    except (ValueError, MTError) as err:
        raise ApiError(400, f"Invalid request: glossary: {err}") from None


def check_constrainable(state: ServerState, field: str | None) -> None:
    """An ApiError where the request's ``field`` needs a search the engine lacks.

    ``field`` (glossary, protect; None: neither) needs a constrained search, which a CTranslate2
    export lacks."""
    if field is not None and state.engine.name != "torch":
        raise ApiError(
            400,
            f"Invalid request: {field} needs a constrained search, which this server's "
            f"{state.engine.name} engine lacks (serve the checkpoint with --engine torch)",
        )


def check_languages(state: ServerState, source: str | None, target: str | None) -> None:
    """A 400 with LibreTranslate's words where the model has no such source, target or pair.

    None (a field not given) is none it has.
    """
    pairs = state.engine.pairs
    have = ", ".join(f"{src} -> {trg}" for src, trg in pairs)
    why = f"this model translates {have}; got source {source!r} and target {target!r}"
    if source != "auto" and source not in {src for src, _ in pairs}:
        raise ApiError(400, f"{source} is not supported", detail=why)
    if target not in {trg for _, trg in pairs}:
        raise ApiError(400, f"{target} is not supported", detail=why)
    if source != "auto" and (source, target) not in pairs:
        toy = is_toy(pairs)
        names = [f"{language_name(code, toy)} ({code})" for code in (target, source)]
        message = f"{names[0]} is not available as a target language from {names[1]}"
        raise ApiError(400, message, detail=why)


async def decode_lines(
    state: ServerState,
    request: Request,
    lines: list[str],
    decode: DecodeConfig,
    attention: bool = False,
    target: str | None = None,
    terms: list[list[str]] | None = None,
) -> list[LineResult]:
    """One result per line, in order, or an ApiError; a client that leaves stops the work.

    Only the lines with something to translate go to the decode worker; the others (empty,
    numbers, emoji, a link) come back as they are (:func:`empty_result`), and a request with
    none of the first kind never waits for the worker. ``terms``: per line, the glossary terms
    its translation must hold (None: no glossary).
    """
    results = [empty_result(decode.nbest, attention, line) for line in lines]
    todo = [i for i, line in enumerate(lines) if has_text(line)]
    if terms is not None and not any(terms[i] for i in todo):
        terms = None  # no term occurs: the plain search, which may join others' batches
    cache = state.cache if state.cache.enabled_for(decode) else None
    keys = {}
    if cache is not None:
        line_terms = terms or [[] for _ in lines]
        keys = {i: cache.key(lines[i], decode, target, attention, line_terms[i]) for i in todo}
        cached = {i: cache.get(keys[i]) for i in todo}
        results = [cached.get(i) or result for i, result in enumerate(results)]
        todo = [i for i in todo if cached[i] is None]
    if todo:
        mine = [terms[i] for i in todo] if terms is not None else None
        todo_lines = [lines[i] for i in todo]
        decoded = await _decode(state, request, todo_lines, decode, attention, target, mine)
        for i, result in zip(todo, decoded, strict=True):
            results[i] = result
            if cache is not None:
                cache.put(keys[i], result)
    return results


async def _decode(
    state: ServerState,
    request: Request,
    lines: list[str],
    decode: DecodeConfig,
    attention: bool,
    target: str | None,
    terms: list[list[str]] | None = None,
) -> list[LineResult]:
    """The decode worker's results for ``lines``, its refusals and failures as ApiErrors."""
    try:
        gone = lambda: _left(request)  # noqa: E731 (a watcher started by the batcher)
        if terms is not None:
            return await state.batcher.translate(
                lines, decode, attention, gone=gone, target=target, terms=terms
            )
        return await state.batcher.translate(lines, decode, attention, gone=gone, target=target)
    except ClientGone:  # nobody reads this answer
        raise ApiError(400, "the client closed the connection before its answer") from None
    except Busy as err:
        raise ApiError(503, f"server busy: {err}") from None
    except Closed as err:
        raise ApiError(503, str(err)) from None
    except MTError as err:
        raise ApiError(400, str(err)) from None
    except Exception as err:
        logger.exception("translation failed")
        raise ApiError(500, f"translation failed: {type(err).__name__}: {err}") from None


async def _left(request: Request) -> None:
    """Return once the client has closed its connection.

    The body has been read, so what the server says next is ``http.disconnect`` (uvicorn keeps
    reading the socket while this waits, so it sees the connection close; waiting costs nothing)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


# --- documents and HTML bodies, parsed off the event loop ------------------------------------

INLINE_PARSE_CHARS = 2048  # an HTML body this short is parsed where it is (a few ms at most)
PARSE_NICENESS = 10  # a parsing process's CPU priority below the server's (decoding comes first)
_POOLS: dict[tuple[int, int], ProcessPoolExecutor] = {}  # this process's, by their settings
_POOLS_LOCK = threading.Lock()


class Parsing:
    """One server's parses: those waiting or running, and the slots that bound them."""

    def __init__(self) -> None:
        self.slots: asyncio.Semaphore | None = None  # made on the server's event loop
        self.waiting = 0


async def parse(state: ServerState, fn: Callable[..., Any], *args: Any, here: bool = False) -> Any:
    """``fn(*args)``, torch-free document work, off the event loop.

    ``fn``: a reader of :mod:`~transformer_mt.documents`, or the splitting of segments into
    sentences and the joining of their results (:func:`decode_segments`).

    It runs in a parsing process (``files.parse_processes`` at once, each at a lower CPU
    priority with its address space bounded: a parse never holds the GIL that the event loop
    and the decode worker need), or with ``here`` (a body small enough to cost a millisecond)
    where it is. A :class:`DocumentTooLarge` is a 413, another MTError a 400, a process that
    died a 422, and more parses waiting than ``files.parse_waiting`` (``mt serve
    --parse-waiting``) a 503."""
    files, parsing = state.settings.files, state.parsing
    try:
        if here:
            return fn(*args)
        if parsing.waiting >= files.parse_processes + files.parse_waiting:
            raise ApiError(
                503,
                f"server busy: {parsing.waiting} documents are being parsed or wait "
                "(mt serve --parse-waiting); try again later",
                {"Retry-After": "1"},
            )
        parsing.slots = parsing.slots or asyncio.Semaphore(files.parse_processes)
        parsing.waiting += 1
        try:
            async with parsing.slots:
                return await asyncio.wrap_future(_pool(files).submit(parse_call, fn, args))
        finally:
            parsing.waiting -= 1
    except DocumentTooLarge as err:
        raise ApiError(413, str(err)) from None
    except MTError as err:
        raise ApiError(400, str(err)) from None
    except BrokenProcessPool:
        _drop_pool(files)
        raise ApiError(
            422, "the document could not be parsed: its parsing process died (out of memory?)"
        ) from None


async def decode_segments(
    state: ServerState,
    request: Request,
    segments: list[str],
    languages: list[str],
    decode: DecodeConfig,
    target: str | None,
    field: str | None = None,
    here: bool = False,
    glossary: Glossary | None = None,
) -> list[LineResult]:
    """One result per document segment, with attention, from its sentences' translations.

    As ``mt translate`` translates a document
    (:func:`~transformer_mt.documents.translate.translate_document`): each segment is cut into
    sentences by the rules of its language (``languages``: one per segment), the sentences of
    all segments are decoded together (:func:`decode_lines`: the batcher, the cache, a client
    that leaves stops the work), and each segment's result is joined from its sentences' with
    their attention (:meth:`~transformer_mt.engines.paragraphs.Paragraphs.join`), which places
    its markup. Where no segment has more than one sentence, the segments are decoded as they
    are. ``field``: the sentences are checked against the request limits
    (:func:`check_lines`), errors naming ``field``. Split and joined where :func:`parse` runs
    (``here``: on the event loop, for a small body). ``glossary``: the terms each sentence's
    translation must hold (its targets of the terms the sentence holds)."""
    paragraphs = await parse(state, split_lines, segments, languages, here=here)
    if field is not None:
        check_lines(paragraphs.sentences, state.limits, field, state.engine)
    whole = all(len(split.sentences) <= 1 for split in paragraphs.splits)
    lines = segments if whole else paragraphs.sentences
    terms = None if glossary is None else [glossary.targets(line) for line in lines]
    results = await decode_lines(state, request, lines, decode, True, target, terms)
    if whole:
        return results
    # Paragraphs.join(results, nbest, outer=False, attention=True): parse passes no keywords.
    return await parse(state, paragraphs.join, results, decode.nbest, False, True, here=here)


DETECT_CHARS = 10_000  # of a document's text (its first segments): enough to tell its language


def segment_languages(engine: Engine, groups: list[list[str]], source: str | None) -> list[str]:
    """Each segment's language for its splitting rules, the segments of ``groups`` in order.

    ``source``, or for "auto" each group's (a fragment's, a document's) detected from its first
    :data:`DETECT_CHARS` characters (:func:`~transformer_mt.engines.paragraphs.line_languages`):
    one language a group, as each pasted text has one."""
    samples = []
    for group in groups:
        sample, size = [], 0
        for segment in group:
            if size >= DETECT_CHARS:
                break
            sample.append(segment[: DETECT_CHARS - size])
            size += len(sample[-1]) + 1
        samples.append(" ".join(sample))
    found = line_languages(engine, samples, source)
    return [language for language, group in zip(found, groups, strict=True) for _ in group]


def document_limits(names: Mapping[str, str] | None = None, **bounds: int) -> DocumentLimits:
    """The documents' bounds: the environment's (``MT_DOC_MAX_*``), with a route's own ``bounds``.

    ``names``: how an error names a bound the route sets. A bad variable is a 500 (the
    server's setting, not the request's fault)."""
    try:
        limits = DocumentLimits.from_env()
    except MTError as err:
        raise ApiError(500, str(err)) from None
    return dataclasses.replace(limits, **bounds, names=dict(names or {}))


def _pool(files: FileSettings) -> ProcessPoolExecutor:
    """This process's pool of parsing processes for ``files``' settings (started as needed)."""
    key = (files.parse_processes, files.parse_memory_bytes)
    with _POOLS_LOCK:
        if key not in _POOLS:
            _POOLS[key] = ProcessPoolExecutor(
                files.parse_processes,
                mp_context=multiprocessing.get_context("spawn"),  # never fork a torch process
                initializer=parse_worker_init,
                initargs=(files.parse_memory_bytes, PARSE_NICENESS),
            )
        return _POOLS[key]


def close_parsing() -> None:
    """Stop this process's parsing processes (the server is stopping); none is left behind."""
    with _POOLS_LOCK:
        pools = list(_POOLS.values())
        _POOLS.clear()
    for pool in pools:
        pool.shutdown(wait=True, cancel_futures=True)


def _drop_pool(files: FileSettings) -> None:
    """Forget a broken pool: the next parse starts a new one."""
    with _POOLS_LOCK:
        pool = _POOLS.pop((files.parse_processes, files.parse_memory_bytes), None)
    if pool is not None:
        pool.shutdown(wait=False, cancel_futures=True)
