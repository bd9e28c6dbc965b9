"""Fetch the files of a registered corpus: resume, retry, verify, unpack, and do it only once.

The path of one file through this module::

    GET url (Range: bytes=N- when <name>.part holds N bytes, with If-Range: the validator
             the server gave when the .part began, kept in <name>.part.validator)  ->  <name>.part
    -> SHA-256 checked against the registry (or logged, loudly, when the registry has none)
    -> os.replace(<name>.part, <name>)               (a final name always holds checked bytes)
    -> unpack (gunzip beside it / extract tar or zip, refusing members that escape the dest)
    -> .mt-download/<name>.json marker               (a second run reads it and fetches nothing)

All of it under a lock on ``<name>.lock`` (:mod:`transformer_mt.data.locking`): of processes that
fetch one file into one directory at once, one fetches it and the others wait, then reuse it.

Only the standard library's urllib talks to the network, so nothing beyond the package's own
dependencies is needed to download a corpus.
"""

from __future__ import annotations

import gzip
import hashlib
import http.client
import json
import logging
import os
import shutil
import stat
import tarfile
import time
import urllib.error
import urllib.parse
import urllib.request
import zipfile
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from tqdm import tqdm

from transformer_mt import __version__
from transformer_mt.data.locking import exclusive_lock, lock_path
from transformer_mt.data.registry import Corpus, CorpusFile, get_corpus
from transformer_mt.errors import MTError
from transformer_mt.fileio import atomic_write, write_text_atomic

log = logging.getLogger(__name__)

CHUNK_SIZE = 1 << 16
"""Bytes per read and write: large enough for speed, small enough for a smooth progress bar."""
TIMEOUT_S = 30.0
"""Seconds a connect or a read may stall before the try counts as failed."""
MARKER_DIR = ".mt-download"
"""Directory inside the destination that records what is already downloaded and unpacked."""
_USER_AGENT = f"transformer-mt/{__version__} (python urllib)"
# Answers worth another try; any other 4xx (404, 403, ...) will not change by asking again.
_RETRY_STATUS = frozenset({408, 425, 429})


@dataclass(frozen=True)
class SettingNames:
    """How the download messages name what a user can change.

    How the messages name what a user can change: `mt download`'s options, or the config keys
    when `mt prepare` / `mt train` download a corpus (they have no --base-url or --dest)."""

    base_url: str  # the mirror setting
    dest: str  # the destination directory setting

    def set_mirror(self) -> str:
        """The advice to use a mirror: "pass --base-url a mirror" or "set data.base_url to ..."."""
        if self.base_url.startswith("--"):
            return f"pass {self.base_url} a mirror"
        return f"set {self.base_url} to a mirror"


CLI_NAMES = SettingNames(base_url="--base-url", dest="--dest")
CONFIG_NAMES = SettingNames(base_url="data.base_url", dest="data.download_dir")


class _RetryableError(Exception):
    """A failure worth another try: network trouble, a 5xx answer, a transfer cut off."""


