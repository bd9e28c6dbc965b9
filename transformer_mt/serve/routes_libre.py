"""LibreTranslate's API, answered as LibreTranslate answers it.

``POST /translate``,
``GET /languages``, ``POST /detect``, ``GET /frontend/settings``, ``POST /suggest``, ``GET
/spec`` (files: :mod:`~transformer_mt.serve.routes_files`).

``POST /translate``: ``{"q": "text" | ["t1", ...], "source": "de" | "auto", "target": "en",
"format": "text" | "html", "alternatives": 0, "api_key": "..."}`` -> ``{"translatedText": ...,
"alternatives": ..., "detectedLanguage": ...}``, its fields from JSON, a form body (urlencoded
or multipart) or the query string. A text of several lines is translated line by line; a line
with nothing to translate (emoji, punctuation, numbers, a URL) comes back unchanged, undecoded.
``format: "html"``: the fragment's text is translated and its markup kept
(:mod:`~transformer_mt.documents.document`). Refusals carry LibreTranslate's error text first
("Invalid request: missing q parameter", "zz is not supported", ...), ours after it.
"""

import langcodes
from fastapi import APIRouter, Depends, Request

from transformer_mt.data.toy import TOY_LANGUAGE_NAMES
from transformer_mt.documents.document import FILE_FORMATS, html_document
from transformer_mt.errors import MTError
from transformer_mt.serve.forms import Strict, body_schema, read_fields
from transformer_mt.serve.settings import ApiError
from transformer_mt.serve.state import (
    ServerState,
    check_languages,
    check_lines,
    decode_lines,
    request_decode,
    server_state,
)
from transformer_mt.text.content import has_text

router = APIRouter()

# How LibreTranslate's fields name the decode settings in its errors.
LIBRE_NAMES = {"beam_size": "beam (alternatives + 1 at least)", "nbest": "alternatives + 1"}


class LibreRequest(Strict):
    """``POST /translate``'s fields.

    Each is optional here: a missing one gets LibreTranslate's "Invalid request: missing ...
    parameter"."""

    q: str | list[str] | None = None  # one text, or several
    source: str | None = None  # one of the model's source languages, or "auto"
    target: str | None = None  # one of the model's target languages
    format: str | None = None  # "text" (the default) or "html"
    alternatives: int = 0  # this many more translations (the n-best's next), plain text only
    api_key: str | None = None  # where the server has keys (`mt serve --api-keys`)


class DetectRequest(Strict):
    """``POST /detect``'s fields."""

    q: str | None = None  # the answer is the model's source language whatever it says
    api_key: str | None = None


@router.post("/translate", openapi_extra=body_schema(LibreRequest))
async def libre_translate(request: Request, state: ServerState = Depends(server_state)) -> dict:
    """LibreTranslate's endpoint: ``{"q", "source", "target"}`` -> ``{"translatedText"}``."""
    req = await read_fields(request, LibreRequest, state.limits)
    texts = _checked(req, state)
    state.check_access(request, req.api_key, texts)
    target = req.target if state.engine.lang_tags else None
    if req.format == "html":
        translated, alternatives = await _translate_html(state, request, texts, target), None
    else:
        translated, alternatives = await _translate_texts(state, request, req, texts, target)
    reply: dict = {"translatedText": translated}
    if req.alternatives > 0:
        reply["alternatives"] = alternatives or [[] for _ in texts]
    if req.source == "auto":  # a source the model knows, as LibreTranslate reports one
        source = next(src for src, trg in state.engine.pairs if trg == req.target)
        translatable = any(has_text(line) for text in texts for line in text.split("\n"))
        detected = {"language": source, "confidence": 100.0 if translatable else 0.0}
        reply["detectedLanguage"] = [detected] * len(texts)
    if isinstance(req.q, str):  # one text: one answer, not a list
        reply = {key: value[0] for key, value in reply.items()}
    return reply


def _checked(req: LibreRequest, state: ServerState) -> list[str]:
    """The request's texts, after LibreTranslate's checks in its order.

    The fields present,
    alternatives within bounds, languages the model has, a format it knows."""
    if not req.q:  # absent, "" or [] (an empty batch)
        raise _missing("q")
    if not req.source:
        raise _missing("source")
    if not req.target:
        raise _missing("target")
    most = state.limits.max_beam - 1
    if req.alternatives > most:
        raise ApiError(
            400,
            f"Invalid request: alternatives parameter must be <= {most} (max_beam - 1 here)",
        )
    check_languages(state, req.source, req.target)
    if (req.format or "text") not in ("text", "html"):
        raise ApiError(400, f"{req.format} format is not supported (text or html)")
    return [req.q] if isinstance(req.q, str) else req.q


def _missing(name: str) -> ApiError:
    """LibreTranslate's refusal of a request without the field ``name``."""
    return ApiError(400, f"Invalid request: missing {name} parameter")


