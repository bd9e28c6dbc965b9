"""Translated files kept for download (/translate_file, then GET /download_file/NAME).

The files live in a directory of their own, under names the server makes (32 random hex digits
and the format's suffix): no name or path from a client ever reaches the file system. A
download name is looked up among the files kept; anything else is refused before any path is
built. Each file expires ``ttl_s`` after it was written; the store keeps at most ``max_files``
files and ``max_total_bytes`` bytes (the oldest go first).
"""

import re
import shutil
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from transformer_mt.fileio import atomic_write
from transformer_mt.inference.serve_settings import FileSettings

# A name this store makes: what GET /download_file/NAME may ask for.
NAME = re.compile(r"[0-9a-f]{32}\.[a-z]{3,4}")


@dataclass(frozen=True)
class Stored:
    """A file kept for download.

    Where it is, the name a client saves it as, its size, when
    it expires (``time.monotonic()``)."""

    path: Path
    download_name: str
    size: int
    expires: float


class FileStore:
    """The downloads of one server; thread-safe."""

    def __init__(self, settings: FileSettings) -> None:
        self.settings = settings
        parent = settings.directory
        if parent is not None:
            parent.mkdir(parents=True, exist_ok=True)
        self.directory = Path(tempfile.mkdtemp(prefix="mt-serve-files-", dir=parent))
        self._files: dict[str, Stored] = {}  # in the order written
        self._lock = threading.Lock()

    def put(self, data: bytes, suffix: str, download_name: str) -> str:
        """Keep ``data`` (a translated file) for download; its name, made here."""
        name = uuid.uuid4().hex + suffix
        assert NAME.fullmatch(name), name
        path = self.directory / name
        with atomic_write(path, "wb") as out:
            out.write(data)
        stored = Stored(path, download_name, len(data), time.monotonic() + self.settings.ttl_s)
        with self._lock:
            self._files[name] = stored
            self._evict()
        return name

    def get(self, name: str) -> Stored | None:
        """The file kept under ``name``, or None.

        None for a name this store did not make, or that has expired or been evicted."""
        if not NAME.fullmatch(name):
            return None
        with self._lock:
            self._evict()
            return self._files.get(name)

    def close(self) -> None:
        """Remove every file and the directory."""
        with self._lock:
            self._files.clear()
        shutil.rmtree(self.directory, ignore_errors=True)

    def _evict(self) -> None:
        """Drop the expired files, then the oldest while over a bound (the lock is held)."""
        now = time.monotonic()
        for name in [n for n, f in self._files.items() if f.expires <= now]:
            self._drop(name)
        total = sum(f.size for f in self._files.values())
        while self._files and (
            len(self._files) > self.settings.max_files or total > self.settings.max_total_bytes
        ):
            oldest = next(iter(self._files))
            total -= self._files[oldest].size
            self._drop(oldest)

    def _drop(self, name: str) -> None:
        self._files.pop(name).path.unlink(missing_ok=True)
