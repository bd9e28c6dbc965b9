"""One builder at a time: an exclusive ``flock`` on a lock file beside what is being built.

Processes that share ``data.cache_dir`` or ``data.download_dir`` (a seed sweep started in parallel
on a fresh machine, several machines on shared storage) would otherwise build the same cache or
fetch the same file at once, and trip over each other's renames. So each builder holds
:func:`exclusive_lock` on ``<output>.lock`` while it checks for the output again and builds it;
the others wait, then find it built and reuse it.

The kernel drops a lock when its holder exits, however it exits, so no stale lock ever blocks a
later run. The holder deletes the lock file before unlocking it, so that nothing is left behind;
a waiter that then gets the lock of a deleted file sees it and locks the current one instead.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO

log = logging.getLogger(__name__)


def lock_path(output: Path) -> Path:
    """The lock file of ``output`` (a file or a directory): ``<output>.lock`` beside it."""
    output = Path(output)
    return output.with_name(output.name + ".lock")


@contextlib.contextmanager
def exclusive_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on the file ``path``, created if missing and removed on release.

    Wait for another process that holds it. Where locks cannot be taken (a file system without
    them, a directory that cannot be written), log a warning and go on unlocked."""
    path = Path(path)
    file = _acquire(path)
    try:
        yield
    finally:
        if file is not None:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()  # while still holding it: see the module's docstring
            file.close()


def _acquire(path: Path) -> IO[bytes] | None:
    """The open, locked lock file; None when it cannot be locked (after a warning)."""
    waiting = False
    while True:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            file = open(path, "ab")  # noqa: SIM115 (held until the lock is released)
        except OSError as err:
            _unlocked(path, err)
            return None
        try:
            try:
                fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if not waiting:
                    log.info(f"waiting for {path}: another process is building the same files")
                    waiting = True
                fcntl.flock(file, fcntl.LOCK_EX)
        except OSError as err:
            file.close()
            _unlocked(path, err)
            return None
        # The holder we waited for deleted the file before unlocking it: our lock is on a file
        # that nobody else will open again, so lock the one at ``path`` now.
        with contextlib.suppress(FileNotFoundError):
            if os.stat(path).st_ino == os.fstat(file.fileno()).st_ino:
                return file
        file.close()


def _unlocked(path: Path, err: OSError) -> None:
    """Warn that ``path`` cannot be locked (``err``), and that building goes on unlocked."""
    log.warning(
        f"cannot lock {path} ({err.strerror or err}): another process building the same files "
        "at the same time may fail"
    )
