"""The SQLite files that the worker processes of `mt serve --workers N` share.

The workers keep their request counts and their index of downloads in SQLite files that each
of them opens, in write-ahead-log mode (readers and a writer at once). Switching a new file to
that mode takes a lock that SQLite does not wait for: two processes that open a new file at the
same moment can fail with "database is locked" whatever their busy timeout. So the supervisor
makes each file (:func:`connect`, then closes it) before it starts the workers; the mode is kept
in the file, and the workers' own :func:`connect` then only reads it.
"""

import sqlite3
from collections.abc import Sequence
from pathlib import Path


def connect(path: Path | str, schema: Sequence[str]) -> sqlite3.Connection:
    """``path`` opened in WAL mode, its tables made by ``schema`` (``IF NOT EXISTS`` statements).

    Autocommit (callers write in their own ``BEGIN IMMEDIATE`` transactions), usable from any
    thread (callers hold their own lock), waiting up to 30 s for another process's write."""
    db = sqlite3.connect(path, timeout=30, isolation_level=None, check_same_thread=False)
    try:
        db.execute("PRAGMA journal_mode=WAL")
        for statement in schema:
            db.execute(statement)
    except BaseException:
        db.close()
        raise
    return db
