"""`mt serve`: the HTTP API's contracts, its limits (each a 4xx JSON error, the server serving on),
dynamic batching (32 concurrent requests get what `mt translate` gives), clients that leave before
their answer (their work stops), a port in use, and SIGTERM with requests in flight. Servers
listen on 127.0.0.1 only, on a free port.

Skipped where FastAPI / uvicorn / httpx are missing (`make test` installs the `serve` extra).
"""

import dataclasses
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the serve extra is not installed")
uvicorn = pytest.importorskip("uvicorn", reason="the serve extra is not installed")
httpx = pytest.importorskip("httpx", reason="the serve extra is not installed")

import typer  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from transformer_mt.cli import app as cli_app  # noqa: E402
from transformer_mt.config import DecodeConfig  # noqa: E402
from transformer_mt.engines.engine import Engine  # noqa: E402
from transformer_mt.engines.results import Attention, DecodeStopped, LineResult  # noqa: E402
from transformer_mt.engines.torch_engine import TorchEngine  # noqa: E402
from transformer_mt.errors import MTError  # noqa: E402
from transformer_mt.serve import settings as serve_settings  # noqa: E402
from transformer_mt.serve.app import Limits, create_app  # noqa: E402
from transformer_mt.serve.batcher import Batcher, BatchSettings  # noqa: E402

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "old_checkpoint"
CKPT = FIXTURE / "old_last.pt"
LIMITS = Limits(max_body_bytes=8192, max_lines=8, max_chars=300, max_beam=6)


@contextmanager
def running(app):
    """``app`` on a real uvicorn in a thread, on a free loopback port; yields its base URL."""
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", access_log=False)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)


@pytest.fixture(scope="module")
def engine():
    return TorchEngine(CKPT)


@pytest.fixture(scope="module")
def served(engine):
    """The fixture model behind small limits and a wide gathering window (batching is sure)."""
    app = create_app(engine, LIMITS, BatchSettings(window_s=0.05, max_wait_s=1.0))
    with running(app) as url, httpx.Client(base_url=url, timeout=60) as client:
        yield client, app


@pytest.fixture(scope="module")
def lines() -> list[str]:
    return (FIXTURE / "src.txt").read_text(encoding="utf-8").splitlines()


def test_v1_translate_contract_nbest_and_attention(served, engine, lines):
    client, _ = served
    text = [lines[0], "", lines[2]]
    reply = client.post(
        "/v1/translate", json={"text": text, "beam": 3, "nbest": 2, "attention": True}
    )
    assert reply.status_code == 200, reply.text
    out = reply.json()["translations"]
    assert len(out) == 3
    empty = out[1]
    assert empty["text"] == "" and len(empty["nbest"]) == 2
    assert empty["attention"] == {"source": [], "target": [], "weights": []}
    assert "confidence" not in empty  # not decoded
    for line, t in zip(text, out, strict=True):
        if not line:
            continue
        best = {"text": t["text"], "score": t["score"], "confidence": t["confidence"]}
        assert len(t["nbest"]) == 2 and t["nbest"][0] == best
        assert 0 < t["confidence"] <= 100 and 0 < t["nbest"][1]["confidence"] <= 100
        assert t["nbest"][0]["score"] >= t["nbest"][1]["score"]
        attn = t["attention"]
        assert attn["source"] == [*engine.src_tok.id_to_piece(engine.src_tok.encode(line)), "</s>"]
        assert engine.trg_tok.sp.decode_pieces(attn["target"][:-1]) == t["text"]
        assert len(attn["weights"]) == len(attn["target"])
        assert all(len(row) == len(attn["source"]) for row in attn["weights"])
        assert all(abs(sum(row) - 1) < 1e-3 for row in attn["weights"])
    # Without "attention", none; defaults: the model's beam, one hypothesis.
    plain = client.post("/v1/translate", json={"text": [lines[0]]}).json()["translations"][0]
    assert "attention" not in plain and len(plain["nbest"]) == 1


def test_libretranslate_contract(served, engine, lines):
    client, _ = served
    one = client.post("/translate", json={"q": lines[0], "source": "src", "target": "trg"})
    assert one.status_code == 200 and isinstance(one.json()["translatedText"], str)
    many = client.post(
        "/translate", json={"q": [lines[0], "", lines[1]], "source": "auto", "target": "trg",
                            "format": "text", "api_key": ""},
    )  # fmt: skip
    assert many.status_code == 200, many.text
    texts = many.json()["translatedText"]
    assert texts[0] == one.json()["translatedText"] and texts[1] == "" and len(texts) == 3
    wrong = client.post("/translate", json={"q": "x", "source": "de", "target": "en"})
    assert wrong.status_code == 400
    assert wrong.json()["error"] == "de is not supported"  # LibreTranslate's words; ours apart:
    assert "src -> trg" in wrong.json()["detail"] and "'de'" in wrong.json()["detail"]


def test_libretranslate_form_bodies_lines_alternatives_and_detection(served, engine, lines):
    """What LibreTranslate's own clients send and read: a form body (libretranslatepy), a text
    of several lines (translated line by line, put back together), ``alternatives`` (the
    n-best's next), and ``detectedLanguage`` for source "auto"."""
    client, _ = served
    by_line = [r.text for r in engine.translate(lines[:2], engine.decode)]
    form = client.post(
        "/translate", data={"q": f"{lines[0]}\n\n{lines[1]}", "source": "src", "target": "trg"}
    )
    assert form.status_code == 200, form.text
    assert form.json() == {"translatedText": f"{by_line[0]}\n\n{by_line[1]}"}
    beam = max(min(engine.decode.beam_size, LIMITS.max_beam), 3)  # the server's rule
    three = dataclasses.replace(engine.decode, beam_size=beam, nbest=3)
    nbest = [text for text, _ in engine.translate([lines[0]], three)[0].nbest]
    alt = client.post(
        "/translate",
        json={"q": [lines[0]], "source": "auto", "target": "trg", "alternatives": 2},
    )
    assert alt.status_code == 200, alt.text
    assert alt.json() == {
        "translatedText": [nbest[0]],
        "alternatives": [nbest[1:]],
        # "src" is no language the detector knows: the model's language, confidence 0
        "detectedLanguage": [{"language": "src", "confidence": 0.0}],
    }
    for body, field in (
        ({"q": "x", "source": "src", "target": "trg", "alternatives": "one"}, "'alternatives'"),
        ({"q": "x", "source": "src", "target": "trg", "colour": "red"}, "colour"),
        ({"q": ["x", "y"], "source": "src", "target": "trg"}, "given twice"),
    ):
        refused = client.post("/translate", data=body)
        assert refused.status_code == 400 and field in refused.json()["error"], refused.text
    too_many = client.post(
        "/translate", json={"q": "x", "source": "src", "target": "trg", "alternatives": 99}
    )
    assert too_many.status_code == 400 and "max_beam" in too_many.json()["detail"]
    lines_over = "\n".join(["x"] * (LIMITS.max_lines + 1))
    over = client.post("/translate", json={"q": lines_over, "source": "src", "target": "trg"})
    assert over.status_code == 413 and "max_lines" in over.json()["error"]


