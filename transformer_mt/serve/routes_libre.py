"""LibreTranslate's API, answered as LibreTranslate answers it.

``POST /translate``,
``GET /languages``, ``POST /detect``, ``GET /frontend/settings``, ``POST /suggest``, ``GET
/spec`` (files: :mod:`~transformer_mt.serve.routes_files`).

``POST /translate``: ``{"q": "text" | ["t1", ...], "source": "de" | "auto", "target": "en",
"format": "text" | "html", "alternatives": 0, "api_key": "..."}`` -> ``{"translatedText": ...,
"alternatives": ..., "detectedLanguage": ...}``, its fields from JSON, a form body (urlencoded
or multipart) or the query string. A text of several lines is translated line by line; a line
with nothing to translate (emoji, punctuation, numbers, a URL) comes back unchanged, undecoded.
``format: "html"``: the fragment's text is translated sentence by sentence, as plain text is, and
its markup kept (:mod:`~transformer_mt.documents.document`; the sentences' attention, joined,
places inline markup). Refusals carry LibreTranslate's error text first
("Invalid request: missing q parameter", "zz is not supported", ...), ours after it.
"""

from fastapi import APIRouter, Depends, Request

from transformer_mt.documents.document import FILE_FORMATS, html_segments, render_html
from transformer_mt.engines.options import TranslateExtras
from transformer_mt.engines.paragraphs import line_languages, split_lines
from transformer_mt.errors import MTError
from transformer_mt.serve.forms import (
    FORM,
    MULTIPART,
    Strict,
    body_schema,
    content_type,
    read_fields,
)
from transformer_mt.serve.languages import is_toy, language_name
from transformer_mt.serve.settings import ApiError
from transformer_mt.serve.state import (
    INLINE_PARSE_CHARS,
    ServerState,
    check_constrainable,
    check_languages,
    check_lines,
    decode_lines,
    decode_segments,
    document_limits,
    parse,
    request_decode,
    request_glossary,
    segment_languages,
    server_state,
)
from transformer_mt.text.content import has_text
from transformer_mt.text.detect import Detection
from transformer_mt.text.detect import detect as detect_language

router = APIRouter()

# Plain texts up to this many characters are split on the event loop (linear: about 4 ms for
# 64 KB of Multi30k German on one core); longer ones in a parsing process, whose one slot by
# default would otherwise queue every pasted article behind the others.
INLINE_SPLIT_CHARS = 65_536
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
    # Ours: a glossary's name (`mt serve --glossary NAME=FILE`) or {"source term": "target"}.
    glossary: str | dict[str, str] | None = None
    # Ours: URLs, e-mail addresses, numbers, `code` and <keep>marked</keep> text come back as
    # they are (constraints of the search: the torch engine, a beam of 2 or more).
    protect: bool = False
    # Ours: the model's confidence in each translation (and alternative), plain text only:
    # the geometric mean of its pieces' probabilities, in percent (LineResult.confidences)
    confidence: bool = False


class DetectRequest(Strict):
    """``POST /detect``'s fields."""

    q: str | None = None  # the text: which of the model's source languages it is in
    api_key: str | None = None


@router.post("/translate", openapi_extra=body_schema(LibreRequest))
async def libre_translate(request: Request, state: ServerState = Depends(server_state)) -> dict:
    """LibreTranslate's endpoint: ``{"q", "source", "target"}`` -> ``{"translatedText"}``."""
    req = await read_fields(request, LibreRequest, state.limits)
    texts = _checked(req, state)
    state.check_access(request, req.api_key, texts)
    target = req.target if state.engine.lang_tags else None
    confidences = None
    if req.format == "html":
        html = await _translate_html(state, request, req, texts, target)
        translated, alternatives = html, None
    else:
        translated, alternatives, confidences = await _translate_texts(
            state, request, req, texts, target
        )
    reply: dict = {"translatedText": translated}
    if req.alternatives > 0:
        reply["alternatives"] = alternatives or [[] for _ in texts]
    if req.confidence and confidences is not None:
        reply["confidence"] = [each[0] if each else None for each in confidences]
        if req.alternatives > 0:
            reply["alternativesConfidence"] = [each[1:] if each else [] for each in confidences]
    if req.source == "auto":  # the best of the model's sources, as LibreTranslate reports it
        reply["detectedLanguage"] = [_detected(state, text)[0] for text in texts]
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
            f"Invalid request: alternatives parameter must be <= {most}",
            detail=f"the server's max_beam ({most + 1}) - 1",
        )
    check_languages(state, req.source, req.target)
    if (req.format or "text") not in ("text", "html"):
        raise ApiError(400, f"{req.format} format is not supported", detail="text or html")
    return [req.q] if isinstance(req.q, str) else req.q


