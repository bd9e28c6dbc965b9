"""The little torch.distributed that training needs; a no-op in a single process.

``torchrun`` sets RANK, LOCAL_RANK and WORLD_SIZE; then the process group is initialized with NCCL
on GPUs and gloo on CPU (the tests run two CPU processes with gloo).

Every helper here is a collective: all ranks must call it, in the same order, or the ones that did
wait for the others. The trainer keeps that promise by making every decision that ends a loop
(max steps, early stopping, a stop signal, too many non-finite losses) from all-reduced numbers.

``python -m transformer_mt.training.distributed`` is torchrun (same arguments) made safe for
restarts and with one-line errors: see :func:`launch`.

Two process groups, two kinds of waiting. The ranks step in lockstep (the step's sums, DDP's
gradients, validation): there a rank that does not answer within ``train.collective_timeout_s`` has
hung or stopped, and the others stop with an :class:`MTError` naming it instead of waiting in
silence. Waiting for rank 0's one-off work (:func:`main_first`: preparing the data, writing a
checkpoint) can legitimately take an hour, so it uses the default group and its long timeout.
"""

import datetime
import os
import re
import signal
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from transformer_mt.errors import MTError

T = TypeVar("T")

# How long ranks wait for rank 0's one-off work in main_first (preparing a large corpus: tokenizer
# training and binarizing can take an hour), and for the rendezvous.
SETUP_TIMEOUT_S = 4 * 3600.0
# After a step's collective timed out: how long the rank-naming check waits for the others.
DIAGNOSE_TIMEOUT_S = 30.0


