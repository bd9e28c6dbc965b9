"""`mt serve` as a LibreTranslate server, over real HTTP on 127.0.0.1: LibreTranslate's own API
tests replayed, the libretranslatepy client, fields from the query string, CORS, the frontend
settings, text with nothing to translate, HTML, files and their downloads, keys and limits.

Most tests use an engine that upper-cases each line (so that every answer is known) and records
what it was asked to decode; the replay uses the fixture model.
"""

import json
import os
import re
import stat
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the serve extra is not installed")
uvicorn = pytest.importorskip("uvicorn", reason="the serve extra is not installed")
httpx = pytest.importorskip("httpx", reason="the serve extra is not installed")

from test_serve import running  # noqa: E402  (the one way to run an app in tests)
from typer.testing import CliRunner  # noqa: E402

from transformer_mt.cli import app as cli_app  # noqa: E402
from transformer_mt.config import DecodeConfig  # noqa: E402
from transformer_mt.engines.engine import Engine  # noqa: E402
from transformer_mt.engines.results import LineResult  # noqa: E402
from transformer_mt.engines.torch_engine import TorchEngine  # noqa: E402
from transformer_mt.errors import MTError  # noqa: E402
from transformer_mt.serve.access import (  # noqa: E402
    INVALID_KEY,
    NEED_KEY,
    add_key,
    read_keys,
    remove_key,
)
from transformer_mt.serve.app import create_app, redact_keys  # noqa: E402
from transformer_mt.serve.file_store import NAME, FileStore  # noqa: E402
from transformer_mt.serve.settings import (  # noqa: E402
    AccessSettings,
    FileSettings,
    ServeSettings,
)

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "old_checkpoint"


class UpperEngine(Engine):
    """Upper-cases each line; records each call's lines."""

    def __init__(self, src: str = "en", trg: str = "es") -> None:
        super().__init__("upper", None, None, DecodeConfig(beam_size=2), src, trg)
        self.calls: list[list[str]] = []

    def count_tokens(self, lines) -> int:
        return sum(len(line.split()) + 1 for line in lines)

    def _translate(self, lines, decode, attention, stop, target, extras):
        self.calls.append(list(lines))
        return [LineResult(s.upper(), 0.0, [(s.upper(), 0.0)] * decode.nbest) for s in lines]


@contextmanager
def serving(settings: ServeSettings | None = None, engine: Engine | None = None):
    """An UpperEngine (en -> es) server; yields a client and the engine."""
    engine = engine or UpperEngine()
    app = create_app(engine, settings=settings)
    with running(app) as url, httpx.Client(base_url=url, timeout=60) as client:
        yield client, engine


@pytest.fixture(scope="module")
def upper():
    with serving() as served:
        yield served