def test_libretranslate_languages_and_detect(served):
    """What LibreTranslate's clients ask first (Weblate, libretranslatepy, its page): GET
    /languages, LibreTranslate's shape, both ends of the model's pair listed (a client checks
    source and target against the codes); POST /detect: the model's one source language, with
    confidence 0 for a toy language no detector knows."""
    client, _ = served
    languages = client.get("/languages")
    assert languages.status_code == 200, languages.text
    # The toy corpus's own names: as ISO 639-3 codes (langcodes' names elsewhere) "src" and
    # "trg" would be Logudorese Sardinian and Lishan Didan.
    assert languages.json() == [
        {"code": "src", "name": "Toy English (source)", "targets": ["trg"]},
        {"code": "trg", "name": "Toy verb-second language", "targets": []},
    ]
    assert client.get("/frontend/settings").json()["language"]["target"] == {
        "code": "trg",
        "name": "Toy verb-second language",
    }
    form = {"content-type": "application/x-www-form-urlencoded"}
    # libretranslatepy sends its GET with a form body (the api_key)
    with_body = client.request("GET", "/languages", content=b"api_key=k", headers=form)
    assert with_body.json() == languages.json()
    detected = [{"language": "src", "confidence": 0.0}]
    for kwargs in (
        {"json": {"q": "Di stair staustaet eni bistor ."}},
        {"json": {"q": "x", "api_key": None}},
        {"data": {"q": "Grüße", "api_key": "k"}},
        {"content": "q=Grüße".encode(), "headers": form},
        {
            "content": multipart((b'name="q"', "Grüße".encode())),
            "headers": {"content-type": MULTIPART},
        },
    ):
        reply = client.post("/detect", **kwargs)
        assert reply.status_code == 200 and reply.json() == detected, (kwargs, reply.text)
    assert client.get("/detect").status_code == 405
    assert client.post("/languages", json={}).status_code == 405


def test_libretranslate_beam_is_capped_by_max_beam(engine, lines):
    """/translate decodes with the model's settings, its beam capped by --max-beam as
    /v1/translate caps its default: on lines where greedy and the model's beam differ, a server
    with max_beam 1 answers greedily."""
    greedy = dataclasses.replace(engine.decode, beam_size=1)
    assert engine.decode.beam_size > 1
    differ = [
        (line, g.text)
        for line, g, b in zip(
            lines,
            engine.translate(lines, greedy),
            engine.translate(lines, engine.decode),
            strict=True,
        )
        if g.text != b.text
    ]
    assert differ, "the fixture has lines where the beam changes the translation"
    differ = differ[: LIMITS.max_lines]
    app = create_app(engine, dataclasses.replace(LIMITS, max_beam=1), BatchSettings())
    with running(app) as url, httpx.Client(base_url=url, timeout=60) as client:
        reply = client.post(
            "/translate", json={"q": [line for line, _ in differ], "source": "src", "target": "trg"}
        )
    assert reply.status_code == 200, reply.text
    assert reply.json()["translatedText"] == [text for _, text in differ]


def test_health_model_and_docs(served):
    client, _ = served
    before = client.get("/health").json()
    assert before["status"] == "ok"
    assert client.post("/v1/translate", json={"text": ["a b", "c"]}).status_code == 200
    after = client.get("/health").json()  # one request, one engine call (two lines)
    assert (after["batches"], after["requests"]) == (before["batches"] + 1, before["requests"] + 1)
    info = client.get("/v1/model").json()
    assert info["engine"] == "torch"
    assert info["languages"] == {"source": "src", "target": "trg"}
    assert info["vocabulary"]["source"] == info["model_args"]["enc_voc_size"] == 200
    assert info["step"] == 1500 and info["validation"] is None  # the fixture has no history
    assert info["limits"]["max_lines"] == LIMITS.max_lines
    assert client.get("/openapi.json").json()["paths"]["/v1/translate"]["post"]["requestBody"]
    assert client.get("/docs").status_code == 200


class Form(dict):
    """A body posted as application/x-www-form-urlencoded."""


@dataclasses.dataclass
class Raw:
    """A body posted as these bytes with this content type."""

    content_type: str
    body: bytes


def multipart(*parts: tuple[bytes, bytes], boundary: bytes = b"b0undary", end: bool = True):
    """A multipart/form-data body of (Content-Disposition parameters, data) parts."""
    head = b"--" + boundary + b"\r\nContent-Disposition: form-data; "
    body = b"".join(head + params + b"\r\n\r\n" + data + b"\r\n" for params, data in parts)
    return body + (b"--" + boundary + b"--\r\n" if end else b"")


MULTIPART = "multipart/form-data; boundary=b0undary"
LANGS = (b'name="source"', b"src"), (b'name="target"', b"trg")
BIG = "x" * 9000
BAD_REQUESTS = [
    # (what, path, body: JSON bytes, JSON, Form or Raw; the status; words the error must hold)
    ("body size", "/v1/translate", {"text": [BIG[:250]] * 40}, 413, "max_body_bytes"),
    ("lines", "/v1/translate", {"text": ["a"] * 9}, 413, "max_lines"),
    ("characters", "/v1/translate", {"text": ["a", "b" * 301]}, 413, "max_chars"),
    # 299 characters, 300 pieces and EOS: more than the model's 64 positions (mt translate cuts)
    ("pieces", "/v1/translate", {"text": ["a", " ".join(["a1"] * 100)]}, 413, "text[1]: 301 sou"),
    (
        "libre pieces",
        "/translate",
        {"q": " ".join(["a1"] * 100), "source": "src", "target": "trg"},
        413,
        "max_len=64",
    ),
    (
        "libre lines",
        "/translate",
        {"q": ["a"] * 9, "source": "src", "target": "trg"},
        413,
        "max_lines",
    ),
    ("beam 0", "/v1/translate", {"text": ["a"], "beam": 0}, 400, "beam"),
    ("beam too big", "/v1/translate", {"text": ["a"], "beam": 7}, 400, "max_beam"),
    ("nbest 0", "/v1/translate", {"text": ["a"], "nbest": 0}, 400, "nbest"),
    ("nbest > beam", "/v1/translate", {"text": ["a"], "beam": 2, "nbest": 3}, 400, "nbest"),
    ("len_penalty", "/v1/translate", {"text": ["a"], "len_penalty": -1}, 400, "len_penalty"),
    ("unknown field", "/v1/translate", {"text": ["a"], "beam_size": 2}, 400, "beam_size"),
    ("wrong type", "/v1/translate", {"text": ["a"], "beam": "4"}, 400, "beam"),
    ("text a string", "/v1/translate", {"text": "a"}, 400, "text"),
    ("missing field", "/translate", {"q": "a", "source": "src"}, 400, "target"),
    (
        "xml",
        "/translate",
        {"q": "a", "source": "src", "target": "trg", "format": "xml"},
        400,
        "xml format is not supported",
    ),
    ("not JSON", "/v1/translate", b"{text: [", 400, "JSON"),
    ("undecodable", "/v1/translate", b'{"text": ["\xff\xfe"]}', 400, "JSON"),
    ("lone surrogate", "/v1/translate", b'{"text": ["\\ud800"]}', 400, "JSON"),
    ("NaN", "/v1/translate", b'{"text": ["a"], "len_penalty": NaN}', 400, "len_penalty"),
    ("an array", "/v1/translate", b"[1, 2]", 400, "object"),
    ("empty body", "/v1/translate", b"", 400, "empty"),
    # Form bodies: integers are -?[0-9]{1,9} (int() took "--1" apart, refused "²" and 5000 digits)
    *[
        (
            f"form int {value[:8]!r}",
            "/translate",
            Form(q="a", source="src", target="trg", alternatives=value),
            400,
            "'alternatives'",
        )
        for value in ("--1", "²", "٣", "9" * 5000, "1_0", " 1", "")
    ],
    (
        "form not UTF-8",
        "/translate",
        Raw("application/x-www-form-urlencoded", b"q=\xff&source=src&target=trg"),
        400,
        "UTF-8",
    ),
    (
        "form escape not UTF-8",
        "/translate",
        Raw("application/x-www-form-urlencoded", b"q=%ff&source=src&target=trg"),
        400,
        "UTF-8",
    ),
    (
        "multipart on /v1",
        "/v1/translate",
        Raw(MULTIPART, multipart((b'name="text"', b"a"))),
        415,
        "application/json",
    ),
    (
        "multipart file",
        "/translate",
        Raw(MULTIPART, multipart((b'name="q"; filename="a.txt"', b"a"), *LANGS)),
        400,
        "'q' is a file",
    ),
    (
        "multipart not UTF-8",
        "/translate",
        Raw(MULTIPART, multipart((b'name="q"', b"\xff"), *LANGS)),
        400,
        "multipart body is not valid UTF-8",
    ),
    (
        "multipart no boundary",
        "/translate",
        Raw("multipart/form-data", multipart(*LANGS)),
        400,
        "boundary",
    ),
    (
        "multipart cut short",
        "/translate",
        Raw(MULTIPART, multipart(*LANGS, end=False)),
        400,
        "closing boundary",
    ),
    ("multipart garbage", "/translate", Raw(MULTIPART, b"q=a&source=src"), 400, "not valid"),
    (
        "multipart no name",
        "/translate",
        Raw(MULTIPART, multipart((b'x="q"', b"a"), *LANGS)),
        400,
        "name",
    ),
    (
        "multipart twice",
        "/translate",
        Raw(MULTIPART, multipart((b'name="q"', b"a"), (b'name="q"', b"b"), *LANGS)),
        400,
        "given twice",
    ),
    (
        "multipart int",
        "/translate",
        Raw(MULTIPART, multipart((b'name="q"', b"a"), (b'name="alternatives"', b"--1"), *LANGS)),
        400,
        "'alternatives'",
    ),
    (
        "multipart body size",
        "/translate",
        Raw(MULTIPART, multipart((b'name="q"', BIG.encode()), *LANGS)),
        413,
        "max_body_bytes",
    ),
    ("detect without q", "/detect", {"api_key": ""}, 400, "Invalid request: missing q parameter"),
    ("detect empty q", "/detect", {"q": ""}, 400, "Invalid request: missing q parameter"),
    ("detect unknown", "/detect", Form(q="a", colour="red"), 400, "colour"),
]


