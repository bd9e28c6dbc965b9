"""`mt serve --workers N`: N server processes on one port, and their supervisor.

`mt serve --workers N`: N processes on the sockets the server bound, each with its own model,
decode worker and event loop; a supervisor that starts them, replaces one that dies after its
model loaded, and stops them together. Their Prometheus metrics meet in one directory
(prometheus-client's multiprocess mode), so a scrape of any worker counts them all."""

import dataclasses
import logging
import multiprocessing
import multiprocessing.connection
import os
import shutil
import signal
import socket
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from transformer_mt.errors import MTError
from transformer_mt.serve import shared_sqlite
from transformer_mt.serve.access import SHARED_LIMITS_ENV, SharedRateLimiter
from transformer_mt.serve.file_store import SHARED_FILES_ENV, FileStore, new_directory
from transformer_mt.serve.metrics import MULTIPROC_ENV, ServerMetrics, process_ended
from transformer_mt.serve.settings import ServeSettings
from transformer_mt.serve.state import ProcessState, Readiness

if TYPE_CHECKING:
    from multiprocessing.queues import SimpleQueue

logger = logging.getLogger(__name__)


def supervise(path: Path | str, settings: ServeSettings, sockets: list[socket.socket]) -> None:
    """Run the worker processes on the bound ``sockets`` until SIGINT/SIGTERM.

    Run ``settings.workers`` worker processes on the bound ``sockets`` until SIGINT/SIGTERM;
    their metrics, request counts and downloads go to temporary directories, removed when
    they have stopped."""
    if settings.engine == "torch":  # one choice for all workers: auto's probe could differ
        from transformer_mt.engines.loading import agreed_precision

        chosen, why = agreed_precision(path, settings.device, settings.quantize, settings.precision)
        if chosen is not None:
            logger.info("every worker's linear layers in %s (%s)", chosen, why)
        settings = dataclasses.replace(settings, precision=chosen)
    files_dir = new_directory(settings.files)
    try:
        with tempfile.TemporaryDirectory(prefix="mt-serve-metrics-") as metrics_dir:
            shared = shared_environment(Path(metrics_dir), files_dir)
            with _environment(shared):  # the spawned workers inherit it
                _Workers(path, settings, sockets).run()
    finally:
        shutil.rmtree(files_dir, ignore_errors=True)


def shared_environment(metrics_dir: Path, files_dir: Path) -> dict[str, str]:
    """The environment that points each worker at what the workers share, made ready for them.

    The workers' metrics, request counts and downloads: the two SQLite files among them are
    made here, before any worker opens them (two workers making one at once can fail:
    ``shared_sqlite``)."""
    limits = metrics_dir / "request-limits.sqlite3"
    shared_sqlite.connect(limits, SharedRateLimiter.SCHEMA).close()
    FileStore.open_index(files_dir).close()
    return {
        MULTIPROC_ENV: str(metrics_dir),  # prometheus-client reads it in each worker
        SHARED_LIMITS_ENV: str(limits),
        SHARED_FILES_ENV: str(files_dir),  # one store of downloads: any worker serves a file
    }


@contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    """This process's environment with ``values`` set, as it was afterwards."""
    previous = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in previous.items():
            os.environ.pop(name)
            if value is not None:
                os.environ[name] = value


