"""Dynamic batching: requests that arrive together are decoded as one batch by one worker thread.

Each request (a few lines and its decode settings) becomes a job on a queue. The worker takes the
oldest job, gathers more while they keep coming, and then decodes, as one engine call, the waiting
jobs with the same settings (beam, n-best, length penalty, attention) in arrival order, up to a
token budget (source pieces; the model's ``decode.batch_tokens``). Each job's lines come back to
its own request, in order. When a batch fails, each of its jobs is retried alone, so one bad
request never fails the others. Jobs with other settings wait for the next round; a job is never
starved, because the oldest job always chooses the settings of the next batch.

Gathering ends when the token budget is full, or when ``window_s`` has passed with no new arrival
(counted from the newest job's arrival or the end of the previous batch, whichever is later), and
at the latest ``max_wait_s`` after it began. Counting from the end of the previous batch matters
under load: N clients waiting one request each split into two groups that take turns (one group's
requests queue while the other's decode, and are older than any window when the worker comes back),
so a window counted from the oldest job alone gave batches of half the clients (32 clients: 16.7
requests per batch with a 5 ms window, 18.2 with 30 ms). Waiting a moment for the group just
answered to come back joins the two: 25.0 requests per batch with 20 ms of quiet
(scripts/bench_serve.py, Multi30k model, 2 cores; 17.6 with 5 ms, where the clients' answers and
new requests, handled in Python on the same 2 cores, come back more slowly than that).

Continuous batching (``BatchSettings.continuous``, opt-in, for engines that offer it: our torch
model): no batch boundaries at all. The worker keeps one running beam search
(:class:`~transformer_mt.decoding.continuous.ContinuousSearch`); between two of its steps, every
job that has arrived is handed to it (within the token budget, counting the source pieces in
flight; the search lets newcomers take their first step together, a few steps later at most),
and each job is answered as soon as its last line is done. Nothing waits for a gathering window
or for the longest sentence of a batch. Jobs that the running search cannot take (attention
requested, another beam size than the running one's, an n-best wider than the beam) wait, in
order, until it is empty; then one with another beam starts the next search, and the others
decode alone, as the batch path would. If a step fails, each job in flight is
decoded again alone; any other failure in the worker fails the jobs in flight and the worker
goes on. It is not the default: each join costs an encoder pass and a first step of its own,
and on 2 CPU cores joining costs more than the gathering window and the batches' tails
(scripts/bench_serve.py; docs/BENCHMARKS.md, "Serving").

A client that leaves costs at most the batch it is in: ``translate`` watches an awaitable that
completes when the client has gone (the server's: the connection's ``http.disconnect``). A request
still queued then is dropped; one decoding stops after its current decode batch (the engine asks
between batches; with several requests in one engine call, or in the continuous search, only once
every one of them has gone). Each such request gets one log line saying how many of its lines
were left undecoded. A batch whose token budget fills before its gathering window ends still
starts ``window_s`` after its newest job arrived, like any other: a client that sends a request
and hangs up at once is seen leaving only after its request is queued (the disconnect reaches
the event loop after the body), and without that wait a batch of big requests started before
the server saw them go, and decoded its first decode batch for nobody. Before, five clients
that sent 64 lines at beam 16 and hung up at once were all decoded, and the next client's
one-line request waited behind them (scripts/bench_disconnect.py).

Search runs in the worker thread, never on the server's event loop, so the server keeps accepting
and answering (errors, /health) while a batch decodes. ``close()`` lets every job already submitted
finish before the worker ends.

Decoding on a CPU keeps freed memory for reuse (``host_memory``: no fresh pages for every step's
tensors); batches of ever-changing shapes leave freed pages between live blocks, so after
``IDLE_TRIM_S`` with nothing to do the worker hands them back to the system (``malloc_trim``).
"""

import asyncio
import dataclasses
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Protocol, cast, runtime_checkable

from transformer_mt.config import DecodeConfig
from transformer_mt.decoding.continuous import ContinuousSearch
from transformer_mt.decoding.search import DecodeResult
from transformer_mt.engines.engine import Engine
from transformer_mt.engines.options import TranslateExtras
from transformer_mt.engines.results import DecodeStopped, LineResult, empty_result
from transformer_mt.host_memory import release_freed_memory
from transformer_mt.serve.settings import BatchSettings

