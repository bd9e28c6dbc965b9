"""`mt serve`: the model over HTTP (FastAPI + uvicorn), with a translation page at ``/``.

Endpoints:

- ``POST /translate``, LibreTranslate's shape: ``{"q": "text" | ["t1", ...], "source": "de",
  "target": "en"}`` -> ``{"translatedText": "..." | [...]}``; the languages must be the model's
  (``source`` may be "auto": ``detectedLanguage`` answers the model's); LibreTranslate's
  ``format`` ("text"), ``api_key`` and ``alternatives`` (the n-best's next) are accepted, as
  are form bodies (urlencoded or multipart, UTF-8); a text of several lines is translated line
  by line. ``GET /languages`` (the model's pair) and ``POST /detect`` (always the model's source
  language) complete what LibreTranslate's clients call.
- ``POST /v1/translate``: ``{"text": [...], "beam": 4, "nbest": 1, "len_penalty": 1.0,
  "attention": false}`` -> ``{"translations": [{"text", "score", "nbest": [{"text", "score"}],
  "attention": {"source", "target", "weights"}}]}``, one per line, in order.
- ``GET /health``, ``GET /v1/model``, FastAPI's ``/docs`` and ``/openapi.json``; the page at
  ``/`` and ``/static/...`` (``inference/static/``).

Every refused request gets a 4xx JSON ``{"error": "<one line naming the limit or field>"}``:
the body is read and parsed here, not by FastAPI, so that invalid JSON, undecodable bytes, unknown
fields and every limit of :class:`Limits` get our one-line message. Decoding goes through one
:class:`~transformer_mt.inference.batcher.Batcher` worker (dynamic batching); an answer with
attention (up to max_lines matrices) is rounded and encoded in a worker thread of starlette's pool
(plain Python, no torch), not on the event loop. A client that closes its connection before its
answer costs at most the decode batch its request is in: queued, the request is dropped;
decoding, it stops after the current batch (the decode worker's log says how many lines were left
undecoded). `mt serve` binds its port before it loads the model: a port in use is one ``error:``
line, at once. On SIGTERM uvicorn stops accepting, lets the
requests in flight finish (for at most the shutdown timeout; the log says how many it cut off),
and the decode worker drains before the process ends.
"""

import asyncio
import dataclasses
import errno
import json
import logging
import math
import re
import signal
import socket
import threading
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from transformer_mt.config import validate_decode
from transformer_mt.errors import MTError
from transformer_mt.inference.batcher import Batcher, BatchSettings, Busy, ClientGone, Closed
from transformer_mt.inference.engines import Engine, LineResult, check_engine, load_engine

try:
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import FileResponse, JSONResponse, Response
    from pydantic import BaseModel, ConfigDict, ValidationError
    from python_multipart import MultipartParser
    from python_multipart.exceptions import FormParserError
    from python_multipart.multipart import parse_options_header
    from starlette.concurrency import run_in_threadpool
    from starlette.exceptions import HTTPException
    from starlette.requests import ClientDisconnect
    from starlette.staticfiles import StaticFiles
except ImportError as err:  # pragma: no cover - depends on the environment
    raise MTError(
        f"`mt serve` needs FastAPI, uvicorn and python-multipart ({err.name} is missing): "
        "pip install 'transformer-mt[serve]' (in a checkout: pip install -e '.[serve]')"
    ) from err

logger = logging.getLogger(__name__)

STATIC_DIR = Path(__file__).resolve().parent / "static"


@dataclass(frozen=True)
class Limits:
    """What one request may ask for; beyond it, a 4xx JSON error naming the limit."""

    max_body_bytes: int = 1 << 20  # request body (1 MiB)
    max_lines: int = 64  # lines per request
    max_chars: int = 2000  # characters per line
    max_beam: int = 16  # beam sizes 1..max_beam; n-best 1..beam
    max_waiting: int = 1024  # requests waiting for the decode worker; more -> 503
    body_timeout_s: float = 30.0  # to receive a request's body; slower -> 408


# On SIGTERM uvicorn waits for every open connection; a client that never finishes sending its
# body (or never reads its answer) would keep the process alive for good. After this long
# (`mt serve --shutdown-timeout`) the requests left are cancelled and their connections closed;
# the decode worker still answers what was submitted before exiting.
SHUTDOWN_TIMEOUT_S = 30.0

