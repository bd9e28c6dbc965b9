"""Request bodies in: received within the limits, parsed into a route's pydantic model.

The body is read here, not by FastAPI, so that every limit of :class:`Limits` (size, time) and
every malformed body gets a one-line ``{"error": ...}``: JSON through pydantic (strict: no
coercion, no NaN, no unknown field); form bodies (LibreTranslate's clients send
``application/x-www-form-urlencoded`` and ``multipart/form-data``) through Starlette's own form
parser, with LibreTranslate's rule that fields may come in the URL's query string too.

Two checks Starlette's parser leaves out are kept: form bodies are strict UTF-8 (Starlette
falls back to Latin-1 and reads ``curl -d 'q=Grüße'`` as mojibake), and a multipart body must
end with its closing boundary.
"""

import asyncio
import json
import re
import urllib.parse
from typing import TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError
from python_multipart.multipart import parse_options_header
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException
from starlette.formparsers import MultiPartException
from starlette.requests import ClientDisconnect, Request
from starlette.types import Receive

from transformer_mt.serve.settings import ApiError, Limits

FORM = "application/x-www-form-urlencoded"
MULTIPART = "multipart/form-data"
MAX_FORM_FIELDS = 32  # a form's fields at most (LibreTranslate's have 7)

# An integer field of a form body: ASCII digits, an optional minus, small enough for any limit.
_FORM_INT = re.compile(r"-?[0-9]{1,9}")


class Strict(BaseModel):
    """A request body, read strictly.

    A request body: no coercion ("4" is not a beam size), no NaN or infinity, no unknown
    fields."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


async def receive_body(request: Request, limits: Limits, max_bytes: int | None = None) -> bytes:
    """The whole request body, within the size and time limits.

    At most ``max_bytes`` (default ``limits.max_body_bytes``), else a 413; received within
    ``limits.body_timeout_s``, else a 408."""
    limit = max_bytes or limits.max_body_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"request body of {int(declared)} bytes exceeds max_body_bytes={limit}")
    body = bytearray()

    async def receive() -> None:
        async for chunk in request.stream():
            body.extend(chunk)
            if len(body) > limit:
                raise ApiError(413, f"request body exceeds max_body_bytes={limit}")

    try:
        await asyncio.wait_for(receive(), limits.body_timeout_s)
    except asyncio.TimeoutError:  # TimeoutError itself only from Python 3.11
        raise ApiError(
            408, f"the request body did not arrive within body_timeout_s={limits.body_timeout_s}"
        ) from None
    except ClientDisconnect:  # the client left: nobody to answer
        raise ApiError(400, "the client closed the connection before sending its body") from None
    return bytes(body)


def content_type(request: Request) -> str:
    """The request's media type, lowercase, without its parameters."""
    return request.headers.get("content-type", "").split(";")[0].strip().lower()


Fields = TypeVar("Fields", bound=BaseModel)  # a route's request model


async def read_json(request: Request, model: type[Fields], limits: Limits) -> Fields:
    """A JSON body as ``model`` (a form body: 415)."""
    body = await receive_body(request, limits)
    if content_type(request) in (FORM, MULTIPART):
        raise ApiError(
            415, f"{request.url.path} takes application/json (got {content_type(request)})"
        )
    if not body:
        raise ApiError(400, "empty request body: send a JSON object")
    return _validate(model, body, json_prefix="")


async def read_fields(request: Request, model: type[Fields], limits: Limits) -> Fields:
    """LibreTranslate's fields as ``model``, from JSON, a form or the query.

    LibreTranslate's fields as ``model``: from a JSON object, or from a form body and the
    query string together (a field given twice: 400); an empty body: the query string alone."""
    body = await receive_body(request, limits)
    kind = content_type(request)
    if body and kind not in (FORM, MULTIPART):
        return _validate(model, body, json_prefix="Invalid JSON format: ")
    pairs = _query_pairs(request)
    if kind == FORM:
        pairs += _urlencoded_pairs(body)
    elif kind == MULTIPART and body:
        items = await form_items(request, body, text_only=True)
        pairs += [(name, value) for name, value in items if isinstance(value, str)]
    return _validate(model, form_fields(pairs, model), json_prefix="")