# --- LibreTranslate's own API tests (libretranslate/tests/test_api/, default flags) -----------
# Each: (its test's name, method, path, request keywords, status, what the answer must hold).
# "en" and "es" are mapped to the fixture model's "src" and "trg".
LT_CASES = [
    ("detect_language", "POST", "/detect", {"data": {"q": "Hello"}}, 200,
     lambda j: "confidence" in j[0] and "language" in j[0] and len(j) >= 1),
    ("detect_language_must_fail_without_parameters", "POST", "/detect", {}, 400,
     lambda j: "error" in j),
    ("detect_language_must_fail_bad_request_type", "GET", "/detect", {}, 405, None),
    ("get_frontend_settings", "GET", "/frontend/settings", {}, 200, None),
    ("get_languages", "GET", "/languages", {}, 200,
     lambda j: "code" in j[0] and "name" in j[0] and len(j) >= 1),
    ("get_languages_must_fail_bad_request_type", "POST", "/languages", {}, 405, None),
    # LibreTranslate answers exactly {"status": "ok"}; ours adds the decode worker's counters.
    ("get_health", "GET", "/health", {}, 200, lambda j: j["status"] == "ok"),
    ("health_must_fail_bad_request_type", "POST", "/health", {}, 405, None),
    ("get_spec", "GET", "/spec", {}, 200, None),
    ("get_spec_must_fail_bad_request_type", "POST", "/spec", {}, 405, None),
    ("translate", "POST", "/translate",
     {"data": {"q": "Hello", "source": "en", "target": "es", "format": "text"}}, 200,
     lambda j: "translatedText" in j),
    ("translate_batch", "POST", "/translate",
     {"json": {"q": ["Hello", "World"], "source": "en", "target": "es", "format": "text"}}, 200,
     lambda j: isinstance(j["translatedText"], list) and len(j["translatedText"]) == 2),
    # LibreTranslate's words exactly; which pairs the model has, in a field of its own.
    ("translate_unsupported_language", "POST", "/translate",
     {"data": {"q": "Hello", "source": "en", "target": "zz", "format": "text"}}, 400,
     lambda j: j["error"] == "zz is not supported" and "src -> trg" in j["detail"]),
    ("translate_missing_parameter", "POST", "/translate",
     {"data": {"source": "en", "target": "es", "format": "text"}}, 400,
     lambda j: j["error"] == "Invalid request: missing q parameter"),
]  # fmt: skip


def _mapped(value):
    """A request's fields with LibreTranslate's test languages mapped to the fixture's."""
    if isinstance(value, dict):
        return {key: _mapped(v) for key, v in value.items()}
    return {"en": "src", "es": "trg"}.get(value, value) if isinstance(value, str) else value


@pytest.fixture(scope="module")
def fixture_model():
    app = create_app(TorchEngine(FIXTURE / "old_last.pt"))
    with running(app) as url, httpx.Client(base_url=url, timeout=60) as client:
        yield client


@pytest.mark.parametrize("case", LT_CASES, ids=[c[0] for c in LT_CASES])
def test_libretranslate_api_tests_replayed(fixture_model, case):
    _, method, path, kwargs, status, holds = case
    reply = fixture_model.request(method, path, **_mapped(kwargs))
    assert reply.status_code == status, reply.text
    assert reply.headers["access-control-allow-origin"] == "*"
    if holds is not None:
        assert holds(reply.json()), reply.text


def test_the_libretranslatepy_client(upper):
    """libretranslatepy (form bodies, a GET with a body) against the server's URL."""
    from libretranslatepy import LibreTranslateAPI

    client, _ = upper
    lt = LibreTranslateAPI(str(client.base_url))
    assert lt.translate("Hello world", "en", "es") == "HELLO WORLD"
    assert lt.translate("Grüße\n🙂", "en", "es") == "GRÜSSE\n🙂"
    sure = lt.detect("The weather is lovely today and we are going for a walk.")
    assert sure == [{"language": "en", "confidence": 100.0}]
    assert lt.detect("Hello") == [{"language": "en", "confidence": 0.0}]  # one word: unsure
    assert lt.languages() == [
        {"code": "en", "name": "English", "targets": ["es"]},
        {"code": "es", "name": "Spanish", "targets": []},
    ]


def test_fields_from_the_query_string_a_form_or_both(upper):
    client, _ = upper
    query = client.post("/translate?q=Hello&source=en&target=es")
    assert query.status_code == 200 and query.json() == {"translatedText": "HELLO"}, query.text
    both = client.post("/translate?source=en&target=es", data={"q": "Hi"})
    assert both.json() == {"translatedText": "HI"}, both.text
    twice = client.post("/translate?q=a&source=en&target=es", data={"q": "b"})
    assert twice.status_code == 400 and "given twice" in twice.json()["error"]


def test_cors_headers_and_a_browsers_preflight(upper):
    client, _ = upper
    for reply in (client.get("/languages"), client.post("/translate", json={"q": "x"})):
        assert reply.headers["access-control-allow-origin"] == "*"
        assert reply.headers["access-control-allow-methods"] == "GET, POST"
    preflight = client.options(
        "/translate",
        headers={"Origin": "https://elsewhere.example", "Access-Control-Request-Method": "POST"},
    )
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] == "*"
    assert preflight.headers["access-control-allow-headers"] == "Authorization, Content-Type"