# An integer field of a form body: ASCII digits, an optional minus, small enough for any limit.
_FORM_INT = re.compile(r"-?[0-9]{1,9}")


class ApiError(Exception):
    """A refused request: its HTTP status and one line for ``{"error": ...}``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


class _Strict(BaseModel):
    # No coercion ("4" is not a beam size), no NaN or infinity, no unknown fields.
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class LibreRequest(_Strict):
    q: str | list[str]  # one text, or several; a text's lines are translated line by line
    source: str  # the model's source language, or "auto"
    target: str  # the model's target language
    format: Literal["text"] = "text"  # LibreTranslate's; only plain text here
    alternatives: int = 0  # LibreTranslate's: this many more translations (the n-best's next)
    api_key: str | None = None  # LibreTranslate's; ignored (no keys here)


class DetectRequest(_Strict):
    q: str  # LibreTranslate's; the answer is the model's one source language whatever it says
    api_key: str | None = None  # LibreTranslate's; ignored


class TranslateRequest(_Strict):
    text: list[str]  # lines to translate; an empty line gives an empty translation
    beam: int | None = None  # default: the model's decode.beam_size
    nbest: int = 1  # hypotheses per line, 1..beam
    len_penalty: float | None = None  # GNMT alpha; default: the model's
    attention: bool = False  # return the cross-attention of each best translation
    target: str | None = None  # the language to translate into (a multilingual model needs it)


@dataclass
class RequestCounts:
    """HTTP requests being handled, and those cancelled before their answer was sent (by
    uvicorn, when its graceful-shutdown timeout ran out with them still in flight)."""

    in_flight: int = 0
    cancelled: int = 0

    @property
    def unanswered(self) -> int:
        """After uvicorn's shutdown: the requests it gave up on. It waits for every request
        until the timeout, then cancels the rest and goes on without waiting for them to
        unwind, so some may still count as in flight."""
        return self.in_flight + self.cancelled


class _CountRequests:
    """ASGI middleware keeping :class:`RequestCounts`."""

    def __init__(self, app, counts: RequestCounts) -> None:
        self.app, self.counts = app, counts

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        self.counts.in_flight += 1
        started = False

        async def tracked_send(message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked_send)
        except asyncio.CancelledError:
            # Cut off by uvicorn's shutdown timeout. A request whose answer has not begun still
            # gets a JSON error (uvicorn's own would be a text/plain 500 and a traceback); the
            # task then ends as uvicorn wants it to.
            self.counts.cancelled += 1
            if started or not await _send_json_error(send, 503, _SHUTTING_DOWN):
                raise
        finally:
            self.counts.in_flight -= 1


_SHUTTING_DOWN = "the server shut down before answering; send the request again"


async def _send_json_error(send, status: int, message: str) -> bool:
    """Send a whole ``{"error": message}`` response through ASGI ``send``; False when the
    connection is gone."""
    body = _json_bytes({"error": message})
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    try:
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
    except Exception:  # any failure here means the client cannot be told
        return False
    return True


def create_app(
    engine: Engine, limits: Limits | None = None, batching: BatchSettings | None = None
) -> FastAPI:
    """The FastAPI app over ``engine``; its decode worker runs while the app's lifespan does.
    ``app.state.requests`` (:class:`RequestCounts`) says what a shutdown left unanswered."""
    limits = limits or Limits()
    batcher = Batcher(engine, batching, max_waiting=limits.max_waiting)
    # python-multipart logs every malformed body it meets: a client could fill the server's log.
    logging.getLogger("python_multipart").setLevel(logging.ERROR)
    counts = RequestCounts()

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        batcher.start()
        try:
            yield
        finally:
            batcher.close()  # every request already submitted gets its answer first

    app = FastAPI(
        title="transformer-mt",
        summary=f"Translate {engine.src_lang} -> {engine.trg_lang} ({engine.name} engine)",
        lifespan=lifespan,
    )
    app.state.engine, app.state.batcher, app.state.limits = engine, batcher, limits
    app.state.requests = counts
    app.add_middleware(_CountRequests, counts=counts)

    @app.exception_handler(ApiError)
    async def _api_error(_request: Request, err: ApiError) -> JSONResponse:
        return JSONResponse({"error": err.message}, status_code=err.status)

    @app.exception_handler(HTTPException)
    async def _http_error(_request: Request, err: HTTPException) -> JSONResponse:
        # err.headers: e.g. the Allow header of a 405
        return JSONResponse(
            {"error": str(err.detail)}, status_code=err.status_code, headers=err.headers
        )

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_request: Request, err: RequestValidationError) -> JSONResponse:
        return JSONResponse({"error": _first_error(err.errors())}, status_code=422)

    @app.post("/translate", openapi_extra=_body_schema(LibreRequest))
    async def libre_translate(request: Request) -> dict:
        """LibreTranslate's endpoint: ``{"q", "source", "target"}`` -> ``{"translatedText"}``."""
        req = await _read(request, LibreRequest, limits, form=True)
        target = _libre_target(engine, req.source, req.target)
        texts = [req.q] if isinstance(req.q, str) else req.q
        # A text of several lines is translated line by line and put back together.
        split = [text.split("\n") for text in texts]
        lines = [line.removesuffix("\r") for text in split for line in text]
        _check_lines(lines, limits, "q lines", engine)
        # The model's decode settings, its beam capped by max_beam as /v1/translate caps it,
        # and widened to give the alternatives asked for.
        beam = min(engine.decode.beam_size, limits.max_beam)
        if not 0 <= req.alternatives < limits.max_beam:
            raise ApiError(
                400,
                f"alternatives is {req.alternatives}; it must be between 0 and max_beam - 1 "
                f"({limits.max_beam - 1})",
            )
        nbest = 1 + req.alternatives
        decode = dataclasses.replace(engine.decode, beam_size=max(beam, nbest), nbest=nbest)
        try:
            validate_decode(decode)
        except MTError as err:
            raise ApiError(400, str(err)) from None
        results = iter(await _translate(batcher, lines, decode, False, request, target))
        answers = []  # per text: its translation, then its alternatives
        for text in split:
            per_line = [next(results).nbest for _ in text]
            answers.append(
                [
                    "\n".join(nb[k][0] if k < len(nb) else "" for nb in per_line)
                    for k in range(nbest)
                ]
            )
        one = isinstance(req.q, str)
        reply: dict = {"translatedText": answers[0][0] if one else [a[0] for a in answers]}
        if req.alternatives:
            reply["alternatives"] = answers[0][1:] if one else [a[1:] for a in answers]
        if req.source == "auto":  # a source the model knows, as LibreTranslate reports one
            source = next(src for src, trg in _pairs(engine) if trg == req.target)
            detected = {"language": source, "confidence": 100.0}
            reply["detectedLanguage"] = detected if one else [detected] * len(answers)
        return reply

    @app.get("/languages")
    async def languages() -> list:
        """LibreTranslate's: every language of the model's pairs and, per source language, its
        targets. Names are the codes: the model knows no others."""
        targets: dict[str, list[str]] = {}
        for src, trg in _pairs(engine):
            targets.setdefault(src, []).append(trg)
        for _, trg in _pairs(engine):  # a client checks both ends against this list
            targets.setdefault(trg, [])
        return [{"code": code, "name": code, "targets": to} for code, to in targets.items()]

    @app.post("/detect", openapi_extra=_body_schema(DetectRequest))
    async def detect(request: Request) -> list:
        """LibreTranslate's language detection: the model knows one source language."""
        await _read(request, DetectRequest, limits, form=True)
        return [{"language": engine.src_lang, "confidence": 100.0}]

    @app.post("/v1/translate", openapi_extra=_body_schema(TranslateRequest))
    async def translate(request: Request) -> Response:
        """Lines -> per line: text, score, n-best list, and on request the cross-attention."""
        req = await _read(request, TranslateRequest, limits)
        _check_lines(req.text, limits, "text", engine)
        decode = _decode_settings(engine, req, limits)
        target = _v1_target(engine, req.target)
        results = await _translate(batcher, req.text, decode, req.attention, request, target)
        if req.attention:  # up to max_lines matrices of floats: not on the event loop
            body = await run_in_threadpool(_translations_body, results)
        else:
            body = _translations_body(results)
        return Response(body, media_type="application/json")

    @app.get("/health")
    async def health() -> dict:
        """Alive; with the decode worker's counters: engine calls and the requests they carried
        (their ratio is the mean batch, in requests), the requests whose client left before
        their answer and the lines that were not decoded for that."""
        return {
            "status": "ok",
            "batches": batcher.batches,
            "requests": batcher.requests,
            "abandoned": batcher.abandoned,
            "lines_not_decoded": batcher.lines_not_decoded,
        }

    @app.get("/v1/model")
    async def model_info() -> dict:
        """Languages, vocabulary, model shape, training step, validation BLEU, engine, limits."""
        return {
            **engine.describe(),
            "limits": dataclasses.asdict(limits),
            "batching": {
                "enabled": batcher.settings.enabled,
                "continuous": batcher.continuous,
                "window_ms": batcher.settings.window_s * 1000,
                "max_wait_ms": batcher.settings.max_wait_s * 1000,
                "max_tokens": batcher.max_tokens,
            },
        }

    @app.get("/", include_in_schema=False)
    async def page():
        index = STATIC_DIR / "index.html"
        if not index.is_file():
            raise ApiError(404, "no translation page is installed (inference/static/index.html)")
        return FileResponse(index)

    app.mount("/static", StaticFiles(directory=STATIC_DIR, check_dir=False), name="static")
    return app


