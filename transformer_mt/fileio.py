"""Reading and writing the files users hand us: UTF-8 lines in, whole files out atomically.

:func:`atomic_write` is the one way this package writes a file that someone may read while it is
being written, or that must survive a crash: checkpoints, translations, tokenizer models, cache
reports, download markers. It writes a temporary file beside the target and renames it into
place, so a reader sees the old file or the new one, never half of one.
"""

import contextlib
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from transformer_mt.errors import MTError


def read_lines(path: Path) -> list[str]:
    """Lines of a UTF-8 text file without their line endings (one segment per line)."""
    path = Path(path)
    if not path.is_file():
        raise MTError(f"file not found: {path}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        line = path.read_bytes()[: err.start].count(b"\n") + 1
        raise MTError(f"{path}:{line}: invalid UTF-8; save the file as UTF-8") from err
    return split_lines(text)


def split_lines(text: str) -> list[str]:
    """Lines as `wc -l` counts them: split on "\n" only (a trailing CR is dropped).

    ``str.splitlines`` would also break at form feeds, U+2028 and other separators that occur
    inside real sentences, and then a translation would no longer match its input line for line.
    """
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


@contextlib.contextmanager
def atomic_write(path: Path, mode: str = "w", *, durable: bool = False) -> Iterator[IO[Any]]:
    """Open a temporary file beside ``path`` for writing; rename it over ``path`` on success.

    Used as ``with atomic_write(path, "wb") as f: ...``. If the block raises (Ctrl-C included), the
    temporary file is removed and ``path`` keeps its old content (or stays absent). ``mode`` is
    ``"w"`` (UTF-8 text) or ``"wb"``. ``durable`` also flushes the data to the disk before the
    rename (checkpoints, cache markers), so that a power cut cannot publish an empty file.
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_write mode must be 'w' or 'wb', got {mode!r}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        encoding = "utf-8" if mode == "w" else None
        with os.fdopen(fd, mode, encoding=encoding) as f:
            yield f
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.chmod(tmp, _mode_for(path))  # mkstemp creates 0600; the result must not be private
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _mode_for(path: Path) -> int:
    """The permissions a written file gets: the old file's, or what ``open()`` would give
    (0666 less the umask) for a new one."""
    try:
        return stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` through :func:`atomic_write`."""
    with atomic_write(path, "w") as f:
        f.write(text)


def write_bytes_atomic(path: Path, data: bytes, *, durable: bool = False) -> None:
    """Write ``data`` to ``path`` through :func:`atomic_write`."""
    with atomic_write(path, "wb", durable=durable) as f:
        f.write(data)
