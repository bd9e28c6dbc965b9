"""Translated files kept for download (/translate_file, then GET /download_file/NAME).

The files live in a directory of their own, under names the server makes (32 random hex digits
and the format's suffix): no name or path from a client ever reaches the file system. A
download name is looked up among the files kept; anything else is refused before any path is
built. Each file expires ``ttl_s`` after it was written; the store keeps at most ``max_files``
files and ``max_total_bytes`` bytes (the oldest go first).

What is kept is listed in an SQLite index in the same directory, so that the worker processes
of `mt serve --workers N` share one store: a file translated by one worker downloads from any.
"""

import re
import shutil
import sqlite3
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from transformer_mt.errors import MTError
from transformer_mt.fileio import atomic_write
from transformer_mt.serve import shared_sqlite
from transformer_mt.serve.settings import FileSettings

# A name this store makes: what GET /download_file/NAME may ask for.
NAME = re.compile(r"[0-9a-f]{32}\.[a-z]{3,4}")
# Set by `mt serve --workers N` for its workers: the directory of the store they share.
SHARED_FILES_ENV = "MT_SERVE_SHARED_FILES"
_INDEX = "index.sqlite3"  # never a NAME: no download reaches it
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS files (name TEXT PRIMARY KEY, download_name TEXT NOT NULL, "
    "size INTEGER NOT NULL, expires REAL NOT NULL)",
)


def new_directory(settings: FileSettings) -> Path:
    """A new directory for a store; an MTError naming --files-dir if it cannot be made.

    It is made under ``settings.directory`` (made if missing) or the system's temporary one."""
    parent = settings.directory
    try:
        if parent is not None:
            parent.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix="mt-serve-files-", dir=parent))
    except OSError as err:
        where = f"--files-dir {parent}" if parent is not None else "the temporary directory"
        raise MTError(
            f"{where}: cannot keep translated files there ({err.strerror or err}); "
            "pass --files-dir a writable directory, or --no-files"
        ) from None


@dataclass(frozen=True)
class Stored:
    """A file kept for download.

    Where it is, the name a client saves it as, its size, when
    it expires (``time.monotonic()``, a clock every process of the machine shares)."""

    path: Path
    download_name: str
    size: int
    expires: float


class FileStore:
    """The downloads of one server, shared by its processes; thread-safe.

    ``shared``: the directory another process made (the workers of one server); the store then
    leaves removing it to that process. Without it the store makes its own directory."""

    def __init__(self, settings: FileSettings, shared: Path | str | None = None) -> None:
        self.settings = settings
        self.directory = new_directory(settings) if shared is None else Path(shared)
        self._owner = shared is None
        self._lock = threading.Lock()
        self._db = self.open_index(self.directory)

    @staticmethod
    def open_index(directory: Path | str) -> sqlite3.Connection:
        """The index of the store in ``directory``, made if new.

        The supervisor of `mt serve --workers N` makes it before its workers open it (see
        ``shared_sqlite``)."""
        return shared_sqlite.connect(Path(directory) / _INDEX, _SCHEMA)

    def put(self, data: bytes, suffix: str, download_name: str) -> str:
        """Keep ``data`` (a translated file) for download; its name, made here."""
        name = uuid.uuid4().hex + suffix
        assert NAME.fullmatch(name), name
        with atomic_write(self.directory / name, "wb") as out:
            out.write(data)
        expires = time.monotonic() + self.settings.ttl_s
        with self._transaction():
            self._db.execute(
                "INSERT INTO files VALUES (?, ?, ?, ?)", (name, download_name, len(data), expires)
            )
            self._evict()
        return name

    def get(self, name: str) -> Stored | None:
        """The file kept under ``name``, or None.

        None for a name this store did not make, or that has expired or been evicted."""
        if not NAME.fullmatch(name):
            return None
        with self._transaction():
            self._evict()
            row = self._db.execute(
                "SELECT download_name, size, expires FROM files WHERE name = ?", (name,)
            ).fetchone()
        return None if row is None else Stored(self.directory / name, *row)

    def close(self) -> None:
        """Close the index; remove every file and the directory if this store made it."""
        with self._lock:
            self._db.close()
        if self._owner:
            shutil.rmtree(self.directory, ignore_errors=True)

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        """The lock, then one write transaction of the index (processes take turns)."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _evict(self) -> None:
        """Drop the expired files, then the oldest while over a bound (in a transaction)."""
        now = time.monotonic()
        gone = [n for (n,) in self._db.execute("SELECT name FROM files WHERE expires <= ?", (now,))]
        kept = self._db.execute(
            "SELECT name, size FROM files WHERE expires > ? ORDER BY rowid", (now,)
        )
        rows = list(kept)
        total = sum(size for _, size in rows)
        while rows and (
            len(rows) > self.settings.max_files or total > self.settings.max_total_bytes
        ):
            name, size = rows.pop(0)
            gone.append(name)
            total -= size
        for name in gone:
            self._db.execute("DELETE FROM files WHERE name = ?", (name,))
            (self.directory / name).unlink(missing_ok=True)