@pytest.mark.parametrize("case", BAD_REQUESTS, ids=[c[0] for c in BAD_REQUESTS])
def test_bad_requests_get_a_4xx_json_error_and_the_server_serves_on(served, case):
    client, _ = served
    _, path, body, status, words = case
    if isinstance(body, bytes):
        reply = client.post(path, content=body, headers={"content-type": "application/json"})
    elif isinstance(body, Raw):
        reply = client.post(path, content=body.body, headers={"content-type": body.content_type})
    elif isinstance(body, Form):
        reply = client.post(path, data=body)
    else:
        reply = client.post(path, json=body)
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert words in error and "\n" not in error
    after = client.post("/v1/translate", json={"text": ["The friend closed the woman."]})
    assert after.status_code == 200 and after.json()["translations"][0]["text"]


def test_chunked_body_over_the_limit_and_unknown_routes(served):
    client, _ = served

    def chunks():  # no content-length: the limit is counted while reading
        for _ in range(10):
            yield b" " * 1000

    reply = client.post("/v1/translate", content=chunks())
    assert reply.status_code == 413 and "max_body_bytes" in reply.json()["error"]
    wrong_method = client.get("/v1/translate")
    assert wrong_method.status_code == 405 and wrong_method.headers["allow"] == "POST"
    assert "error" in client.get("/no/such/page").json()
    assert client.get("/health").json()["status"] == "ok"


def test_32_concurrent_requests_get_what_mt_translate_gives(served, lines):
    client, app = served
    lines = (lines * 2)[:32]
    before = app.state.batcher.largest_batch
    src = FIXTURE / "src.txt"
    cli = CliRunner().invoke(cli_app, ["translate", "-c", str(CKPT), "-i", str(src), "--beam", "3", "--nbest", "2"])  # fmt: skip
    assert cli.exit_code == 0, cli.output
    rows = [row.split("\t") for row in cli.stdout.splitlines()]
    expected = {
        line: rows[2 * i : 2 * i + 2] for i, line in enumerate(src.read_text().splitlines())
    }

    def ask(line: str) -> dict:
        reply = client.post("/v1/translate", json={"text": [line], "beam": 3, "nbest": 2})
        assert reply.status_code == 200, reply.text
        return reply.json()["translations"][0]

    with ThreadPoolExecutor(32) as pool:
        answers = list(pool.map(ask, lines))
    for line, answer in zip(lines, answers, strict=True):
        want = expected[line]
        assert [h["text"] for h in answer["nbest"]] == [text for text, _ in want], line
        for h, (_, score) in zip(answer["nbest"], want, strict=True):
            assert abs(h["score"] - float(score)) < 1e-3
    assert app.state.batcher.largest_batch > 1 or before > 1, "no two requests shared a batch"


class FakeEngine(Engine):
    """Upper-cases lines; fails any call that carries the line "boom"; counts its calls; a call
    with the line "hold" waits until ``release`` is set."""

    def __init__(self) -> None:
        super().__init__("fake", None, None, DecodeConfig(beam_size=2), "src", "trg")
        self.calls: list[list[str]] = []
        self.release = threading.Event()

    def count_tokens(self, lines) -> int:
        return sum(len(line.split()) + 1 for line in lines)

    def _translate(self, lines, decode, attention, stop, target, extras):
        self.calls.append(list(lines))
        if "boom" in lines:
            raise RuntimeError("the engine failed")
        if "slow" in lines:
            time.sleep(0.3)
        if "hold" in lines:
            assert self.release.wait(30), "the test never released the engine"
        return [
            LineResult(s.upper(), float(decode.beam_size), [(s.upper(), 0.0)] * decode.nbest)
            for s in lines
        ]


@pytest.fixture
def fake_served():
    """A FakeEngine behind LIMITS; yields an HTTP client and the engine."""
    engine = FakeEngine()
    with running(create_app(engine, LIMITS)) as url, httpx.Client(base_url=url, timeout=30) as c:
        yield c, engine


def test_libretranslate_form_bodies_are_utf8_urlencoded_or_multipart(fake_served):
    """``curl -d 'q=Grüße...'`` sends raw UTF-8 in a urlencoded body (was refused: read as
    ASCII); a browser's FormData (LibreTranslate's own page) and httpx's ``files`` post
    multipart/form-data (was read as JSON): each reaches the engine as the text typed."""
    client, engine = fake_served
    urlencoded = {"content-type": "application/x-www-form-urlencoded"}
    raw = client.post(
        "/translate", content="q=Grüße+aus+K%C3%B6ln!&source=src&target=trg".encode(),
        headers=urlencoded,
    )  # fmt: skip
    assert raw.status_code == 200, raw.text
    assert raw.json() == {"translatedText": "GRÜSSE AUS KÖLN!"}
    assert engine.calls[-1] == ["Grüße aus Köln!"]
    httpx_multipart = client.post(
        "/translate",
        files={"q": (None, "Grüße\r\nété")},
        data={"source": "src", "target": "trg", "alternatives": "1"},
    )
    assert httpx_multipart.request.headers["content-type"].startswith("multipart/form-data")
    assert httpx_multipart.status_code == 200, httpx_multipart.text
    assert httpx_multipart.json() == {
        "translatedText": "GRÜSSE\nÉTÉ",
        "alternatives": ["GRÜSSE\nÉTÉ"],
    }
    boundary = b"----WebKitFormBoundaryx8GQ3ScfRmBmKbqN"  # what Chromium's FormData sends
    browser = multipart(
        (b'name="q"', "Grüße".encode()), *LANGS, (b'name="format"', b"text"),
        (b'name="alternatives"', b"0"), (b'name="api_key"', b""), boundary=boundary,
    )  # fmt: skip
    reply = client.post(
        "/translate", content=browser,
        headers={"content-type": "multipart/form-data; boundary=" + boundary.decode()},
    )  # fmt: skip
    assert reply.status_code == 200, reply.text
    assert reply.json() == {"translatedText": "GRÜSSE"}


def _submit_together(batcher: Batcher, jobs) -> list:
    futures = [batcher.submit(lines, decode) for lines, decode in jobs]
    out = []
    for f in futures:
        try:
            out.append([r.text for r in f.result(timeout=10)])
        except RuntimeError as err:
            out.append(err)
    return out