def test_frontend_settings_suggest_and_files_off(upper, tmp_path):
    client, _ = upper
    assert client.get("/frontend/settings").json() == {
        "charLimit": -1,
        "frontendTimeout": 500,
        "apiKeys": False,
        "keyRequired": False,
        "suggestions": False,
        "filesTranslation": True,
        "supportedFilesFormat": [".txt", ".html", ".docx", ".odt", ".pptx", ".epub"],
        "language": {
            "source": {"code": "en", "name": "English"},
            "target": {"code": "es", "name": "Spanish"},
        },
    }
    suggest = client.post("/suggest", data={"q": "a", "s": "b", "source": "en", "target": "es"})
    assert suggest.status_code == 403
    assert suggest.json() == {"error": "Suggestions are disabled on this server."}
    keys = tmp_path / "keys.json"
    add_key(keys, "team")
    settings = ServeSettings(
        access=AccessSettings(api_keys=keys, require_api_key=True, char_limit=300),
        files=FileSettings(enabled=False),
    )
    with serving(settings) as (other, _):
        got = other.get("/frontend/settings").json()
        upload = other.post("/translate_file", files={"file": ("a.txt", b"x")})
    assert (got["charLimit"], got["apiKeys"], got["keyRequired"]) == (300, True, True)
    assert (got["filesTranslation"], got["supportedFilesFormat"]) == (False, [])
    assert upload.status_code == 403
    assert upload.json() == {"error": "Files translation are disabled on this server."}


@pytest.mark.parametrize(
    "body, error",
    [
        ({"q": [], "source": "en", "target": "es"}, "Invalid request: missing q parameter"),
        ({"q": "", "source": "en", "target": "es"}, "Invalid request: missing q parameter"),
        ({"q": "a", "target": "es"}, "Invalid request: missing source parameter"),
        ({"q": "a", "source": "en"}, "Invalid request: missing target parameter"),
        ({"q": "a", "source": "zz", "target": "es"}, "zz is not supported"),
        ({"q": "a", "source": "en", "target": "es", "format": "xml"}, "xml format is not supp"),
        ([1, 2], "Invalid JSON format"),
    ],
)
def test_libretranslates_refusals(upper, body, error):
    client, engine = upper
    calls = len(engine.calls)
    reply = client.post("/translate", json=body)
    assert reply.status_code == 400 and reply.json()["error"].startswith(error), reply.text
    assert len(engine.calls) == calls


def test_nothing_to_translate_comes_back_unchanged_and_undecoded(upper):
    client, engine = upper
    calls = len(engine.calls)
    alone = client.post("/translate", json={"q": "🙂", "source": "auto", "target": "es"})
    assert alone.json() == {
        "translatedText": "🙂",
        "detectedLanguage": {"language": "en", "confidence": 0.0},
    }
    assert len(engine.calls) == calls, "an emoji was decoded"
    batch = ["🙂", "Hello", "3.14 !", "https://example.com/a", "ok\n--\n42"]
    reply = client.post("/translate", json={"q": batch, "source": "en", "target": "es"})
    assert reply.json()["translatedText"] == [
        "🙂", "HELLO", "3.14 !", "https://example.com/a", "OK\n--\n42",
    ]  # fmt: skip
    assert engine.calls[calls:] == [["Hello", "ok"]]


def test_alternatives_of_lines_with_nothing_to_translate(upper):
    client, _ = upper
    reply = client.post(
        "/translate",
        json={"q": ["Hi", "🙂"], "source": "en", "target": "es", "alternatives": 1},
    )
    assert reply.json() == {"translatedText": ["HI", "🙂"], "alternatives": [["HI"], []]}