async def form_items(
    request: Request, body: bytes, text_only: bool
) -> list[tuple[str, str | UploadFile]]:
    """A multipart body's parts through Starlette's parser.

    Text fields as strings, files as
    UploadFiles (with ``text_only``, a file part is refused and the body must be UTF-8)."""
    header = request.headers.get("content-type", "")
    boundary = parse_options_header(header)[1].get(b"boundary")
    if not boundary:
        raise ApiError(400, "the multipart/form-data content type has no boundary")
    if text_only:
        _check_utf8(body, "the multipart body")
    replay = Request(request.scope, _replay(body))
    try:
        form = await replay.form(max_fields=MAX_FORM_FIELDS, max_part_size=len(body))
    except (MultiPartException, HTTPException) as err:
        detail = getattr(err, "message", None) or getattr(err, "detail", "")
        raise ApiError(400, f"the multipart body is not valid: {detail}") from None
    if not body.rstrip(b"\r\n").endswith(b"--" + boundary + b"--"):
        await form.close()
        raise ApiError(400, "the multipart body ends before its closing boundary")
    items = form.multi_items()
    for name, value in items:
        if text_only and isinstance(value, UploadFile):
            await form.close()
            raise ApiError(400, f"form field {name!r} is a file; send text fields")
    return items


def _replay(body: bytes) -> Receive:
    """An ASGI ``receive`` that gives ``body`` (already read and checked) once."""
    sent = False

    async def receive() -> dict:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return receive


def _check_utf8(raw: bytes, what: str) -> None:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ApiError(400, f"{what} is not valid UTF-8: {err}") from None


def _query_pairs(request: Request) -> list[tuple[str, str]]:
    """The URL's query fields (LibreTranslate reads them as form fields), strict UTF-8."""
    return _urlencoded_pairs(request.scope.get("query_string", b""), "the query string")


def _urlencoded_pairs(body: bytes, what: str = "the form body") -> list[tuple[str, str]]:
    """An urlencoded text's (name, value) pairs, strict UTF-8.

    Both the text and its %-escapes must be UTF-8: raw bytes as ``curl -d`` sends them, or
    escaped."""
    if not body:
        return []
    try:
        return urllib.parse.parse_qsl(
            body.decode("utf-8"), keep_blank_values=True, strict_parsing=True, errors="strict"
        )
    except UnicodeDecodeError as err:
        raise ApiError(400, f"{what} is not valid UTF-8: {err}") from None
    except ValueError as err:
        raise ApiError(400, f"{what} is not valid: {err}") from None


def form_fields(pairs: list[tuple[str, str]], model: type[BaseModel]) -> dict:
    """A form's fields, each given once; integer fields of ``model`` parsed as integers."""
    fields: dict = {}
    for name, value in pairs:
        if name in fields:
            raise ApiError(400, f"form field {name!r} given twice")
        annotation = model.model_fields[name].annotation if name in model.model_fields else None
        if annotation is int:
            if not _FORM_INT.fullmatch(value):
                raise ApiError(
                    400,
                    f"Invalid request: {name} parameter is not a number (form field {name!r}: "
                    f"{value[:20]!r} is not an integer, -?[0-9]{{1,9}})",
                )
            fields[name] = int(value)
        else:
            fields[name] = value
    return fields


def _validate(model: type[Fields], data: bytes | dict, json_prefix: str) -> Fields:
    """``data`` as ``model``, or a 400 naming the first error.

    ``data`` (JSON bytes or form fields) as ``model``, or a 400 naming the first error;
    a body that is not a JSON object gets ``json_prefix`` first (LibreTranslate's wording)."""
    try:
        if isinstance(data, bytes):
            return model.model_validate_json(data)
        return model.model_validate(data)
    except ValidationError as err:
        errors = err.errors()
        kind = errors[0].get("type") if errors else ""
        prefix = json_prefix if kind in ("json_invalid", "model_type") else ""
        raise ApiError(400, prefix + first_error(errors)) from None


def first_error(errors: list) -> str:
    """One line for the first of pydantic's errors, naming the field."""
    if not errors:
        return "invalid request"
    first = errors[0]
    where = ".".join(str(part) for part in first.get("loc", ()) if part != "body")
    kind, message = first.get("type", ""), first.get("msg", "invalid")
    if kind == "json_invalid":
        return f"the body is not valid UTF-8 JSON: {message.removeprefix('Invalid JSON: ')}"
    if kind == "extra_forbidden":
        return f"unknown field {where!r}"
    if kind == "missing":
        return f"missing field {where!r}"
    if kind == "model_type":
        return "the body must be a JSON object"
    return f"field {where!r}: {message}" if where else message


def json_bytes(value: object) -> bytes:
    """``value`` as compact UTF-8 JSON (no NaN: JSON has none)."""
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()


def body_schema(model: type[BaseModel]) -> dict:
    """The request body as OpenAPI shows it (the routes parse it themselves)."""
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": model.model_json_schema()}},
        }
    }