def test_batcher_groups_by_settings_and_a_failure_stays_with_its_request():
    engine = FakeEngine()
    batcher = Batcher(engine, BatchSettings(window_s=0.2, max_wait_s=2.0)).start()
    d2, d3 = DecodeConfig(beam_size=2), DecodeConfig(beam_size=3)
    jobs = [(["a b", "c"], d2), (["boom"], d2), (["d"], d3), (["e"], d2)]
    out = _submit_together(batcher, jobs)
    batcher.close()
    assert out[0] == ["A B", "C"] and out[2] == ["D"] and out[3] == ["E"]
    assert isinstance(out[1], RuntimeError)
    # One batch of the beam-2 requests (failed), each of them again alone, one beam-3 batch.
    assert engine.calls[0] == ["a b", "c", "boom", "e"]
    assert sorted(map(tuple, engine.calls[1:])) == [("a b", "c"), ("boom",), ("d",), ("e",)]


def test_requests_coming_back_after_a_batch_join_the_waiting_ones():
    """Clients answered by one batch send again at once; the requests that queued during that
    batch (older than any window by then) wait for them instead of leaving in a batch of their
    own, so the two groups of a busy server decode together."""
    engine = FakeEngine()
    batcher = Batcher(engine, BatchSettings(window_s=0.1, max_wait_s=2.0)).start()
    d2 = DecodeConfig(beam_size=2)
    first = batcher.submit(["slow"], d2)  # decodes from ~0.1 s to ~0.4 s
    time.sleep(0.2)
    queued = batcher.submit(["b"], d2)  # arrives while "slow" decodes
    first.result(timeout=10)
    back = batcher.submit(["c"], d2)  # "slow"'s client again, right after its answer
    assert [r.text for r in queued.result(timeout=10) + back.result(timeout=10)] == ["B", "C"]
    batcher.close()
    assert engine.calls == [["slow"], ["b", "c"]]


def test_an_idle_decode_worker_hands_freed_memory_back_once_per_idle_spell(monkeypatch):
    """Decoding keeps freed memory for reuse; after IDLE_TRIM_S without work the worker returns
    it (malloc_trim), once, and not before any work was done."""
    from transformer_mt.serve import batcher as batcher_module

    trims = []
    monkeypatch.setattr(batcher_module, "IDLE_TRIM_S", 0.05)
    monkeypatch.setattr(batcher_module, "release_freed_memory", lambda: trims.append(1))
    batcher = Batcher(FakeEngine(), BatchSettings(window_s=0.0)).start()
    time.sleep(0.3)
    assert trims == [], "nothing decoded yet: nothing to hand back"
    assert [r.text for r in batcher.submit(["a"], DecodeConfig(beam_size=2)).result(10)] == ["A"]
    deadline = time.monotonic() + 5
    while not trims and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.3)  # idle on: no second trim
    assert trims == [1]
    batcher.close()


def test_batching_off_decodes_one_request_at_a_time():
    engine = FakeEngine()
    batcher = Batcher(engine, BatchSettings(enabled=False)).start()
    d2 = DecodeConfig(beam_size=2)
    out = _submit_together(batcher, [([s], d2) for s in "abcde"])
    batcher.close()
    assert out == [[s.upper()] for s in "abcde"] and engine.calls == [[s] for s in "abcde"]
    assert batcher.largest_batch == 1


def test_continuous_batching_answers_what_translate_gives_and_drains_on_close(engine, lines):
    """Torch engine, continuous batching: jobs of one and two lines, empty lines, a job with
    attention and one with another beam (both wait for the running search to empty, then decode
    alone), submitted together and closed at once: every job gets exactly engine.translate's
    answer for its own settings, and close() finishes them all."""
    d3 = dataclasses.replace(engine.decode, beam_size=3, nbest=2)
    d2 = dataclasses.replace(engine.decode, beam_size=2)
    jobs = [([lines[0]], d3, False), ([lines[1], ""], d3, False), ([lines[2]], d3, True),
            ([lines[3]], d2, False), ([lines[4], lines[5]], d3, False), ([""], d3, False)]  # fmt: skip
    batcher = Batcher(engine, BatchSettings(continuous=True)).start()
    assert batcher.continuous
    assert not Batcher(engine, BatchSettings()).continuous, "batch by batch unless asked"
    futures = [batcher.submit(text, decode, attention) for text, decode, attention in jobs]
    batcher.close()
    for (text, decode, attention), future in zip(jobs, futures, strict=True):
        assert future.done(), "close() let every submitted job finish"
        got, want = future.result(), engine.translate(text, decode, attention)
        assert [[t for t, _ in r.nbest] for r in got] == [[t for t, _ in r.nbest] for r in want]
        assert [r.text for r in got] == [r.text for r in want], text
        for mine, theirs in zip(got, want, strict=True):  # summed in another order: rounding
            assert [s for _, s in mine.nbest] == pytest.approx(
                [s for _, s in theirs.nbest], abs=1e-4
            )
        assert [r.attention is not None for r in got] == [attention] * len(text)
    assert batcher.requests == len(jobs)
    assert not Batcher(FakeEngine(), BatchSettings(continuous=True)).continuous, "no search"


def test_a_request_that_arrives_mid_search_joins_it_and_gets_what_translate_gives(
    engine, lines, monkeypatch
):
    """Continuous batching: a request submitted after the running search's first step joins
    that search (one merge of its one sentence) and each request gets engine.translate's
    answer."""
    from transformer_mt.decoding import continuous

    decode = dataclasses.replace(engine.decode, beam_size=3, nbest=2)
    batcher = Batcher(engine, BatchSettings(continuous=True)).start()
    merges, steps, late = [], [], []
    merge, step = continuous._Rows.merge, continuous.ContinuousSearch.step

    def counting_merge(rows, other):
        merges.append(len(other.sentences))
        return merge(rows, other)

    def stepping(search):
        done = step(search)
        steps.append(search)
        if len(steps) == 1:  # in the worker, between two steps of the first request
            late.append(batcher.submit([lines[5]], decode))
        return done

    monkeypatch.setattr(continuous._Rows, "merge", counting_merge)
    monkeypatch.setattr(continuous.ContinuousSearch, "step", stepping)
    try:
        got = {"first": batcher.submit(lines[:4], decode).result(timeout=60)}
        got["late"] = late[0].result(timeout=60)
    finally:
        batcher.close()
    assert merges == [1], "the late request joined the running search"
    for key, text in (("first", lines[:4]), ("late", [lines[5]])):
        want = engine.translate(text, decode)
        assert [[t for t, _ in r.nbest] for r in got[key]] == [
            [t for t, _ in r.nbest] for r in want
        ]
        for mine, theirs in zip(got[key], want, strict=True):  # summed in another order
            assert [s for _, s in mine.nbest] == pytest.approx(
                [s for _, s in theirs.nbest], abs=1e-4
            )


def test_continuous_worker_survives_a_job_it_cannot_run_and_its_own_failure(
    engine, lines, monkeypatch
):
    """Continuous batching: a job whose settings the search refuses (n-best wider than the beam)
    gets the batch path's error; a failure in the worker itself fails the jobs in flight, not
    the thread; the next job is answered as engine.translate answers it."""
    decode = dataclasses.replace(engine.decode, beam_size=2, nbest=1)
    batcher = Batcher(engine, BatchSettings(continuous=True)).start()
    try:
        wide = dataclasses.replace(decode, nbest=3)
        with pytest.raises(Exception) as direct:
            engine.translate([lines[0]], wide)
        with pytest.raises(direct.type, match=re.escape(str(direct.value))):
            batcher.submit([lines[0]], wide).result(timeout=60)
        calls = []

        def broken(result, decode):
            calls.append(result)
            raise RuntimeError("a bug in line_result")

        monkeypatch.setattr(engine, "line_result", broken)
        with pytest.raises(RuntimeError, match="a bug in line_result"):
            batcher.submit([lines[1]], decode).result(timeout=60)
        assert calls, "the worker reached line_result"
        monkeypatch.undo()
        good = batcher.submit([lines[2]], decode).result(timeout=60)
        assert [r.text for r in good] == [r.text for r in engine.translate([lines[2]], decode)]
        assert batcher._thread.is_alive()
    finally:
        batcher.close()


