"""The little torch.distributed that training needs; a no-op in a single process.

``torchrun`` sets RANK, LOCAL_RANK and WORLD_SIZE; then the process group is initialized with NCCL
on GPUs and gloo on CPU (the tests run two CPU processes with gloo).

Every helper here is a collective: all ranks must call it, in the same order, or the ones that did
wait for the others. The trainer keeps that promise by making every decision that ends a loop
(max steps, early stopping, a stop signal, too many non-finite losses) from all-reduced numbers.

Two process groups, two kinds of waiting. The ranks step in lockstep (the step's sums, DDP's
gradients, validation): there a rank that does not answer within ``train.collective_timeout_s`` has
hung or stopped, and the others stop with an :class:`MTError` naming it instead of waiting in
silence. Waiting for rank 0's one-off work (:func:`main_first`: preparing the data, writing a
checkpoint) can legitimately take an hour, so it uses the default group and its long timeout.
"""

import datetime
import os
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
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
        dist.all_gather_object(out, obj)
        return out
    with lockstep("the gathering of the ranks' results", info):
        dist.all_gather_object(out, obj, group=info.step_group)
    return out


_COMM_ERROR = re.compile(
    r"gloo|nccl|timed? ?out|connection (closed|reset)|pair closure|broken pipe", re.IGNORECASE
)


def is_communication_error(error: BaseException) -> bool:
    """Whether ``error`` came from the process group (a peer timed out, stopped or died) rather
    than from the computation: torch's DistError family, or gloo's / NCCL's RuntimeErrors."""
    dist_error = getattr(dist, "DistError", None)
    if dist_error is not None and isinstance(error, dist_error):
        return True
    return isinstance(error, RuntimeError) and bool(_COMM_ERROR.search(str(error)))


@contextmanager
def lockstep(what: str, info: DistInfo) -> Iterator[None]:
    """Run a lockstep collective; a communication failure (a rank that did not answer within
    ``train.collective_timeout_s``) becomes a one-line :class:`MTError` naming the rank(s) that
    did not answer, where the backend can tell (gloo), else the operation and the timeout."""
    try:
        yield
    except RuntimeError as err:
        if not (info.enabled and is_communication_error(err)):
            raise
        raise MTError(_timeout_message(what, info, err)) from err


def _timeout_message(what: str, info: DistInfo, error: BaseException) -> str:
    timeout = f"{info.timeout_s:g} s" if info.timeout_s is not None else "the timeout"
    missing = _ranks_not_answering(info)
    detail = re.sub(r"^\[[^\]]*\]:? *", "", _one_line(error))  # gloo's "[file.cc:78] " prefix
    # "another rank" where the store could not tell which.
    who = f"rank{'s' if ',' in missing else ''} {missing}" if missing else "another rank"
    return (
        f"{who} did not answer {what} within {timeout} (train.collective_timeout_s; rank "
        f"{info.rank} saw: {detail}); it hung, stopped or died: see its output, or raise "
        "train.collective_timeout_s if it is only slow"
    )


def _ranks_not_answering(info: DistInfo) -> str | None:
    """Which ranks did not answer, e.g. "1" or "1, 3"; None when unknown.

    Every rank that timed out says so in the process group's key-value store (which outlives the
    broken collective), then waits up to ``DIAGNOSE_TIMEOUT_S`` for the others to do the same:
    the ranks that never say so are the silent ones. So a healthy rank that merely waited with
    this one is never blamed, and any rank can name the culprit, rank 0 included.
    """
    store = _store()
    if store is None:
        return None
    wait = min(DIAGNOSE_TIMEOUT_S, info.timeout_s or DIAGNOSE_TIMEOUT_S)
    try:
        store.set(f"{_TIMED_OUT}{info.rank}", "1")
        deadline = time.monotonic() + wait
        while True:
            silent = [r for r in range(info.world_size) if not store.check([f"{_TIMED_OUT}{r}"])]
            if not silent or time.monotonic() >= deadline:
                break
            time.sleep(0.2)
    except (RuntimeError, OSError):  # the store is gone too: nothing more to learn
        return None
    return ", ".join(map(str, silent)) or None


_TIMED_OUT = "transformer_mt/timed_out/"  # store keys of the ranks that saw a collective time out


def _store() -> Any:
    """The default process group's key-value store (torchrun's), or None where torch does not
    expose it."""
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
    result: T | None = None
    error: BaseException | None = None
    if info.is_main:
        try:
            result = fn()
        except Exception as err:  # handed to every rank below, then re-raised here
            error = err
    agree_on_error(error, info)
    if not info.is_main:
        result = (others or fn)()
    return result  # type: ignore[return-value]


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()


def shutdown() -> None:
    """Leave the process group, if this process joined one."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