@dataclass
class DistInfo:
    """Where this process sits in the job (rank 0 of 1 when not distributed)."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    # The lockstep collectives' group and timeout (None: the default group, no timeout of ours).
    step_group: Any = field(default=None, repr=False, compare=False)
    timeout_s: float | None = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def init_distributed(device_type: str, timeout_s: float = 300.0) -> DistInfo:
    """Join the process group that torchrun set up, or return a single-process DistInfo.

    The lockstep collectives get their own group whose operations time out after ``timeout_s``
    seconds; the default group (main_first's waits) gets :data:`SETUP_TIMEOUT_S`.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return DistInfo()
    if not dist.is_initialized():
        setup = datetime.timedelta(seconds=max(SETUP_TIMEOUT_S, timeout_s))
        dist.init_process_group(backend="nccl" if device_type == "cuda" else "gloo", timeout=setup)
    step_group = dist.new_group(timeout=datetime.timedelta(seconds=timeout_s))
    rank, local_rank = dist.get_rank(), int(os.environ.get("LOCAL_RANK", "0"))
    return DistInfo(rank, local_rank, dist.get_world_size(), step_group, timeout_s)


def all_reduce_sum(values: list[float], info: DistInfo, device: torch.device) -> list[float]:
    """Sum a few numbers over all ranks (token counts, loss sums, stop flags); lockstep."""
    if not info.enabled:
        return values
    # float64: token counts of a large step stay exact and loss sums lose nothing in the sum.
    t = torch.tensor(values, dtype=torch.float64, device=device)
    with lockstep("the all-reduce of a step's sums", info):
        dist.all_reduce(t, group=info.step_group)
    return t.tolist()


def all_gather_objects(obj: Any, info: DistInfo, *, lockstep_op: bool = True) -> list[Any]:
    """Every rank's ``obj`` (picklable), in rank order; ``[obj]`` in a single process.

    A lockstep operation by default; ``lockstep_op=False`` waits in the default group instead
    (for ranks that may be waiting for rank 0's long work)."""
    if not info.enabled:
        return [obj]
    out: list[Any] = [None] * info.world_size
    if not lockstep_op:
        with _peer_failures_named("the gathering of the ranks' results", info, SETUP_TIMEOUT_S):
            dist.all_gather_object(out, obj)
        return out
    with lockstep("the gathering of the ranks' results", info):
        dist.all_gather_object(out, obj, group=info.step_group)
    return out


_COMM_ERROR = re.compile(
    r"gloo|nccl|timed? ?out|connection (closed|reset)|pair closure|broken pipe", re.IGNORECASE
)


def is_communication_error(error: BaseException) -> bool:
    """Whether ``error`` came from the process group rather than the computation.

    That is, a peer timed out, stopped or died: torch's DistError family, or gloo's / NCCL's
    RuntimeErrors."""
    dist_error = getattr(dist, "DistError", None)
    if dist_error is not None and isinstance(error, dist_error):
        return True
    return isinstance(error, RuntimeError) and bool(_COMM_ERROR.search(str(error)))


@contextmanager
def lockstep(what: str, info: DistInfo) -> Iterator[None]:
    """Run a lockstep collective; a communication failure becomes a one-line error.

    The failure is a rank that did not answer within ``train.collective_timeout_s``, or one whose
    connection closed. The :class:`MTError` names the rank(s) that did not answer, where the
    backend can tell (gloo), else the operation and the timeout."""
    with _peer_failures_named(what, info, info.timeout_s):
        yield


@contextmanager
def _peer_failures_named(what: str, info: DistInfo, timeout_s: float | None) -> Iterator[None]:
    """Turn a communication failure inside the block into a one-line :class:`MTError`."""
    try:
        yield
    except RuntimeError as err:
        if not (info.enabled and is_communication_error(err)):
            raise
        raise MTError(_failure_message(what, info, err, timeout_s)) from err


_CLOSED = re.compile(r"connection (closed|reset)|pair closure|broken pipe", re.IGNORECASE)


def _failure_message(
    what: str, info: DistInfo, error: BaseException, timeout_s: float | None
) -> str:
    """What the user reads when a peer failed: who, in which operation, and what to do."""
    missing = _ranks_not_answering(info)
    detail = re.sub(r"^\[[^\]]*\]:? *", "", _one_line(error))  # gloo's "[file.cc:78] " prefix
    # "another rank" where the store could not tell which.
    who = f"rank{'s' if ',' in missing else ''} {missing}" if missing else "another rank"
    seen = f"rank {info.rank} saw: {detail}"
    if _CLOSED.search(detail):  # a peer process that ended closes its connections at once
        return (
            f"{who} left {what} ({seen}); it died or was killed: see its output (under "
            "torchrun --max-restarts, the group restarts from last.pt)"
        )
    timeout = f"{timeout_s:g} s" if timeout_s is not None else "the timeout"
    return (
        f"{who} did not answer {what} within {timeout} (train.collective_timeout_s; {seen}); "
        "it hung, stopped or died: see its output, or raise train.collective_timeout_s if it is "
        "only slow"
    )


def _ranks_not_answering(info: DistInfo) -> str | None:
    """Which ranks did not answer, e.g. "1" or "1, 3"; None when unknown.

    Every rank that saw a collective fail says so in the process group's key-value store (which
    outlives the broken collective), then waits up to ``DIAGNOSE_TIMEOUT_S`` for the others to do
    the same: the ranks that never say so are the silent ones. So a healthy rank that merely
    waited with this one is never blamed, and any rank can name the culprit, rank 0 included.
    A SIGTERM or SIGINT during the wait (torchrun stopping the group to restart it) ends the
    wait at once, the culprit unknown: a restart must not wait for a diagnosis.
    """
    store = _store()
    if store is None:
        return None
    wait = min(DIAGNOSE_TIMEOUT_S, info.timeout_s or DIAGNOSE_TIMEOUT_S)
    try:
        store.set(f"{_TIMED_OUT}{info.rank}", "1")
        deadline = time.monotonic() + wait
        with _stop_signals_noted() as stopping:
            while True:
                silent = [
                    r for r in range(info.world_size) if not store.check([f"{_TIMED_OUT}{r}"])
                ]
                if stopping:
                    return None
                if not silent or time.monotonic() >= deadline:
                    break
                time.sleep(0.2)
    except (RuntimeError, OSError):  # the store is gone too: nothing more to learn
        return None
    return ", ".join(map(str, silent)) or None


_TIMED_OUT = "transformer_mt/timed_out/"  # store keys of the ranks that saw a collective fail


@contextmanager
def _stop_signals_noted() -> Iterator[list[int]]:
    """Note the SIGTERM / SIGINT received inside the block.

    The SIGTERM / SIGINT received inside the block, in a list; each is passed on to the
    handler that was in place (the trainer's stop flag), or, where that was the default
    action, delivered again after the block. Outside the main thread: nothing is noted."""
    noted: list[int] = []
    old: dict[int, Any] = {}

    def note(signum: int, frame: Any) -> None:
        noted.append(signum)
        if callable(old.get(signum)):
            old[signum](signum, frame)

    for sig in (signal.SIGTERM, signal.SIGINT):
        with suppress(ValueError):  # not the main thread
            old[sig] = signal.signal(sig, note)
    try:
        yield noted
    finally:
        for number, handler in old.items():
            signal.signal(number, handler)
        for signum in noted:
            if old.get(signum) == signal.SIG_DFL:
                signal.raise_signal(signum)


def _store() -> Any:
    """The default process group's key-value store (torchrun's), or None.

    None where torch does not expose it."""
    try:
        return dist.distributed_c10d._get_default_store()
    except (AttributeError, RuntimeError, ValueError):
        return None


def agree_on_error(error: BaseException | None, info: DistInfo) -> None:
    """Raise on every rank if any rank failed, so no rank waits forever for a failed peer.

    Each rank passes the exception it caught (or None). The failing rank re-raises its own; the
    others raise an :class:`MTError` that carries the failing rank's message, so whichever rank's
    output the user reads, it names the real cause.
    """
    if info.enabled:
        message = None if error is None else _one_line(error)
        messages = all_gather_objects(message, info, lockstep_op=False)
        failed = [(r, m) for r, m in enumerate(messages) if m is not None]
    else:
        failed = [] if error is None else [(0, _one_line(error))]
    if error is not None:
        raise error
    if failed:
        rank, message = failed[0]
        raise MTError(f"rank {rank} failed: {message}")


def _one_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def main_first(fn: Callable[[], T], info: DistInfo, others: Callable[[], T] | None = None) -> T:
    """Run ``fn`` on rank 0, then ``others`` (default ``fn``) on the other ranks.

    For work that writes shared files (downloads, caches): rank 0 builds them while the others
    wait, then the others read what it built. If rank 0 fails, every rank raises (see
    :func:`agree_on_error`) instead of the others waiting at a barrier until a timeout.
    """
    built: list[T] = []  # rank 0's result
    error: BaseException | None = None
    if info.is_main:
        try:
            built.append(fn())
        except Exception as err:  # handed to every rank below, then re-raised here
            error = err
    agree_on_error(error, info)
    return built[0] if info.is_main else (others or fn)()


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()


def shutdown() -> None:
    """Leave the process group, if this process joined one."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


# torchrun's agents share one key-value store across the group's restarts by default; a
# restarted rank can then read a peer's address from before the restart and fail to connect
# ("Gloo connectFullMesh failed ... Connection refused"). This makes each restart's rank 0 host
# a fresh store.
FRESH_STORE_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


def launch(argv: list[str]) -> int:
    """Run torchrun's agent with ``argv`` (torchrun's own arguments); returns the exit status.

    Two differences from plain ``torchrun``: every restart (``--max-restarts``) starts from a
    fresh key-value store (:data:`FRESH_STORE_ENV`), and a rendezvous that does not fill, failed
    workers or a stop signal end with one ``error:`` line instead of the agent's traceback.
    """
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import RendezvousError

    for key, value in FRESH_STORE_ENV.items():
        os.environ.setdefault(key, value)
    args = torchrun.parse_args(argv)
    try:
        torchrun.run(args)
    except RendezvousError as err:
        return _fail(_rendezvous_message(args, err))
    except ChildFailedError as err:
        ranks = ", ".join(
            f"rank {r} ({_exit(f.exitcode)})" for r, f in sorted(err.failures.items())
        )
        return _fail(
            f"the workers failed ({ranks}) after {args.max_restarts} restart(s) "
            "(--max-restarts); each rank's own error line says why"
        )
    except SignalException as err:
        _fail(f"the launcher was stopped by {signal.Signals(err.sigval).name}")
        return 128 + int(err.sigval)
    return 0


def _exit(code: int) -> str:
    """A worker's exit status in words: "exit code 1", "killed by SIGKILL"."""
    if code < 0:
        with suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"


def _fail(message: str) -> int:
    """Print ``error: message`` on stderr; returns the exit status 1."""
    print(f"error: {message}", file=sys.stderr, flush=True)
    return 1


def _rendezvous_message(args: Any, error: BaseException) -> str:
    """One line on a rendezvous that failed: where, what was expected, and what to do."""
    from torch.distributed.elastic.rendezvous.api import RendezvousTimeoutError

    where = f"the rendezvous at {args.rdzv_endpoint} (--rdzv-id {args.rdzv_id})"
    if not isinstance(error, RendezvousTimeoutError):
        return f"{where} failed: {_one_line(error)}"
    conf = dict(item.split("=", 1) for item in args.rdzv_conf.split(",") if "=" in item)
    timeout = conf.get("join_timeout", "600")
    return (
        f"{where} did not gather --nnodes {args.nnodes} within join_timeout={timeout} s: start "
        "the same command on every node (the same --rdzv-endpoint and --rdzv-id), or raise "
        "--rdzv-conf join_timeout=SECONDS"
    )


if __name__ == "__main__":
    sys.exit(launch(sys.argv[1:]))