def test_a_failing_request_gets_a_json_error_the_others_their_answers():
    engine = FakeEngine()
    app = create_app(engine, LIMITS, BatchSettings(window_s=0.5, max_wait_s=2.0))
    with running(app) as url, httpx.Client(base_url=url, timeout=30) as client:
        with ThreadPoolExecutor(3) as pool:
            bodies = [{"text": ["x"]}, {"text": ["boom"]}, {"text": ["y z"]}]
            replies = list(pool.map(lambda b: client.post("/v1/translate", json=b), bodies))
        assert [r.status_code for r in replies] == [200, 500, 200]
        assert "the engine failed" in replies[1].json()["error"]
        assert replies[2].json()["translations"][0]["text"] == "Y Z"
        # The failing request shared an engine call with the others; then each went alone.
        assert sorted(engine.calls[0]) == ["boom", "x", "y z"], engine.calls
        assert sorted(map(tuple, engine.calls[1:])) == [("boom",), ("x",), ("y z",)]
        assert client.post("/v1/translate", json={"text": ["ok"]}).status_code == 200


def test_too_many_waiting_requests_get_a_503_and_the_server_serves_on():
    """max_waiting requests submitted and not yet answered (here one, held in the engine): the
    next one gets a 503 JSON error naming the limit, at once; once they are answered, the
    server takes requests again."""
    engine = FakeEngine()
    app = create_app(engine, dataclasses.replace(LIMITS, max_waiting=1))
    with running(app) as url, httpx.Client(base_url=url, timeout=30) as client:
        with ThreadPoolExecutor(1) as pool:
            held = pool.submit(client.post, "/v1/translate", json={"text": ["hold"]})
            deadline = time.monotonic() + 30
            while not engine.calls:  # the worker is decoding "hold"
                assert time.monotonic() < deadline and not held.done(), "hold never decoded"
                time.sleep(0.01)
            busy = client.post("/translate", json={"q": "a", "source": "src", "target": "trg"})
            engine.release.set()
            assert held.result().status_code == 200
        assert busy.status_code == 503, busy.text
        assert "max_waiting" in busy.json()["error"] and "busy" in busy.json()["error"]
        assert engine.calls == [["hold"]], "the refused request never reached the engine"
        after = client.post("/v1/translate", json={"text": ["a"]})
        assert after.status_code == 200 and after.json()["translations"][0]["text"] == "A"


def _until(condition, what: str, seconds: float = 30) -> None:
    """Wait until ``condition()`` holds; fail naming ``what`` after ``seconds``."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {seconds} s"
        time.sleep(0.01)


def _sent_request(url: str, body: dict) -> socket.socket:
    """A connection that has sent a whole ``POST /v1/translate`` of ``body`` and reads nothing
    (closing it is the client leaving)."""
    data = json.dumps(body).encode()
    sock = socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])), timeout=30)
    sock.sendall(
        b"POST /v1/translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % len(data) + data
    )
    return sock


def _gone_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "a client left" in r.getMessage()]


def test_requests_whose_clients_left_while_queued_are_never_decoded(caplog):
    """Three clients send two lines each while the worker is busy, then hang up: their requests
    are dropped from the queue (before, each was decoded for nobody, and the next client's
    request waited behind them); one log line each; the server serves on."""
    caplog.set_level(logging.INFO, logger="transformer_mt")
    engine = FakeEngine()
    app = create_app(engine, LIMITS)
    batcher = app.state.batcher
    with running(app) as url, httpx.Client(base_url=url, timeout=30) as client:
        with ThreadPoolExecutor(1) as pool:
            held = pool.submit(client.post, "/v1/translate", json={"text": ["hold"]})
            _until(lambda: engine.calls, "the worker decoding 'hold'")
            gone = [_sent_request(url, {"text": [f"gone {i}", "x"]}) for i in range(3)]
            _until(lambda: batcher.waiting == 4, "three requests queued behind 'hold'")
            for sock in gone:
                sock.close()
            _until(lambda: batcher.abandoned == 3, "the server seeing the clients leave")
            engine.release.set()
            assert held.result().status_code == 200
        after = client.post("/v1/translate", json={"text": ["after"]})
        assert after.json()["translations"][0]["text"] == "AFTER"
        health = client.get("/health").json()
    assert engine.calls == [["hold"], ["after"]], "a request of a client that left was decoded"
    assert health["abandoned"] == 3 and health["lines_not_decoded"] == 6
    assert (
        _gone_lines(caplog)
        == [
            "a client left before its answer: dropped from the queue, 2 of its 2 lines left undecoded"
        ]
        * 3
    )


def test_a_full_batch_whose_client_hung_up_at_once_is_dropped_not_decoded(caplog):
    """A client that sends a request and closes at once: the server sees it leave only after the
    request is queued. A batch that fills its token budget (here: any request) still waits out
    the gathering window, so the request is dropped; before, the worker took it at once and
    decoded it for nobody."""
    caplog.set_level(logging.INFO, logger="transformer_mt")
    engine = FakeEngine()
    app = create_app(engine, LIMITS, BatchSettings(window_s=0.5, max_wait_s=1.0, max_tokens=1))
    with running(app) as url:
        _sent_request(url, {"text": ["slow", "too"]}).close()  # "slow": 0.3 s to decode
        _until(lambda: app.state.batcher.abandoned, "the server seeing the client leave")
        calls = list(engine.calls)
        after = httpx.post(f"{url}/v1/translate", json={"text": ["after"]}, timeout=30)
    assert calls == [], "the request of a client that had left was decoded"
    assert after.json()["translations"][0]["text"] == "AFTER"
    assert _gone_lines(caplog) == [
        "a client left before its answer: dropped from the queue, 2 of its 2 lines left undecoded"
    ]


class PausingEngine(TorchEngine):
    """The fixture model, one sentence per decode batch; its first stop check (after the first
    batch) waits until the server has seen the client leave, so that the test knows when."""

    def __init__(self) -> None:
        super().__init__(CKPT)
        self.decode = dataclasses.replace(self.decode, batch_tokens=1)  # each sentence alone
        self.first_batch = threading.Event()
        self.answers: list[bool] = []  # what each stop check said

    def translate(self, lines, decode, attention=False, stop=None, target=None):
        def check() -> bool:
            self.first_batch.set()
            if not self.answers:
                _until(stop, "the server seeing the client leave", 20)
            self.answers.append(stop())
            return self.answers[-1]

        return super().translate(lines, decode, attention, None if stop is None else check)


def test_a_long_request_stops_after_the_batch_its_client_left_in(lines, caplog):
    """Eight lines in eight decode batches; the client leaves during the first: the engine is
    asked once between batches, stops, and the log says 7 of the 8 lines were not decoded."""
    caplog.set_level(logging.INFO, logger="transformer_mt")
    engine = PausingEngine()
    app = create_app(engine, LIMITS)
    text = [line for line in lines if line][:8]
    with running(app) as url:
        with _sent_request(url, {"text": text, "beam": 2}):
            assert engine.first_batch.wait(20), "the request never decoded a batch"
        _until(lambda: app.state.batcher.abandoned, "the worker letting the request go")
        assert engine.answers == [True], "decoding went on after the client left"
        health = httpx.get(f"{url}/health", timeout=10).json()
        again = httpx.post(f"{url}/v1/translate", json={"text": text[:1]}, timeout=30)
    assert health["abandoned"] == 1 and health["lines_not_decoded"] == 7
    assert _gone_lines(caplog) == [
        "a client left before its answer: decoding stopped, 7 of its 8 lines left undecoded"
    ]
    assert again.status_code == 200, again.text  # the server serves on


def test_continuous_search_ends_when_every_client_in_it_has_left(engine, lines, monkeypatch):
    """Continuous batching: the only request in the search loses its client during the first
    step; the search ends after that step instead of running its eight sentences to the end."""
    from transformer_mt.decoding import continuous

    app = create_app(engine, LIMITS, BatchSettings(continuous=True))
    steps, step = [], continuous.ContinuousSearch.step
    counts = app.state.requests

    def pausing(search):
        steps.append(search)
        if len(steps) == 1:  # the request's handler has returned: the server saw it leave
            _until(lambda: counts.in_flight == 0, "the server seeing the client leave", 20)
        return step(search)

    monkeypatch.setattr(continuous.ContinuousSearch, "step", pausing)
    text = [line for line in lines if line][:8]
    with running(app) as url:
        with _sent_request(url, {"text": text, "beam": 2}):
            _until(lambda: steps, "the search's first step")
        _until(lambda: app.state.batcher.abandoned, "the worker letting the request go")
    assert len(steps) == 1, f"{len(steps)} steps: the search went on after the client left"
    assert app.state.batcher.lines_not_decoded == 8


def test_serve_on_a_port_in_use_is_one_error_line_before_loading_the_model():
    """Before, uvicorn logged "serving on", then its own "[Errno 98]" line, and exited with 3."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(cli_app, ["serve", "-c", str(CKPT), "--port", str(port)])
    assert result.exit_code == 1, result.output
    assert result.output.strip().splitlines() == [
        f"error: port {port} on 127.0.0.1 is in use (another `mt serve`, or another program); "
        "stop it or choose another --port"
    ]


