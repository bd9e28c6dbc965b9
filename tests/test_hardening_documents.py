"""Documents read as an attacker would send them: every input's cost bounded while it is read.

Each case builds its adversarial input itself (small on disk: a few KB that claim gigabytes) and
checks the one-line error or the correct output, and bounded memory where the case is about
memory (the peak RSS of a subprocess that reads the file, as `mt translate` reads it). The server's
cases run a real uvicorn on 127.0.0.1 with the test suite's upper-casing engine: a document or an
HTML body is parsed in a parsing process, never on the event loop, and a request past its bounds
gets a 413 (or 400) of one line while other clients are answered at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import io
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
import types
import zipfile
from pathlib import Path

import pytest

from transformer_mt.documents.document import (
    html_document,
    read_document,
)
from transformer_mt.documents.html import HtmlPage
from transformer_mt.documents.limits import Budget, DocumentLimits, DocumentTooLarge
from transformer_mt.engines.results import LineResult
from transformer_mt.errors import MTError

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "old_checkpoint"
UNBOUNDED = DocumentLimits(max_depth=10**9, max_elements=10**9, max_segments=10**9)


def upper(document) -> list[LineResult]:
    """Each segment in capitals, without attention (markup placed in proportion)."""
    return [LineResult(line.upper(), 0.0, [(line.upper(), 0.0)]) for line in document.segments]


def one_line(text: str) -> str:
    assert text and "\n" not in text.strip(), text
    return text


# --- adversarial files, written by the tests (streamed: never whole in memory) ----------------


def _rewrite(template: bytes, member: str, marker: bytes, filler: bytes, count: int) -> bytes:
    """``template`` (a zip) with ``count`` copies of ``filler`` after ``marker`` in ``member``."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(template)) as source, zipfile.ZipFile(out, "w") as target:
        for info in source.infolist():
            data = source.read(info)
            if info.filename != member:
                target.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED)
                continue
            at = data.index(marker) + len(marker)
            streamed = zipfile.ZipInfo(member)
            streamed.compress_type = zipfile.ZIP_DEFLATED
            with target.open(streamed, "w") as f:
                f.write(data[:at])
                block = filler * 100_000
                for _ in range(count // 100_000):
                    f.write(block)
                f.write(filler * (count % 100_000))
                f.write(data[at:])
    return out.getvalue()


def docx_bomb(paragraphs: int, filler: bytes = b"<w:p/>") -> bytes:
    docx = pytest.importorskip("docx")
    template = io.BytesIO()
    docx.Document().save(template)
    return _rewrite(template.getvalue(), "word/document.xml", b"<w:body>", filler, paragraphs)


def pptx_bomb(paragraphs: int) -> bytes:
    pptx = pytest.importorskip("pptx")
    from pptx.util import Inches

    presentation = pptx.Presentation()
    slide = presentation.slides.add_slide(presentation.slide_layouts[6])  # blank
    slide.shapes.add_textbox(Inches(1), Inches(1), Inches(4), Inches(1)).text_frame.text = "x"
    template = io.BytesIO()
    presentation.save(template)
    member = "ppt/slides/slide1.xml"
    return _rewrite(template.getvalue(), member, b"<a:lstStyle/>", b"<a:p/>", paragraphs)


def odt_bomb(paragraphs: int) -> bytes:
    pytest.importorskip("odf")
    from odf.opendocument import OpenDocumentText
    from odf.text import P

    document = OpenDocumentText()
    document.text.addElement(P(text="x"))
    template = io.BytesIO()
    document.save(template)
    return _rewrite(template.getvalue(), "content.xml", b"<office:text>", b"<text:p/>", paragraphs)


CONTAINER = (
    '<?xml version="1.0"?><container version="1.0" xmlns="urn:oasis:names:tc:opendocument:xmlns:'
    'container"><rootfiles><rootfile full-path="OEBPS/content.opf" media-type="application/'
    'oebps-package+xml"/></rootfiles></container>'
)
PACKAGE = (
    '<?xml version="1.0"?><package xmlns="http://www.idpf.org/2007/opf" version="3.0"><manifest>'
    '<item id="c1" href="ch1.xhtml" media-type="application/xhtml+xml"/></manifest>'
    '<spine><itemref idref="c1"/></spine></package>'
)


def epub(chapter: str, extra: dict[str, str] | None = None) -> bytes:
    data = io.BytesIO()
    with zipfile.ZipFile(data, "w", zipfile.ZIP_DEFLATED) as book:
        book.writestr(zipfile.ZipInfo("mimetype"), "application/epub+zip")
        book.writestr("META-INF/container.xml", CONTAINER)
        book.writestr("OEBPS/content.opf", PACKAGE)
        book.writestr("OEBPS/ch1.xhtml", chapter)
        for name, text in (extra or {}).items():
            book.writestr(name, text)
    return data.getvalue()


def epub_bomb(paragraphs: int) -> bytes:
    template = epub("<html><body>MARK</body></html>")
    return _rewrite(template, "OEBPS/ch1.xhtml", b"<body>", b"<p>x</p>", paragraphs)


def encrypt_flag(data: bytes, member: str) -> bytes:
    """``data`` (a zip) with ``member`` marked encrypted, as a password-protected zip marks it."""
    out = bytearray(data)
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        info = archive.getinfo(member)
    out[info.header_offset + 6] |= 0x1  # the local header's flag bits
    central = out.find(b"PK\x01\x02")
    while central >= 0:  # the central directory's entry for the member
        name_length = int.from_bytes(out[central + 28 : central + 30], "little")
        if out[central + 46 : central + 46 + name_length] == member.encode():
            out[central + 8] |= 0x1
        central = out.find(b"PK\x01\x02", central + 1)
    return bytes(out)


# VmHWM, the peak of this process's own memory (ru_maxrss keeps a forking parent's across exec)
READER = """
import sys
from transformer_mt.documents.document import read_document_file
from transformer_mt.errors import MTError
try:
    print("segments", len(read_document_file(sys.argv[1]).segments))
except MTError as err:
    print("error:", err)
status = open("/proc/self/status").read().split("VmHWM:")[1]
print(int(status.split()[0]) // 1024)
"""


def read_in_subprocess(path: Path) -> tuple[str, int]:
    """What reading ``path`` as `mt translate -i` reads it says, and its peak RSS in MB."""
    done = subprocess.run(
        [sys.executable, "-c", READER, str(path)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    said, peak = done.stdout.strip().splitlines()
    return said, int(peak)


# --- 1. zip-based documents: memory out of all proportion to the input ------------------------


@pytest.mark.parametrize(
    "suffix, make, paragraphs",
    [
        (".docx", docx_bomb, 10_000_000),
        (".pptx", pptx_bomb, 10_000_000),
        (".odt", odt_bomb, 5_000_000),
        (".epub", epub_bomb, 5_000_000),
    ],
)
def test_a_document_bomb_is_refused_while_read_in_bounded_memory(
    tmp_path, suffix, make, paragraphs
):
    # The issue's inputs: a 128 KB .docx of 10M empty paragraphs (4 GB), an 83 KB .odt (4 GB),
    # a 62 KB .epub (2.7 GB); a .pptx slide of 10M empty paragraphs in 116 KB.
    path = tmp_path / f"bomb{suffix}"
    path.write_bytes(make(paragraphs))
    assert path.stat().st_size < 200_000
    said, peak = read_in_subprocess(path)
    assert said.startswith(f"error: {path}: more than ") and one_line(said)
    bound = "MT_DOC_MAX_SEGMENTS" if suffix == ".epub" else "MT_DOC_MAX_ELEMENTS"
    assert f"{bound}=" in said and f"set {bound} higher" in said
    assert peak < 300, f"{peak} MB peak reading a {path.stat().st_size} byte file"


def test_mt_translate_refuses_a_docx_bomb_with_one_line(tmp_path):
    from typer.testing import CliRunner

    from transformer_mt.cli import app

    path = tmp_path / "bomb.docx"
    path.write_bytes(docx_bomb(1_000_000))
    ckpt = FIXTURE / "old_last.pt"
    result = CliRunner().invoke(
        app, ["translate", "-c", str(ckpt), "-i", str(path), "-o", str(tmp_path / "out.docx")]
    )
    assert result.exit_code == 1
    assert result.output.strip().splitlines()[-1].startswith(f"error: {path}: more than 250,000")
    assert "MT_DOC_MAX_ELEMENTS" in result.output and not (tmp_path / "out.docx").exists()


def test_the_environment_raises_a_bound_and_a_bad_value_is_one_line(monkeypatch):
    data = docx_bomb(300)
    small = DocumentLimits(max_elements=100)
    with pytest.raises(DocumentTooLarge, match=r"more than 100 XML elements \(MT_DOC_MAX_ELEMENTS"):
        read_document(data, ".docx", "a.docx", small)
    monkeypatch.setenv("MT_DOC_MAX_ELEMENTS", "100")
    with pytest.raises(DocumentTooLarge, match="MT_DOC_MAX_ELEMENTS=100;"):
        read_document(data, ".docx", "a.docx")
    monkeypatch.setenv("MT_DOC_MAX_ELEMENTS", "100_000")
    assert read_document(data, ".docx", "a.docx").segments == []
    monkeypatch.setenv("MT_DOC_MAX_ELEMENTS", "lots")
    with pytest.raises(
        MTError, match=r"^MT_DOC_MAX_ELEMENTS is 'lots'; it must be a whole number$"
    ):
        read_document(data, ".docx", "a.docx")


def test_mt_serve_refuses_a_bad_document_bound_before_it_binds_the_port(monkeypatch):
    pytest.importorskip("fastapi", reason="the serve extra is not installed")
    from typer.testing import CliRunner

    from transformer_mt.cli import app
    from transformer_mt.serve import launch

    bound: list[object] = []
    monkeypatch.setattr(launch, "bind_sockets", lambda *args: bound.append(args) or [])
    monkeypatch.setenv("MT_DOC_MAX_BYTES", "0")
    fixture = Path(__file__).resolve().parent / "fixtures" / "old_checkpoint" / "old_last.pt"
    result = CliRunner().invoke(app, ["serve", "-c", str(fixture)])
    assert result.exit_code == 1 and not bound
    assert result.output == "error: MT_DOC_MAX_BYTES is 0; it must be a whole number, at least 1\n"


def test_zip_members_and_declared_sizes_are_checked_before_extracting():
    data = io.BytesIO()
    with zipfile.ZipFile(data, "w", zipfile.ZIP_DEFLATED) as archive:
        for i in range(50):
            archive.writestr(f"m{i}.xml", "<a/>")
        archive.writestr("zeros.bin", b"\0" * (2 << 20))  # 2 MiB in about 2 KB
    bounds = DocumentLimits(max_members=10)
    with pytest.raises(DocumentTooLarge, match=r"^a.docx: more than 10 zip members \(MT_DOC_MAX_M"):
        read_document(data.getvalue(), ".docx", "a.docx", bounds)
    bounds = DocumentLimits(max_bytes=1 << 20)
    with pytest.raises(DocumentTooLarge, match=r"more than 1,048,576 bytes of contents"):
        read_document(data.getvalue(), ".epub", "a.epub", bounds)


def test_a_member_larger_than_its_declared_size_is_never_decompressed_past_it():
    data = bytearray(epub_bomb(1_000_000))  # the chapter: 8 MB of <p>x</p>
    with zipfile.ZipFile(io.BytesIO(bytes(data))) as archive:
        info = archive.getinfo("OEBPS/ch1.xhtml")
    lie = (1000).to_bytes(4, "little")
    central = bytes(data).rfind(b"OEBPS/ch1.xhtml") - 46  # its central directory entry
    data[central + 24 : central + 28] = lie  # declares 1000 bytes
    data[info.header_offset + 22 : info.header_offset + 26] = lie
    with pytest.raises(MTError, match=r"^b.epub: not a readable epub \(Bad CRC-32"):
        read_document(bytes(data), ".epub", "b.epub")


def test_xml_entities_and_deep_xml_in_an_office_file_are_refused():
    laughs = b'<!DOCTYPE d [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;&a;&a;">]>'
    docx = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(docx_bomb(1))) as source, zipfile.ZipFile(docx, "w") as out:
        for info in source.infolist():
            data = source.read(info)
            if info.filename == "word/document.xml":
                data = data.replace(b"?>", b"?>" + laughs, 1)
            out.writestr(info, data)
    with pytest.raises(MTError, match=r"word/document\.xml declares the XML entity 'a'; refused$"):
        read_document(docx.getvalue(), ".docx", "c.docx")
    deep = docx_bomb(1, b"<w:p>" * 300 + b"</w:p>" * 300)
    with pytest.raises(DocumentTooLarge, match=r"more than 256 XML elements in word/document\.xml"):
        read_document(deep, ".docx", "c.docx")


def test_a_text_file_of_empty_lines_is_refused_before_it_is_split():
    with pytest.raises(DocumentTooLarge, match=r"^t.txt: more than 250,000 lines \(MT_DOC"):
        read_document(b"\r" * 1_000_000, ".txt", "t.txt")
    assert read_document(b"a\n\nb\r\nc", ".txt", "t.txt").segments == ["a", "b", "c"]


# --- 2. epubs: encryption, DRM, and their DOCTYPE ----------------------------------------------


def test_an_encrypted_epub_is_one_line_not_a_crash():
    book = encrypt_flag(epub("<html><body><p>Hello</p></body></html>"), "OEBPS/ch1.xhtml")
    with pytest.raises(MTError, match=r"^e.epub: OEBPS/ch1.xhtml is encrypted \(a password-"):
        read_document(book, ".epub", "e.epub")
    drm = epub(
        "<html><body><p>Hello</p></body></html>",
        {
            "META-INF/encryption.xml": '<encryption xmlns="urn:oasis:names:tc:opendocument:xmlns:'
            'container" xmlns:enc="http://www.w3.org/2001/04/xmlenc#"><enc:EncryptedData>'
            '<enc:CipherData><enc:CipherReference URI="OEBPS/ch1.xhtml"/></enc:CipherData>'
            "</enc:EncryptedData></encryption>"
        },
    )
    with pytest.raises(MTError, match=r"^d.epub: 1 of its chapters are encrypted .*DRM"):
        read_document(drm, ".epub", "d.epub")
    with pytest.raises(MTError, match=r"^p\.docx: not a zip-based \.docx file but a compound file"):
        read_document(b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + b"\0" * 512, ".docx", "p.docx")


DOCTYPE = (
    '<?xml version="1.0" encoding="utf-8"?>\n<!DOCTYPE html PUBLIC "-//W3C//DTD XHTML 1.1//EN" '
    '"http://www.w3.org/TR/xhtml11/DTD/xhtml11.dtd" [\n  <!ENTITY logo "<b>x</b>">\n'
    "  <!ATTLIST p data-x CDATA #IMPLIED>\n]>\n"
)


def test_a_doctype_internal_subset_survives_byte_for_byte():
    page = (
        DOCTYPE
        + '<html xmlns="http://www.w3.org/1999/xhtml"><body><p>Hello <b>world</b></p></body></html>'
    )
    document = read_document(page.encode(), ".html", "p.html")
    out = document.render(upper(document)).decode()
    assert out == page.replace("Hello <b>world</b>", "HELLO <b>WORLD</b>")
    book = read_document(epub(page), ".epub", "b.epub")
    chapter = zipfile.ZipFile(io.BytesIO(book.render(upper(book)))).read("OEBPS/ch1.xhtml")
    assert chapter.decode().startswith(DOCTYPE) and b"]&gt;" not in chapter


# --- 3. HTML: linear in its input, nesting bounded ---------------------------------------------


def _seconds(html: str) -> float:
    """The time to read and render ``html``, bounds lifted (the garbage collector paused)."""
    gc.collect()
    gc.disable()
    try:
        start = time.perf_counter()
        page = HtmlPage(html, budget=Budget(UNBOUNDED, "x"))
        page.render([LineResult(s.line.upper(), 0.0, []) for s in page.segments])
        return time.perf_counter() - start
    finally:
        gc.enable()


HOSTILE_HTML = {
    "nested": lambda n: "<p>" + "<b>" * n + "word " + "</b>" * n,
    "unclosed": lambda n: "<p>" + "<b>x " * n,
    "siblings": lambda n: "<p>" + "<b>x</b> " * n,
    "closing nothing open": lambda n: "<p>" + "<i>" * 200 + "x" + "</u>" * n,
    "unclosed start tags": lambda n: "<p>x" + "<a " * n,
    "unclosed comments": lambda n: "<p>x" + "<!--a>" * n,
    "unclosed CDATA": lambda n: "<p>x" + "<![CDATA[a>" * n,
}


@pytest.mark.parametrize("kind", sorted(HOSTILE_HTML))
def test_hostile_html_is_read_in_linear_time(kind):
    # Each took seconds at 90 KB and grew with the square of its size (41 s through /translate).
    make = HOSTILE_HTML[kind]
    small, large = make(4_000), make(16_000)
    times = [(_seconds(small), _seconds(large)) for _ in range(3)]  # the least of 3, interleaved
    least_small, least_large = (min(runs) for runs in zip(*times, strict=True))
    assert least_large < 4.0 and least_large < 10 * max(least_small, 0.005), times


def test_deep_html_is_one_line_and_its_markup_is_kept_below_the_bound():
    with pytest.raises(
        DocumentTooLarge, match=r"^q\[0\]: more than 256 HTML inline elements nested"
    ):
        html_document("<p>" + "<b>" * 300 + "x", name="q[0]")
    fragment = "<p>" + "<i><b>" * 100 + "a b" + "</b></i>" * 100 + "</p>"
    document = html_document(fragment)
    assert document.render(upper(document)).decode() == fragment.replace("a b", "A B")


def test_malformed_html_reads_as_text_and_an_unclosed_script_is_kept():
    # Each of these stopped html.parser with an AssertionError, or cost a scan to the end per "<".
    cases = {
        "<p>x<![a>y": "<p>X&lt;![A&gt;Y",
        "<p>x<![ <b>y": "<p>X&lt;![ &lt;B&gt;Y",
        "<p>x<!--y": "<p>X&lt;!--Y",
        "<p>x <a b='y": "<p>X &lt;A B='Y",
    }
    for junk, expected in cases.items():
        document = html_document(junk)
        assert document.render(upper(document)).decode() == expected
    document = html_document("<p>Hi</p><script>var a = '<p>';")
    assert document.render(upper(document)).decode() == "<p>HI</p><script>var a = '<p>';"


# --- 4. the server: parsing off the event loop, bounded, one-line refusals ----------------------

pytest.importorskip("fastapi", reason="the serve extra is not installed")
httpx = pytest.importorskip("httpx", reason="the serve extra is not installed")

from transformer_mt.serve import state as serve_state  # noqa: E402
from transformer_mt.serve.settings import ApiError, FileSettings, ServeSettings  # noqa: E402
from transformer_mt.serve.state import INLINE_PARSE_CHARS, Parsing, parse  # noqa: E402


@pytest.fixture(scope="module")
def server():
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from test_libretranslate import serving

    with serving() as (client, _):
        yield client


def _post_html(client, html: str):
    return client.post(
        "/translate", json={"q": html, "source": "en", "target": "es", "format": "html"}
    )


def _plain_while(client, hostile, delay: float = 0.5) -> tuple[float, bool, list]:
    """How long a plain /translate takes while ``hostile()`` runs in another thread.

    The plain request is sent ``delay`` seconds after the hostile one. Returns how long it
    took, whether the hostile request was still unanswered when it was answered, and the
    hostile request's answer (in a list)."""
    answers: list = []
    worker = threading.Thread(target=lambda: answers.append(hostile()))
    worker.start()
    time.sleep(delay)  # the hostile request is being parsed
    start = time.perf_counter()
    reply = client.post("/translate", json={"q": "Hello", "source": "en", "target": "es"})
    waited, pending = time.perf_counter() - start, not answers
    assert reply.status_code == 200 and reply.json()["translatedText"] == "HELLO"
    worker.join(120)
    return waited, pending, answers


def _parsing_children() -> list[int]:
    """The pids of this process's parsing processes (the server's: in this process)."""
    return [child.pid for child in multiprocessing.active_children()]


def _children_cpu_s() -> float:
    """The CPU seconds this process's parsing processes have used so far."""
    ticks = 0
    for pid in _parsing_children():
        with contextlib.suppress(FileNotFoundError):  # a process that has just ended
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            ticks += int(fields[11]) + int(fields[12])  # utime and stime (stat's 14th, 15th)
    return ticks / os.sysconf("SC_CLK_TCK")


PAGE_LINES = [f"Line {i} of a page long enough to be parsed apart." for i in range(40)]
SMALL_PAGE = "".join(f"<p>{line}</p>" for line in PAGE_LINES)  # parsed in a parsing process


def test_a_long_html_parse_never_holds_the_event_loop(server):
    assert len(SMALL_PAGE) > INLINE_PARSE_CHARS
    assert _post_html(server, SMALL_PAGE).status_code == 200  # a parsing process is running
    body = "<p>" + "<b>x</b> " * 116_000  # 1 MB (the body limit): one segment, seconds to parse
    cpu = _children_cpu_s()
    waited, pending, (reply,) = _plain_while(server, lambda: _post_html(server, body), 0.3)
    assert reply.status_code == 413
    assert one_line(reply.json()["error"]).endswith("exceed max_chars=2000 per line")
    assert pending, "the plain request was answered only after the HTML parse"
    assert waited < 1.0, f"a plain request waited {waited:.1f} s behind an HTML parse"
    parsed = _children_cpu_s() - cpu
    assert parsed > 0.3, f"the parsing processes worked {parsed:.2f} s: the server parsed it"


def test_the_nested_html_of_the_issue_is_a_413_at_once_beside_a_plain_request(server):
    body = "<p>" + "<b>" * 30_000 + "word"  # 90 KB: took 41 s through /translate

    def hostile():
        start = time.perf_counter()
        return _post_html(server, body), time.perf_counter() - start

    waited, _, ((reply, took),) = _plain_while(server, hostile, 0.05)
    assert reply.status_code == 413
    error = one_line(reply.json()["error"])
    assert error.startswith("q[0]: more than 256 HTML inline elements nested"), error
    assert took < 2.0, f"the nested HTML took {took:.1f} s to refuse"
    assert waited < 1.0, f"a plain request waited {waited:.1f} s beside the nested HTML"


def test_html_past_its_bounds_is_a_413_of_one_line(server):
    reply = _post_html(server, "<p>" + "<b>" * 300 + "x")
    assert reply.status_code == 413
    assert one_line(reply.json()["error"]).startswith("q[0]: more than 256 HTML inline elements")
    many = "".join(f"<p>s{i}</p>" for i in range(300))  # parsed in a parsing process (> 2 KB)
    reply = _post_html(server, many)
    assert reply.status_code == 413
    assert "more than 64 segments to translate (max_lines=64 per request" in reply.json()["error"]
    page = DOCTYPE + "<html><body><p>Hello <b>world</b></p></body></html>"
    reply = _post_html(server, page)
    assert reply.status_code == 200
    assert reply.json()["translatedText"] == page.replace(
        "Hello <b>world</b>", "HELLO <b>WORLD</b>"
    )


def _children_peak_mb() -> int:
    """The largest peak RSS (MB) of this process's parsing processes (there must be one)."""
    peaks = []
    for pid in _parsing_children():
        with contextlib.suppress(FileNotFoundError):
            status = Path(f"/proc/{pid}/status").read_text().splitlines()
            peaks += [int(line.split()[1]) // 1024 for line in status if line.startswith("VmHWM")]
    assert peaks, "no parsing process: the server parsed the document itself"
    return max(peaks)


def _upload(client, name: str, data: bytes):
    files = {"file": (name, data)}
    return client.post("/translate_file", data={"source": "en", "target": "es"}, files=files)


@pytest.mark.parametrize(
    "suffix, make",
    [(".docx", docx_bomb), (".pptx", pptx_bomb), (".odt", odt_bomb), (".epub", epub_bomb)],
)
def test_a_document_bomb_upload_is_a_413_in_bounded_memory(server, suffix, make):
    import resource

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    data = make(5_000_000)
    assert len(data) < 8 << 20
    cpu = _children_cpu_s()
    waited, _, (reply,) = _plain_while(server, lambda: _upload(server, "bomb" + suffix, data))
    assert reply.status_code == 413, reply.text
    error = one_line(reply.json()["error"])
    assert error.startswith(f"bomb{suffix}: more than ") and "MT_DOC_MAX_" in error
    assert waited < 1.5
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    assert after - before < 100, "the server's own process parsed the document"
    assert _children_peak_mb() < 400
    parsed = _children_cpu_s() - cpu  # reading up to the bound: a tenth of a second or more
    assert parsed >= 0.02, f"the parsing processes worked {parsed:.2f} s: the server parsed it"


def test_parses_past_parse_waiting_get_a_503_naming_the_option_and_the_server_serves_on():
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from test_libretranslate import UpperEngine
    from test_serve import running

    from transformer_mt.serve.app import create_app

    files = FileSettings(parse_processes=1, parse_waiting=0)
    app = create_app(UpperEngine(), settings=ServeSettings(files=files))
    slow = "<p>" + "<b>x</b> " * 116_000  # seconds in the one parsing process
    with running(app) as url, httpx.Client(base_url=url, timeout=60) as client:
        answers: list = []
        worker = threading.Thread(target=lambda: answers.append(_post_html(client, slow)))
        worker.start()
        deadline = time.monotonic() + 30
        while app.state.server.parsing.waiting < 1:
            assert time.monotonic() < deadline, "the slow body was never parsed"
            time.sleep(0.01)
        busy = _post_html(client, SMALL_PAGE)
        assert not answers, "the slow body was parsed before the next one came"
        worker.join(120)
        assert busy.status_code == 503 and busy.headers["retry-after"] == "1"
        assert one_line(busy.json()["error"]) == (
            "server busy: 1 documents are being parsed or wait (mt serve --parse-waiting); "
            "try again later"
        )
        assert answers[0].status_code == 413  # the slow one itself: its line is too long
        again = _post_html(client, SMALL_PAGE)
        assert again.status_code == 200
        assert again.json()["translatedText"] == "".join(f"<p>{t.upper()}</p>" for t in PAGE_LINES)


def test_a_parsing_process_that_dies_is_a_422_and_the_next_parse_gets_a_new_one():
    files = FileSettings(parse_memory_bytes=768 << 20)  # a pool of its own
    # What parse() reads of a ServerState.
    server = types.SimpleNamespace(settings=ServeSettings(files=files), parsing=Parsing())

    async def parses() -> tuple[int, int]:
        first = await parse(server, os.getpid)
        with pytest.raises(ApiError) as died:
            await parse(server, os._exit, 1)
        assert died.value.status == 422
        assert died.value.message == (
            "the document could not be parsed: its parsing process died (out of memory?)"
        )
        return first, await parse(server, os.getpid)

    try:
        first, second = asyncio.run(parses())
    finally:
        serve_state._drop_pool(files)
    assert os.getpid() not in (first, second) and first != second


def test_an_encrypted_epub_upload_is_a_400_of_one_line(server):
    book = encrypt_flag(epub("<html><body><p>Hello</p></body></html>"), "OEBPS/ch1.xhtml")
    reply = _upload(server, "locked.epub", book)
    assert reply.status_code == 400
    assert one_line(reply.json()["error"]).startswith("locked.epub: OEBPS/ch1.xhtml is encrypted")
    reply = _upload(server, "fine.epub", epub("<html><body><p>Hello</p></body></html>"))
    assert reply.status_code == 200, reply.text


PARENT = """
import multiprocessing, os
from concurrent.futures import ProcessPoolExecutor
from transformer_mt.documents.limits import parse_worker_init
pool = ProcessPoolExecutor(
    1, mp_context=multiprocessing.get_context("spawn"), initializer=parse_worker_init,
    initargs=(0, 0),
)
print(pool.submit(os.getpid).result(), flush=True)
os.kill(os.getpid(), 9)
"""


def test_a_parsing_process_ends_when_its_server_is_killed():
    done = subprocess.run(
        [sys.executable, "-c", PARENT], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == -signal.SIGKILL, done.stderr
    child = int(done.stdout.split()[0])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return
        if state in ("Z", "X"):
            return
        time.sleep(0.2)
    os.kill(child, signal.SIGKILL)
    pytest.fail("the parsing process outlived its parent")


# --- 5. HTML entities: a reference to an unknown entity comes back as written -------------------


def same(document) -> list[LineResult]:
    """Each segment as it is (the identity translation)."""
    return [LineResult(line, 0.0, [(line, 0.0)]) for line in document.segments]


def test_an_unknown_entity_comes_back_as_written_and_known_ones_as_their_characters():
    fragment = "<p>Caf&eacute; &foo; caf&#233; &amp; & more</p>"
    document = html_document(fragment)
    assert document.segments == ["Café café & & more"]  # &foo; is kept, never translated
    assert document.render(upper(document)).decode() == "<p>CAFÉ &foo; CAFÉ &amp; &amp; MORE</p>"
    assert document.render(same(document)).decode() == "<p>Café &foo; café &amp; &amp; more</p>"


def test_unknown_entities_in_kept_markup_attributes_a_doctype_and_the_tail_are_as_written():
    cases = {
        "<p>a &amp;foo; b</p>": "<p>A &amp;FOO; B</p>",  # an escaped "&foo;" is text
        "<p>AT&T; &my-entity.x; &notit; x</p>": "<p>AT&T; &my-entity.x; ¬IT; X</p>",
        "<pre>x &foo; y</pre><p>&foo;</p>": "<pre>x &foo; y</pre><p>&foo;</p>",
        '<p>x <img alt="an &foo; logo"> y <img alt="a &amp; b"> z</p>': (
            '<p>X <img alt="an &foo; logo"> Y <img alt="A &amp; B"> Z</p>'
        ),
        "<p>a</p>tail &bar; end": "<p>A</p>TAIL &bar; END",
        # a "<" that starts no tag (read as text up to the next "<" or ">")
        "<p>x <a b='y &foo; z": "<p>X &lt;A B='Y &foo; Z",
        "<p>1 < 2 &foo; 3 <!--a>&foo; b": "<p>1 &lt; 2 &foo; 3 &lt;!--A&gt;&foo; B",
    }
    for fragment, expected in cases.items():
        document = html_document(fragment)
        assert document.render(upper(document)).decode() == expected, fragment
    page = (
        DOCTYPE + '<html xmlns="http://www.w3.org/1999/xhtml"><body><p>Our &logo; is &eacute;</p>'
        "</body></html>"
    )
    book = read_document(epub(page), ".epub", "b.epub")
    chapter = zipfile.ZipFile(io.BytesIO(book.render(upper(book)))).read("OEBPS/ch1.xhtml")
    assert chapter.decode() == page.replace("Our &logo; is &eacute;", "OUR &logo; IS É")


def test_html_full_of_entity_references_is_read_in_linear_time():
    for make in (lambda n: "<p>" + "&foo; x " * n, lambda n: "<p>x" + "<!--a>&b; " * n):
        small, large = make(4_000), make(16_000)
        times = [(_seconds(small), _seconds(large)) for _ in range(3)]
        least_small, least_large = (min(runs) for runs in zip(*times, strict=True))
        assert least_large < 4.0 and least_large < 10 * max(least_small, 0.005), times


def test_a_parse_past_its_memory_is_a_document_too_large_naming_the_bound():
    """The server's parsing processes (spawned, address space bounded): a parse that needs more
    than the bound is a DocumentTooLarge (the server's 413) naming it, and the process lives on."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from transformer_mt.documents.limits import DocumentTooLarge, parse_call, parse_worker_init

    context = multiprocessing.get_context("spawn")
    bound = 512 << 20
    with ProcessPoolExecutor(1, context, parse_worker_init, (bound, 0)) as pool:
        with pytest.raises(DocumentTooLarge, match=r"512 MiB \(mt serve --parse-memory-mib\)$"):
            pool.submit(parse_call, bytearray, (2 << 30,)).result()
        assert len(pool.submit(parse_call, bytearray, (1 << 20,)).result()) == 1 << 20