def _missing(name: str) -> ApiError:
    """LibreTranslate's refusal of a request without the field ``name``."""
    return ApiError(400, f"Invalid request: missing {name} parameter")


async def _translate_texts(
    state: ServerState, request: Request, req: LibreRequest, texts: list[str], target: str | None
) -> tuple[list[str], list[list[str]], list[list[float] | None]]:
    """Plain texts, sentence by sentence: per text its translation, alternatives, confidences.

    Each text is cut into sentences (by the rules of ``source``, or of each text's detected
    language for "auto"), the sentences of all texts are decoded together and joined back with
    each text's own spaces and line breaks (:mod:`~transformer_mt.engines.paragraphs`; a JSON
    text's byte for byte, a form's with its CRLF line breaks, which browsers send, as LF).
    Sentences with nothing to translate are kept as they are (never decoded:
    :func:`decode_lines`), and a text of such sentences alone has no alternatives. Texts whose
    sentences could not fit the request limits are refused before they are split
    (:func:`_check_size`), and split in a parsing process where they are over
    :data:`INLINE_SPLIT_CHARS` (:func:`parse`): never for long on the event loop.
    """
    if content_type(request) in (FORM, MULTIPART):  # a browser sends a textarea's breaks as CRLF
        texts = [text.replace("\r\n", "\n") for text in texts]
    _check_size(texts, state)
    languages = line_languages(state.engine, texts, req.source)
    here = sum(len(text) for text in texts) <= INLINE_SPLIT_CHARS
    paragraphs = await parse(state, split_lines, texts, languages, req.protect, here=here)
    lines = paragraphs.sentences
    check_lines(lines, state.limits, "q sentences", state.engine)
    glossary = request_glossary(state, req.glossary)
    check_constrainable(state, "protect" if req.protect else "glossary" if glossary else None)
    terms = [glossary.targets(line) for line in lines] if glossary is not None else None
    if req.protect:
        lines, extras = TranslateExtras(glossary=glossary, protect=True).constrained(lines)
        terms = [list(line_terms) for line_terms in extras.terms or []]
    nbest = 1 + max(0, req.alternatives)
    # The model's decode settings, its beam capped by max_beam as /v1/translate caps it, and
    # widened to give the alternatives asked for.
    beam = max(min(state.engine.decode.beam_size, state.limits.max_beam), nbest)
    decode = request_decode(
        state.engine.decode, {"beam_size": beam, "nbest": nbest}, state.limits, LIBRE_NAMES
    )
    results = await decode_lines(state, request, lines, decode, False, target, terms)
    joined = paragraphs.join(results, nbest, outer=True)
    translated, alternatives, confidences = [], [], []
    for split, result in zip(paragraphs.splits, joined, strict=True):
        translated.append(result.text)
        untranslated = not any(has_text(sentence) for sentence in split.sentences)
        alternatives.append([] if untranslated else [text for text, _ in result.nbest[1:]])
        confidences.append(result.confidences())
    return translated, alternatives, confidences