class AttentionEngine(FakeEngine):
    """FakeEngine whose lines come with a ``size`` x ``size`` attention matrix when asked."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size
        self.matrix = [[(i * 7 + j) % 97 / 97.0000001 for j in range(size)] for i in range(size)]

    def _translate(self, lines, decode, attention, stop, target, extras):
        results = super()._translate(lines, decode, attention, stop, target, extras)
        for result in results if attention else ():
            result.attention = Attention(["s"] * self.size, ["t"] * self.size, self.matrix)
        return results


def test_an_answer_with_attention_is_built_off_the_event_loop():
    """Rounding and encoding 8 attention matrices of 400 x 400 takes about a second of Python;
    done on the event loop (before), every other request waited for it. /health, asked again
    and again while such an answer is built, must come back far sooner."""
    engine = AttentionEngine(400)
    app = create_app(engine, LIMITS)
    body = {"text": ["a"] * LIMITS.max_lines, "attention": True}
    with (
        running(app) as url,
        httpx.Client(base_url=url, timeout=60) as big,
        httpx.Client(base_url=url, timeout=60) as small,
    ):
        assert small.get("/health").status_code == big.get("/health").status_code == 200
        waits = []
        with ThreadPoolExecutor(1) as pool:
            start = time.monotonic()
            reply = pool.submit(big.post, "/v1/translate", json=body)
            while not reply.done():
                asked = time.monotonic()
                assert small.get("/health").status_code == 200
                waits.append(time.monotonic() - asked)
            took = time.monotonic() - start
        reply = reply.result()
    assert reply.status_code == 200, reply.text
    out = reply.json()["translations"]
    assert len(out) == LIMITS.max_lines and out[0]["text"] == "A"
    attention = out[-1]["attention"]
    assert attention["source"] == ["s"] * 400 and attention["target"] == ["t"] * 400
    assert attention["weights"] == [[round(w, 6) for w in row] for row in engine.matrix]
    assert len(waits) >= 3 and max(waits) < took / 4, (max(waits), took, len(waits))


def test_attention_weights_that_are_not_finite_are_null():
    """JSON has no NaN or infinity: a broken model's weights answer as null, not as a 500."""
    engine = AttentionEngine(2)
    engine.matrix = [[float("nan"), 1.0], [float("inf"), 0.25]]
    with running(create_app(engine, LIMITS)) as url, httpx.Client(base_url=url) as client:
        reply = client.post("/v1/translate", json={"text": ["a"], "attention": True})
    assert reply.status_code == 200, reply.text
    assert reply.json()["translations"][0]["attention"]["weights"] == [[None, 1.0], [None, 0.25]]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stalled_upload(port: int):
    """A connection that sends its headers and 10 of the 100 body bytes it announces, then
    nothing: a slow or stuck client."""
    import socket

    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(
        b"POST /v1/translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 100\r\n\r\n" + b'{"text": ['
    )
    return sock


def test_a_body_that_does_not_arrive_gets_a_408_and_the_server_serves_on(engine):
    app = create_app(engine, dataclasses.replace(LIMITS, body_timeout_s=0.5))
    with running(app) as url:
        sock = _stalled_upload(int(url.rsplit(":", 1)[1]))
        with sock:
            started = time.monotonic()
            answer = b""
            while not answer.endswith(b"}"):  # the JSON body may come in a segment of its own
                chunk = sock.recv(4096)
                assert chunk, f"connection closed after {answer!r}"
                answer += chunk
            waited = time.monotonic() - started
            answer = answer.decode()
        assert answer.startswith("HTTP/1.1 408"), answer
        assert "body_timeout_s=0.5" in answer and 0.4 < waited < 10
        assert httpx.get(f"{url}/health", timeout=10).json()["status"] == "ok"


def test_sigterm_ends_the_server_after_the_shutdown_timeout_beside_a_stuck_request():
    """A request still in flight at SIGTERM that would take longer than --shutdown-timeout
    (its body never arrives, and --body-timeout is a minute): the process cuts it off after the
    shutdown timeout, exits with 0, and says so. Without uvicorn's graceful-shutdown timeout
    it waited for that request (here the body timeout; a client that never reads its answer:
    forever)."""
    port = _free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "transformer_mt", "serve", "-c", str(CKPT), "--port", str(port),
         "--body-timeout", "60", "--shutdown-timeout", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True,
    )  # fmt: skip
    try:
        _wait_until_serving(proc, f"http://127.0.0.1:{port}")
        with _stalled_upload(port) as sock:
            time.sleep(0.5)  # the request is in flight: the handler waits for its body
            proc.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
            assert proc.wait(timeout=30) == 0
            took = time.monotonic() - signalled
            answer = b""
            while chunk := sock.recv(4096):
                answer += chunk
        # Cut off, it still gets a JSON error (uvicorn's own: a text/plain 500).
        assert answer.startswith(b"HTTP/1.1 503") and answer.endswith(
            b'{"error":"the server shut down before answering; send the request again"}'
        ), answer
        assert 0.9 < took < 15, f"exited {took:.1f} s after SIGTERM"
        log = proc.stdout.read()
        assert "stopped (SIGTERM); 1 request(s) still in flight were cut off (after the " \
            "shutdown timeout of 1 s" in log, log  # fmt: skip
        assert log.count("stopped (") == 1, log
        assert "every request in flight was answered" not in log, log
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _wait_until_serving(proc: subprocess.Popen, url: str) -> None:
    deadline = time.monotonic() + 60
    while True:
        assert proc.poll() is None, proc.stdout.read()
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "the server did not start"
        time.sleep(0.1)