def test_html_keeps_its_markup_attributes_and_entities(upper):
    client, _ = upper
    html = [
        '<p>Hello <b>big</b> world</p>',
        '<div class="x"><a href="/a?b=1&amp;c=2" title="T">click here</a> &amp; more</div>',
        "<ul><li>one</li><li>two <i>three</i></li></ul>",
    ]  # fmt: skip
    reply = client.post(
        "/translate", json={"q": html, "source": "en", "target": "es", "format": "html"}
    )
    assert reply.status_code == 200, reply.text
    assert reply.json()["translatedText"] == [
        "<p>HELLO <b>BIG</b> WORLD</p>",
        '<div class="x"><a href="/a?b=1&amp;c=2" title="T">CLICK HERE</a> &amp; MORE</div>',
        "<ul><li>ONE</li><li>TWO <i>THREE</i></li></ul>",
    ]
    one = client.post("/translate", data={"q": html[0], "source": "en", "target": "es",
                                          "format": "html"})  # fmt: skip
    assert one.json() == {"translatedText": "<p>HELLO <b>BIG</b> WORLD</p>"}


def test_translate_a_file_and_download_it(upper):
    client, _ = upper
    for name, data, translated in (
        ("notes.txt", "Hello\n\nworld 🙂\n".encode(), "HELLO\n\nWORLD 🙂\n".encode()),
        ("page.html", b"<html><body><p>Hi <b>you</b></p></body></html>", b"HI <b>YOU</b>"),
    ):
        reply = client.post(
            "/translate_file", data={"source": "en", "target": "es"}, files={"file": (name, data)}
        )
        assert reply.status_code == 200, reply.text
        url = reply.json()["translatedFileUrl"]
        assert url.startswith(f"{client.base_url}/download_file/")
        download = client.get(url)
        assert download.status_code == 200
        assert translated in download.content, download.content
        disposition = f"attachment; filename=\"{name}\"; filename*=utf-8''{name}"
        assert download.headers["content-disposition"] == disposition
    for files, data, error in (
        ({"file": ("a.pdf", b"%PDF")}, {"source": "en", "target": "es"}, "file format not supp"),
        ({}, {"source": "en", "target": "es"}, "missing file parameter"),
        ({"file": ("a.txt", b"x")}, {"source": "en"}, "missing target parameter"),
        ({"file": ("a.txt", b"x")}, {"source": "en", "target": "zz"}, "zz is not supported"),
    ):
        reply = client.post("/translate_file", data=data, files=files or None)
        assert reply.status_code == 400 and error in reply.json()["error"], reply.text


def test_a_download_name_built_to_escape_the_directory_is_refused(upper):
    client, _ = upper
    made = client.post(
        "/translate_file", data={"source": "en", "target": "es"}, files={"file": ("a.txt", b"x")}
    ).json()["translatedFileUrl"]
    name = made.rsplit("/", 1)[1]
    assert client.get(made).status_code == 200
    for attempt in (
        "..%2F..%2F..%2Fetc%2Fpasswd",
        "%2e%2e",
        f"..%2F{name}",
        f"{name}%2F..%2F..%2Fx",
        "0" * 32 + ".txt",  # the shape of a name, but never made
        name.upper(),
    ):
        reply = client.get(f"/download_file/{attempt}")
        assert reply.status_code in (400, 404), (attempt, reply.status_code)
        assert "error" in reply.json()


def test_downloads_expire_and_are_bounded_in_count_and_bytes(tmp_path):
    store = FileStore(FileSettings(directory=tmp_path, ttl_s=0.2, max_files=2))
    first, second = store.put(b"a", ".txt", "a.txt"), store.put(b"b", ".txt", "b.txt")
    assert store.get(first).path.read_bytes() == b"a"
    third = store.put(b"c", ".txt", "c.txt")
    assert store.get(first) is None and store.get(second) is not None
    assert _kept(store) == sorted([second, third])
    time.sleep(0.25)
    assert store.get(second) is None and _kept(store) == []
    small = FileStore(FileSettings(directory=tmp_path, max_total_bytes=5))
    names = [small.put(b"xx", ".txt", "x.txt") for _ in range(3)]
    assert [small.get(n) is not None for n in names] == [False, True, True]
    (small.directory / ("f" * 32 + ".txt")).write_bytes(b"not made by the store")
    assert small.get("f" * 32 + ".txt") is None
    small.close()
    assert not small.directory.exists()