async def _read(request: Request, model: type[BaseModel], limits: Limits, form: bool = False):
    """The request body, size-checked, received within ``limits.body_timeout_s`` and parsed
    into ``model`` (or an ApiError). With ``form``, an ``application/x-www-form-urlencoded``
    or ``multipart/form-data`` body (LibreTranslate's clients send both) is read too, its text
    fields as JSON's; otherwise a multipart body gets a 415."""
    limit = limits.max_body_bytes
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
    if not body:
        raise ApiError(400, "empty request body: send a JSON object")
    content_type_header = request.headers.get("content-type", "")
    content_type = content_type_header.split(";")[0].strip().lower()
    try:
        if form and content_type == "application/x-www-form-urlencoded":
            return model.model_validate(_form_fields(_urlencoded_pairs(bytes(body)), model))
        if content_type == "multipart/form-data":
            if not form:
                raise ApiError(
                    415,
                    f"{request.url.path} takes application/json (got multipart/form-data)",
                )
            pairs = _multipart_pairs(bytes(body), content_type_header)
            return model.model_validate(_form_fields(pairs, model))
        return model.model_validate_json(bytes(body))
    except ValidationError as err:
        raise ApiError(400, _first_error(err.errors())) from None


def _urlencoded_pairs(body: bytes) -> list[tuple[str, str]]:
    """An ``application/x-www-form-urlencoded`` body's (name, value) pairs: the body and its
    %-escapes strict UTF-8 (raw bytes as ``curl -d`` sends them, or escaped)."""
    try:
        return urllib.parse.parse_qsl(
            body.decode("utf-8"), keep_blank_values=True, strict_parsing=True, errors="strict"
        )
    except UnicodeDecodeError as err:
        raise ApiError(400, f"the form body is not valid UTF-8: {err}") from None
    except ValueError as err:
        raise ApiError(400, f"the form body is not valid: {err}") from None


