"""Reading and writing the text files users hand us: UTF-8 lines in, whole files out atomically."""

import os
import tempfile
from pathlib import Path

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


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path`` and rename it into place, so a failure
    never leaves a half-written output file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