def test_sigterm_lets_requests_in_flight_finish(lines):
    """Four requests wait in a gathering window of 1 s (a max wait of 5 s lets it apply:
    before, the 50 ms default ended gathering and they were all answered before the signal)
    when SIGTERM comes; each is answered, and the log says so."""
    port = _free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "transformer_mt", "serve", "-c", str(CKPT), "--port", str(port),
         "--batch-window-ms", "1000", "--batch-max-wait-ms", "5000", "--no-continuous"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True,
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_until_serving(proc, url)
        assert httpx.get(f"{url}/v1/model").json()["batching"]["window_ms"] == 1000
        with httpx.Client(base_url=url, timeout=30) as client, ThreadPoolExecutor(4) as pool:
            # warm: the first decode is slower; the window alone must keep the others waiting
            assert client.post("/v1/translate", json={"text": [lines[0]]}).status_code == 200
            futures = [
                pool.submit(client.post, "/v1/translate", json={"text": [line]})
                for line in lines[:4]
            ]
            time.sleep(0.3)  # the requests wait in the 1000 ms gathering window
            answered = [f.done() for f in futures]
            proc.send_signal(signal.SIGTERM)
            replies = [f.result() for f in futures]
        assert not any(answered), "a request was answered before SIGTERM: nothing was in flight"
        assert [r.status_code for r in replies] == [200] * 4
        texts = [r.json()["translations"][0]["text"] for r in replies]
        assert all(texts[i] for i in range(4) if lines[i])
        assert proc.wait(timeout=30) == 0
        assert "stopped (SIGTERM); every request in flight was answered" in proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_ct2_engine_serves_an_export(engine, lines, tmp_path):
    pytest.importorskip("ctranslate2", reason="the ct2 extra is not installed")
    from transformer_mt.convert.ctranslate2 import export_ctranslate2
    from transformer_mt.engines import load_for_inference
    from transformer_mt.engines.ct2 import translate_lines_ct2
    from transformer_mt.engines.engine import load_engine

    directory = export_ctranslate2(load_for_inference(CKPT), tmp_path / "ct2")
    ct2 = load_engine("ct2", directory)
    app = create_app(ct2, LIMITS)
    text = [lines[0], "", lines[3]]
    with running(app) as url, httpx.Client(base_url=url, timeout=30) as client:
        info, torch_info = client.get("/v1/model").json(), engine.describe()
        assert info["engine"] == "ct2" and info["quantization"] == "float32"
        assert info["model_args"] == torch_info["model_args"] and info["model_args"]["d_model"]
        assert info["step"] == torch_info["step"] == 1500
        reply = client.post(
            "/v1/translate", json={"text": text, "beam": 2, "nbest": 2, "attention": True}
        )
        assert reply.status_code == 200, reply.text
        out = reply.json()["translations"]
        plain = client.post("/translate", json={"q": text, "source": "src", "target": "trg"})
    decode = dataclasses.replace(ct2.decode, beam_size=2, nbest=2)
    want = translate_lines_ct2(ct2.model, text, decode)
    assert [[h["text"] for h in t["nbest"]] for t in out] == [[t for t, _ in w] for w in want]
    assert plain.json()["translatedText"] == [
        r[0][0] for r in translate_lines_ct2(ct2.model, text, ct2.decode)
    ]
    for line, t in ((text[0], out[0]), (text[2], out[2])):
        attn = t["attention"]  # CTranslate2's: without the EOS column and row
        assert attn["source"] == ct2.src_tok.id_to_piece(ct2.src_tok.encode(line))
        assert len(attn["weights"]) == len(attn["target"]) > 0
        assert all(len(row) == len(attn["source"]) for row in attn["weights"])
    # Told to stop after its first decode batch (here one sentence each), either path gives up
    # naming the three lines it left.
    one_each = dataclasses.replace(ct2.decode, batch_tokens=1)
    for attention in (False, True):
        with pytest.raises(DecodeStopped) as stopped:
            ct2.translate(lines[:4], one_each, attention, stop=lambda: True)
        assert len(stopped.value.left) == 3, attention


def test_a_gathering_window_longer_than_the_max_wait_is_refused():
    """It would never apply (gathering ends at the max wait), and /v1/model would report it."""
    wrong = CliRunner().invoke(
        cli_app,
        ["serve", "-c", str(CKPT), "--batch-window-ms", "800", "--port", "0"],
    )
    assert wrong.exit_code == 1, wrong.output
    assert wrong.output.strip().splitlines() == [
        "error: --batch-window-ms (800) exceeds --batch-max-wait-ms (50): gathering would never "
        "wait that long; lower the window or raise the max wait"
    ]
    with pytest.raises(MTError) as built:
        BatchSettings(window_s=0.8)
    assert f"error: {built.value}" == wrong.output.strip()


def test_serve_command_errors():
    runner = CliRunner()
    missing = runner.invoke(cli_app, ["serve", "-c", "no/such.pt", "--port", "0"])
    assert missing.exit_code == 1 and "no/such.pt" in missing.output
    wrong = runner.invoke(cli_app, ["serve", "-c", str(CKPT), "--engine", "ct2"])
    assert wrong.exit_code == 1 and "not a directory" in wrong.output
    other = runner.invoke(cli_app, ["serve", "-c", str(CKPT), "--engine", "onnx"])
    assert other.exit_code == 1 and "expected one of torch, ct2" in other.output
    assert json.loads(json.dumps(dataclasses.asdict(Limits())))["max_lines"] == 64


def test_the_torch_engine_can_serve_an_int8_model():
    from transformer_mt.engines.engine import load_engine
    from transformer_mt.engines.loading import Int8Linear

    engine = load_engine("torch", CKPT, quantize="int8")
    assert isinstance(engine.model.out, Int8Linear)
    (line,) = engine.translate(["Di stair staustaet eni bistor ."], engine.decode)
    assert isinstance(line.text, str)
    with pytest.raises(MTError, match="--quantize is for --engine torch"):
        load_engine("ct2", CKPT, quantize="int8")


def test_validation_bleu_is_the_entry_of_the_checkpoints_step():
    from transformer_mt.engines.loading import validation_bleu

    history = [{"step": 500, "val_bleu": 20.0}, {"step": 1000, "val_loss": 2.0}]
    history.append({"step": 1000, "val_bleu": 31.5})
    state = {"state": {"history": history}}
    assert validation_bleu(state, 500) == {"step": 500, "bleu": 20.0}
    assert validation_bleu(state, 1500) == {"step": 1000, "bleu": 31.5}  # else the latest
    assert validation_bleu({"state": {"history": history[1:2]}}, 1000) is None
    assert validation_bleu(None, 0) is None  # averaged checkpoints keep no train_state


def _serve_params() -> dict:
    """The click parameters of `mt serve`, by name, as Typer builds them."""
    command = typer.main.get_command(cli_app).commands["serve"]
    return {param.name: param for param in command.params}


def test_each_serve_option_is_read_from_the_setting_it_sets():
    """Name, default (in the option's unit), help and range of every `mt serve` option are
    its setting's declaration; no option of the command sets a setting without one."""
    params, declared = _serve_params(), serve_settings.serve_options()
    assert set(params) - {o.param for o in declared.values()} == {"checkpoint"}
    fresh = serve_settings.ServeSettings()
    for flag, option in declared.items():
        param, f = params[option.param], option.declared
        settings = getattr(fresh, option.group) if option.group else fresh
        size = f.metadata["unit"].size if "unit" in f.metadata else 1
        assert param.opts == [flag], flag
        assert param.secondary_opts == ([f"--no-{flag[2:]}"] if option.type is bool else [])
        if param.default is None or isinstance(param.default, bool | str | Path):
            assert param.default == getattr(settings, f.name), flag
        else:
            assert param.default == pytest.approx(getattr(settings, f.name) / size), flag
        help_text = " ".join(param.help.split())
        assert help_text.lower().startswith(f.metadata["help"].lower()), flag
        allowed = f.metadata["range"]
        if allowed is not None and allowed.lo is not None:
            assert f"{allowed.lo / size:g}" in help_text, flag
        if allowed is not None and allowed.hi is not None:
            assert f"{allowed.hi / size:g}" in help_text, flag
    # The command's defaults, through the option path, build the declared defaults.
    defaults = {o.param: params[o.param].default for o in declared.values()}
    assert serve_settings.settings_from_options(defaults) == fresh


# A value other than its default for each `mt serve` option, in the option's unit (a yes/no
# option: its other form); with the options one needs.
SERVE_VALUES: dict[str, object] = {
    "--host": "0.0.0.0", "--port": 8123, "--engine": "ct2", "--device": "cuda:1",
    "--batching": False, "--continuous": True, "--batch-window-ms": 7.0,
    "--batch-max-wait-ms": 70.0, "--max-lines": 65, "--max-chars": 2001, "--max-body-kib": 3,
    "--body-timeout": 31.0, "--shutdown-timeout": 32.0, "--drain-seconds": 3.0, "--workers": 2,
    "--max-beam": 17, "--access-log": True, "--quantize": "int8", "--precision": "bf16",
    "--api-keys": Path("keys.json"), "--require-api-key": True,
    "--key-free-origin": r"https://a\.example", "--req-limit": 5, "--ipv6-prefix": 48,
    "--char-limit": 99, "--forwarded-allow-ips": "10.0.0.1", "--files": False,
    "--files-dir": Path("downloads"), "--files-ttl": 60.0, "--cache-lines": 11,
    "--glossary": ("a=x.tsv", "b=y.tsv"), "--public-url": "https://mt.example.org",
    "--parse-processes": 2, "--parse-waiting": 3, "--parse-memory-mib": 300,
}  # fmt: skip
SERVE_NEEDS = {"--require-api-key": ("--api-keys",)}