def _multipart_pairs(body: bytes, content_type_header: str) -> list[tuple[str, str]]:
    """A ``multipart/form-data`` body's text fields as (name, value) pairs, strict UTF-8 (what
    a browser's ``FormData`` sends); a file part is refused. The body is whole and within
    max_body_bytes already, so every field is too."""
    boundary = parse_options_header(content_type_header)[1].get(b"boundary")
    if not boundary:
        raise ApiError(400, "the multipart/form-data content type has no boundary")
    pairs: list[tuple[str, str]] = []
    part: dict = {}
    ended = []

    def header_field(data: bytes, start: int, end: int) -> None:
        part["field"] = part.get("field", b"") + data[start:end]

    def header_value(data: bytes, start: int, end: int) -> None:
        part["value"] = part.get("value", b"") + data[start:end]

    def header_end() -> None:
        name, value = part.pop("field", b"").lower(), part.pop("value", b"")
        if name == b"content-disposition":
            part["disposition"] = value

    def headers_finished() -> None:
        options = parse_options_header(part.get("disposition"))[1]
        if b"name" not in options:
            raise ApiError(400, "a multipart part has no Content-Disposition name")
        part["name"] = _utf8(options[b"name"], "a multipart field name")
        if b"filename" in options:
            raise ApiError(400, f"form field {part['name']!r} is a file; send text fields")

    def part_data(data: bytes, start: int, end: int) -> None:
        part["data"] = part.get("data", b"") + data[start:end]

    def part_end() -> None:
        name = part["name"]
        pairs.append((name, _utf8(part.get("data", b""), f"form field {name!r}")))
        part.clear()

    callbacks = {
        "on_header_field": header_field,
        "on_header_value": header_value,
        "on_header_end": header_end,
        "on_headers_finished": headers_finished,
        "on_part_data": part_data,
        "on_part_end": part_end,
        "on_end": lambda: ended.append(True),
    }
    try:
        parser = MultipartParser(boundary, callbacks)
        parser.write(body)
        parser.finalize()
    except FormParserError as err:
        raise ApiError(400, f"the multipart body is not valid: {err}") from None
    if not ended:
        raise ApiError(400, "the multipart body ends before its closing boundary")
    return pairs


