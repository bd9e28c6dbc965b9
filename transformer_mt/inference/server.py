"""`mt serve`: the model over HTTP (FastAPI + uvicorn), with a translation page at ``/``.

Endpoints:

- ``POST /translate``, LibreTranslate's shape: ``{"q": "text" | ["t1", ...], "source": "de",
  "target": "en"}`` -> ``{"translatedText": "..." | [...]}``; the languages must be the model's
  (``source`` may be "auto": ``detectedLanguage`` answers the model's); LibreTranslate's
  ``format`` ("text"), ``api_key`` and ``alternatives`` (the n-best's next) are accepted, as
  are form bodies; a text of several lines is translated line by line.
- ``POST /v1/translate``: ``{"text": [...], "beam": 4, "nbest": 1, "len_penalty": 1.0,
  "attention": false}`` -> ``{"translations": [{"text", "score", "nbest": [{"text", "score"}],
  "attention": {"source", "target", "weights"}}]}``, one per line, in order.
- ``GET /health``, ``GET /v1/model``, FastAPI's ``/docs`` and ``/openapi.json``; the page at
  ``/`` and ``/static/...`` (``inference/static/``).

Every refused request gets a 4xx JSON ``{"error": "<one line naming the limit or field>"}``:
the body is read and parsed here, not by FastAPI, so that invalid JSON, undecodable bytes, unknown
fields and every limit of :class:`Limits` get our one-line message. Decoding goes through one
:class:`~transformer_mt.inference.batcher.Batcher` worker (dynamic batching). On SIGTERM uvicorn
stops accepting, lets the requests in flight finish, and the worker drains before the process ends.
"""

import asyncio
import dataclasses
import logging
import math
import signal
import threading
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from transformer_mt.config import validate_decode
from transformer_mt.errors import MTError
from transformer_mt.inference.batcher import Batcher, BatchSettings, Busy, Closed
from transformer_mt.inference.engines import Engine, LineResult, load_engine

try:
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import FileResponse, JSONResponse
    from pydantic import BaseModel, ConfigDict, ValidationError
    from starlette.exceptions import HTTPException
    from starlette.requests import ClientDisconnect
    from starlette.staticfiles import StaticFiles
