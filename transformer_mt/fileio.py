"""Reading and writing the files users hand us: UTF-8 lines in, whole files out atomically.

:func:`atomic_write` is the one way this package writes a file that someone may read while it is
being written, or that must survive a crash: checkpoints, translations, tokenizer models, cache
reports, download markers. It writes a temporary file beside the target and renames it into
place, so a reader sees the old file or the new one, never half of one.

A path that a user names as a command's output goes through :func:`output_file` (or
:func:`write_output`): refused when it is one of the command's inputs, a directory, or in a
directory that does not exist; a regular file is written atomically (through a symlink to its
target, the link stays a link); a FIFO, a device (``/dev/null``) or ``/dev/stdout`` is written in
place, since renaming a file over it would replace it. :func:`os_error_message` turns the
ordinary failures of a user's paths (permission denied, disk full, a directory where a file is
expected) into the one line the command line prints.
"""

import contextlib
import errno
import os
import stat
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from transformer_mt.errors import MTError

NO_SPACE = (errno.ENOSPC, errno.EDQUOT)  # a full disk, or a full quota

# errno -> what the user reads after the path. Other OS errors are not a user's mistake.
_OS_HINTS = {
    errno.ENOENT: "no such file or directory; check the path",
    errno.EISDIR: "is a directory; a file is expected here",
    errno.ENOTDIR: "a part of this path is a file, not a directory; check the path",
    errno.EEXIST: "already exists and is in the way (a file where a directory is expected?); "
    "move it or choose another path",
    errno.ENOTEMPTY: "directory not empty; move it or choose another path",
    errno.EACCES: "permission denied; check its permissions or choose another path",
    errno.EPERM: "operation not permitted; check its permissions or choose another path",
    errno.ENOSPC: "no space left on device; free some space or choose another location",
    errno.EDQUOT: "disk quota exceeded; free some space or choose another location",
    errno.EROFS: "read-only file system; choose another location",
    errno.ENAMETOOLONG: "file name too long; choose a shorter path",
    errno.ELOOP: "too many levels of symbolic links; check the path",
    errno.EFBIG: "file too large for this file system; choose another location",
    errno.ENXIO: "no such device or address (a FIFO without a reader?)",
    errno.EIO: "input/output error; check the disk or the network file system",
}


def os_error_message(err: BaseException) -> str | None:
    """One line for an OS failure of a user's path, or None when ``err`` is not one.

    The line gives the path, what happened and what to do; with None a bug keeps its traceback.
    Disk full is recognised also when a library (torch) wrapped it in another exception."""
    for cause in _chain(err):
        if isinstance(cause, OSError) and cause.errno in _OS_HINTS:
            if cause is not err and cause.errno not in NO_SPACE:
                return None
            where = [str(f) for f in (cause.filename, cause.filename2) if f is not None]
            hint = _OS_HINTS[cause.errno]
            return f"{' -> '.join(where)}: {hint}" if where else hint
    return None


def is_no_space(err: BaseException) -> bool:
    """Whether ``err`` (or an exception it was raised from) is a full disk or quota."""
    return any(isinstance(e, OSError) and e.errno in NO_SPACE for e in _chain(err))


def no_space_error(path: Path | str, nbytes: int) -> MTError:
    """The one line for an output that did not fit: the path and how much was to be written."""
    return MTError(
        f"{path}: no space left on device to write {nbytes:,} bytes; free some space or "
        "choose another location"
    )


def _chain(err: BaseException | None) -> Iterator[BaseException]:
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        yield err
        err = err.__cause__ or err.__context__


UTF8_BOM = "\ufeff"  # the byte-order mark, as text


