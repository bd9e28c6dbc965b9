"""The files of one training run, and its lock.

The files of one training run, written by rank 0: config.yaml, the tokenizers, checkpoints
(last.pt, best.pt, the newest ``keep_last`` step_N.pt, average.pt) and metrics.jsonl; and the lock
(RUN_DIR/.lock) that keeps a second `mt train` out of the directory while one runs."""

import contextlib
import datetime
import fcntl
import json
import logging
import os
import re
import shutil
import socket
from pathlib import Path
from typing import IO, Any

from transformer_mt.checkpoint import average_checkpoints, save_checkpoint
from transformer_mt.config import Config, save_config
from transformer_mt.data.tokenizer import Tokenizer
from transformer_mt.errors import MTError
from transformer_mt.fileio import atomic_write
from transformer_mt.training.metrics import MetricsLog

log = logging.getLogger(__name__)

LOCK_FILE = ".lock"
_STEP_FILE = re.compile(r"step_(\d+)\.pt")
# What fileio.atomic_write leaves beside the run's files when a process dies mid-write.
_LEFTOVER = re.compile(
    r"\.(last\.pt|best\.pt|average\.pt|step_\d+\.pt|metrics\.jsonl|config\.yaml"
    r"|spm\.(src|trg)\.model)\..+\.tmp"
)


class RunLock:
    """An exclusive ``flock`` on RUN_DIR/.lock, held for the whole run by one process (rank 0).

    The kernel drops the lock when its holder exits, however it exits (SIGKILL, a crash, a power
    cut), so no stale lock is ever left to clear by hand. The file names its holder (pid, host,
    start time) for the error that a second process gets; it is removed when the run ends, and a
    run directory that the lock itself created is removed again if nothing else was written.
    """

    def __init__(self, run_dir: Path, file: IO[str] | None, created_dir: bool) -> None:
        self.run_dir, self._file, self._created_dir = run_dir, file, created_dir

    @property
    def path(self) -> Path:
        return self.run_dir / LOCK_FILE

    @classmethod
    def acquire(cls, run_dir: Path) -> "RunLock":
        """Lock ``run_dir`` or raise an MTError naming the holder.

        Lock ``run_dir`` (created if missing) or raise an MTError naming the holder; a second
        process touches none of the run's files."""
        run_dir = Path(run_dir)
        created = not run_dir.exists()
        if run_dir.exists() and not run_dir.is_dir():
            raise MTError(f"run directory {run_dir} is not a directory; pass another --run-dir")
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise MTError(f"cannot create run directory {run_dir}: {err.strerror}") from err
        path = run_dir / LOCK_FILE
        while True:
            try:
                file = open(path, "a+", encoding="utf-8")  # noqa: SIM115 (held for the run)
            except OSError as err:
                raise MTError(f"cannot open {path}: {err.strerror}") from err
            try:
                fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                file.seek(0)
                holder = file.read()
                file.close()
                raise MTError(_in_use_message(run_dir, holder)) from None
            except OSError as err:  # a file system without locks: run, but say so
                log.warning(
                    f"cannot lock {path} ({err.strerror}): nothing stops a second `mt train` "
                    "on this run directory"
                )
                file.close()
                return cls(run_dir, None, created)
            # Its holder may have removed the file between our open and our flock: then this
            # lock is on a file nobody else will see; lock the one that is there now.
            with contextlib.suppress(FileNotFoundError):
                if os.stat(path).st_ino == os.fstat(file.fileno()).st_ino:
                    break
            file.close()
        started = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
        file.truncate(0)
        file.write(
            json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": started})
        )
        file.write("\n")
        file.flush()
        return cls(run_dir, file, created)

    def release(self) -> None:
        """Remove the lock file (while still holding it), then unlock; idempotent."""
        if self._file is None:
            return
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        self._file.close()
        self._file = None
        if self._created_dir:
            with contextlib.suppress(OSError):
                self.run_dir.rmdir()  # only when empty: a run that failed before writing

    def remove_leftovers(self) -> None:
        """Delete the temporary files of writes that a killed process left.

        Runs under the lock, so that no live writer owns them."""
        removed = 0
        for p in self.run_dir.iterdir():
            if _LEFTOVER.fullmatch(p.name) and p.is_file() and not p.is_symlink():
                p.unlink()
                removed += 1
        if removed:
            log.info(f"{self.run_dir}: removed {removed} temporary file(s) of an interrupted run")


def _in_use_message(run_dir: Path, holder: str) -> str:
    try:
        info = json.loads(holder)
        who = f"pid {info['pid']} on {info['host']}, started {info['started']}"
    except (ValueError, KeyError, TypeError):
        who = "a process that is starting"
    return (
        f"run directory {run_dir} is in use by another `mt train` ({who}); wait for it to end, "
        "or pass another --run-dir"
    )


# What a new run writes over (config.yaml, the tokenizers) or empties (metrics.jsonl and
# TensorBoard's events, cut back to step 0) besides its checkpoints.
SETUP_FILES = ("config.yaml", "spm.src.model", "spm.trg.model", "metrics.jsonl", "tensorboard")