def _utf8(raw: bytes, what: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ApiError(400, f"{what} is not valid UTF-8: {err}") from None


def _form_fields(pairs: list[tuple[str, str]], model: type[BaseModel]) -> dict:
    """A form's fields, each given once; integer fields of ``model`` parsed as integers."""
    fields: dict = {}
    for name, value in pairs:
        if name in fields:
            raise ApiError(400, f"form field {name!r} given twice")
        annotation = model.model_fields[name].annotation if name in model.model_fields else None
        if annotation is int:
            if not _FORM_INT.fullmatch(value):
                raise ApiError(
                    400, f"form field {name!r}: {value[:20]!r} is not an integer (-?[0-9]{{1,9}})"
                )
            fields[name] = int(value)
        else:
            fields[name] = value
    return fields


def _first_error(errors: list) -> str:
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


def _check_lines(lines: list[str], limits: Limits, field: str, engine: Engine) -> None:
    if len(lines) > limits.max_lines:
        raise ApiError(
            413, f"{field}: {len(lines)} lines exceed max_lines={limits.max_lines} per request"
        )
    for i, line in enumerate(lines):
        if len(line) > limits.max_chars:
            raise ApiError(
                413,
                f"{field}[{i}]: {len(line)} characters exceed max_chars={limits.max_chars} per line",
            )
    too_long = engine.too_long(lines)
    if too_long is not None:
        i, pieces = too_long
        raise ApiError(
            413,
            f"{field}[{i}]: {pieces} source pieces (with EOS) exceed the model's "
            f"max_len={engine.max_src_len}; split the line",
        )


def _decode_settings(engine: Engine, req: TranslateRequest, limits: Limits):
    beam = req.beam if req.beam is not None else min(engine.decode.beam_size, limits.max_beam)
    if not 1 <= beam <= limits.max_beam:
        raise ApiError(400, f"beam is {beam}; it must be between 1 and max_beam={limits.max_beam}")
    if not 1 <= req.nbest <= beam:
        raise ApiError(400, f"nbest is {req.nbest}; it must be between 1 and the beam ({beam})")
    len_penalty = engine.decode.len_penalty if req.len_penalty is None else req.len_penalty
    if not 0.0 <= len_penalty <= 10.0:
        raise ApiError(400, f"len_penalty is {len_penalty:g}; it must be between 0 and 10")
    decode = dataclasses.replace(
        engine.decode, beam_size=beam, nbest=req.nbest, len_penalty=len_penalty
    )
    try:
        validate_decode(decode)
    except MTError as err:
        raise ApiError(400, str(err)) from None
    return decode


async def _translate(
    batcher: Batcher,
    lines: list[str],
    decode,
    attention: bool,
    request: Request,
    target: str | None = None,
) -> list[LineResult]:
    """The decode worker's results, or an ApiError; a client that leaves stops the work."""
    try:
        gone = lambda: _left(request)  # noqa: E731 (a watcher started by the batcher)
        return await batcher.translate(lines, decode, attention, gone=gone, target=target)
    except ClientGone:  # nobody reads this answer
        raise ApiError(400, "the client closed the connection before its answer") from None
    except Busy as err:
        raise ApiError(503, f"server busy: {err}") from None
    except Closed as err:
        raise ApiError(503, str(err)) from None
    except MTError as err:
        raise ApiError(400, str(err)) from None
    except Exception as err:
        logger.exception("translation failed")
        raise ApiError(500, f"translation failed: {type(err).__name__}: {err}") from None


def _pairs(engine: Engine) -> list[tuple[str, str]]:
    return engine.pairs or [(engine.src_lang, engine.trg_lang)]


def _libre_target(engine: Engine, source: str, target: str) -> str | None:
    """The target a LibreTranslate request asks a multilingual model for (None for a model of
    one target), or a 400 naming the pairs the model has."""
    pairs = _pairs(engine)
    if not any(source in (src, "auto") and target == trg for src, trg in pairs):
        have = ", ".join(f"{src} -> {trg}" for src, trg in pairs)
        raise ApiError(
            400, f"this model translates {have}; got source {source!r} and target {target!r}"
        )
    return target if engine.lang_tags else None


def _v1_target(engine: Engine, target: str | None) -> str | None:
    """/v1/translate's ``target``: required where the model has several, checked against them."""
    try:
        engine.source_prefix(target)
    except MTError as err:
        raise ApiError(400, str(err).replace("--target-lang", "target")) from None
    return target if engine.lang_tags else None


async def _left(request: Request) -> None:
    """Return once the client has closed its connection. The body has been read: what the
    server says next is ``http.disconnect`` (uvicorn keeps reading the socket while this waits,
    so it sees the connection close; waiting costs nothing)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _number(x: float) -> float | None:
    return x if math.isfinite(x) else None  # JSON has no infinity


def _translations_body(results: list[LineResult]) -> bytes:
    """``{"translations": [...]}`` as JSON bytes (as starlette's JSONResponse encodes). Each
    ``json.dumps`` call holds the GIL throughout, so the attention weights are rounded and
    encoded row by row: run in a worker thread, it gives the event loop the GIL back every
    switch interval (5 ms), where a whole answer of 8 matrices of 400 x 400 holds it ~0.8 s."""
    return b'{"translations":[' + b",".join(_line_bytes(r) for r in results) + b"]}"


def _line_bytes(result: LineResult) -> bytes:
    out: dict = {
        "text": result.text,
        "score": _number(result.score),
        "nbest": [{"text": text, "score": _number(score)} for text, score in result.nbest],
    }
    if result.attention is None:
        return _json_bytes(out)
    out["attention"] = {"source": result.attention.source, "target": result.attention.target}
    head = _json_bytes(out)
    assert head.endswith(b"}}")  # "attention" is the last field, "weights" its last
    rows = [_json_bytes([_number(round(w, 6)) for w in row]) for row in result.attention.weights]
    return head[:-2] + b',"weights":[' + b",".join(rows) + b"]}}"


def _json_bytes(value) -> bytes:
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()


def _body_schema(model: type[BaseModel]) -> dict:
    """The request body as OpenAPI shows it (the handlers parse it themselves)."""
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": model.model_json_schema()}},
        }
    }


def serve(
    path: Path | str,
    *,
    engine: str = "torch",
    device: str = "cpu",
    host: str = "127.0.0.1",
    port: int = 8000,
    limits: Limits | None = None,
    batching: BatchSettings | None = None,
    access_log: bool = False,
    quantize: str | None = None,
    shutdown_timeout_s: float = SHUTDOWN_TIMEOUT_S,
) -> None:
    """Load the model and serve it until SIGINT/SIGTERM (requests in flight finish first, for at
    most ``shutdown_timeout_s``); ``quantize="int8"``: dynamic int8 linear layers (torch engine,
    CPU). The port is bound first: one in use is an MTError before the model loads."""
    check_engine(engine, path, quantize)  # a mistake in the options comes first
    sockets = bind_sockets(host, port)
    try:
        model = load_engine_off_main_thread(engine, path, device, quantize)
        app = create_app(model, limits, batching)
        port = sockets[0].getsockname()[1]  # the one the system chose for port 0
        where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        message = "loaded %s -> %s (%s engine); serving on http://%s (API docs at /docs)"
        logger.info(message, model.src_lang, model.trg_lang, model.name, where)
        _run_uvicorn(app, sockets, access_log, shutdown_timeout_s)
    finally:
        for sock in sockets:
            sock.close()


def bind_sockets(host: str, port: int) -> list[socket.socket]:
    """Sockets bound to ``port`` on each address of ``host`` (as asyncio's ``create_server``
    binds them, for uvicorn to listen on); an MTError naming host and port when one is in use,
    or ``host`` is not an address of this machine."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as err:
        raise MTError(f"--host {host}: not an address or a known name ({err.strerror})") from None
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:  # as asyncio: IPv6 only, "::" is not 0.0.0.0 too
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
    except OSError as err:
        for sock in sockets:
            sock.close()
        raise MTError(_bind_error(host, port, err)) from None
    return sockets


def _bind_error(host: str, port: int, err: OSError) -> str:
    """One line for a port that cannot be bound."""
    if err.errno == errno.EADDRINUSE:
        return (
            f"port {port} on {host} is in use (another `mt serve`, or another program); stop "
            "it or choose another --port"
        )
    if err.errno == errno.EACCES:
        return f"port {port} on {host} needs privileges here; choose a --port of 1024 or above"
    if err.errno == errno.EADDRNOTAVAIL:
        return f"--host {host} is not an address of this machine; use 127.0.0.1 or 0.0.0.0"
    return f"cannot listen on port {port} on {host}: {err.strerror or err}"


def _run_uvicorn(
    app: FastAPI, sockets: list[socket.socket], access_log: bool, shutdown_timeout_s: float
) -> None:
    """Serve ``app`` on the bound ``sockets`` until SIGINT/SIGTERM; the stop is logged once."""
    import uvicorn

    # uvicorn shuts down gracefully on SIGINT/SIGTERM, then raises the signal again for the
    # handler it found: a quiet one here, so that a requested stop ends with exit code 0.
    quiet = threading.current_thread() is threading.main_thread()
    stops = (signal.SIGINT, signal.SIGTERM)

    logged: list[str] = []  # uvicorn raises each signal it caught again: log the stop once

    def stopped(signum: int, _frame) -> None:
        if not logged:
            logged.append(signal.Signals(signum).name)
            _log_stop(logged[0], app.state.requests, shutdown_timeout_s)

    previous = {sig: signal.signal(sig, stopped) for sig in stops} if quiet else {}
    config = uvicorn.Config(
        app, access_log=access_log, log_level="info", timeout_graceful_shutdown=shutdown_timeout_s
    )
    try:
        uvicorn.Server(config).run(sockets=sockets)
    except KeyboardInterrupt:  # as uvicorn.run: a second Ctrl-C during the shutdown
        pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def load_engine_off_main_thread(
    engine: str, path: Path | str, device: str = "cpu", quantize: str | None = None
) -> Engine:
    """:func:`load_engine` in a thread that ends when it returns, so that the server's main
    thread never runs torch's parallel (OpenMP) work.

    Each thread that starts OpenMP work keeps a team of threads for as long as it lives. With two
    such teams (the main thread's, from loading the model, and the decode worker's) libgomp sees
    more of its threads than CPUs and stops spin-waiting between parallel regions: every small
    op of a search step then pays a futex wake-up (a 160 x 256 add, 2 threads: 3 us alone,
    14-57 us beside a second team), and decoding in the worker ran about 25 % slower than the
    same calls in a lone thread (docs/BENCHMARKS.md, "Serving: one OpenMP team"). Loaded here,
    the worker's team is the only one.
    """
    with ThreadPoolExecutor(1, thread_name_prefix="mt-load") as pool:  # its thread ends here
        return pool.submit(load_engine, engine, path, device, quantize).result()


def _log_stop(signal_name: str, counts: RequestCounts, shutdown_timeout_s: float) -> None:
    """What a stop did to the requests in flight (uvicorn has finished shutting down)."""
    if counts.unanswered:
        logger.warning(
            "stopped (%s); %d request(s) still in flight were cut off (after the shutdown "
            "timeout of %g s, or a second signal): those whose answer had not begun got a JSON "
            "503", signal_name, counts.unanswered, shutdown_timeout_s,
        )  # fmt: skip
    else:
        logger.info("stopped (%s); every request in flight was answered", signal_name)
