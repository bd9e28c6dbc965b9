"""The download path for real, against a loopback HTTP server.

The server supports ``Range: bytes=N-``, counts requests, and can be told to cut a transfer off
half-way, corrupt a file, ignore Range, or fail with 503. Tests that need the original Multi30k
files serve them from ../shared/data/multi30k (or $MT_SHARED_DATA) and skip when it is absent; the
rest build tiny files of their own and always run.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import http.server
import io
import logging
import os
import re
import sys
import tarfile
import threading
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from conftest import run_together, shared_multi30k

from transformer_mt.data.download import CLI_NAMES, CONFIG_NAMES, download_corpus
from transformer_mt.data.registry import Corpus, CorpusFile, Unpack, get_corpus, list_corpora
from transformer_mt.errors import MTError

M30K_RAW = "data/task1/raw"
VERIFIED = [f"{s}.{lang}.gz" for s in ("train", "val", "test_2016_flickr") for lang in ("de", "en")]
# fr and cs have checksums too; their files sit beside ../shared/data/multi30k, in multi30k-fr-cs.
VERIFIED_FR_CS = [
    f"{s}.{lang}.gz" for s in ("train", "val", "test_2016_flickr") for lang in ("fr", "cs")
]


SHARED = shared_multi30k()
needs_multi30k = pytest.mark.skipif(
    SHARED is None,
    reason="original Multi30k files absent (../shared/data/multi30k; set MT_SHARED_DATA)",
)


# --- a loopback server --------------------------------------------------------------------------


@dataclass
class ServerState:
    """What the server records, and how it misbehaves; keyed by URL path (``/data/x.gz``)."""

    requests: list[tuple[str, str | None]] = field(default_factory=list)  # (path, Range header)
    cut_once: set[str] = field(default_factory=set)  # send half the body, then hang up, once
    down: bool = False  # answer every request 503 (the server went away)
    down_after_cut: bool = False  # go down once a cut_once transfer is cut
    corrupt: set[str] = field(default_factory=set)  # flip one byte of the body, every time
    fail_first: dict[str, int] = field(default_factory=dict)  # answer 503 this many times
    honor_range: bool = True  # False: ignore Range and answer 200 with the whole file
    etag: bool = True  # send a strong ETag (honouring If-Range); False: no validator at all
    headers: list[dict[str, str]] = field(default_factory=list)  # each request's headers
    pause: float = 0.0  # seconds to wait after each 64 KiB of a body: a slow link


class _Server(http.server.ThreadingHTTPServer):
    state: ServerState


class _Handler(http.server.SimpleHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: object) -> None:  # keep pytest output clean
        pass

    def do_GET(self) -> None:
        state = self.server.state
        state.requests.append((self.path, self.headers.get("Range")))
        state.headers.append(dict(self.headers))
        if state.down:
            self.send_error(503, "down")
            return
        if state.fail_first.get(self.path, 0) > 0:
            state.fail_first[self.path] -= 1
            self.send_error(503, "busy, try later")
            return
        file = Path(self.translate_path(self.path))
        if not file.is_file():
            self.send_error(404, "no such file")
            return
        data = bytearray(file.read_bytes())
        if self.path in state.corrupt:
            data[len(data) // 2] ^= 0xFF
        start = 0
        etag = f'"{hashlib.sha256(data).hexdigest()[:16]}"'
        match = re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range") or "")
        if_range = self.headers.get("If-Range")
        if match and state.honor_range and (if_range is None or if_range == etag):
            start = int(match.group(1))
            if start >= len(data):
                self.send_error(416, "range not satisfiable")
                return
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        else:
            self.send_response(200)
        body = bytes(data[start:])
        self.send_header("Content-Length", str(len(body)))  # always the full promise
        if state.etag:
            self.send_header("ETag", etag)
        self.end_headers()
        if self.path in state.cut_once:
            state.cut_once.discard(self.path)
            body = body[: len(body) // 2]
            self.close_connection = True
            state.down = state.down_after_cut
        step = 1 << 16 if state.pause else max(len(body), 1)
        for start in range(0, len(body), step):
            self.wfile.write(body[start : start + step])
            self.wfile.flush()
            time.sleep(state.pause)


@dataclass
class Loopback:
    root: Path  # served directory
    url: str  # base URL, with a trailing slash
    state: ServerState

    def requests_for(self, name: str) -> list[str | None]:
        """The Range headers of the requests for a file whose URL path ends with ``name``."""
        return [rng for path, rng in self.state.requests if path.endswith("/" + name)]


@pytest.fixture
def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Loopback]:
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)  # 127.0.0.1 must not go through a proxy
    root = tmp_path / "www"
    root.mkdir()
    httpd = _Server(("127.0.0.1", 0), functools.partial(_Handler, directory=str(root)))
    httpd.state = ServerState()
    # A short poll interval keeps shutdown() (it waits for the next poll) from costing 0.5 s a test.
    thread = threading.Thread(target=httpd.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    yield Loopback(root, f"http://127.0.0.1:{httpd.server_address[1]}/", httpd.state)
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def m30k_server(server: Loopback) -> Loopback:
    """The server, with the original Multi30k files laid out under data/task1/raw/."""
    assert SHARED is not None
    raw = server.root / M30K_RAW
    raw.mkdir(parents=True)
    for gz in SHARED.glob("*.gz"):
        (raw / gz.name).symlink_to(gz)
    return server


def _sums() -> dict[str, str]:
    assert SHARED is not None
    if not (SHARED / "SHA256SUMS").is_file():  # $MT_SHARED_DATA may name an `mt download` copy
        pytest.skip(f"{SHARED} has no SHA256SUMS to check the downloads against")
    lines = (SHARED / "SHA256SUMS").read_text().split("\n")
    return {name: digest for digest, name in (line.split() for line in lines if line.strip())}


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _no_leftovers(dest: Path) -> list[str]:
    suffixes = (".part", ".tmp", ".validator")
    return sorted(p.name for p in dest.rglob("*") if p.name.endswith(suffixes))


# --- Multi30k from the loopback server ----------------------------------------------------------


@needs_multi30k
def test_multi30k_checksums_pass_unpack_and_second_run_fetches_nothing(
    m30k_server: Loopback, tmp_path: Path
) -> None:
    dest = tmp_path / "dest"
    out = download_corpus("multi30k", dest, m30k_server.url, only=VERIFIED, progress=False)
    assert sorted(p.name for p in out) == sorted(n.removesuffix(".gz") for n in VERIFIED)
    assert SHARED is not None
    for name, digest in _sums().items():
        assert _sha(dest / name) == digest
        assert (dest / name.removesuffix(".gz")).read_bytes() == gzip.decompress(
            (SHARED / name).read_bytes()
        )
    assert len((dest / "train.de").read_text(encoding="utf-8").splitlines()) == 29_000
    assert _no_leftovers(dest) == []
    assert len(m30k_server.state.requests) == len(VERIFIED)

    m30k_server.state.requests.clear()
    again = download_corpus("multi30k", dest, m30k_server.url, only=VERIFIED, progress=False)
    assert again == out
    assert m30k_server.state.requests == []  # idempotent: not a single request


@needs_multi30k
def test_cut_off_transfer_resumes_with_range(m30k_server: Loopback, tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    m30k_server.state.cut_once.add(f"/{M30K_RAW}/train.de.gz")
    download_corpus(
        "multi30k", dest, m30k_server.url, only=["train.de.gz"], backoff=0, progress=False
    )
    assert SHARED is not None
    half = (SHARED / "train.de.gz").stat().st_size // 2
    # First the whole file (cut at half), then exactly the missing rest.
    assert m30k_server.requests_for("train.de.gz") == [None, f"bytes={half}-"]
    assert _sha(dest / "train.de.gz") == _sums()["train.de.gz"]
    assert _no_leftovers(dest) == []


@needs_multi30k
def test_part_left_by_an_earlier_run_is_resumed(m30k_server: Loopback, tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    dest.mkdir()
    assert SHARED is not None
    (dest / "val.en.gz.part").write_bytes((SHARED / "val.en.gz").read_bytes()[:1000])
    download_corpus("multi30k", dest, m30k_server.url, only=["val.en.gz"], progress=False)
    assert m30k_server.requests_for("val.en.gz") == ["bytes=1000-"]
    assert _sha(dest / "val.en.gz") == _sums()["val.en.gz"]


@needs_multi30k
def test_corrupted_multi30k_file_is_rejected_and_removed(
    m30k_server: Loopback, tmp_path: Path
) -> None:
    dest = tmp_path / "dest"
    m30k_server.state.corrupt.add(f"/{M30K_RAW}/val.de.gz")
    with pytest.raises(MTError, match=r"val\.de\.gz: SHA-256 mismatch, expected [0-9a-f]{64}"):
        download_corpus("multi30k", dest, m30k_server.url, only=["val.*"], progress=False)
    assert not (dest / "val.de.gz").exists()
    assert not (dest / "val.de").exists()
    assert _no_leftovers(dest) == []


@needs_multi30k
def test_unverified_file_that_is_missing_gives_a_clear_404(
    m30k_server: Loopback, tmp_path: Path
) -> None:
    # The loopback server only has de and en; test_2017_flickr.fr is unverified and absent here.
    with pytest.raises(MTError, match=r"test_2017_flickr\.fr\.gz answered HTTP 404.*--base-url"):
        download_corpus(
            "multi30k", tmp_path / "d", m30k_server.url, only=["test_2017_flickr.fr.gz"]
        )
    assert len(m30k_server.state.requests) == 1  # a 404 is not retried


# --- tiny synthetic corpora (never skipped) -----------------------------------------------------


def _serve(server: Loopback, name: str, data: bytes) -> None:
    (server.root / name).write_bytes(data)


def _corpus(name: str, sha256: str | None, unpack: Unpack) -> Corpus:
    """A one-file corpus that exists only in this test (its base URL is always overridden)."""
    files = (CorpusFile(path=name, sha256=sha256, unpack=unpack, local_name=name),)
    return Corpus("tiny", "a test corpus", "http://unused.invalid/", files)


def test_corrupted_file_is_rejected_and_removed(server: Loopback, tmp_path: Path) -> None:
    good = gzip.compress(b"hallo welt\n")
    bad = good[:-1] + bytes([good[-1] ^ 0xFF])  # one byte off
    _serve(server, "tiny.txt.gz", bad)
    corpus = _corpus("tiny.txt.gz", hashlib.sha256(good).hexdigest(), "gunzip")
    with pytest.raises(MTError) as info:
        download_corpus(corpus, tmp_path / "d", server.url, progress=False)
    message = str(info.value)
    assert "tiny.txt.gz" in message
    assert hashlib.sha256(good).hexdigest() in message
    assert hashlib.sha256(bad).hexdigest() in message
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == []  # no file, no .part


def test_edited_file_is_checked_again_and_fetched_anew(server: Loopback, tmp_path: Path) -> None:
    data = b"line\n" * 1000
    _serve(server, "f.txt", data)
    corpus = _corpus("f.txt", hashlib.sha256(data).hexdigest(), "none")
    dest = tmp_path / "d"
    download_corpus(corpus, dest, server.url, progress=False)
    (dest / "f.txt").write_bytes(b"tampered\n")  # the marker no longer matches size and mtime
    download_corpus(corpus, dest, server.url, progress=False)
    assert len(server.requests_for("f.txt")) == 2
    assert (dest / "f.txt").read_bytes() == data


def test_unverified_file_warns_and_logs_its_hash(
    server: Loopback, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = gzip.compress(b"a\nb\n")
    _serve(server, "u.gz", data)
    out = download_corpus(_corpus("u.gz", None, "gunzip"), tmp_path / "d", server.url)
    assert out == [(tmp_path / "d" / "u").resolve()]
    (warning,) = [r for r in caplog.records if r.name == "transformer_mt.data.download"]
    assert warning.levelno == logging.WARNING
    assert "UNVERIFIED" in warning.getMessage()
    assert hashlib.sha256(data).hexdigest() in warning.getMessage()


def test_server_ignoring_range_restarts_from_zero(server: Loopback, tmp_path: Path) -> None:
    data = os.urandom(50_000)
    _serve(server, "blob.bin", data)
    server.state.honor_range = False
    server.state.cut_once.add("/blob.bin")
    corpus = _corpus("blob.bin", hashlib.sha256(data).hexdigest(), "none")
    download_corpus(corpus, tmp_path / "d", server.url, backoff=0, progress=False)
    assert server.requests_for("blob.bin") == [None, "bytes=25000-"]  # asked, got a 200 instead
    assert (tmp_path / "d" / "blob.bin").read_bytes() == data


@pytest.mark.parametrize("verified", [True, False])
def test_a_part_of_a_file_changed_on_the_server_is_not_spliced(
    server: Loopback, tmp_path: Path, verified: bool
) -> None:
    """A .part of version 1, then the server publishes version 2: the resumed request names
    version 1 (If-Range), so the server sends version 2 whole instead of its tail."""
    v1, v2 = os.urandom(40_000), os.urandom(40_000)
    _serve(server, "blob.bin", v1)
    server.state.cut_once.add("/blob.bin")
    server.state.down_after_cut = True
    corpus = _corpus("blob.bin", None, "none")
    with pytest.raises(MTError, match="could not download"):  # cut, then the server went away
        download_corpus(corpus, tmp_path / "d", server.url, retries=1, backoff=0, progress=False)
    assert (tmp_path / "d" / "blob.bin.part").read_bytes() == v1[:20_000]
    server.state.down = False
    server.state.requests.clear()
    _serve(server, "blob.bin", v2)
    corpus = _corpus("blob.bin", hashlib.sha256(v2).hexdigest() if verified else None, "none")
    download_corpus(corpus, tmp_path / "d", server.url, progress=False)
    assert (tmp_path / "d" / "blob.bin").read_bytes() == v2
    assert server.requests_for("blob.bin") == ["bytes=20000-"]  # answered 200: all of v2
    assert server.state.headers[-1]["If-Range"] == f'"{hashlib.sha256(v1).hexdigest()[:16]}"'
    assert _no_leftovers(tmp_path / "d") == []


def test_a_part_without_validator_resumes_only_when_a_checksum_will_check_it(
    server: Loopback, tmp_path: Path
) -> None:
    data = os.urandom(30_000)
    _serve(server, "blob.bin", data)
    server.state.etag = False  # nothing to tell a changed file by
    for verified, asked in ((True, "bytes=1000-"), (False, None)):
        dest = tmp_path / str(verified)
        dest.mkdir()
        (dest / "blob.bin.part").write_bytes(data[:1000])
        sha = hashlib.sha256(data).hexdigest() if verified else None
        download_corpus(_corpus("blob.bin", sha, "none"), dest, server.url, progress=False)
        assert server.requests_for("blob.bin")[-1] == asked
        assert (dest / "blob.bin").read_bytes() == data


_FETCH_WHEN_TOLD = """
import hashlib, sys
from pathlib import Path
from transformer_mt.data.download import download_corpus
from transformer_mt.data.registry import Corpus, CorpusFile

