"""Our own API: translation with n-best and attention, the model, health.

Our own API: ``POST /v1/translate`` (n-best, scores, attention), ``GET /v1/model``,
``GET /health``, the translation page at ``/``, and what a load balancer and a monitoring
system ask: ``GET /health/live``, ``GET /health/ready`` and ``GET /metrics`` (these three answer
from the start, before the model is loaded).

``POST /v1/translate``: ``{"text": [...], "beam": 4, "nbest": 1, "len_penalty": 1.0,
"attention": false}`` -> ``{"translations": [{"text", "score", "confidence", "nbest": [{"text",
"score", "confidence"}], "attention": {"source", "target", "weights"}}]}``, one per line, in
order; ``confidence`` (the geometric mean of the pieces' probabilities, in percent:
:meth:`LineResult.confidences`) where the engine gives it and the line was decoded. An answer with
attention (up to max_lines matrices) is rounded and encoded in a worker thread of starlette's
pool (plain Python, no torch), not on the event loop.
"""

import dataclasses
import math
import os
from pathlib import Path

from fastapi import APIRouter, Depends, Request
from fastapi.responses import FileResponse, JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from transformer_mt.config import DecodeConfig
from transformer_mt.engines.engine import Engine
from transformer_mt.engines.results import LineResult
from transformer_mt.errors import MTError
from transformer_mt.serve.forms import Strict, body_schema, json_bytes, read_json
from transformer_mt.serve.metrics import CONTENT_TYPE
from transformer_mt.serve.settings import ApiError, Limits
from transformer_mt.serve.state import (
    ProcessState,
    ServerState,
    check_lines,
    decode_lines,
    process_state,
    request_decode,
    server_state,
)

STATIC_DIR = Path(__file__).resolve().parent / "static"

router = APIRouter()


class TranslateRequest(Strict):
    """``POST /v1/translate``'s body."""

    text: list[str]  # lines to translate; an empty line gives an empty translation
    beam: int | None = None  # default: the model's decode.beam_size
    nbest: int = 1  # hypotheses per line, 1..beam
    len_penalty: float | None = None  # GNMT alpha; default: the model's
    attention: bool = False  # return the cross-attention of each best translation
    target: str | None = None  # the language to translate into (a multilingual model needs it)
    api_key: str | None = None  # where the server has keys (`mt serve --api-keys`)


@router.post("/v1/translate", openapi_extra=body_schema(TranslateRequest))
async def translate(request: Request, state: ServerState = Depends(server_state)) -> Response:
    """Lines -> per line: text, score, n-best list, and on request the cross-attention."""
    req = await read_json(request, TranslateRequest, state.limits)
    check_lines(req.text, state.limits, "text", state.engine)
    decode = _decode_settings(state.engine, req, state.limits)
    target = _target(state.engine, req.target)
    state.check_access(request, req.api_key, ["\n".join(req.text)])
    results = await decode_lines(state, request, req.text, decode, req.attention, target)
    if req.attention:  # up to max_lines matrices of floats: not on the event loop
        body = await run_in_threadpool(translations_body, results)
    else:
        body = translations_body(results)
    return Response(body, media_type="application/json")


@router.get("/health")
async def health(state: ServerState = Depends(server_state)) -> dict:
    """Alive and loaded, with the decode worker's counters.

    Alive and loaded (a 503 while the model loads; a load balancer has /health/live and
    /health/ready), with this process's decode worker's counters: engine calls and the
    requests they carried (their ratio is the mean batch, in requests), the requests whose
    client left before their answer and the lines that were not decoded for that."""
    batcher = state.batcher
    return {
        "status": "ok",
        "batches": batcher.batches,
        "requests": batcher.requests,
        "abandoned": batcher.abandoned,
        "lines_not_decoded": batcher.lines_not_decoded,
    }


@router.get("/health/live")
async def live(request: Request) -> JSONResponse:
    """Liveness: whether this process answers and its decode worker runs.

    Liveness: 200 while this process answers and its decode worker (once the model is
    loaded) runs; a 503 means it should be restarted."""
    state: ServerState | None = request.app.state.server
    if state is not None and not state.batcher.alive:
        return JSONResponse({"status": "dead", "error": "the decode worker has stopped"}, 503)
    return JSONResponse({"status": "alive"})


