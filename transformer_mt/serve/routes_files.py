"""LibreTranslate's file translation: /translate_file and /download_file.

LibreTranslate's file translation: ``POST /translate_file`` (multipart: ``file``, ``source``,
``target``, ``api_key``; ours besides: ``glossary``, the name of one of the server's glossaries,
held in every sentence) -> ``{"translatedFileUrl": ".../download_file/NAME"}``, then ``GET
/download_file/NAME`` -> the translated file, as an attachment named after the upload.

A file is read by :mod:`~transformer_mt.documents.document` (its structure kept), its segments
cut into sentences (by the rules of ``source``; for "auto", of the language detected from the
document's start) and decoded through the decode worker with their attention, each segment
joined back from its sentences' translations and attention, which places its inline markup
(:func:`~transformer_mt.serve.state.decode_segments`, as ``mt translate`` translates a
document), and the translated file kept by the
:class:`~transformer_mt.serve.file_store.FileStore` under a name the server makes.
"""

import re
import urllib.parse
from pathlib import PurePath

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile

from transformer_mt.documents.document import FILE_FORMATS, document_segments, render_document
from transformer_mt.serve.file_store import NAME
from transformer_mt.serve.forms import (
    MULTIPART,
    Strict,
    content_type,
    first_error,
    form_fields,
    form_items,
    receive_body,
)
from transformer_mt.serve.settings import ApiError
from transformer_mt.serve.state import (
    ServerState,
    check_constrainable,
    check_languages,
    decode_segments,
    document_limits,
    parse,
    request_decode,
    request_glossary,
    segment_languages,
    server_state,
)

router = APIRouter()

DISABLED = "Files translation are disabled on this server."


class FileRequest(Strict):
    """``POST /translate_file``'s text fields."""

    source: str | None = None
    target: str | None = None
    api_key: str | None = None
    glossary: str | None = None  # ours: the name of one of the server's glossaries


@router.post("/translate_file")
async def translate_file(request: Request, state: ServerState = Depends(server_state)) -> dict:
    """Translate an uploaded .txt, .html, .docx, .odt, .pptx or .epub file; its download URL."""
    if state.files is None:
        raise ApiError(403, DISABLED)
    fields, filename, data = await _read_upload(request, state)
    suffix = PurePath(filename).suffix.lower()
    if suffix not in FILE_FORMATS:
        formats = ", ".join(FILE_FORMATS)
        raise ApiError(400, "Invalid request: file format not supported", detail=formats)
    check_languages(state, fields.source, fields.target)
    state.check_access(request, fields.api_key, [])
    glossary = request_glossary(state, fields.glossary)
    check_constrainable(state, "glossary" if glossary else None)
    # Read, split, joined (and, translated, read again and written) in a parsing process:
    # never on the event loop.
    limits = document_limits()
    segments = await parse(state, document_segments, data, suffix, filename, limits)
    languages = segment_languages(state.engine, [segments], fields.source)
    decode = request_decode(state.engine.decode, {}, state.limits, {})
    target = fields.target if state.engine.lang_tags else None
    results = await decode_segments(
        state, request, segments, languages, decode, target, glossary=glossary
    )
    translated = await parse(state, render_document, data, suffix, filename, limits, results)
    name = await run_in_threadpool(state.files.put, translated, suffix, _download_name(filename))
    return {"translatedFileUrl": _file_url(request, state, name)}


def _file_url(request: Request, state: ServerState, name: str) -> str:
    """Where the download ``name`` is: under ``--public-url``, else where the request came in.

    Without ``--public-url``, the scheme, address and port of the connection the request came
    in on (its Host header, which the client writes, is never copied); a connection without an
    address gets the path alone. An absolute URL, as LibreTranslate answers: its clients fetch
    the URL as they get it."""
    path = str(request.app.url_path_for("download_file", name=name))
    public = state.settings.files.download_url(path)
    if public is not None:
        return public
    server = request.scope.get("server")
    if not server or server[1] is None:
        return path
    host, port = server
    host = f"[{host}]" if ":" in host else host
    return f"{request.scope.get('scheme', 'http')}://{host}:{port}{path}"


async def _read_upload(request: Request, state: ServerState) -> tuple[FileRequest, str, bytes]:
    """The upload's fields, file name and bytes.

    The body is read within ``max_file_bytes``; what is missing gets LibreTranslate's answers."""
    limit = state.settings.files.max_file_bytes
    body = await receive_body(request, state.limits, max_bytes=limit)
    if content_type(request) != MULTIPART or not body:
        raise ApiError(400, "Invalid request: missing file parameter (send multipart/form-data)")
    items = await form_items(request, body, text_only=False)
    texts = [(name, value) for name, value in items if isinstance(value, str)]
    uploads = [value for name, value in items if name == "file" and isinstance(value, UploadFile)]
    try:
        fields = FileRequest.model_validate(form_fields(texts, FileRequest))
    except ValidationError as err:  # an unknown field
        raise ApiError(400, f"Invalid request: {first_error(err.errors())}") from None
    if not uploads:
        raise ApiError(400, "Invalid request: missing file parameter")
    for name in ("source", "target"):
        if not getattr(fields, name):
            raise ApiError(400, f"Invalid request: missing {name} parameter")
    upload = uploads[0]
    if not upload.filename:
        raise ApiError(400, "Invalid request: empty file")
    data = await upload.read()
    await upload.close()
    return fields, upload.filename, data


def _download_name(filename: str) -> str:
    """The name a client saves the translation as.

    The upload's base name, its characters
    kept to letters, digits, ``.``, ``-`` and ``_`` (it only ever appears in a header)."""
    base = re.split(r"[\\/]", filename)[-1]
    safe = re.sub(r"[^\w.-]", "_", base, flags=re.ASCII).lstrip(".")
    return safe or "translated"


@router.get("/download_file/{name}", name="download_file")
async def download_file(name: str, state: ServerState = Depends(server_state)) -> Response:
    """A translated file, by the name /translate_file gave.

    Only a server-made name is accepted: any other is refused before a path is built."""
    if state.files is None:
        raise ApiError(400, DISABLED)
    if not NAME.fullmatch(name):
        raise ApiError(400, "Invalid filename")
    stored = state.files.get(name)
    if stored is None:
        ttl = state.settings.files.ttl_s
        raise ApiError(404, f"no such file (downloads are kept {ttl:g} s): translate it again")
    try:
        data = await run_in_threadpool(stored.path.read_bytes)
    except FileNotFoundError:  # expired between the lookup and the read
        raise ApiError(404, "no such file: translate it again") from None
    # The name is ASCII letters, digits, ".", "-" and "_": safe in either form of the header.
    name = stored.download_name
    quoted = urllib.parse.quote(name)
    headers = {"Content-Disposition": f"attachment; filename=\"{name}\"; filename*=utf-8''{quoted}"}
    return Response(data, media_type="application/octet-stream", headers=headers)