async def _translate_texts(
    state: ServerState, request: Request, req: LibreRequest, texts: list[str], target
) -> tuple[list[str], list[list[str]]]:
    """Plain texts, line by line: per text its translation and its alternatives.

    Lines with nothing to translate are kept as they are (never decoded: :func:`decode_lines`),
    and a text of such lines alone has no alternatives.
    """
    split = [text.split("\n") for text in texts]
    lines = [line.removesuffix("\r") for text in split for line in text]
    check_lines(lines, state.limits, "q lines", state.engine)
    nbest = 1 + max(0, req.alternatives)
    # The model's decode settings, its beam capped by max_beam as /v1/translate caps it, and
    # widened to give the alternatives asked for.
    beam = max(min(state.engine.decode.beam_size, state.limits.max_beam), nbest)
    decode = request_decode(
        state.engine.decode, {"beam_size": beam, "nbest": nbest}, state.limits, LIBRE_NAMES
    )
    results = await decode_lines(state, request, lines, decode, False, target)
    kept = [not has_text(line) for line in lines]
    per_line = [
        [line] * nbest if keep else [t for t, _ in r.nbest] + [""] * (nbest - len(r.nbest))
        for line, keep, r in zip(lines, kept, results, strict=True)
    ]
    rows, flags = iter(per_line), iter(kept)
    translated, alternatives = [], []
    for text in split:
        hyps = [next(rows) for _ in text]
        untranslated = all([next(flags) for _ in text])
        joined = ["\n".join(h[k] for h in hyps) for k in range(nbest)]
        translated.append(joined[0])
        alternatives.append([] if untranslated else joined[1:])
    return translated, alternatives


async def _translate_html(
    state: ServerState, request: Request, texts: list[str], target
) -> list[str]:
    """HTML fragments translated, their markup kept.

    HTML fragments: their text translated (with attention, which places inline markup),
    their markup kept."""
    try:
        documents = [html_document(text) for text in texts]
    except MTError as err:
        raise ApiError(400, str(err)) from None
    segments = [segment for doc in documents for segment in doc.segments]
    check_lines(segments, state.limits, "q segments", state.engine)
    decode = request_decode(state.engine.decode, {}, state.limits, LIBRE_NAMES)
    results = await decode_lines(state, request, segments, decode, True, target)
    out, start = [], 0
    for doc in documents:
        end = start + len(doc.segments)
        out.append(doc.render(results[start:end]).decode("utf-8"))
        start = end
    return out


@router.get("/languages")
async def languages(state: ServerState = Depends(server_state)) -> list:
    """LibreTranslate's list of the model's languages.

    LibreTranslate's: every language of the model's pairs, its English name (langcodes)
    and, per source language, its targets."""
    targets: dict[str, list[str]] = {}
    for src, trg in state.engine.pairs:
        targets.setdefault(src, []).append(trg)
    for _, trg in state.engine.pairs:  # a client checks both ends against this list
        targets.setdefault(trg, [])
    toy = _is_toy(state.engine.pairs)
    return [
        {"code": code, "name": language_name(code, toy), "targets": to}
        for code, to in targets.items()
    ]


def _is_toy(pairs: list[tuple[str, str]]) -> bool:
    """Whether every language of ``pairs`` is one of the built-in toy corpus's."""
    return all(lang in TOY_LANGUAGE_NAMES for pair in pairs for lang in pair)


def language_name(code: str, toy: bool = False) -> str:
    """A language code's English name ("de" -> "German"), or the code where langcodes knows none.

    ``toy``: the model speaks the built-in toy corpus's languages, named as the toy names them."""
    if toy and code in TOY_LANGUAGE_NAMES:
        return TOY_LANGUAGE_NAMES[code]
    try:
        language = langcodes.Language.get(code)
    except (langcodes.LanguageTagError, ValueError):
        return code
    return language.display_name() if language.is_valid() else code


@router.post("/detect", openapi_extra=body_schema(DetectRequest))
async def detect(request: Request, state: ServerState = Depends(server_state)) -> list:
    """LibreTranslate's language detection: the model knows one source language."""
    req = await read_fields(request, DetectRequest, state.limits)
    if not req.q:
        raise _missing("q")
    state.check_access(request, req.api_key, [req.q])
    return [{"language": state.engine.src_lang, "confidence": 100.0}]


@router.get("/frontend/settings")
async def frontend_settings(state: ServerState = Depends(server_state)) -> dict:
    """What LibreTranslate's page and clients read first: limits, keys, files, languages."""
    access, files = state.settings.access, state.files
    source, target = state.engine.pairs[0]
    toy = _is_toy(state.engine.pairs)
    return {
        "charLimit": access.char_limit or -1,
        "frontendTimeout": state.settings.frontend_timeout_ms,
        "apiKeys": access.api_keys is not None,
        "keyRequired": access.require_api_key,
        "suggestions": False,
        "filesTranslation": files is not None,
        "supportedFilesFormat": list(FILE_FORMATS) if files is not None else [],
        "language": {
            "source": {"code": source, "name": language_name(source, toy)},
            "target": {"code": target, "name": language_name(target, toy)},
        },
    }


@router.post("/suggest")
async def suggest() -> dict:
    """LibreTranslate's suggestions: off here, as its servers answer by default."""
    raise ApiError(403, "Suggestions are disabled on this server.")


@router.get("/spec", include_in_schema=False)
async def spec(request: Request) -> dict:
    """The OpenAPI description (LibreTranslate serves its own at /spec)."""
    return request.app.openapi()