def _check_size(texts: list[str], state: ServerState) -> None:
    """A 413 where ``texts`` are too long for any split to fit the request limits.

    That is, more characters besides whitespace than max_lines sentences of max_chars could hold:
    their sentences would exceed one of the two (:func:`check_lines`), and splitting them first
    would be time lost."""
    limits = state.limits
    most = limits.max_lines * limits.max_chars
    size = sum(len(word) for text in texts for word in text.split())  # one pass, in C
    if size > most:
        raise ApiError(
            413,
            f"q: {size} characters besides whitespace exceed max_lines={limits.max_lines} "
            f"sentences of max_chars={limits.max_chars} per request",
        )


def _detected(state: ServerState, text: str) -> list[dict]:
    """LibreTranslate's detections of ``text`` among the model's source languages, best first.

    Text too short or ambiguous to tell, or in a language the model does not translate from,
    gets the model's first source language with confidence 0."""
    sources = list(dict.fromkeys(src for src, _ in state.engine.pairs))
    try:
        found = detect_language(text, sources, sources[0])
    except MTError:  # the detector is not installed (the text extra): no reason to choose
        found = [Detection(sources[0], 0.0)]
    return [{"language": d.language, "confidence": d.confidence} for d in found]


async def _translate_html(
    state: ServerState, request: Request, req: LibreRequest, texts: list[str], target: str | None
) -> list[str]:
    """HTML fragments translated sentence by sentence, their markup kept.

    Each fragment's segments (its blocks of text) are cut into sentences (by the rules of
    ``source``, or of each fragment's detected language for "auto"), the sentences of all
    fragments are decoded together with their attention, and each segment is joined back from
    its sentences' translations and attention, which places its inline markup
    (:func:`decode_segments`, as ``mt translate`` translates a document). Parsed, split, joined
    (and, translated, parsed again and written) in a parsing process where they are not small
    (:func:`parse`): never for long on the event loop; a fragment stops being read past
    max_lines segments, and the sentences count against the request limits. A glossary holds
    in every sentence, as in plain text; ``protect`` is plain text's (HTML marks what it keeps
    with ``translate="no"``)."""
    if req.protect:
        raise ApiError(
            400,
            "Invalid request: protect is for plain text (format: text)",
            detail='in HTML, mark the spans to keep with translate="no" (or <code>)',
        )
    glossary = request_glossary(state, req.glossary)
    check_constrainable(state, "glossary" if glossary else None)
    most = state.limits.max_lines
    why = {"max_segments": f"max_lines={most} per request: mt serve --max-lines"}
    limits = document_limits(why, max_segments=most)
    here = sum(len(text) for text in texts) <= INLINE_PARSE_CHARS
    found = await parse(state, html_segments, texts, limits, "q", here=here)
    segments = [segment for text in found for segment in text]
    languages = segment_languages(state.engine, found, req.source)
    decode = request_decode(state.engine.decode, {}, state.limits, LIBRE_NAMES)
    results = await decode_segments(
        state, request, segments, languages, decode, target, "q sentences", here, glossary
    )
    grouped, start = [], 0
    for text in found:
        grouped.append(results[start : start + len(text)])
        start += len(text)
    return await parse(state, render_html, texts, limits, "q", grouped, here=here)


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
    toy = is_toy(state.engine.pairs)
    return [
        {"code": code, "name": language_name(code, toy), "targets": to}
        for code, to in targets.items()
    ]


@router.post("/detect", openapi_extra=body_schema(DetectRequest))
async def detect(request: Request, state: ServerState = Depends(server_state)) -> list:
    """LibreTranslate's language detection, among the languages the model translates from."""
    req = await read_fields(request, DetectRequest, state.limits)
    if not req.q:
        raise _missing("q")
    state.check_access(request, req.api_key, [req.q])
    return _detected(state, req.q)


@router.get("/frontend/settings")
async def frontend_settings(state: ServerState = Depends(server_state)) -> dict:
    """What LibreTranslate's page and clients read first: limits, keys, files, languages."""
    access, files = state.settings.access, state.files
    source, target = state.engine.pairs[0]
    toy = is_toy(state.engine.pairs)
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
