"""What reading one document may cost: the bounds every document reader checks as it reads.

A document is user input, and a small file can claim a large cost: a 128 KB .docx whose ten
million empty paragraphs take gigabytes once a library has parsed them, a zip whose members
decompress to terabytes or number in millions, HTML nested thousands deep. Each cost has a bound
(:class:`DocumentLimits`), checked while the document is read and, for a zip, before anything is
extracted: its member count and declared sizes first (zipfile never decompresses a member past its
declared size: it fails the member's CRC instead), then every XML member streamed through expat
(elements, depth, no entity declarations) before a library builds a tree of it. Past a bound, a
:class:`DocumentTooLarge` of one line names the file, the bound and the environment variable that
raises it (``MT_DOC_MAX_ELEMENTS=...``), which `mt translate` and `mt serve` read alike.

:func:`parse_worker_init` and :func:`parse_call` are what a server's parsing processes run
(torch-free, so that such a process never loads the model's libraries).
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import io
import os
import threading
import time
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import IO, Any
from xml.parsers import expat

from transformer_mt.errors import MTError

ENV = {
    "max_bytes": "MT_DOC_MAX_BYTES",
    "max_members": "MT_DOC_MAX_MEMBERS",
    "max_segments": "MT_DOC_MAX_SEGMENTS",
    "max_elements": "MT_DOC_MAX_ELEMENTS",
    "max_depth": "MT_DOC_MAX_DEPTH",
}
CHUNK = 1 << 16  # bytes of a zip member decompressed at a time while it is scanned
ZIP_METHODS = (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA)


@dataclass(frozen=True)
class DocumentLimits:
    """The bounds of one document, each raised by its environment variable (:data:`ENV`)."""

    # bytes of a document's contents: its zip members as declared (together), a plain file's size
    max_bytes: int = 100 << 20
    max_members: int = 10_000  # members of a zip-based document (.docx, .odt, .pptx, .epub)
    max_segments: int = 100_000  # segments to translate: paragraphs, HTML blocks, text lines
    # elements of its markup, together: XML elements of every XML member, HTML start tags, and a
    # text file's lines (the libraries spend about 0.4 KB (lxml) to 0.9 KB (odfpy) on each)
    max_elements: int = 250_000
    max_depth: int = 256  # XML elements nested, HTML inline elements open at once
    # how an error names a bound a caller sets in its own way (the server's max_lines), by field
    names: Mapping[str, str] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ENV and (not isinstance(value, int) or value < 1):
                raise MTError(f"{ENV[f.name]} is {value!r}; it must be a whole number, at least 1")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> DocumentLimits:
        """The defaults, each replaced by its environment variable where that is set."""
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for name, variable in ENV.items():
            text = environ.get(variable, "").strip().replace("_", "")
            if text:
                try:
                    values[name] = int(text)
                except ValueError:
                    raise MTError(
                        f"{variable} is {environ[variable]!r}; it must be a whole number"
                    ) from None
        return cls(**values)

    def how_to_raise(self, name: str) -> str:
        """How an error names the bound ``name`` and says how to raise it."""
        if name in self.names:
            return self.names[name]
        variable = ENV[name]
        return f"{variable}={getattr(self, name)}; for a trusted document, set {variable} higher"


class DocumentTooLarge(MTError):
    """A document past one of its bounds (a server answers 413)."""


class Budget:
    """What one document has cost so far, against its :class:`DocumentLimits`."""

    def __init__(self, limits: DocumentLimits, name: str) -> None:
        self.limits, self.name = limits, name
        self.bytes = self.elements = self.segments = 0

    def over(self, bound: str, what: str) -> DocumentTooLarge:
        """The error for a document with more ``what`` than the bound ``bound`` allows."""
        limit = getattr(self.limits, bound)
        return DocumentTooLarge(
            f"{self.name}: more than {limit:,} {what} ({self.limits.how_to_raise(bound)})"
        )

    def add_bytes(self, n: int) -> None:
        """Count ``n`` more bytes of contents."""
        self.bytes += n
        if self.bytes > self.limits.max_bytes:
            raise self.over("max_bytes", "bytes of contents")

    def add_elements(self, n: int = 1, what: str = "elements") -> None:
        """Count ``n`` more elements (a text file's lines)."""
        self.elements += n
        if self.elements > self.limits.max_elements:
            raise self.over("max_elements", what)

    def add_segment(self) -> None:
        """Count one more segment to translate."""
        self.segments += 1
        if self.segments > self.limits.max_segments:
            raise self.over("max_segments", "segments to translate")

    def check_depth(self, depth: int, what: str) -> None:
        """Refuse ``depth`` levels of nesting past ``max_depth``."""
        if depth > self.limits.max_depth:
            raise self.over("max_depth", f"{what} nested")


def open_zip(data: bytes, budget: Budget) -> zipfile.ZipFile:
    """``data`` as a zip archive, its member count, encryption and declared sizes checked first.

    The count its end record declares is checked before zipfile reads the central directory,
    then the members it lists; encrypted members and compression methods zipfile lacks are an
    MTError (zipfile's errors for a damaged archive pass through)."""
    declared = _declared_members(data)
    if declared is not None and declared > budget.limits.max_members:
        raise budget.over("max_members", "zip members")
    archive = zipfile.ZipFile(io.BytesIO(data))
    infos = archive.infolist()
    if len(infos) > budget.limits.max_members:
        raise budget.over("max_members", "zip members")
    for info in infos:
        if info.flag_bits & 0x1:
            raise MTError(
                f"{budget.name}: {info.filename} is encrypted (a password-protected zip); "
                "decrypt the file and translate that"
            )
        if info.compress_type not in ZIP_METHODS:
            raise MTError(
                f"{budget.name}: {info.filename} uses zip compression method "
                f"{info.compress_type}, which this reader lacks; save the file again"
            )
    budget.add_bytes(sum(info.file_size for info in infos))
    return archive


def _declared_members(data: bytes) -> int | None:
    """The member count a zip's end of central directory record declares (None: zip64 or none)."""
    at = data.rfind(b"PK\x05\x06", max(0, len(data) - 22 - 0xFFFF))
    if at < 0 or at + 12 > len(data):
        return None
    count = int.from_bytes(data[at + 10 : at + 12], "little")
    return None if count == 0xFFFF else count


def scan_zip_xml(archive: zipfile.ZipFile, budget: Budget) -> None:
    """Stream every member that holds XML through :func:`scan_xml` before a library reads it.

    A member holds XML when its first bytes (after whitespace and a byte-order mark) are ``<``;
    others (images, fonts) are never decompressed here."""
    for info in archive.infolist():
        if info.is_dir():
            continue
        with archive.open(info) as stream:
            first = stream.read(CHUNK)
            if first.lstrip(b" \t\r\n\xef\xbb\xbf")[:1] == b"<":
                scan_xml(first, stream, budget, info.filename)


def scan_xml(first: bytes, stream: IO[bytes], budget: Budget, member: str) -> None:
    """Count an XML stream's elements and depth against ``budget``, its entities refused.

    ``first`` is what was read of ``stream`` already. The elements add to the document's
    count; an element nested deeper than ``max_depth`` or an entity declaration (an office
    file's XML never needs one; expanding them is the "billion laughs") is refused. XML that is
    not well-formed is left to the format's library to report."""
    parser = expat.ParserCreate()
    depth = 0

    def start(name: str, attributes: Any) -> None:
        nonlocal depth
        depth += 1
        budget.check_depth(depth, f"XML elements in {member}")
        budget.add_elements(1, "XML elements")

    def end(name: str) -> None:
        nonlocal depth
        depth -= 1

    def entity(name: str, *_: Any) -> None:
        raise MTError(f"{budget.name}: {member} declares the XML entity {name!r}; refused")

    parser.StartElementHandler, parser.EndElementHandler = start, end
    parser.EntityDeclHandler = entity
    try:
        chunk = first
        while chunk:
            parser.Parse(chunk, False)
            chunk = stream.read(CHUNK)
        parser.Parse(b"", True)
    except expat.ExpatError:
        return


def check_xml_bytes(data: bytes, budget: Budget, member: str) -> bytes:
    """``data`` (an XML member already read), after :func:`scan_xml`; returned unchanged."""
    scan_xml(data, io.BytesIO(), budget, member)
    return data


# --- what a server's parsing processes run ---------------------------------------------------


PRELOAD = (
    "transformer_mt.documents.document",
    "transformer_mt.documents.html",
    "transformer_mt.documents.office",
    "docx",
    "pptx",
    "odf.opendocument",
)  # what a parsing process imports before its memory is bounded (a missing extra: skipped)


def parse_worker_init(memory_bytes: int, niceness: int) -> None:
    """Set up a parsing process: libraries loaded, address space bounded, CPU priority lowered.

    It ends when its parent does. With ``memory_bytes`` (0: none) a parse that needs more fails
    with a MemoryError in this process alone; ``niceness`` leaves the CPUs to the server's
    decoding when both want them."""
    import importlib
    import resource  # Unix only, as the servers that use this

    for variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[variable] = "1"  # numpy (placement) needs no thread pool here
    for module in PRELOAD:
        with contextlib.suppress(ImportError):
            importlib.import_module(module)
    threading.Thread(target=_exit_with, args=(os.getppid(),), daemon=True).start()
    if memory_bytes:
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    if niceness:
        os.nice(niceness)


def _exit_with(parent: int) -> None:
    """End this process once its parent has (a killed server leaves no parsing process behind)."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(0)


def parse_call(fn: Callable[..., Any], args: tuple) -> Any:
    """``fn(*args)`` in a parsing process; its memory handed back to the system afterwards.

    A MemoryError becomes a :class:`DocumentTooLarge` naming the process's bound."""
    try:
        return fn(*args)
    except MemoryError:
        import resource

        limit = resource.getrlimit(resource.RLIMIT_AS)[0]
        where = f" of {limit / (1 << 20):,.0f} MiB" if limit > 0 else ""
        raise DocumentTooLarge(
            f"parsing the document needs more than this server's parsing memory{where} "
            "(mt serve --parse-memory-mib)"
        ) from None
    finally:
        gc.collect()
        _trim()


def _trim() -> None:
    """Give freed heap memory back to the system (glibc's malloc_trim; elsewhere nothing)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