def _kept(store: FileStore) -> list[str]:
    """The downloads in the store's directory (its index lives there too)."""
    return sorted(p.name for p in store.directory.iterdir() if NAME.fullmatch(p.name))


def test_two_stores_on_one_directory_are_one_store(tmp_path):
    """The worker processes of one server open one directory: a file one keeps, the other
    serves; eviction by either removes it for both; only the store that made the directory
    removes it."""
    first = FileStore(FileSettings(directory=tmp_path, max_files=2))
    second = FileStore(FileSettings(directory=tmp_path, max_files=2), shared=first.directory)
    name = first.put(b"a", ".txt", "a.txt")
    assert second.get(name).path.read_bytes() == b"a" and second.get(name).download_name == "a.txt"
    second.put(b"b", ".txt", "b.txt"), second.put(b"c", ".txt", "c.txt")  # over max_files
    assert first.get(name) is None and len(_kept(first)) == 2
    second.close()
    assert first.directory.exists() and first.get(_kept(first)[0]) is not None
    first.close()
    assert not first.directory.exists()


@pytest.fixture
def keyed(tmp_path):
    """A server whose keys file has "team" (its own limits) and "other"; a key is required
    except for pages of https://mine.example; clients without a key: 2 requests a minute."""
    keys = tmp_path / "keys.json"
    team = add_key(keys, "team", req_limit=3, char_limit=40)
    other = add_key(keys, "other")
    access = AccessSettings(
        api_keys=keys,
        require_api_key=True,
        key_free_origin=r"https://mine\.example$",
        req_limit=2,
        char_limit=10,
    )
    with serving(ServeSettings(access=access)) as (client, engine):
        yield client, engine, team, other


def _ask(client, key=None, origin=None, q="Hi"):
    body = {"q": q, "source": "en", "target": "es", **({"api_key": key} if key else {})}
    return client.post("/translate", data=body, headers={"Origin": origin} if origin else {})


def test_keys_required_invalid_and_the_origin_free_of_them(keyed):
    client, engine, team, _ = keyed
    calls = len(engine.calls)
    missing = _ask(client)
    assert missing.status_code == 400 and missing.json() == {"error": NEED_KEY}
    elsewhere = _ask(client, origin="https://mine.example.evil")
    assert elsewhere.status_code == 400
    wrong = _ask(client, key=team[:-1] + ("A" if team[-1] != "A" else "B"))
    assert wrong.status_code == 403 and wrong.json() == {"error": INVALID_KEY}
    assert len(engine.calls) == calls, "a refused request was decoded"
    from libretranslatepy import LibreTranslateAPI

    assert LibreTranslateAPI(str(client.base_url), api_key=team).translate("Hi") == "HI"
    assert _ask(client, origin="https://mine.example").status_code == 200
    v1 = client.post("/v1/translate", json={"text": ["a"]})
    assert v1.status_code == 400 and v1.json() == {"error": NEED_KEY}
    v1 = client.post("/v1/translate", json={"text": ["a"], "api_key": team})
    assert v1.status_code == 200


