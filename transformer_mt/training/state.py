"""The resumable state of a run besides weights and optimizer.

Position, best value, generators,
and the stop flag that Ctrl-C / SIGTERM raise."""

import contextlib
import random
import signal
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch


@dataclass
class TrainState:
    """Everything besides weights and optimizer that a resumed run needs to continue exactly."""

    step: int = 0  # optimizer steps done
    epoch: int = 0  # current epoch
    batch_in_epoch: int = 0  # this rank's next batch within the epoch
    best: float | None = None  # best validation value of train.best_metric
    best_metric: str | None = None  # the train.best_metric that ``best`` measures (None: older
    # checkpoints, which did not record it)
    bad_validations: int = 0  # validations in a row without improvement (early stopping)
    nonfinite_in_a_row: int = 0
    train_seconds: float = 0.0  # wall time spent training and validating, over all invocations
    warmup_seconds: float | None = None  # train_seconds when warm-up ended (linear lr schedule)
    history: list[dict[str, float]] = field(default_factory=list)  # validation results


def rng_state(device: torch.device) -> dict[str, Any]:
    """This process's generators.

    Batch order has its own seeded generator (make_batches); these cover dropout and any code that
    draws from the global generators."""
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if device.type == "cuda":
        # Only this rank's own GPU: get_rng_state_all would create a context on every visible GPU.
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    # .cpu(): the checkpoint is loaded with map_location=<the GPU>, but generator states must be
    # CPU ByteTensors.
    torch.set_rng_state(state["torch"].cpu())
    random.setstate(state["python"])
    if "cuda" in state and device.type == "cuda":
        if isinstance(state["cuda"], list):  # older checkpoints stored every visible GPU's state
            torch.cuda.set_rng_state_all([x.cpu() for x in state["cuda"]])
        else:
            torch.cuda.set_rng_state(state["cuda"].cpu(), device)


def rank_seed(seed: int, rank: int) -> int:
    """The dropout seed of ``rank``.

    Dropout seed of ``rank``: rank 0 keeps ``seed`` (a single process is unchanged); other ranks
    get their own stream, or every rank would drop the same units of its different batch."""
    if rank == 0:
        return seed
    return int(np.random.SeedSequence([seed, rank]).generate_state(1)[0])


class StoppedBySignal(Exception):
    """A run stopped by Ctrl-C or SIGTERM, after saving its checkpoint.

    Not a failure, but not a
    finished run either, so `mt train` exits with the shell's code for the signal (130 for
    SIGINT, 143 for SIGTERM) and `mt train && next` does not go on."""

    def __init__(self, signum: int, step: int) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name} at step {step}")
        self.signum, self.step = signum, step

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


class StopFlag:
    """The flag that Ctrl-C / SIGTERM raise to stop the loop.

    Ctrl-C / SIGTERM ask the loop to save a checkpoint and stop after the current step;
    ``signum`` remembers the first signal (for the exit code).

    A second signal stops at once (KeyboardInterrupt), but only once ``REPEAT_GRACE_S`` have
    passed since the first: under torchrun a Ctrl-C reaches each worker twice within moments (from
    the terminal, and relayed by torchrun's agent), and that pair must still save a checkpoint.
    """

    REPEAT_GRACE_S = 2.0

    def __init__(self) -> None:
        self.requested = False
        self.signum: int | None = None  # the first signal received
        self._first_at = 0.0
        self._old: dict[int, Any] = {}

    def __enter__(self) -> "StopFlag":
        for sig in (signal.SIGINT, signal.SIGTERM):
            # Outside the main thread (e.g. a test runner's thread) no handlers can be set.
            with contextlib.suppress(ValueError):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        now = time.monotonic()
        if not self.requested:
            self.requested, self.signum, self._first_at = True, signum, now
        elif now - self._first_at > self.REPEAT_GRACE_S:  # the user insists: stop now
            raise KeyboardInterrupt

    def __exit__(self, *exc: Any) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