url, dest, sha256 = sys.argv[1:]
files = (CorpusFile(path="blob.bin", sha256=sha256, unpack="none", local_name="blob.bin"),)
corpus = Corpus("tiny", "a test corpus", "http://unused.invalid/", files)
print("ready", flush=True)
sys.stdin.readline()
(out,) = download_corpus(corpus, Path(dest), url, progress=False)
print(hashlib.sha256(out.read_bytes()).hexdigest(), flush=True)
"""


def test_two_processes_fetching_one_file_at_once_both_get_it(
    server: Loopback, tmp_path: Path
) -> None:
    """Two runs started together on a fresh machine download into one directory: one fetches the
    file, under a lock beside it; the other waits, then finds it done (no two writers appending
    to one .part, no rename of a .part the other one already moved)."""
    data = os.urandom(1 << 20)
    _serve(server, "blob.bin", data)
    server.state.pause = 0.03  # about half a second a transfer: the two overlap
    sha = hashlib.sha256(data).hexdigest()
    dest = tmp_path / "d"
    args = [sys.executable, "-c", _FETCH_WHEN_TOLD, server.url, str(dest), sha]
    results = run_together([args, args], timeout=120)
    assert results == [(0, sha + "\n"), (0, sha + "\n")], results
    assert (dest / "blob.bin").read_bytes() == data
    assert server.requests_for("blob.bin") == [None]  # fetched once
    assert sorted(p.name for p in dest.iterdir()) == [".mt-download", "blob.bin"]


def test_5xx_is_retried_then_gives_up_with_a_clear_error(server: Loopback, tmp_path: Path) -> None:
    data = b"x" * 100
    _serve(server, "f.txt", data)
    corpus = _corpus("f.txt", hashlib.sha256(data).hexdigest(), "none")
    server.state.fail_first["/f.txt"] = 2
    download_corpus(corpus, tmp_path / "a", server.url, retries=3, backoff=0, progress=False)
    assert len(server.requests_for("f.txt")) == 3

    server.state.fail_first["/f.txt"] = 5
    with pytest.raises(MTError, match=r"after 2 failed tries: HTTP 503.*--base-url"):
        download_corpus(corpus, tmp_path / "b", server.url, retries=2, backoff=0, progress=False)


def test_unreachable_server_is_a_clear_error(tmp_path: Path) -> None:
    corpus = _corpus("f.txt", None, "none")
    with pytest.raises(MTError, match=r"could not download http://127\.0\.0\.1:1/f\.txt after 2"):
        download_corpus(corpus, tmp_path, "http://127.0.0.1:1/", retries=2, backoff=0)


def _tar_gz(members: list[tarfile.TarInfo], payload: bytes = b"evil\n") -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for info in members:
            if info.isfile():
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
            else:
                tar.addfile(info)
    return buf.getvalue()


def _member(name: str, kind: bytes = tarfile.REGTYPE, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, linkname
    return info


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        (_member("../evil.txt"), "'..'"),
        (_member("sub/../../evil.txt"), "'..'"),
        (_member("/tmp/mt-test-evil.txt"), "absolute"),
        (_member("link", tarfile.SYMTYPE, "../evil.txt"), "link to"),
        (_member("link", tarfile.SYMTYPE, "/etc/passwd"), "link to"),
        (_member("hard", tarfile.LNKTYPE, "../evil.txt"), "link to"),
    ],
)
def test_tar_member_escaping_dest_is_refused(
    server: Loopback, tmp_path: Path, bad: tarfile.TarInfo, why: str
) -> None:
    archive = _tar_gz([_member("good.txt"), bad])
    _serve(server, "c.tgz", archive)
    dest = tmp_path / "out" / "dest"
    corpus = _corpus("c.tgz", hashlib.sha256(archive).hexdigest(), "tar")
    with pytest.raises(MTError, match=rf"member {re.escape(repr(bad.name))} .*{re.escape(why)}"):
        download_corpus(corpus, dest, server.url, progress=False)
    assert not (tmp_path / "out" / "evil.txt").exists()
    assert not Path("/tmp/mt-test-evil.txt").exists()
    assert not (dest / "good.txt").exists()  # every member is checked before any is written


def test_zip_member_escaping_dest_is_refused(server: Loopback, tmp_path: Path) -> None:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("ok.txt", "fine\n")
        zf.writestr("../evil.txt", "evil\n")
    _serve(server, "c.zip", buf.getvalue())
    dest = tmp_path / "out" / "dest"
    with pytest.raises(MTError, match=r"member '\.\./evil\.txt'"):
        download_corpus(_corpus("c.zip", None, "zip"), dest, server.url, progress=False)
    assert not (tmp_path / "out" / "evil.txt").exists()


def test_archives_unpack_and_second_run_fetches_nothing(server: Loopback, tmp_path: Path) -> None:
    archive = _tar_gz([_member("de-en/train.de"), _member("de-en/train.en")])
    _serve(server, "c.tgz", archive)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("de-en/train.tags.de-en.de", "hallo\n")
    _serve(server, "c.zip", buf.getvalue())
    dest = tmp_path / "d"
    out_tar = download_corpus(_corpus("c.tgz", None, "tar"), dest, server.url, progress=False)
    out_zip = download_corpus(_corpus("c.zip", None, "zip"), dest, server.url, progress=False)
    root = dest.resolve()
    assert out_tar == [root / "de-en/train.de", root / "de-en/train.en"]
    assert out_zip == [root / "de-en/train.tags.de-en.de"]
    assert (root / "de-en/train.en").read_bytes() == b"evil\n"

    server.state.requests.clear()
    assert download_corpus(_corpus("c.tgz", None, "tar"), dest, server.url) == out_tar
    assert server.state.requests == []


# --- the registry -------------------------------------------------------------------------------


def test_registry_lists_multi30k_files_and_checksums() -> None:
    m30k = get_corpus("multi30k")
    assert m30k.base_url == "https://github.com/multi30k/dataset/raw/master/"
    assert len(m30k.files) == 22
    assert all(f.path == f"{M30K_RAW}/{f.local_name}" for f in m30k.files)
    assert sorted(f.local_name for f in m30k.files if f.verified) == sorted(
        VERIFIED + VERIFIED_FR_CS
    )
    known = {f.local_name: f.sha256 for f in m30k.files if f.verified}
    for folder, names in (
        (SHARED, VERIFIED),
        (SHARED and SHARED.parent / "multi30k-fr-cs", VERIFIED_FR_CS),
    ):
        sums = folder / "SHA256SUMS" if folder is not None else None
        if sums is not None and sums.is_file():  # the copies the checksums were taken from
            lines = [line.split() for line in sums.read_text().splitlines() if line.strip()]
            assert {name: known[name] for name in names} == {n: d for d, n in lines}


def test_multi30k_split_map_lives_with_its_registry_entry() -> None:
    m30k = get_corpus("multi30k")
    assert dict(m30k.splits) == {"train": "train", "valid": "val", "test": "test_2016_flickr"}
    assert m30k.languages() == ["cs", "de", "en", "fr"]  # the ones with all three splits
    valid_de = m30k.split_file("valid", "de")
    assert (valid_de.local_name, valid_de.unpacked_name) == ("val.de.gz", "val.de")
    # Every listed corpus can be trained, alone or as the archives of a standard task:
    # `mt download` fetches nothing `mt train` cannot read.
    from transformer_mt.data.tasks import TASKS

    in_tasks = {
        str(spec["archive"]).split("/")[0]
        for task in TASKS.values()
        for specs in task.splits.values()
        for spec in specs
        if "archive" in spec
    }
    assert all(c.trainable or c.name in in_tasks for c in list_corpora())
    assert in_tasks <= {c.name for c in list_corpora()}


def test_a_corpus_split_map_is_checked_when_the_registry_is_built() -> None:
    files = (CorpusFile("a.zip", None, "zip", "a.zip"), CorpusFile("b.de", None, "none", "b.de"))
    with pytest.raises(ValueError, match="splits must name"):
        Corpus("x", "x", "http://x/", files, splits={"train": "a"})
    with pytest.raises(ValueError, match="the train split cannot be an archive"):
        Corpus(
            "x",
            "x",
            "http://x/",
            files,
            {"train": "a", "valid": "a", "test": "a"},
            "{split}.{lang}",
        )
    untrainable = Corpus("x", "x", "http://x/", files)
    assert not untrainable.trainable and untrainable.languages() == []


def test_unknown_corpus_and_bad_filter_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(MTError, match=r"unknown corpus 'wmt99'; known corpora: .*multi30k"):
        get_corpus("wmt99")
    with pytest.raises(MTError, match=r"--only 'train\.xx\.gz' matches no file"):
        download_corpus("multi30k", tmp_path, "http://127.0.0.1:1/", only=["train.xx.gz"])
    with pytest.raises(MTError, match=r"not an http\(s\) URL"):
        download_corpus("multi30k", tmp_path, "ftp://mirror/")


# --- the `mt download` command --------------------------------------------------------------------


@needs_multi30k
def test_mt_download_command_fetches_and_verifies(m30k_server: Loopback, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from transformer_mt.cli import app

    runner = CliRunner()
    dest = tmp_path / "m30k"
    args = ["download", "multi30k", "--base-url", m30k_server.url, "--dest", str(dest)]
    only = [x for name in VERIFIED for x in ("--only", name)]
    result = runner.invoke(app, [*args, *only])
    assert result.exit_code == 0, result.output
    printed = sorted(Path(line).name for line in result.stdout.split())
    assert printed == sorted(n.removesuffix(".gz") for n in VERIFIED)
    assert all(_sha(dest / name) == digest for name, digest in _sums().items())

    listed = runner.invoke(app, ["download", "--list"])
    assert listed.exit_code == 0 and "multi30k" in listed.stdout
    bad = runner.invoke(app, ["download", "nope"])
    assert bad.exit_code == 1 and "unknown corpus" in bad.stderr


# --- messages name the setting the user has: --base-url for `mt download`, the config key else ----

_ADVICE = [
    (CLI_NAMES, "pass --base-url a mirror", "--dest"),
    (CONFIG_NAMES, "set data.base_url to a mirror", "data.download_dir"),
]


@pytest.mark.parametrize(("names", "advice", "dest_name"), _ADVICE)
def test_download_errors_advise_the_setting_the_command_has(
    server: Loopback, tmp_path: Path, names, advice, dest_name
) -> None:
    other = "--base-url" if names is CONFIG_NAMES else "data.base_url"
    missing = _corpus("absent.gz", None, "gunzip")
    with pytest.raises(MTError) as err:  # 404
        download_corpus(missing, tmp_path / "d", server.url, progress=False, names=names)
    assert advice in str(err.value) and other not in str(err.value)

    good = b"hallo\n"
    _serve(server, "f.txt", b"other\n")
    wrong = _corpus("f.txt", hashlib.sha256(good).hexdigest(), "none")
    with pytest.raises(MTError) as err:  # checksum mismatch
        download_corpus(wrong, tmp_path / "d", server.url, progress=False, names=names)
    assert names.base_url in str(err.value) and other not in str(err.value)

    closed = "http://127.0.0.1:9/"  # the discard port: nothing listens there
    with pytest.raises(MTError) as err:  # retries exhausted
        download_corpus(missing, tmp_path / "d", closed, progress=False, names=names, backoff=0)
    assert advice in str(err.value) and other not in str(err.value)

    (tmp_path / "file").write_text("x")
    with pytest.raises(MTError) as err:  # a destination that cannot be created
        download_corpus(missing, tmp_path / "file" / "d", server.url, names=names)
    assert f"cannot create {dest_name} " in str(err.value)