def test_a_limit_reached_answers_429_with_retry_after_without_decoding(keyed):
    client, engine, team, other = keyed
    mine = "https://mine.example"
    assert [_ask(client, origin=mine).status_code for _ in range(2)] == [200, 200]
    calls = len(engine.calls)
    limited = _ask(client, origin=mine)
    assert limited.status_code == 429
    assert limited.json() == {"error": "Slowdown: 2 per 1 minute"}
    assert 1 <= int(limited.headers["retry-after"]) <= 60
    assert len(engine.calls) == calls, "a request over the limit was decoded"
    # A key counts on its own: its limit (3), not the address's.
    assert [_ask(client, key=team).status_code for _ in range(4)] == [200, 200, 200, 429]
    assert _ask(client, key=other).status_code == 200  # the server's limit, for this key


def test_char_limit_per_text_and_per_key(keyed):
    client, _, team, other = keyed
    long = "Hello there!"  # 12 characters
    refused = _ask(client, key=other, q=long)
    assert refused.status_code == 400
    assert refused.json() == {"error": "Invalid request: request (12) exceeds text limit (10)"}
    assert _ask(client, key=team, q=long).json() == {"translatedText": long.upper()}


def test_serve_keys_command_adds_lists_and_removes(tmp_path):
    keys = tmp_path / "keys.json"
    runner = CliRunner()
    added = runner.invoke(cli_app, ["serve-keys", "add", str(keys), "alice", "--req-limit", "30"])
    assert added.exit_code == 0, added.output
    key = added.stdout.strip()
    assert len(key) >= 32 and key not in keys.read_text()  # the file keeps its hash only
    assert os.stat(keys).st_mode & 0o777 == 0o600
    assert [k.name for k in read_keys(keys)] == ["alice"]
    listed = runner.invoke(cli_app, ["serve-keys", "list", str(keys)])
    assert listed.stdout == "alice\treq_limit=30\tchar_limit=-\n" and key not in listed.output
    again = runner.invoke(cli_app, ["serve-keys", "add", str(keys), "alice"])
    assert again.exit_code == 1 and "exists" in again.output
    assert runner.invoke(cli_app, ["serve-keys", "remove", str(keys), "alice"]).exit_code == 0
    assert read_keys(keys) == []
    gone = runner.invoke(cli_app, ["serve-keys", "remove", str(keys), "alice"])
    assert gone.exit_code == 1 and "no key named 'alice'" in gone.output
    keys.write_text(json.dumps({"keys": [{"name": "x", "sha256": "nothex"}]}))
    bad = runner.invoke(cli_app, ["serve-keys", "list", str(keys)])
    assert bad.exit_code == 1 and "keys[0]" in bad.output


def test_serve_keys_keep_what_they_do_not_know_and_write_through_a_symlink(tmp_path):
    """add then remove gives the keys file back byte for byte: the fields this version does not
    read (the file's and an entry's, a newer version's) and the file's mode stay; a link stays a
    link and its target gets the change."""
    target = tmp_path / "real" / "keys.json"
    target.parent.mkdir()
    bob = {"name": "bob", "sha256": "a" * 64, "req_limit": None, "char_limit": 7}
    bob |= {"scopes": ["translate"], "note": "équipe"}  # an entry's fields of a newer version
    target.write_text(json.dumps({"keys": [bob], "owner": "ops", "version": 3}))
    target.chmod(0o640)  # the server's group may read it
    link = tmp_path / "keys.json"
    link.symlink_to(target)
    runner = CliRunner()
    assert runner.invoke(cli_app, ["serve-keys", "add", str(link), "carol"]).exit_code == 0
    written = target.read_bytes()  # the file as serve-keys writes it
    added = runner.invoke(cli_app, ["serve-keys", "add", str(link), "alice"])
    assert added.exit_code == 0, added.output
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    data = json.loads(target.read_text())
    assert data["owner"] == "ops" and data["version"] == 3 and data["keys"][0] == bob
    assert [k.name for k in read_keys(link)] == ["bob", "carol", "alice"]
    listed = runner.invoke(cli_app, ["serve-keys", "list", str(link)])
    assert listed.stdout.splitlines()[0] == "bob\treq_limit=-\tchar_limit=7"
    assert runner.invoke(cli_app, ["serve-keys", "remove", str(link), "alice"]).exit_code == 0
    assert target.read_bytes() == written
    assert link.is_symlink() and stat.S_IMODE(target.stat().st_mode) == 0o640