def sha256_of(path: Path) -> str:
    """Lower-case hex SHA-256 of a file, read in chunks so that large archives fit in memory."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _content_range_start(value: str | None) -> int | None:
    """The first byte of ``Content-Range: bytes START-END/TOTAL``, or None if unreadable."""
    if not value or not value.startswith("bytes "):
        return None
    start, _, _ = value[len("bytes ") :].partition("-")
    return int(start) if start.isdigit() else None


def _validator_file(part: Path) -> Path:
    """Where the validator of the response that began ``part`` is kept (see :func:`_transfer`)."""
    return part.with_name(part.name + ".validator")


def _discard(part: Path) -> None:
    """Delete a ``.part`` and its validator: the next try starts from zero."""
    part.unlink(missing_ok=True)
    _validator_file(part).unlink(missing_ok=True)


def _strong_validator(response: http.client.HTTPResponse) -> str | None:
    """What ``If-Range`` can name to ask for the same file again.

    A strong ETag, else the
    Last-Modified date (a weak ETag does not qualify); None when the server gave neither."""
    etag = response.headers.get("ETag")
    if etag and not etag.startswith("W/"):
        return etag
    return response.headers.get("Last-Modified")


def _open(
    opener: urllib.request.OpenerDirector,
    url: str,
    part: Path,
    offset: int,
    names: SettingNames,
    validator: str | None = None,
) -> http.client.HTTPResponse:
    """The HTTP response for ``url`` from byte ``offset`` on.

    With ``validator`` given, the response is the whole file if the file no longer matches it.
    Failures worth another try raise :class:`_RetryableError`, the others :class:`MTError`."""
    headers = {"User-Agent": _USER_AGENT}
    if offset:
        headers["Range"] = f"bytes={offset}-"
        if validator:
            headers["If-Range"] = validator
    try:
        return opener.open(urllib.request.Request(url, headers=headers), timeout=TIMEOUT_S)
    except urllib.error.HTTPError as exc:
        exc.close()
        if exc.code == 416 and offset:
            # The .part is not a prefix the server can continue (longer than the file, or the file
            # changed): it is worthless, so the next try starts from zero.
            _discard(part)
            raise _RetryableError("the server refused to resume (HTTP 416)") from None
        if exc.code >= 500 or exc.code in _RETRY_STATUS:
            raise _RetryableError(f"HTTP {exc.code} {exc.reason}") from None
        raise MTError(
            f"{url} answered HTTP {exc.code} {exc.reason}; check the corpus name, "
            f"or {names.set_mirror()} that has this file"
        ) from None
    except (OSError, http.client.HTTPException) as exc:  # URLError, refused, timeout, reset
        raise _RetryableError(str(getattr(exc, "reason", exc)) or type(exc).__name__) from None


def _transfer(
    opener: urllib.request.OpenerDirector,
    url: str,
    part: Path,
    progress: bool,
    names: SettingNames,
    verified: bool,
) -> None:
    """One try at bringing ``part`` up to the full file, resuming from its current length.

    A resumed request names the file the ``.part`` began with (``If-Range`` and the validator
    kept beside it), so a file changed on the server since then is sent whole rather than
    spliced onto the old beginning. Without a validator a ``.part`` is resumed only when a
    checksum (``verified``) will catch such a splice; otherwise it starts over.
    """
    offset = part.stat().st_size if part.exists() else 0
    validator_file = _validator_file(part)
    validator = validator_file.read_text(encoding="utf-8") if validator_file.is_file() else None
    if offset and validator is None and not verified:
        log.info(f"{part.name}: the server gave no validator to resume it by; starting over")
        _discard(part)
        offset = 0
    with _open(opener, url, part, offset, names, validator) as response:
        if offset and response.status == 206:
            start = _content_range_start(response.headers.get("Content-Range"))
            if start != offset:
                _discard(part)
                raise _RetryableError(f"the server resumed at byte {start}, not {offset}")
            mode = "ab"
        else:
            # 200 sends the whole file again (a server that ignores Range, or a file that no longer
            # matches the validator): start over from zero, remembering this file's validator.
            offset, mode = 0, "wb"
            part.unlink(missing_ok=True)  # never the old bytes beside the new file's validator
            new_validator = _strong_validator(response)
            if new_validator is None:
                validator_file.unlink(missing_ok=True)
            else:
                write_text_atomic(validator_file, new_validator)
        length = response.headers.get("Content-Length")
        expected = int(length) if length and length.isdigit() else None
        total = offset + expected if expected is not None else None
        bar = tqdm(
            total=total,
            initial=offset,
            unit="B",
            unit_scale=True,
            unit_divisor=1024,
            desc=part.name.removesuffix(".part"),
            disable=not progress,
        )
        with bar:
            received = _copy_body(response, part, mode, bar, names)
    # http.client returns b"" at a closed connection instead of raising, so a cut-off transfer
    # shows only as fewer bytes than Content-Length promised.
    if expected is not None and received < expected:
        raise _RetryableError(f"connection closed after {offset + received} of {total} bytes")


def _copy_body(
    response: http.client.HTTPResponse, part: Path, mode: str, bar: tqdm, names: SettingNames
) -> int:
    """Append (``"ab"``) or write (``"wb"``) the response body to ``part``; returns its bytes."""
    received = 0
    try:
        with open(part, mode) as out:
            while True:
                try:
                    chunk = response.read(CHUNK_SIZE)
                except (OSError, http.client.HTTPException) as exc:
                    raise _RetryableError(f"transfer interrupted: {exc!r}") from None
                if not chunk:
                    return received
                out.write(chunk)
                received += len(chunk)
                bar.update(len(chunk))
    except OSError as exc:  # only the local file can raise it here: reads are caught above
        raise MTError(
            f"cannot write {part}: {exc.strerror}; free disk space or choose another {names.dest}"
        ) from None


def fetch_file(
    url: str,
    target: Path,
    sha256: str | None,
    *,
    retries: int = 4,
    backoff: float = 0.5,
    progress: bool = True,
    names: SettingNames = CLI_NAMES,
) -> str:
    """Download ``url`` to ``target`` through ``target.part``; return the file's SHA-256.

    A ``.part`` left by an earlier run is resumed with an HTTP Range request, if the server's
    file is still the one it began (:func:`_transfer`). Network errors,
    5xx answers and cut-off transfers are retried after ``backoff * 2**k`` seconds; a try that
    made the ``.part`` longer does not count against ``retries``, so a long download over a flaky
    link keeps going. A wrong checksum deletes the download and raises :class:`MTError`; an
    unknown one (``sha256=None``) logs a warning with the actual hash. ``target`` appears only
    after the check, by an atomic rename. ``names`` says how the errors name the settings.
    """
    if retries < 1:
        raise ValueError(f"retries must be at least 1, got {retries}")
    part = target.with_name(target.name + ".part")
    # A fresh opener reads the proxy settings of the environment at each call.
    opener = urllib.request.build_opener()
    failures = 0
    while True:
        before = part.stat().st_size if part.exists() else 0
        try:
            _transfer(opener, url, part, progress, names, verified=sha256 is not None)
            break
        except _RetryableError as exc:
            reason = str(exc)
        after = part.stat().st_size if part.exists() else 0
        if after <= before:
            failures += 1
            if failures >= retries:
                raise MTError(
                    f"could not download {url} after {retries} failed tries: {reason}; "
                    f"check the network or {names.set_mirror()}"
                )
            time.sleep(backoff * 2 ** (failures - 1))

    actual = sha256_of(part)
    if sha256 is not None and actual != sha256:
        _discard(part)
        raise MTError(
            f"{target.name}: SHA-256 mismatch, expected {sha256}, got {actual}; the download was "
            f"deleted: run again, and if it persists check that {names.base_url} serves the "
            "original file"
        )
    if sha256 is None:
        _warn_unverified(target.name, actual)
    os.replace(part, target)
    _validator_file(part).unlink(missing_ok=True)
    return actual


def _warn_unverified(name: str, actual: str) -> None:
    log.warning(
        f"warning: {name} is UNVERIFIED (the registry has no SHA-256 for it); its SHA-256 is "
        f"{actual}: compare it with a trusted source before relying on it"
    )


# --- unpacking ------------------------------------------------------------------------------------


def _unsafe(archive: Path, member: str, why: str) -> MTError:
    return MTError(
        f"refusing to unpack {archive.name}: member {member!r} {why}; nothing was extracted, "
        "get the archive from a trusted source"
    )


def _check_member_path(archive: Path, name: str, dest: Path) -> None:
    """Refuse an archive member name that is absolute, climbs with '..', or lands outside dest."""
    posix = PurePosixPath(name.replace("\\", "/"))
    if posix.is_absolute() or (len(name) > 1 and name[1] == ":"):
        raise _unsafe(archive, name, "has an absolute path")
    if ".." in posix.parts:
        raise _unsafe(archive, name, "climbs out with '..'")
    # resolve() also follows symlinks already on disk, which could redirect a harmless name.
    if not (dest / posix).resolve().is_relative_to(dest):
        raise _unsafe(archive, name, f"resolves outside {dest}")


def _check_link_target(archive: Path, member: str, target: str, dest: Path) -> None:
    # A link target with '..' is refused even when it looks inside: chains of such links can climb
    # out in ways that a per-link check on the names alone does not see.
    posix = PurePosixPath(target.replace("\\", "/"))
    if posix.is_absolute() or ".." in posix.parts:
        raise _unsafe(archive, member, f"is a link to {target!r}, which may point outside {dest}")


def _gunzip(path: Path) -> Path:
    out = path.with_name(path.name.removesuffix(".gz"))
    try:
        # Atomic: the unpacked name never holds a half-written file.
        with gzip.open(path, "rb") as src, atomic_write(out, "wb") as dst:
            shutil.copyfileobj(src, dst, CHUNK_SIZE)
    except (OSError, EOFError, zlib.error) as exc:
        raise MTError(f"cannot gunzip {path}: {exc}; delete it and download again") from None
    return out


def _extract_tar(path: Path, dest: Path) -> list[Path]:
    try:
        with tarfile.open(path, "r:*") as tar:
            members = tar.getmembers()
            # Check every member before writing anything, so that a bad archive leaves no trace.
            for m in members:
                _check_member_path(path, m.name, dest)
                if m.issym() or m.islnk():
                    _check_link_target(path, m.name, m.linkname, dest)
                elif not (m.isfile() or m.isdir()):
                    raise _unsafe(path, m.name, "is a device or fifo")
            # The "data" filter (Python 3.11.4+) repeats these checks inside tarfile itself.
            extra: dict[str, Any] = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
            tar.extractall(dest, members=members, **extra)
    except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
        raise MTError(f"cannot extract {path}: {exc}; delete it and download again") from None
    return [dest / m.name for m in members if m.isfile()]


def _extract_zip(path: Path, dest: Path) -> list[Path]:
    try:
        with zipfile.ZipFile(path) as zf:
            infos = zf.infolist()
            for info in infos:
                _check_member_path(path, info.filename, dest)
                if stat.S_ISLNK(info.external_attr >> 16):
                    raise _unsafe(path, info.filename, "is a symlink")
            for info in infos:
                zf.extract(info, dest)
    except (zipfile.BadZipFile, OSError, EOFError, zlib.error) as exc:
        raise MTError(f"cannot extract {path}: {exc}; delete it and download again") from None
    return [dest / info.filename for info in infos if not info.is_dir()]


def unpack_file(path: Path, kind: str, dest: Path) -> list[Path]:
    """Make a downloaded file usable; return the usable files.

    ``kind`` is "gunzip" (writes ``path`` without ``.gz`` beside it), "tar" or "zip" (extract into
    ``dest``, refusing, before anything is written, any member that would escape it) or "none".
    """
    dest = dest.resolve()
    if kind == "none":
        return [path]
    if kind == "gunzip":
        return [_gunzip(path)]
    if kind == "tar":
        return _extract_tar(path, dest)
    if kind == "zip":
        return _extract_zip(path, dest)
    raise ValueError(f"unknown unpack kind {kind!r}")


# --- one file, once -------------------------------------------------------------------------------


def _marker_path(dest: Path, f: CorpusFile) -> Path:
    return dest / MARKER_DIR / f"{f.local_name}.json"


def _recorded_outputs(dest: Path, f: CorpusFile) -> list[Path] | None:
    """The outputs of an earlier complete run for ``f``, or None if anything changed since.

    Size and mtime stand in for re-hashing (cheap for a multi-GB archive); any edit to the file
    changes them, and then the hash is checked again.
    """
    try:
        record = json.loads(_marker_path(dest, f).read_text(encoding="utf-8"))
        st = (dest / f.local_name).stat()
    except (OSError, ValueError):
        return None
    if (
        record.get("size") != st.st_size
        or record.get("mtime_ns") != st.st_mtime_ns
        or record.get("unpack") != f.unpack
        or (f.sha256 is not None and record.get("sha256") != f.sha256)
    ):
        return None
    outputs = [dest / rel for rel in record.get("outputs", [])]
    return outputs if outputs and all(p.exists() for p in outputs) else None


def _write_marker(dest: Path, f: CorpusFile, url: str, sha256: str, outputs: list[Path]) -> None:
    st = (dest / f.local_name).stat()
    record = {
        "url": url,
        "sha256": sha256,
        "verified": f.verified,
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "unpack": f.unpack,
        "outputs": [str(p.relative_to(dest)) for p in outputs],
    }
    write_text_atomic(_marker_path(dest, f), json.dumps(record, indent=1) + "\n")


def ensure_file(
    f: CorpusFile,
    dest: Path,
    base_url: str,
    *,
    retries: int = 4,
    backoff: float = 0.5,
    progress: bool = True,
    names: SettingNames = CLI_NAMES,
) -> list[Path]:
    """Download, verify and unpack one corpus file into ``dest`` unless that is already done.

    Another process fetching the same file into ``dest`` is waited for (its ``.part`` is not
    ours to append to), and its result reused.
    """
    dest = dest.resolve()
    outputs = _recorded_outputs(dest, f)
    if outputs is not None:
        return outputs
    with exclusive_lock(lock_path(dest / f.local_name)):
        outputs = _recorded_outputs(dest, f)  # done by the process we waited for, if any
        if outputs is not None:
            return outputs
        return _fetch_and_unpack(
            f, dest, base_url, retries=retries, backoff=backoff, progress=progress, names=names
        )


def _fetch_and_unpack(
    f: CorpusFile,
    dest: Path,
    base_url: str,
    *,
    retries: int,
    backoff: float,
    progress: bool,
    names: SettingNames,
) -> list[Path]:
    """The body of :func:`ensure_file`, run under its lock."""
    target = dest / f.local_name
    url = f.url(base_url)
    actual: str | None = None
    if target.exists():
        # Present without a marker (an unpack was interrupted, or the file was edited or copied
        # in by hand): only its hash decides whether it can be used.
        actual = sha256_of(target)
        if f.sha256 is not None and actual != f.sha256:
            log.warning(
                f"{target.name}: the copy on disk does not match its SHA-256; downloading again"
            )
            target.unlink()
            actual = None
        elif f.sha256 is None:
            _warn_unverified(target.name, actual)
    if actual is None:
        actual = fetch_file(
            url, target, f.sha256, retries=retries, backoff=backoff, progress=progress, names=names
        )
    outputs = unpack_file(target, f.unpack, dest)
    _write_marker(dest, f, url, actual, outputs)
    return outputs


def download_corpus(
    corpus: str | Corpus,
    dest: Path,
    base_url: str | None = None,
    *,
    only: Sequence[str] | None = None,
    retries: int = 4,
    backoff: float = 0.5,
    progress: bool = True,
    names: SettingNames = CLI_NAMES,
) -> list[Path]:
    """Download a corpus into ``dest``; return its usable (unpacked) files.

    Download a corpus (a registry name or a :class:`Corpus`) into ``dest``; return its usable
    (unpacked) files.

    ``base_url`` replaces the registry's base (a mirror, or a loopback server in tests); ``only``
    keeps the files whose local name matches one of its glob patterns (``["train.*", "val.*"]``).
    Running it again when everything is present and unchanged downloads nothing. ``names``: how
    errors name the mirror and destination settings (:data:`CONFIG_NAMES` for a config's data).
    """
    corpus = get_corpus(corpus) if isinstance(corpus, str) else corpus
    base = base_url or corpus.base_url
    if urllib.parse.urlsplit(base).scheme not in ("http", "https"):
        raise MTError(
            f"{names.base_url} {base!r} is not an http(s) URL; give one, e.g. http://host:port/"
        )
    files = corpus.select(only)
    dest = Path(dest)
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise MTError(
            f"cannot create {names.dest} {dest}: {exc.strerror}; choose another one"
        ) from None
    outputs: list[Path] = []
    for f in files:
        outputs.extend(
            ensure_file(
                f, dest, base, retries=retries, backoff=backoff, progress=progress, names=names
            )
        )
    return outputs