except ImportError as err:  # pragma: no cover - depends on the environment
    raise MTError(
        f"`mt serve` needs FastAPI and uvicorn ({err.name} is missing): "
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
# body (or never reads its answer) would keep the process alive for good. After this long the
# connections left are closed; the decode worker still answers what was submitted before exiting.
SHUTDOWN_TIMEOUT_S = 30


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


class TranslateRequest(_Strict):
    text: list[str]  # lines to translate; an empty line gives an empty translation
    beam: int | None = None  # default: the model's decode.beam_size
    nbest: int = 1  # hypotheses per line, 1..beam
    len_penalty: float | None = None  # GNMT alpha; default: the model's
    attention: bool = False  # return the cross-attention of each best translation


def create_app(
    engine: Engine, limits: Limits | None = None, batching: BatchSettings | None = None
) -> FastAPI:
    """The FastAPI app over ``engine``; its decode worker runs while the app's lifespan does."""
    limits = limits or Limits()
    batcher = Batcher(engine, batching, max_waiting=limits.max_waiting)

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
        if req.source not in (engine.src_lang, "auto") or req.target != engine.trg_lang:
            raise ApiError(
                400,
                f"this model translates {engine.src_lang} -> {engine.trg_lang}; "
                f"got source {req.source!r} and target {req.target!r}",
            )
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
        results = iter(await _translate(batcher, lines, decode, False))
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
        if req.source == "auto":  # one language in, as LibreTranslate reports a detection
            detected = {"language": engine.src_lang, "confidence": 100.0}
            reply["detectedLanguage"] = detected if one else [detected] * len(answers)
        return reply

    @app.post("/v1/translate", openapi_extra=_body_schema(TranslateRequest))
    async def translate(request: Request) -> dict:
        """Lines -> per line: text, score, n-best list, and on request the cross-attention."""
        req = await _read(request, TranslateRequest, limits)
        _check_lines(req.text, limits, "text", engine)
        decode = _decode_settings(engine, req, limits)
        results = await _translate(batcher, req.text, decode, req.attention)
        return {"translations": [_line_json(r) for r in results]}

    @app.get("/health")
    async def health() -> dict:
        """Alive; with the decode worker's counters: engine calls and the requests they carried
        (their ratio is the mean batch, in requests)."""
        return {"status": "ok", "batches": batcher.batches, "requests": batcher.requests}

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
    body is read too (LibreTranslate's clients send one), its fields as JSON's."""
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
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    try:
        if form and content_type == "application/x-www-form-urlencoded":
            return model.model_validate(_form_fields(bytes(body), model))
        return model.model_validate_json(bytes(body))
    except ValidationError as err:
        raise ApiError(400, _first_error(err.errors())) from None


def _form_fields(body: bytes, model: type[BaseModel]) -> dict:
    """A form body's fields, each given once; integer fields of ``model`` parsed as integers."""
    try:
        pairs = urllib.parse.parse_qsl(
            body.decode("ascii"), keep_blank_values=True, strict_parsing=True, errors="strict"
        )
    except (UnicodeDecodeError, ValueError) as err:
        raise ApiError(400, f"the form body is not valid: {err}") from None
    fields: dict = {}
    for name, value in pairs:
        if name in fields:
            raise ApiError(400, f"form field {name!r} given twice")
        annotation = model.model_fields[name].annotation if name in model.model_fields else None
        if annotation is int:
            if not value.lstrip("-").isdigit():
                raise ApiError(400, f"form field {name!r}: {value!r} is not an integer")
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


async def _translate(batcher: Batcher, lines: list[str], decode, attention: bool):
    try:
        return await batcher.translate(lines, decode, attention)
    except Busy as err:
        raise ApiError(503, f"server busy: {err}") from None
    except Closed as err:
        raise ApiError(503, str(err)) from None
    except MTError as err:
        raise ApiError(400, str(err)) from None
    except Exception as err:
        logger.exception("translation failed")
        raise ApiError(500, f"translation failed: {type(err).__name__}: {err}") from None


def _number(x: float) -> float | None:
    return x if math.isfinite(x) else None  # JSON has no infinity


def _line_json(result: LineResult) -> dict:
    out = {
        "text": result.text,
        "score": _number(result.score),
        "nbest": [{"text": text, "score": _number(score)} for text, score in result.nbest],
    }
    if result.attention is not None:
        out["attention"] = {
            "source": result.attention.source,
            "target": result.attention.target,
            "weights": [[round(w, 6) for w in row] for row in result.attention.weights],
        }
    return out


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
) -> None:
    """Load the model and serve it until SIGINT/SIGTERM (requests in flight finish first);
    ``quantize="int8"``: dynamic int8 linear layers (torch engine, CPU)."""
    import uvicorn

    model = load_engine_off_main_thread(engine, path, device, quantize)
    app = create_app(model, limits, batching)
    logger.info(
        "loaded %s -> %s (%s engine); serving on http://%s:%d (API docs at /docs)",
        model.src_lang, model.trg_lang, model.name, host, port,
    )  # fmt: skip
    # uvicorn shuts down gracefully on SIGINT/SIGTERM, then raises the signal again for the
    # handler it found: a quiet one here, so that a requested stop ends with exit code 0.
    quiet = threading.current_thread() is threading.main_thread()
    stops = (signal.SIGINT, signal.SIGTERM)
    previous = {sig: signal.signal(sig, _stopped) for sig in stops} if quiet else {}
    try:
        uvicorn.run(
            app,
            host=host,
            port=port,
            access_log=access_log,
            log_level="info",
            timeout_graceful_shutdown=SHUTDOWN_TIMEOUT_S,
        )
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


def _stopped(signum: int, _frame) -> None:
    logger.info("stopped (%s); every request in flight was answered", signal.Signals(signum).name)
