"""What training logs: the metrics window of the steps since the last line, and metrics.jsonl.

``metrics.jsonl`` holds one JSON object per logged step and one per validation. Both carry
``step`` and ``time_s`` (training seconds so far). Step lines add ``epoch``, ``loss`` (label
smoothed), ``nll``, ``lr``, ``grad_norm`` and ``tokens_per_s``; validation lines add ``val_loss``,
``val_ppl``, ``val_bleu``, memory (``rss_mib`` on a CPU, ``cuda_peak_mib`` on a GPU),
``precision`` (what train.precision=auto chose, or the config's) and, with train.compile, the graphs
torch.compile has compiled so far and the seconds it took (``compiled_graphs``, ``compile_s``).
"""

import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformer_mt.errors import MTError
from transformer_mt.fileio import write_text_atomic

log = logging.getLogger(__name__)


def read_records(path: Path) -> list[dict[str, Any]]:
    """The records of a metrics.jsonl file (blank lines skipped).

    A process killed while appending can leave half a line at the end: an unparsable *last* line
    is dropped with a warning. Anywhere else it is an MTError naming the line, since something
    other than a crash has written it.
    """
    return [record for _, record in _parse(Path(path))]


def _parse(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """(line, record) pairs of :func:`read_records`."""
    lines = path.read_bytes().split(b"\n")
    records: list[tuple[str, dict[str, Any]]] = []
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    for i, raw in enumerate(lines):
        if not raw.strip():
            continue
        try:
            text = raw.decode("utf-8")
            record = json.loads(text)
            if not isinstance(record, dict) or not isinstance(record.get("step"), int):
                raise ValueError("not a JSON object with an integer step")
        except ValueError as err:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            if i == last:
                log.warning(f"{path}:{i + 1}: ignoring a half-written last line (a killed run)")
                continue
            raise MTError(
                f"{path}:{i + 1}: not a metrics record ({err}); delete or fix that line"
            ) from err
        records.append((text.rstrip("\r"), record))
    return records


@dataclass
class MetricsWindow:
    """Sums over the optimizer steps since the last metrics line, and the time they took.

    Times are readings of one clock (``time.perf_counter`` in training), passed in by the caller:
    the window never reads a clock itself, so a test can drive it with any numbers. Time spent
    inside the window on something else than training (a validation) is excluded with
    :meth:`pause`, so ``tokens_per_s`` measures training alone.
    """

    started: float  # clock reading when the window opened
    loss_sum: float = 0.0  # summed label-smoothed token losses
    nll_sum: float = 0.0  # summed token negative log-likelihoods
    tokens: float = 0.0  # non-pad target tokens
    grad_norm_sum: float = 0.0  # over the steps whose gradient norm was finite
    norm_steps: int = 0
    paused: float = 0.0  # seconds inside the window that were not training

    def add(self, loss: float, nll: float, tokens: float, grad_norm: float) -> None:
        """Count one optimizer step (sums over its micro-batches and ranks)."""
        self.loss_sum += loss
        self.nll_sum += nll
        self.tokens += tokens
        if math.isfinite(grad_norm):
            # An fp16 overflow step has no norm (the scaler skipped the update).
            self.grad_norm_sum += grad_norm
            self.norm_steps += 1

    def pause(self, seconds: float) -> None:
        """Leave out ``seconds`` spent inside the window not training (e.g. a validation)."""
        self.paused += seconds

    def summary(self, now: float) -> dict[str, float]:
        """Per-token loss and NLL, mean gradient norm and training throughput up to ``now``."""
        seconds = now - self.started - self.paused
        return {
            "loss": self.loss_sum / self.tokens,
            "nll": self.nll_sum / self.tokens,
            "grad_norm": self.grad_norm_sum / max(self.norm_steps, 1),
            "tokens_per_s": self.tokens / max(seconds, 1e-9),
        }


class MetricsLog:
    """Append records to RUN_DIR/metrics.jsonl (and TensorBoard when asked).

    Appends records to RUN_DIR/metrics.jsonl (and TensorBoard when asked); a no-op on ranks
    other than 0, so that every rank can call it."""

    def __init__(self, run_dir: Path, enabled: bool, tensorboard: bool = False) -> None:
        self.path = Path(run_dir) / "metrics.jsonl"
        self.enabled = enabled
        self.tensorboard = tensorboard and enabled
        self.writer: Any = None

    def open(self, step: int = 0) -> None:
        """Open the TensorBoard writer, when asked for.

        Fails with what to do if the tensorboard package is missing. A run resumed at ``step`` drops
        the events logged after it, as :meth:`trim` drops lines."""
        if not self.tensorboard:
            return
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as err:
            raise MTError(
                "train.tensorboard: true needs the tensorboard package; pip install tensorboard "
                "or set train.tensorboard=false"
            ) from err
        # Events after ``step`` are dropped: a resume's (logged again) and, for a fresh run, an
        # earlier run's whose checkpoints were moved away (its curves would overlap the new ones).
        self.writer = SummaryWriter(str(self.path.parent / "tensorboard"), purge_step=step + 1)

    def trim(self, last_step: int) -> None:
        """On resume, drop the lines logged after the checkpoint.

        They will be logged again (and
        a half-written last line, see :func:`read_records`); a fresh run starts an empty log."""
        if not (self.enabled and self.path.is_file()):
            return
        parsed = _parse(self.path) if last_step > 0 else []
        keep = [line for line, record in parsed if record["step"] <= last_step]
        write_text_atomic(self.path, "".join(line + "\n" for line in keep))

    def write(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        if self.writer is not None:
            for key, value in record.items():
                if key != "step" and isinstance(value, int | float):
                    self.writer.add_scalar(key, value, record["step"])
            self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
