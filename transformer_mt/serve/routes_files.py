"""LibreTranslate's file translation: /translate_file and /download_file.

LibreTranslate's file translation: ``POST /translate_file`` (multipart: ``file``, ``source``,
``target``, ``api_key``) -> ``{"translatedFileUrl": ".../download_file/NAME"}``, then ``GET
/download_file/NAME`` -> the translated file, as an attachment named after the upload.

A file is read by :mod:`~transformer_mt.documents.document` (its structure kept), its segments
decoded through the decode worker with their attention (which places inline markup), and the
translated file kept by the :class:`~transformer_mt.serve.file_store.FileStore` under a
name the server makes.
"""

import re
import urllib.parse
from pathlib import PurePath

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile

from transformer_mt.documents.document import FILE_FORMATS, read_document
from transformer_mt.errors import MTError
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
    check_languages,
    decode_lines,
    request_decode,
    server_state,
)

router = APIRouter()

DISABLED = "Files translation are disabled on this server."


class FileRequest(Strict):
    """``POST /translate_file``'s text fields."""

    source: str | None = None
    target: str | None = None
    api_key: str | None = None


@router.post("/translate_file")
async def translate_file(request: Request, state: ServerState = Depends(server_state)) -> dict:
    """Translate an uploaded .txt, .html, .docx, .odt, .pptx or .epub file; its download URL."""
    if state.files is None:
        raise ApiError(403, DISABLED)
    fields, filename, data = await _read_upload(request, state)
    suffix = PurePath(filename).suffix.lower()
    if suffix not in FILE_FORMATS:
        formats = ", ".join(FILE_FORMATS)
        raise ApiError(400, f"Invalid request: file format not supported ({formats})")
    check_languages(state, fields.source, fields.target)
    state.check_access(request, fields.api_key, [])
    try:
        document = await run_in_threadpool(read_document, data, suffix, filename)
    except MTError as err:
        raise ApiError(400, str(err)) from None
    decode = request_decode(state.engine.decode, {}, state.limits, {})
    target = fields.target if state.engine.lang_tags else None
    results = await decode_lines(state, request, document.segments, decode, True, target)
    translated = await run_in_threadpool(document.render, results)
    name = await run_in_threadpool(state.files.put, translated, suffix, _download_name(filename))
    return {"translatedFileUrl": str(request.url_for("download_file", name=name))}


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