def decode_utf8(data: bytes, name: str | Path) -> str:
    """``data`` as UTF-8 text, or an MTError naming ``name`` and the line of the first bad byte."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise MTError(f"{name}:{line}: invalid UTF-8; save the file as UTF-8") from None


def read_lines(path: Path) -> list[str]:
    """The lines of a UTF-8 text file, without line endings or a byte-order mark.

    Lines of a UTF-8 text file without their line endings (one segment per line), and
    without the byte-order mark some editors put first (it would be part of the first word:
    a hypothesis that starts with one scores lower BLEU). A FIFO or ``/dev/stdin``
    (``-i <(zcat x.gz)``) is read like a file."""
    path = Path(path)
    if path.is_dir():
        raise MTError(f"{path} is a directory; name a text file")
    if not path.exists():
        raise MTError(f"file not found: {path}")
    with open(path, "rb") as f:
        return split_lines(decode_utf8(f.read(), path).removeprefix(UTF8_BOM))


def split_lines(text: str) -> list[str]:
    """Split text into lines as `wc -l` counts them.

    Lines as `wc -l` counts them: split on "\n" only; the CRs that end a line go (CRLF
    files), a lone CR inside a line stays in it.

    ``str.splitlines`` (and Python's universal newlines) would also break at a lone CR, form
    feeds, U+2028 and other separators that occur inside real sentences, and then a translation
    would no longer match its input line for line.
    """
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line.rstrip("\r") for line in lines]


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
    except OSError as err:
        written = os.stat(tmp).st_size if os.path.exists(tmp) else 0
        Path(tmp).unlink(missing_ok=True)
        if err.errno in NO_SPACE:
            raise MTError(
                f"{path}: no space left on device after writing {written:,} bytes of it; free "
                "some space or choose another location"
            ) from err
        raise
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _mode_for(path: Path) -> int:
    """The permissions a written file gets.

    The old file's, or what ``open()`` would give
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


_STREAMS = ("/dev/stdout", "/dev/stderr", "/dev/fd/", "/proc/")  # a process's own streams


def _in_place(path: Path) -> bool:
    """Whether ``path`` must be written in place rather than replaced.

    It must when it exists and is not a regular file (a FIFO, a device, a socket), or when it
    names a process's own stream (``/dev/stdout``, ``/dev/fd/1``), whose link target may be a pipe
    or a file opened for appending."""
    if str(path.absolute()).startswith(_STREAMS):
        return True
    try:
        return not stat.S_ISREG(path.stat().st_mode)
    except (FileNotFoundError, NotADirectoryError):
        return False


def check_output(path: Path | str, inputs: Iterable[Path | str | os.stat_result] = ()) -> Path:
    """Check that ``path`` can be a command's output without harm.

    Raise a one-line MTError unless ``path`` can be a command's output without harm: not a
    directory, in a directory that exists, and not the same file as any of ``inputs`` (paths, or
    ``os.stat`` results, e.g. of stdin). Returns the path to write: a symlink's target."""
    path = Path(path)
    if path.is_dir():
        raise MTError(f"output {path} is a directory; name a file to write")
    if _in_place(path):
        target = path
    else:
        target = Path(os.path.realpath(path))  # through symlinks: the link stays a link
        if not target.parent.is_dir():
            raise MTError(
                f"output {path}: directory {target.parent} does not exist; create it first"
            )
        if not os.access(target.parent, os.W_OK | os.X_OK):  # where the temporary file goes
            raise MTError(
                f"output {path}: cannot write in {target.parent} (permission denied or a "
                "read-only file system); choose another path"
            )
    try:
        out = path.stat()
    except OSError:
        return target  # a new file cannot be an input
    if not stat.S_ISREG(out.st_mode):
        return target  # a FIFO or a device (/dev/null, a terminal) destroys no input file
    for given in inputs:
        try:
            st = given if isinstance(given, os.stat_result) else os.stat(given)
        except OSError:
            continue
        if (st.st_dev, st.st_ino) == (out.st_dev, out.st_ino):
            name = "stdin" if isinstance(given, os.stat_result) else str(given)
            raise MTError(
                f"output {path} is the input {name}: writing it would destroy the input; "
                "choose another output path"
            )
    return target


@contextlib.contextmanager
def output_file(
    path: Path | str,
    mode: str = "w",
    *,
    inputs: Iterable[Path | str | os.stat_result] = (),
    durable: bool = False,
) -> Iterator[IO[Any]]:
    """Open a user-named output for writing, after :func:`check_output`.

    A regular file (or a
    new one) through :func:`atomic_write`, keeping its mode (new files: 0666 less the umask); a
    FIFO, a device or ``/dev/stdout`` in place. Used as ``with output_file(p, "wb") as f``."""
    target = check_output(path, inputs)
    if _in_place(Path(path)):
        # Appending: reopening /dev/stdout with "w" would truncate a file the shell opened for
        # appending (`>> log`); a FIFO or a device does not care.
        with open(path, mode.replace("w", "a"), encoding="utf-8" if mode == "w" else None) as f:
            yield f
    else:
        with atomic_write(target, mode, durable=durable) as f:
            yield f


def write_output(
    path: Path | str,
    data: str | bytes,
    *,
    inputs: Iterable[Path | str | os.stat_result] = (),
    durable: bool = False,
) -> None:
    """Write ``data`` to the user-named output ``path``.

    Write ``data`` (text as UTF-8) to the user-named output ``path`` through
    :func:`output_file`; a full disk is one MTError naming the path and the bytes needed."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    try:
        with output_file(path, "wb", inputs=inputs, durable=durable) as f:
            f.write(raw)
    except (OSError, MTError) as err:  # atomic_write turns a full disk into an MTError
        if is_no_space(err):
            raise no_space_error(path, len(raw)) from err
        raise
