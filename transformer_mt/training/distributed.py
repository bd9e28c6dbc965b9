"""The little torch.distributed that training needs; a no-op in a single process.

``torchrun`` sets RANK, LOCAL_RANK and WORLD_SIZE; then the process group is initialized with NCCL
on GPUs and gloo on CPU (the tests run two CPU processes with gloo).

Every helper here is a collective: all ranks must call it, in the same order, or the ones that did
wait for the others. The trainer keeps that promise by making every decision that ends a loop
(max steps, early stopping, a stop signal, too many non-finite losses) from all-reduced numbers.
"""

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from transformer_mt.errors import MTError

T = TypeVar("T")


@dataclass
class DistInfo:
    """Where this process sits in the job (rank 0 of 1 when not distributed)."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def init_distributed(device_type: str) -> DistInfo:
    """Join the process group that torchrun set up, or return a single-process DistInfo."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return DistInfo()
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device_type == "cuda" else "gloo")
    return DistInfo(dist.get_rank(), int(os.environ.get("LOCAL_RANK", "0")), dist.get_world_size())


def all_reduce_sum(values: list[float], info: DistInfo, device: torch.device) -> list[float]:
    """Sum a few numbers over all ranks (token counts, loss sums, stop flags)."""
    if not info.enabled:
        return values
    # float64: token counts of a large step stay exact and loss sums lose nothing in the sum.
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()


def all_gather_objects(obj: Any, info: DistInfo) -> list[Any]:
    """Every rank's ``obj`` (picklable), in rank order; ``[obj]`` in a single process."""
    if not info.enabled:
        return [obj]
    out: list[Any] = [None] * info.world_size
    dist.all_gather_object(out, obj)
    return out


def agree_on_error(error: BaseException | None, info: DistInfo) -> None:
    """Raise on every rank if any rank failed, so no rank waits forever for a failed peer.

    Each rank passes the exception it caught (or None). The failing rank re-raises its own; the
    others raise an :class:`MTError` that carries the failing rank's message, so whichever rank's
    output the user reads, it names the real cause.
    """
    if info.enabled:
        messages = all_gather_objects(None if error is None else _one_line(error), info)
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