def test_each_serve_option_given_on_the_command_line_sets_its_own_field(monkeypatch):
    """`mt serve` with one option changed (and the options it needs) serves with the default
    settings but for that option's field, in the field's unit: no option's value lands in
    another field or is lost on the way from the command's parameters."""
    declared, served = serve_settings.serve_options(), []
    assert set(SERVE_VALUES) == set(declared), "give each new option a value here"
    monkeypatch.setattr(
        "transformer_mt.serve.launch.serve", lambda path, settings: served.append(settings)
    )
    for flag in declared:
        args, expected = [], serve_settings.ServeSettings()
        for given in (*SERVE_NEEDS.get(flag, ()), flag):
            option, value = declared[given], SERVE_VALUES[given]
            if option.type is bool:
                assert value != option.default, given
                args.append(given if value else f"--no-{given[2:]}")
            else:
                values = value if isinstance(value, tuple) else (value,)
                args += [arg for one in values for arg in (given, str(one))]
            group = getattr(expected, option.group) if option.group else expected
            assert getattr(group, option.declared.name) != option.to_field(value), given
            group = dataclasses.replace(group, **{option.declared.name: option.to_field(value)})
            if option.group:
                expected = dataclasses.replace(expected, **{option.group: group})
            else:
                expected = group
        result = CliRunner().invoke(cli_app, ["serve", "-c", str(CKPT), *args])
        assert result.exit_code == 0, (flag, result.output)
        assert served.pop() == expected, flag


def _outside(allowed, size: float) -> list[float]:
    """Values just outside a declared range, in the option's unit."""
    out = []
    if allowed.lo is not None:
        out.append(allowed.lo / size if allowed.lo_open else allowed.lo / size - 1)
    if allowed.hi is not None:
        out.append(allowed.hi / size if allowed.hi_open else allowed.hi / size + 1)
    return out


def test_a_serve_option_outside_its_range_is_one_error_line_from_the_cli_and_in_code():
    """Each ranged option, one step outside either end: the command refuses it with one line
    naming the option (before loading anything), and building the settings object refuses the
    same value with the same words; its bounds themselves are accepted."""
    runner, checked = CliRunner(), 0
    for flag, option in serve_settings.serve_options().items():
        allowed, unit = option.declared.metadata["range"], option.unit
        if allowed is None:
            continue
        size = unit.size if unit is not None else 1
        number = int if option.type is int else float
        for value in _outside(allowed, size):
            shown = f"{number(value):g}"
            result = runner.invoke(cli_app, ["serve", "-c", str(CKPT), f"{flag}={shown}"])
            assert result.exit_code == 1, (flag, result.output)
            (said,) = result.output.strip().splitlines()
            assert said.startswith(f"error: {flag} is {shown}; it must be "), said
            values = {o.param: o.default for o in serve_settings.serve_options().values()}
            with pytest.raises(MTError) as built:
                serve_settings.settings_from_options({**values, option.param: number(value)})
            assert f"error: {built.value}" == said
            checked += 1
        for bound in (allowed.lo, allowed.hi):
            if bound is not None and not (allowed.lo_open and bound == allowed.lo):
                values = {o.param: o.default for o in serve_settings.serve_options().values()}
                values[option.param] = number(bound / size)
                if flag == "--batch-window-ms":  # the window within the max wait
                    values["batch_max_wait_ms"] = values[option.param]
                if flag == "--batch-max-wait-ms":
                    values["batch_window_ms"] = 0.0
                serve_settings.settings_from_options(values)
    assert checked >= 15
    wrong = runner.invoke(cli_app, ["serve", "-c", str(CKPT), "--engine", "onnx"])
    assert wrong.output.strip() == "error: --engine='onnx': expected one of torch, ct2"


def test_server_settings_built_in_code_check_their_declared_ranges():
    """A settings object is checked when it is built (also by ``dataclasses.replace``), its
    error naming the option in the option's unit, or the field that has no option."""
    cases = [
        (lambda: Limits(max_beam=0), "--max-beam is 0; it must be 1 to 64"),
        (
            lambda: dataclasses.replace(LIMITS, max_lines=0),
            "--max-lines is 0; it must be at least 1",
        ),
        (lambda: Limits(max_body_bytes=512), "--max-body-kib is 0.5; it must be at least 1"),
        (lambda: BatchSettings(max_wait_s=20.0), "--batch-max-wait-ms is 20000; it must be 0 to"),
        (
            lambda: BatchSettings(max_tokens=0),
            "BatchSettings.max_tokens is 0; it must be at least 1",
        ),
        (
            lambda: serve_settings.FileSettings(max_files=0),
            "FileSettings.max_files is 0; it must be",
        ),
        (lambda: serve_settings.ServeSettings(workers=65), "--workers is 65; it must be 1 to 64"),
        (
            lambda: serve_settings.ServeSettings(quantize="int4"),
            "--quantize='int4': expected one of int8",
        ),
        (
            lambda: serve_settings.AccessSettings(req_limit=-1),
            "--req-limit is -1; it must be at least 0",
        ),
        (
            lambda: serve_settings.AccessSettings(require_api_key=True),
            "--require-api-key needs --api-keys FILE",
        ),
    ]
    for build, says in cases:
        with pytest.raises(MTError) as refused:
            build()
        assert str(refused.value).startswith(says)
        assert "\n" not in str(refused.value)
    assert BatchSettings(max_tokens=None).max_tokens is None  # null: the model's budget


def test_serve_options_in_other_units_are_converted_once():
    """--max-body-kib is KiB, --batch-*-ms milliseconds; their settings keep bytes and seconds."""
    values = {o.param: o.default for o in serve_settings.serve_options().values()}
    values |= {"max_body_kib": 3, "batch_window_ms": 5.0, "batch_max_wait_ms": 250.0}
    settings = serve_settings.settings_from_options(values)
    assert settings.limits.max_body_bytes == 3 * 1024
    assert isinstance(settings.limits.max_body_bytes, int)
    assert settings.batching.window_s == pytest.approx(0.005)
    assert settings.batching.max_wait_s == pytest.approx(0.25)
    assert settings.limits.body_timeout_s == values["body_timeout"]  # seconds on both sides


def test_lines_with_nothing_to_translate_never_reach_the_decode_worker(fake_served):
    """Every route's decode call keeps such lines as they are; a request of them alone never
    reaches the engine, and LibreTranslate's gives a text of them no alternatives."""
    client, engine = fake_served
    answer = client.post("/v1/translate", json={"text": ["", "42 ", "a dog", "🙂"]})
    assert [t["text"] for t in answer.json()["translations"]] == ["", "42", "A DOG", "🙂"]
    assert engine.calls[-1] == ["a dog"]
    calls = len(engine.calls)
    alone = client.post("/v1/translate", json={"text": ["12", "", "https://x.org"], "nbest": 2})
    assert [t["nbest"] for t in alone.json()["translations"]] == [
        [{"text": t, "score": 0.0}] * 2 for t in ("12", "", "https://x.org")
    ]
    body = {"q": ["7 \n a cat", " 8 "], "source": "src", "target": "trg", "alternatives": 1}
    libre = client.post("/translate", json=body).json()
    assert libre["translatedText"] == ["7 \n A CAT", " 8 "]
    assert libre["alternatives"] == [["7 \n A CAT"], []]
    assert engine.calls[calls:] == [["a cat"]]  # sentences, stripped