def refuse_earlier_run(path: Path) -> None:
    """Refuse a new run where another run left checkpoints or files.

    A new run (not a resume) must not start where another run left checkpoints: it would
    prune the new step files before the old ones (their steps are higher) and average the old
    run's weights into its average.pt. Nor where files it writes over are someone else's: an
    earlier run's log and tokenizers, or a config.yaml of the user's (a new run writes its
    resolved config there). Raises an MTError that names them and what to do."""
    old = sorted(p.name for p in path.glob("*.pt"))
    if old:
        shown = ", ".join(old[:4]) + (", ..." if len(old) > 4 else "")
        raise MTError(
            f"{path} holds checkpoints of an earlier run ({shown}); a new run there would mix "
            "with them: resume it (without --no-resume, with its last.pt), choose another "
            "--run-dir, or move those files away"
        )
    taken = [name for name in SETUP_FILES if _holds_something(path / name)]
    if taken:
        raise MTError(
            f"{path} holds {', '.join(taken)} of an earlier run (or yours), and no last.pt to "
            "resume; a new run would overwrite them: move them away (a config of yours can "
            "live outside the run directory), or choose another --run-dir"
        )


def _holds_something(path: Path) -> bool:
    """Whether ``path`` is a non-empty file, or a directory with anything in it."""
    try:
        return any(path.iterdir()) if path.is_dir() else path.stat().st_size > 0
    except OSError:  # absent (or unreadable: the run's own write then names it)
        return False


class RunDirectory:
    """Where a run keeps its files; see the module docstring for what it holds."""

    def __init__(self, path: Path, cfg: Config, is_main: bool) -> None:
        self.path = Path(path)
        self.keep_last = cfg.train.keep_last
        self.metrics = MetricsLog(self.path, is_main, cfg.train.tensorboard)

    @property
    def last(self) -> Path:
        return self.path / "last.pt"

    def write_setup(self, cfg: Config, src_tok: Tokenizer, trg_tok: Tokenizer, step: int) -> None:
        """The resolved config and the tokenizers; on resume, metrics.jsonl cut back to ``step``."""
        self.path.mkdir(parents=True, exist_ok=True)
        save_config(cfg, self.path / "config.yaml")
        for side, tok in (("src", src_tok), ("trg", trg_tok)):
            tok.save(self.path / f"spm.{side}.model")
        self.metrics.trim(step)

    def step_checkpoints(self) -> list[Path]:
        """The step_N.pt files, oldest first.

        Other names, such as a user's step_best.pt, are left alone: never pruned, never averaged."""
        steps = {p: m for p in self.path.glob("step_*.pt") if (m := _STEP_FILE.fullmatch(p.name))}
        return sorted(steps, key=lambda p: int(steps[p].group(1)))

    def save(self, ckpt: dict[str, Any], step: int, best: bool, step_file: bool = True) -> None:
        """Save best.pt, last.pt and step_N.pt, then prune old step files.

        best.pt (when ``best``), last.pt, then step_N.pt; then only the newest ``keep_last``
        step files stay. In that order, a process killed between two writes leaves files that
        agree: never a last.pt that records a best whose weights best.pt lacks (a resume would
        not write it again), never a step file without the last.pt that a resume needs. Without
        ``step_file`` (a save for a signal, at a step no validation saw), last.pt alone: no step
        file to crowd a validated one out of the ``keep_last`` that average.pt is made from."""
        if best:
            save_checkpoint(ckpt, self.path / "best.pt")
        save_checkpoint(ckpt, self.last)
        if not step_file:
            return
        save_checkpoint(ckpt, self.path / f"step_{step}.pt")
        self._prune_step_files()

    def _prune_step_files(self) -> None:
        """Only the newest ``keep_last`` step files stay."""
        step_files = self.step_checkpoints()
        for old in step_files[: max(0, len(step_files) - self.keep_last)]:
            old.unlink()

    def restore_step_file(self, step: int) -> None:
        """Write a missing step_N.pt from last.pt.

        Write step_N.pt from last.pt at a validated ``step`` where it is missing: a process
        killed between the two writes of :meth:`save` left it out, and the resumed run, past that
        step, would never write it (``keep_last`` and average.pt would silently lack it)."""
        target = self.path / f"step_{step}.pt"
        if self.keep_last == 0 or target.is_file() or not self.last.is_file():
            return  # (keep_last 0: no step files are kept)
        with atomic_write(target, "wb", durable=True) as out, open(self.last, "rb") as src:
            shutil.copyfileobj(src, out, 1 << 20)
        log.info(f"wrote {target.name}, which an interrupted save left out (a copy of last.pt)")
        self._prune_step_files()

    def write_average(self, n_last: int) -> None:
        """average.pt: the weights averaged over the newest ``n_last`` step checkpoints.

        Averaging the last few checkpoints of a run usually adds BLEU for free."""
        chosen = self.step_checkpoints()[-n_last:]
        target = self.path / "average.pt"
        try:  # step files of one run directory: a resume may have changed the seed
            average_checkpoints(chosen, target, other_runs=True)
        except MTError as err:  # e.g. another tokenizer since a resume with --allow-data-change
            log.warning(f"no average.pt: {err}")
            return
        names = ", ".join(p.name for p in chosen)
        log.info(f"wrote {self.path / 'average.pt'}: the average of {names}")