@pytest.mark.parametrize(
    "entry, says",
    [
        ({"req_limit": "5"}, "keys[0]: req_limit must be a positive integer or null"),
        ({"char_limit": 0}, "keys[0]: char_limit must be a positive integer or null"),
        ({"sha256": 5}, "keys[0]: name and sha256 must be strings"),
        ({"name": ["x"]}, "keys[0]: name and sha256 must be strings"),
    ],
)
def test_a_known_field_of_another_type_is_refused_beside_unknown_ones(tmp_path, entry, says):
    keys = tmp_path / "keys.json"
    known = {"name": "bob", "sha256": "a" * 64, "scopes": ["translate"]}
    keys.write_text(json.dumps({"keys": [known | entry]}))
    before = keys.read_bytes()
    with pytest.raises(MTError, match=rf"^{re.escape(str(keys))}: {re.escape(says)}$"):
        read_keys(keys)
    result = CliRunner().invoke(cli_app, ["serve-keys", "add", str(keys), "alice"])
    assert result.exit_code == 1 and says in result.output and keys.read_bytes() == before
    keys.write_text(json.dumps({"keys": ["bob"]}))
    with pytest.raises(MTError, match=r"keys\[0\]: an entry is an object of name, sha256"):
        read_keys(keys)


@pytest.mark.parametrize("name", ["", "   ", "a\nb", "tab\there", "bell\x07"])
def test_serve_keys_refuse_names_with_control_characters_or_nothing(tmp_path, name):
    keys = tmp_path / "keys.json"
    keys.write_text('{"keys": []}')
    before = keys.read_bytes()
    result = CliRunner().invoke(cli_app, ["serve-keys", "add", str(keys), name])
    assert result.exit_code == 1 and "key name" in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert keys.read_bytes() == before


def test_keys_in_an_access_log_line_are_redacted():
    import logging

    record = logging.LogRecord(
        "uvicorn.access", logging.INFO, "", 0, '%s - "%s %s HTTP/%s" %d',
        ("127.0.0.1:5", "POST", "/translate?q=a&api_key=s3cret&x=1", "1.1", 200), None,
    )  # fmt: skip
    assert redact_keys(record)
    assert "s3cret" not in record.getMessage() and "api_key=***" in record.getMessage()


def test_serve_refuses_key_options_that_cannot_work_before_loading(tmp_path):
    runner = CliRunner()
    ckpt = str(FIXTURE / "old_last.pt")
    alone = runner.invoke(cli_app, ["serve", "-c", ckpt, "--require-api-key"])
    assert alone.exit_code == 1 and "--require-api-key needs --api-keys" in alone.output
    missing = runner.invoke(cli_app, ["serve", "-c", ckpt, "--api-keys", str(tmp_path / "k")])
    assert missing.exit_code == 1 and "mt serve-keys add" in missing.output
    add_key(tmp_path / "k", "a")
    regex = runner.invoke(
        cli_app,
        ["serve", "-c", ckpt, "--api-keys", str(tmp_path / "k"), "--key-free-origin", "("],
    )
    assert regex.exit_code == 1 and "--key-free-origin '('" in regex.output


def test_keys_added_or_removed_while_serving_count_at_once(tmp_path):
    keys = tmp_path / "keys.json"
    first = add_key(keys, "first")
    access = AccessSettings(api_keys=keys, require_api_key=True)
    with serving(ServeSettings(access=access)) as (client, _):
        assert _ask(client, key=first).status_code == 200
        later = add_key(keys, "later")
        assert _ask(client, key=later).status_code == 200
        remove_key(keys, "first")
        assert _ask(client, key=first).status_code == 403
        keys.write_text("{broken")  # a bad edit: the keys read before stay
        assert _ask(client, key=later).status_code == 200