@router.get("/health/ready")
async def ready(process: ProcessState = Depends(process_state)) -> JSONResponse:
    """Readiness: whether every worker has its model loaded and none drains.

    Readiness: 200 when every worker process has its model loaded; a 503 while one loads,
    and from the moment the server is told to stop (draining). The same answer from each
    worker of `mt serve --workers N`."""
    readiness = process.readiness
    status = readiness.status
    body = {
        "status": status,
        "workers": readiness.workers,
        "workers_ready": readiness.workers_ready,
        "worker": process.worker,
        "pid": os.getpid(),
    }
    return JSONResponse(body, 200 if status == "ready" else 503)


@router.get("/metrics")
async def metrics(process: ProcessState = Depends(process_state)) -> Response:
    """The server's metrics in Prometheus's text format (of all its worker processes)."""
    return Response(process.metrics.scrape(), media_type=CONTENT_TYPE)


@router.get("/v1/model")
async def model_info(state: ServerState = Depends(server_state)) -> dict:
    """Languages, vocabulary, model shape, training step, validation BLEU, engine, limits."""
    batcher = state.batcher
    return {
        **state.engine.describe(),
        "limits": dataclasses.asdict(state.limits),
        "batching": {
            "enabled": batcher.settings.enabled,
            "continuous": batcher.continuous,
            "window_ms": batcher.settings.window_s * 1000,
            "max_wait_ms": batcher.settings.max_wait_s * 1000,
            "max_tokens": batcher.max_tokens,
        },
    }


@router.get("/", include_in_schema=False)
async def page() -> FileResponse:
    """The translation page (``serve/static/index.html``)."""
    index = STATIC_DIR / "index.html"
    if not index.is_file():
        raise ApiError(404, "no translation page is installed (serve/static/index.html)")
    return FileResponse(index)


# How /v1/translate's fields name the decode settings in its errors.
REQUEST_NAMES = {"beam_size": "beam", "nbest": "nbest", "len_penalty": "len_penalty"}


def _decode_settings(engine: Engine, req: TranslateRequest, limits: Limits) -> DecodeConfig:
    """The model's decode settings with the request's beam, n-best and length penalty.

    Checked as `mt translate` checks its options, and the beam against the server's max_beam.
    """
    overrides = {"beam_size": req.beam, "nbest": req.nbest, "len_penalty": req.len_penalty}
    return request_decode(engine.decode, overrides, limits, REQUEST_NAMES)


def _target(engine: Engine, target: str | None) -> str | None:
    """``target``: required where the model has several, checked against them."""
    try:
        engine.source_prefix(target, name="target")
    except MTError as err:
        raise ApiError(400, str(err)) from None
    return target if engine.lang_tags else None


def _number(x: float) -> float | None:
    return x if math.isfinite(x) else None  # JSON has no infinity


def translations_body(results: list[LineResult]) -> bytes:
    """``{"translations": [...]}`` as JSON bytes, encoded row by row.

    The bytes are those starlette's JSONResponse encodes. Each ``json.dumps`` call holds the GIL
    throughout, so the attention weights are rounded and encoded row by row: run in a worker
    thread, it gives the event loop the GIL back every switch interval (5 ms), where a whole answer
    of 8 matrices of 400 x 400 holds it ~0.8 s."""
    return b'{"translations":[' + b",".join(_line_bytes(r) for r in results) + b"]}"


def _line_bytes(result: LineResult) -> bytes:
    out: dict = {
        "text": result.text,
        "score": _number(result.score),
        "nbest": [{"text": text, "score": _number(score)} for text, score in result.nbest],
    }
    confidences = result.confidences()  # none for a line not decoded
    if confidences is not None:
        out["confidence"] = confidences[0]
        for entry, confidence in zip(out["nbest"], confidences, strict=True):
            entry["confidence"] = confidence
    if result.attention is None:
        return json_bytes(out)
    out["attention"] = {"source": result.attention.source, "target": result.attention.target}
    head = json_bytes(out)
    assert head.endswith(b"}}")  # "attention" is the last field, "weights" its last
    rows = [json_bytes([_number(round(w, 6)) for w in row]) for row in result.attention.weights]
    return head[:-2] + b',"weights":[' + b",".join(rows) + b"]}}"