class _Workers:
    """The worker processes of `mt serve --workers N`.

    Started, restarted when one dies after
    its model was loaded, stopped together (SIGTERM to each); a worker that fails before its
    model is loaded stops them all with its error."""

    def __init__(
        self, path: Path | str, settings: ServeSettings, sockets: list[socket.socket]
    ) -> None:
        self.path, self.settings, self.sockets = path, settings, sockets
        self.context = multiprocessing.get_context("spawn")  # a fresh interpreter: no torch state
        self.readiness = Readiness(settings.workers)
        self.errors = self.context.SimpleQueue()  # a worker's load error, as one line
        self.processes: dict[int, multiprocessing.process.BaseProcess] = {}
        self.stopping = False
        self.failure: str | None = None
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        # N workers share the CPUs: each decodes on its part (unless OMP_NUM_THREADS says)
        self.threads = (
            None if "OMP_NUM_THREADS" in os.environ else max(1, (cpus or 1) // settings.workers)
        )

    def run(self) -> None:
        """Start the workers, watch them until they have all ended; MTError if one failed."""
        previous = {sig: signal.signal(sig, self.stop) for sig in (signal.SIGINT, signal.SIGTERM)}
        threads = "as OMP_NUM_THREADS says" if self.threads is None else f"{self.threads} each"
        logger.info("starting %d workers (threads: %s)", self.settings.workers, threads)
        try:
            for worker in range(self.settings.workers):
                if not self.stopping:  # a signal may come while they start
                    self.start(worker)
            while self.processes:
                sentinels = [process.sentinel for process in self.processes.values()]
                multiprocessing.connection.wait(sentinels, timeout=1.0)
                for worker, process in list(self.processes.items()):
                    if process.exitcode is not None:
                        self.ended(worker, process)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        if self.failure is not None:
            raise MTError(self.failure)

    def start(self, worker: int) -> None:
        """Start worker number ``worker`` (0..N-1)."""
        args = (self.path, self.settings, self.sockets, self.readiness, worker, self.errors)
        process = self.context.Process(
            target=_worker_main, args=(*args, self.threads), name=f"mt-serve-{worker}"
        )
        process.start()
        self.processes[worker] = process

    def ended(self, worker: int, process: multiprocessing.process.BaseProcess) -> None:
        """Restart a worker that died after loading, or stop them all.

        A worker has exited: restart it if it had loaded its model and died, or stop the
        others if it failed before."""
        del self.processes[worker]
        if process.pid is not None:  # it was started
            process_ended(process.pid)
        was_ready = self.readiness.worker_loaded(worker)
        self.readiness.set_loaded(worker, False)  # a killed worker could not say so
        if self.stopping:
            return
        if was_ready:
            logger.warning(
                "worker %d (pid %d) died (exit code %s); starting another",
                worker,
                process.pid,
                process.exitcode,
            )
            self.start(worker)
            return
        error = None if self.errors.empty() else self.errors.get()
        self.failure = (
            error
            or f"worker {worker} exited with code {process.exitcode} before its model was loaded"
        )
        self.stop()

    def stop(self, signum: int | None = None, _frame: FrameType | None = None) -> None:
        """Stop every worker (SIGTERM: each drains and lets its requests finish)."""
        if signum is not None and not self.stopping:
            logger.info(
                "stopping (%s): the workers finish their requests", signal.Signals(signum).name
            )
        self.stopping = True
        self.readiness.drain()
        for process in self.processes.values():
            if process.exitcode is None:
                process.terminate()


def _worker_main(
    path: Path | str,
    settings: ServeSettings,
    sockets: list[socket.socket],
    readiness: Readiness,
    worker: int,
    errors: "SimpleQueue[str]",
    threads: int | None,
) -> None:
    """One worker process of `mt serve --workers N`.

    Its own model, decode worker and event
    loop on the shared sockets; an MTError (its model did not load) goes to ``errors``."""
    # Ctrl-C reaches every process of the terminal's group; the supervisor's SIGTERM stops this
    # one (uvicorn takes SIGINT again while it serves: a second Ctrl-C stops at once).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"worker {worker}: %(message)s"))
    package = logging.getLogger("transformer_mt")
    package.addHandler(handler)
    package.setLevel(logging.INFO)
    from transformer_mt.serve import app as server  # the worker's own import (spawned)

    if threads is not None:
        import torch

        torch.set_num_threads(threads)
    try:
        server.serve_process(
            path, settings, sockets, ProcessState(worker, readiness, ServerMetrics(worker))
        )
    except MTError as err:
        errors.put(str(err))
        sys.exit(1)