logger = logging.getLogger(__name__)

IDLE_TRIM_S = 1.0  # seconds without work after which the worker returns freed memory


class BatchObserver:
    """What the decode worker reports as it works (the server's metrics); this one ignores it."""

    def waiting(self, delta: int) -> None:
        """Requests submitted and not yet answered changed by ``delta``."""

    def batch(self, requests: int, lines: int, tokens: int) -> None:
        """A batch began decoding.

        Its requests, lines and source pieces (continuous batching:
        the requests that joined the search at one step)."""

    def decoded(self, seconds: float) -> None:
        """An engine call (continuous batching: a search step) took ``seconds``."""

    def abandoned(self) -> None:
        """A request's client left before its answer."""


class Busy(Exception):
    """Too many requests are waiting for the decode worker."""


class Closed(Exception):
    """The batcher is shutting down and takes no new work."""


class ClientGone(Exception):
    """The request's client left before its answer.

    From the worker, with the number of its
    lines left undecoded."""

    def __init__(self, left: int | None = None) -> None:
        undecoded = "" if left is None else f"; {left} lines left undecoded"
        super().__init__(f"the client left{undecoded}")
        self.left = left


@dataclass
class _Job:
    lines: list[str]
    decode: DecodeConfig
    attention: bool
    arrived: float
    future: Future = field(default_factory=Future)
    tokens: int = 0  # counted by the worker (the event loop does no tokenizing)
    gone: bool = False  # its client left (set on the event loop, read by the worker)
    target: str | None = None  # the language a multilingual model translates into
    terms: list[list[str]] | None = None  # per line, glossary terms its translation must hold

    @property
    def key(self) -> tuple:
        """The key of the jobs that may decode together.

        Jobs decode together only with equal settings (and, in a multilingual model's batch
        calls, one target language: its tag starts every source of the call); constrained jobs
        (glossary terms) only with each other."""
        constrained = self.terms is not None
        return (*dataclasses.astuple(self.decode), self.attention, self.target, constrained)


_STOP = object()


class Batcher:
    """One decode worker over ``engine``; ``submit`` from any thread, ``translate`` from async."""

    def __init__(
        self,
        engine: Engine,
        settings: BatchSettings | None = None,
        max_waiting: int = 1024,
        observer: BatchObserver | None = None,
    ):
        self.engine = engine
        self.settings = settings or BatchSettings()
        self.observer = observer or BatchObserver()
        self.max_tokens = self.settings.max_tokens or engine.decode.batch_tokens
        self.max_waiting = max_waiting
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._waiting = 0  # submitted and not yet answered
        self._closed = False
        self._thread: threading.Thread | None = None
        # Counters for tests and logs: engine calls (with continuous batching: groups of requests
        # that joined the search at one step), the requests they carried, and the most requests
        # decoded together.
        self.batches = 0
        self.requests = 0
        self.largest_batch = 0
        # Requests whose client left before their answer, and their lines not decoded for that.
        self.abandoned = 0
        self.lines_not_decoded = 0
        self.continuous = (
            self.settings.enabled
            and self.settings.continuous
            and isinstance(engine, _SearchEngine)
            and (engine.continuous_search(engine.decode) is not None)
        )
        self._free_since = 0.0  # when the worker finished its last batch (monotonic clock)
        self._trim_due = False  # work was done since the freed memory last went back

    def start(self) -> "Batcher":
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="mt-decode", daemon=True)
            self._thread.start()
        return self

    @property
    def alive(self) -> bool:
        """Whether the worker thread runs (or was never started)."""
        return self._thread is None or self._thread.is_alive()

    @property
    def waiting(self) -> int:
        """Requests submitted and not yet answered (queued or decoding)."""
        return self._waiting

    def submit(
        self,
        lines: list[str],
        decode: DecodeConfig,
        attention: bool = False,
        target: str | None = None,
    ) -> Future:
        """Queue a request; its future gets one :class:`LineResult` per line, in order."""
        return self._submit(lines, decode, attention, target).future

    def _submit(
        self,
        lines: list[str],
        decode: DecodeConfig,
        attention: bool,
        target: str | None = None,
        terms: list[list[str]] | None = None,
    ) -> _Job:
        with self._lock:
            if self._closed:
                raise Closed("the server is shutting down")
            if self._waiting >= self.max_waiting:
                raise Busy(f"{self._waiting} requests are waiting (max_waiting); try again later")
            self._waiting += 1
            self.observer.waiting(1)
            job = _Job(list(lines), decode, attention, time.monotonic(), target=target, terms=terms)
            job.future.add_done_callback(self._answered)
            self._queue.put(job)  # under the lock: never behind the stop sign
        return job

    async def translate(
        self,
        lines: list[str],
        decode: DecodeConfig,
        attention: bool = False,
        gone: Callable[[], Awaitable[object]] | None = None,
        target: str | None = None,
        terms: list[list[str]] | None = None,
    ) -> list[LineResult]:
        """:meth:`submit`, awaited.

        ``terms``: per line, the target terms its translation must hold (a glossary's).

        ``gone()`` is awaited beside it and completes when the client has left: then the request is
        dropped if still queued, or stops after its current decode batch, and this raises
        :class:`ClientGone` at once (the log says how many lines were left undecoded)."""
        job = self._submit(lines, decode, attention, target, terms)
        answer = asyncio.wrap_future(job.future)
        if gone is None:
            return await answer
        watcher = asyncio.ensure_future(gone())
        try:
            await asyncio.wait((answer, watcher), return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:  # the request itself was cancelled (a shutdown)
            answer.cancel()  # a job not yet decoding is dropped
            raise
        finally:
            watcher.cancel()
        if answer.done() or watcher.exception() is not None:  # answered, or no way to tell
            return await answer
        self._abandon(job)
        answer.cancel()  # its result, if it comes, goes nowhere
        raise ClientGone

    def _abandon(self, job: _Job) -> None:
        """Drop ``job``, or let the worker stop it between batches.

        Drop ``job`` if it is still queued, else let the worker stop it between batches; one
        log line says what it cost (at once, or when the worker lets go of it)."""
        job.gone = True
        if job.future.cancel():
            self._log_gone(job, "dropped from the queue", len(job.lines))
        else:
            job.future.add_done_callback(lambda future: self._log_outcome(job, future))

    def _log_outcome(self, job: _Job, future: Future) -> None:
        """Log what an abandoned job the worker had begun cost, once the worker lets go of it."""
        err = future.exception()
        if isinstance(err, ClientGone) and err.left is not None:
            self._log_gone(job, "decoding stopped", err.left)
        elif err is None:
            self._log_gone(job, "decoded in full all the same", 0)
        else:
            self._log_gone(job, f"its decoding failed ({type(err).__name__}: {err})", 0)

    def _log_gone(self, job: _Job, what: str, left: int) -> None:
        """Count an abandoned job and its ``left`` lines not decoded; one log line."""
        with self._lock:
            self.abandoned += 1
            self.lines_not_decoded += left
        self.observer.abandoned()
        message = "a client left before its answer: %s, %d of its %d lines left undecoded"
        logger.info(message, what, left, len(job.lines))

    def close(self, timeout: float | None = None) -> None:
        """Take no new work, finish every submitted job, stop the worker."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._queue.put(_STOP)
        if self._thread is not None:
            self._thread.join(timeout)

    def _answered(self, _future: Future) -> None:
        with self._lock:
            self._waiting -= 1
        self.observer.waiting(-1)

    # -- the worker ----------------------------------------------------------------------------

    def _run(self) -> None:
        if self.continuous and isinstance(self.engine, _SearchEngine):
            _ContinuousWorker(self, self.engine).run()
            return
        pending: deque[_Job] = deque()
        stopping = False
        while True:
            if not pending:
                if stopping:
                    return
                item = self._next_item()
                if item is _STOP:
                    return  # nothing pending, nothing queued before the stop
                self._add(pending, item)
                if not pending:
                    continue  # its client had left
            stopping = self._gather(pending) or stopping
            batch = self._take_batch(pending)  # none: every pending job's client left
            if batch and self._decode(batch):  # False: every client of the batch left
                self._free_since = time.monotonic()

    def _next_item(self) -> Any:
        """The next queued item, waiting as long as it takes.

        After ``IDLE_TRIM_S`` of waiting, when work was done since the last time, the freed
        memory of that work goes back to the system first."""
        item: Any
        try:
            item = self._queue.get(timeout=IDLE_TRIM_S) if self._trim_due else self._queue.get()
        except queue.Empty:
            release_freed_memory()
            item = self._queue.get()
        self._trim_due = True
        return item

    def _add(self, pending: deque, job: _Job) -> None:
        if job.future.cancelled():
            return  # its client left while it was queued
        try:
            job.tokens = self.engine.count_tokens(job.lines)
        except Exception:  # the engine reports it to this job alone when it decodes
            job.tokens = 0
        pending.append(job)

    def _gather(self, pending: deque) -> bool:
        """Add queued jobs to ``pending`` until the window passes or the budget is full.

        The window passes when no job comes within it (see the module docstring). Returns whether
        the stop sign came; the jobs queued before it are all taken."""
        settings = self.settings
        latest_wait = time.monotonic() + settings.max_wait_s
        budget = self.max_tokens
        while sum(job.tokens for job in pending) < budget:
            if settings.enabled:
                quiet_since = max(self._free_since, pending[-1].arrived)  # newest job last
                deadline = min(quiet_since + settings.window_s, latest_wait)
            else:  # take what is already queued (to keep the order), wait for nothing
                deadline = 0.0
            remaining = deadline - time.monotonic()
            try:
                item = (
                    self._queue.get(timeout=remaining)
                    if remaining > 0
                    else self._queue.get_nowait()
                )
            except queue.Empty:
                return False
            if item is _STOP:
                return True
            self._add(pending, item)
        return False

    def _take_batch(self, pending: deque) -> list[_Job]:
        """The next batch: the oldest job and the later ones with its settings.

        The oldest job and, batching on, the later ones with its settings within the budget;
        none if every pending job's client has left (those jobs are dropped here)."""
        live = [job for job in pending if not job.future.cancelled()]
        pending.clear()
        pending.extend(live)
        if not pending:
            return []
        first = pending.popleft()
        batch, tokens = [first], first.tokens
        if not self.settings.enabled:
            return batch
        keep: deque[_Job] = deque()
        while pending:
            job = pending.popleft()
            if job.key == first.key and tokens + job.tokens <= self.max_tokens:
                batch.append(job)
                tokens += job.tokens
            else:
                keep.append(job)
        pending.extend(keep)
        return batch

    def _settle(self, batch: list[_Job]) -> None:
        """Wait until ``window_s`` after the newest job of ``batch`` arrived.

        With batching on, wait until ``window_s`` after the newest job of ``batch`` arrived:
        only a batch whose token budget filled sooner waits here. A client that sends a request
        and hangs up at once is seen leaving a moment after its request is queued (its
        disconnect goes through the event loop after its body); the wait lets its job be
        dropped instead of decoded (see the module docstring)."""
        if self.settings.enabled:
            newest = max(job.arrived for job in batch)
            time.sleep(max(0.0, newest + self.settings.window_s - time.monotonic()))

    def _decode(self, batch: list[_Job]) -> bool:
        """Decode the jobs of ``batch`` whose client is still there, after :meth:`_settle`.

        Returns False if no client was."""
        self._settle(batch)
        batch = [job for job in batch if job.future.set_running_or_notify_cancel()]
        if not batch:
            return False  # every client went away
        lines = [line for job in batch for line in job.lines]
        self.batches += 1
        self.requests += len(batch)
        self.largest_batch = max(self.largest_batch, len(batch))
        self.observer.batch(len(batch), len(lines), sum(job.tokens for job in batch))
        self._engine_call(batch, lines)
        return True

    def _engine_call(self, batch: list[_Job], lines: list[str]) -> None:
        """Decode ``lines`` as one engine call and answer each job.

        Decode ``lines`` (those of ``batch``, in order) as one engine call and answer each job;
        it stops between decode batches once every client of ``batch`` has left."""
        try:
            terms = None
            if batch[0].terms is not None:  # the key keeps constrained jobs together
                terms = [t for job in batch for t in (job.terms or [[]] * len(job.lines))]
            stop = lambda: all(j.gone for j in batch)  # noqa: E731
            results = self._translate(lines, batch[0], stop, terms)
        except DecodeStopped as stopped:  # every client of the batch left
            self._stopped(batch, set(stopped.left))
            return
        except Exception as err:
            if len(batch) == 1:
                batch[0].future.set_exception(err)
                return
            logger.warning(
                "a batch of %d requests failed (%s); retrying each alone", len(batch), err
            )
            for job in batch:
                self._decode_alone(job)
            return
        start = 0
        for job in batch:
            job.future.set_result(results[start : start + len(job.lines)])
            start += len(job.lines)

    def _stopped(self, batch: list[_Job], left: set[int]) -> None:
        """Fail each job of a stopped engine call with :class:`ClientGone`.

        Counting its lines
        in ``left`` (indices into the call's lines)."""
        start = 0
        for job in batch:
            end = start + len(job.lines)
            job.future.set_exception(ClientGone(sum(start <= i < end for i in left)))
            start = end

    def _decode_alone(self, job: _Job) -> None:
        if job.gone:
            job.future.set_exception(ClientGone(len(job.lines)))
            return
        self.batches += 1
        self.observer.batch(1, len(job.lines), job.tokens)
        try:
            results = self._translate(job.lines, job, lambda: job.gone, job.terms)
        except DecodeStopped as stopped:
            job.future.set_exception(ClientGone(len(stopped.left)))
        except Exception as err:
            job.future.set_exception(err)
        else:
            job.future.set_result(results)

    def _translate(
        self,
        lines: list[str],
        job: _Job,
        stop: Callable[[], bool],
        terms: list[list[str]] | None = None,
    ) -> list:
        """The engine's results for ``lines`` with ``job``'s settings (and per line ``terms``).

        The observer is told how long it took before any job is answered."""
        started = time.monotonic()
        try:
            if terms is not None:
                extras = TranslateExtras(terms=terms)
                return self.engine.translate(
                    lines, job.decode, job.attention, stop, job.target, extras=extras
                )
            return self.engine.translate(lines, job.decode, job.attention, stop, job.target)
        finally:
            self.observer.decoded(time.monotonic() - started)


@runtime_checkable
class _SearchEngine(Protocol):
    """An engine whose requests can join a running search (continuous batching).

    Our torch model is one. These are the methods continuous batching calls besides
    :class:`Engine`'s."""

    def continuous_search(self, decode: DecodeConfig) -> ContinuousSearch | None:
        """A search that requests with ``decode``'s beam can join; None where there is none."""

    def encode_lines(
        self, lines: Sequence[str], decode: DecodeConfig, target: str | None = None
    ) -> dict[int, list[int]]:
        """Source ids of the lines with something to translate, by line index."""

    def line_result(self, result: DecodeResult, decode: DecodeConfig) -> LineResult:
        """A search result of ``decode``'s search as a line's translation."""


class _ContinuousWorker:
    """The decode worker with continuous batching (see the module docstring)."""

    def __init__(self, batcher: Batcher, engine: _SearchEngine) -> None:
        self.batcher, self.engine = batcher, engine
        self.waiting: deque[_Job] = deque()  # arrived, not yet decoding
        self.search: ContinuousSearch | None = None  # the running search; None: idle
        self.flights: dict[int, _Flight] = {}  # by job id: the jobs in the search
        self.tokens_in_flight = 0

    def run(self) -> None:
        stopping = False
        while True:
            if not self.flights and not self.waiting:
                if stopping:
                    return
                item = self.batcher._next_item()
                if item is _STOP:
                    return
                self.batcher._add(self.waiting, item)
            stopping = self._take_queued() or stopping
            try:
                self._admit()
                if self.flights:
                    self._step()
            except Exception as err:  # a bug of ours: fail the jobs in flight, keep serving
                logger.exception("the continuous decode worker failed; its jobs get the error")
                self._fail_in_flight(err)

    def _fail_in_flight(self, err: Exception) -> None:
        flights, self.flights, self.search, self.tokens_in_flight = self.flights, {}, None, 0
        for flight in flights.values():
            if not flight.job.future.done():
                flight.job.future.set_exception(err)

    def _take_queued(self) -> bool:
        """Move every queued job to ``waiting`` without waiting; True if the stop sign came."""
        while True:
            try:
                item = self.batcher._queue.get_nowait()
            except queue.Empty:
                return False
            if item is _STOP:
                return True
            self.batcher._add(self.waiting, item)

    def _admit(self) -> None:
        """Let waiting jobs join the search, oldest first, within the token budget.

        A job the
        search cannot take waits (and keeps the later ones waiting) until it is empty, then
        starts a new search or, if no search can take it, decodes alone."""
        joined: list[_Job] = []
        while self.waiting:
            job = self.waiting[0]
            if job.future.cancelled():  # its client left while it waited
                self.waiting.popleft()
                continue
            fits = self.tokens_in_flight + job.tokens <= self.batcher.max_tokens
            if self.flights and not (fits and self._joins(job)):
                break
            self.waiting.popleft()
            if not job.future.set_running_or_notify_cancel():
                continue  # its client went away
            self.batcher.requests += 1
            if not self._joins(job):
                self.batcher._decode_alone(job)
                continue
            if self._start(job):
                joined.append(job)
        if joined:
            self.batcher.batches += 1
            self.batcher.largest_batch = max(self.batcher.largest_batch, len(self.flights))
            lines, tokens = sum(len(j.lines) for j in joined), sum(j.tokens for j in joined)
            self.batcher.observer.batch(len(joined), lines, tokens)

    def _joins(self, job: _Job) -> bool:
        """Whether ``job`` can decode in the running search (or start a new one)."""
        if job.attention or job.terms is not None:
            return False  # the batch path answers it (the running search has no constraints)
        if not 1 <= job.decode.nbest <= job.decode.beam_size:
            return False  # the batch path answers (or refuses) it
        if self.search is None or not self.flights:
            return self.engine.continuous_search(job.decode) is not None
        return job.decode.beam_size == self.search.beam_size

    def _start(self, job: _Job) -> int:
        """Add ``job``'s lines to the search; 1 if it joined, 0 if it was answered at once."""
        try:
            sources = self.engine.encode_lines(job.lines, job.decode, job.target)
        except Exception as err:
            job.future.set_exception(err)
            return 0
        # Lines with nothing to translate stay as they are (empty ones empty).
        flight = _Flight(job, [empty_result(job.decode.nbest, False, line) for line in job.lines])
        if not sources:
            job.future.set_result(flight.results)
            return 0
        if not self.flights:
            self.search = self.engine.continuous_search(job.decode)
        if self.search is None:  # _joins admits a job only where the engine has a search
            job.future.set_exception(RuntimeError("no continuous search for this request"))
            return 0
        flight.left = len(sources)
        self.flights[id(job)] = flight  # first: if adding fails, run() fails it with the rest
        self.tokens_in_flight += job.tokens
        for line, ids in sources.items():
            self.search.add((id(job), line), ids, job.decode)
        return 1

    def _step(self) -> None:
        if self.search is None:  # run() fails the jobs in flight with this
            raise RuntimeError("requests in flight without a running search")
        started = time.monotonic()
        try:
            done = self.search.step()
            self.batcher.observer.decoded(time.monotonic() - started)
        except Exception as err:
            flights, self.flights, self.search, self.tokens_in_flight = self.flights, {}, None, 0
            logger.warning(
                "a search step over %d requests failed (%s); retrying each alone", len(flights), err
            )
            for flight in flights.values():
                self.batcher._decode_alone(flight.job)
            return
        for tag, result in done:
            key, line = cast(tuple[int, int], tag)  # (job id, line index): how _start adds them
            flight = self.flights[key]
            flight.results[line] = self.engine.line_result(result, flight.job.decode)
            flight.left -= 1
            if flight.left == 0:
                del self.flights[key]
                self.tokens_in_flight -= flight.job.tokens
                flight.job.future.set_result(flight.results)
        if self.flights and all(flight.job.gone for flight in self.flights.values()):
            self._drop_search()

    def _drop_search(self) -> None:
        """End the running search, whose clients have all left.

        Every client of the running search has left: end it, each job failing with
        :class:`ClientGone` (its sentences still running are left undecoded)."""
        flights, self.flights, self.search, self.tokens_in_flight = self.flights, {}, None, 0
        for flight in flights.values():
            flight.job.future.set_exception(ClientGone(flight.left))


@dataclass
class _Flight:
    """A job in the continuous search: its results so far and the lines still decoding."""

    job: _Job
    results: list[LineResult]
    left: int = 0
