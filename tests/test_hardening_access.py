"""`mt serve`'s access checks against a client that tries to get past them: X-Forwarded-For
or Forwarded rotated to escape --req-limit, IPv6 addresses rotated within one /64, a batch that carries many times --char-limit, an Origin that
only starts like the key-free one or is built to make the pattern backtrack, a keys file removed
from a running server, a Host header copied into translatedFileUrl, key names a keys file may
not hold. Servers listen on 127.0.0.1 only; the ones that matter for proxy headers are served as
`mt serve` serves them (``app._run_uvicorn``).
"""

import json
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the serve extra is not installed")
httpx = pytest.importorskip("httpx", reason="the serve extra is not installed")

from test_libretranslate import UpperEngine, serving  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from transformer_mt.cli import app as cli_app  # noqa: E402
from transformer_mt.errors import MTError  # noqa: E402
from transformer_mt.serve.access import (  # noqa: E402
    INVALID_KEY,
    NEED_KEY,
    Access,
    add_key,
    forwarded_nodes,
    origin_pattern,
    rate_group,
    read_keys,
    remove_key,
)
from transformer_mt.serve.app import _run_uvicorn, create_app  # noqa: E402
from transformer_mt.serve.launch import bind_sockets  # noqa: E402
from transformer_mt.serve.settings import (  # noqa: E402
    AccessSettings,
    ApiError,
    FileSettings,
    ServeSettings,
)

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "old_checkpoint"
runner = CliRunner()
try:
    import re2  # noqa: F401 (--key-free-origin's engine, in the serve extra)

    HAVE_RE2 = True
except ImportError:
    HAVE_RE2 = False
needs_re2 = pytest.mark.skipif(not HAVE_RE2, reason="google-re2 (the serve extra) is missing")


@contextmanager
def served_as_mt_serve(settings: ServeSettings):
    """An UpperEngine app served by ``app._run_uvicorn`` (uvicorn configured as `mt serve`
    configures it) on 127.0.0.1; yields an httpx client."""
    app = create_app(UpperEngine(), settings=settings)
    sockets = bind_sockets("127.0.0.1", 0)
    for sock in sockets:
        sock.listen(64)
    url = f"http://127.0.0.1:{sockets[0].getsockname()[1]}"
    thread = threading.Thread(target=_run_uvicorn, args=(app, sockets, settings), daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    with httpx.Client(base_url=url, timeout=30) as client:
        while True:
            try:
                if client.get("/health/live").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
            time.sleep(0.02)
        try:
            yield client
        finally:
            app.state.stop()
            thread.join(30)
            for sock in sockets:
                sock.close()


def _ask(client, q="Hi", key=None, origin=None, forwarded=None, rfc7239=None):
    """A /translate request; ``forwarded``: its X-Forwarded-For, ``rfc7239``: its Forwarded."""
    body = {"q": q, "source": "en", "target": "es", **({"api_key": key} if key else {})}
    headers = {"Origin": origin} if origin else {}
    if forwarded is not None:
        headers["X-Forwarded-For"] = forwarded
    if rfc7239 is not None:
        headers["Forwarded"] = rfc7239
    return client.post("/translate", json=body, headers=headers)


# --- X-Forwarded-For: trusted from the proxies --forwarded-allow-ips names only -------------


def test_a_client_rotating_x_forwarded_for_is_limited_by_default(monkeypatch):
    """No proxy named (the default): the header is ignored, also where uvicorn's own default
    (127.0.0.1) or FORWARDED_ALLOW_IPS=* would have trusted it."""
    monkeypatch.setenv("FORWARDED_ALLOW_IPS", "*")
    with served_as_mt_serve(ServeSettings(access=AccessSettings(req_limit=2))) as client:
        codes = [_ask(client, forwarded=f"203.0.113.{i}").status_code for i in range(3)]
        assert codes == [200, 200, 429]
        assert _ask(client, forwarded="198.51.100.7").json() == {
            "error": "Slowdown: 2 per 1 minute"
        }


def test_a_named_proxy_names_the_client_and_a_chain_is_read_from_the_right():
    access = AccessSettings(req_limit=2, forwarded_allow_ips="127.0.0.1")
    with served_as_mt_serve(ServeSettings(access=access)) as client:
        # Each client behind the proxy has its own count...
        assert [_ask(client, forwarded=f"203.0.113.{i}").status_code for i in range(4)] == [200] * 4
        # ...and a client that writes its own header gets the address the proxy appended.
        spoofed = [_ask(client, forwarded=f"10.9.9.{i}, 198.51.100.7") for i in range(3)]
        assert [r.status_code for r in spoofed] == [200, 200, 429]


def test_the_client_address_rules():
    def client(allow, peer, *values):
        return Access(AccessSettings(forwarded_allow_ips=allow)).client(peer, list(values))

    assert client(None, "192.0.2.1", "203.0.113.5") == "192.0.2.1"  # no proxy named
    assert client("10.0.0.0/8", "192.0.2.1", "203.0.113.5") == "192.0.2.1"  # not a proxy
    assert client("10.0.0.0/8", "10.1.2.3", "203.0.113.5") == "203.0.113.5"
    assert client("10.0.0.0/8", "10.1.2.3", "1.1.1.1, 203.0.113.5, 10.4.4.4") == "203.0.113.5"
    assert client("10.0.0.0/8", "10.1.2.3", "1.1.1.1", "203.0.113.5:4711") == "203.0.113.5"
    assert client("10.0.0.0/8", "10.1.2.3", "1.1.1.1, junk") == "10.1.2.3"  # the last proxy
    assert client("10.0.0.0/8", "10.1.2.3", "1.1.1.1, 10.0.0.9") == "1.1.1.1"
    assert client("10.0.0.0/8", "10.1.2.3", "[2001:db8::1]:443") == "2001:db8::1"
    assert client("10.0.0.0/8", "::ffff:10.1.2.3", "203.0.113.5") == "203.0.113.5"
    assert client("::1", "::1", "::ffff:203.0.113.5") == "203.0.113.5"  # one name per client
    assert client("*", "192.0.2.1", "203.0.113.5") == "203.0.113.5"
    assert client(None, "unknown") == "unknown"


# --- Forwarded (RFC 7239): the same rule, X-Forwarded-For first -----------------------------


def test_a_client_rotating_forwarded_is_limited_by_default():
    with served_as_mt_serve(ServeSettings(access=AccessSettings(req_limit=2))) as client:
        codes = [_ask(client, rfc7239=f"for=203.0.113.{i}").status_code for i in range(3)]
        assert codes == [200, 200, 429]


def test_a_named_proxy_names_the_client_in_forwarded_and_x_forwarded_for_wins():
    access = AccessSettings(req_limit=2, forwarded_allow_ips="127.0.0.1")
    with served_as_mt_serve(ServeSettings(access=access)) as client:
        # Each client behind the proxy has its own count (IPv6 quoted, bracketed, with a port)...
        named = [_ask(client, rfc7239=f'for="[2001:db8:{i}::1]:4711";proto=http') for i in range(4)]
        assert [r.status_code for r in named] == [200] * 4
        # ...a client that writes its own header gets the element the proxy appended...
        spoofed = [_ask(client, rfc7239=f"for=10.9.9.{i}, for=198.51.100.7") for i in range(3)]
        assert [r.status_code for r in spoofed] == [200, 200, 429]
        # ...and an unknown or obfuscated client counts as the proxy (the peer) does.
        hidden = [_ask(client, rfc7239=f) for f in ("for=unknown", "for=_hidden", "for=_x")]
        assert [r.status_code for r in hidden] == [200, 200, 429]
        # Both headers: X-Forwarded-For names the client, a rotated Forwarded changes nothing.
        both = [
            _ask(client, forwarded="203.0.113.77", rfc7239=f"for=192.0.2.{i}") for i in range(3)
        ]
        assert [r.status_code for r in both] == [200, 200, 429]


def test_forwarded_elements_are_read_as_rfc_7239_writes_them():
    example = 'for=192.0.2.60;proto=http;by=203.0.113.43, for="[2001:db8:cafe::17]:4711"'
    assert forwarded_nodes([example]) == ["192.0.2.60", "2001:db8:cafe::17"]
    assert forwarded_nodes(['For="192.0.2.43:47011"', 'for="[::ffff:203.0.113.5]"']) == [
        "192.0.2.43",
        "203.0.113.5",
    ]
    assert forwarded_nodes([" , for=198.51.100.17 ;; proto=https ,"]) == ["198.51.100.17"]
    unknown = [
        "for=unknown",
        'for="_hidden:4711"',
        "for=_SEVKISEK",
        "proto=https;by=10.0.0.1",  # no for=
        "for=1.1.1.1;for=2.2.2.2",  # for= twice
        'for=1.1.1.1;x="a;b"',  # a quoted ";" (no node holds one)
        'for="1.1.1.1',  # an unclosed quote
        "1.1.1.1",  # not name=value
        "for=",
    ]
    assert forwarded_nodes(unknown) == [None] * len(unknown)


def test_the_client_address_rules_with_forwarded():
    def client(allow, peer, forwarded, x_forwarded_for=()):
        access = Access(AccessSettings(forwarded_allow_ips=allow))
        return access.client(peer, list(x_forwarded_for), [forwarded])

    assert client(None, "192.0.2.1", "for=203.0.113.5") == "192.0.2.1"  # no proxy named
    assert client("10.0.0.0/8", "192.0.2.1", "for=203.0.113.5") == "192.0.2.1"  # not a proxy
    assert client("10.0.0.0/8", "10.1.2.3", "for=203.0.113.5") == "203.0.113.5"
    chain = 'for=1.1.1.1, for="203.0.113.5:80", for=10.4.4.4'
    assert client("10.0.0.0/8", "10.1.2.3", chain) == "203.0.113.5"
    assert client("10.0.0.0/8", "10.1.2.3", 'for="[2001:db8::1]:4711"') == "2001:db8::1"
    assert client("10.0.0.0/8", "10.1.2.3", "for=unknown") == "10.1.2.3"  # the peer
    assert client("10.0.0.0/8", "10.1.2.3", "for=_hidden;proto=https") == "10.1.2.3"
    assert client("10.0.0.0/8", "10.1.2.3", "for=1.1.1.1, for=_hidden, for=10.0.0.9") == "10.0.0.9"
    # A quote a client opens cannot swallow the element its proxy appends.
    assert client("10.0.0.0/8", "10.1.2.3", 'for=9.9.9.9;x=", for=203.0.113.5') == "203.0.113.5"
    # Both headers: X-Forwarded-For wins; a blank one counts as not sent.
    assert client("10.0.0.0/8", "10.1.2.3", "for=1.1.1.1", ["203.0.113.5"]) == "203.0.113.5"
    assert client("10.0.0.0/8", "10.1.2.3", "for=1.1.1.1", [" "]) == "1.1.1.1"


# --- IPv6 clients: counted by their /64 ------------------------------------------------------


def _admitted(access: Access, client: str) -> bool:
    try:
        access.check(None, "", client, ["Hi"])
    except ApiError as refused:
        assert refused.status == 429
        return False
    return True


def test_ipv6_clients_are_counted_by_their_64_and_mapped_ipv4_as_ipv4():
    assert rate_group("2001:db8:1:2::1") == "2001:db8:1:2::/64"
    assert rate_group("2001:db8:1:2:ffff:ffff:ffff:ffff") == "2001:db8:1:2::/64"
    assert rate_group("2001:db8:1:3::1") == "2001:db8:1:3::/64"
    assert rate_group("::ffff:192.0.2.1") == rate_group("192.0.2.1") == "192.0.2.1"
    assert rate_group("2001:db8:1:2::1", 48) == "2001:db8:1::/48"
    assert rate_group("testclient") == "testclient"
    access = Access(AccessSettings(req_limit=2))
    assert [_admitted(access, f"2001:db8:1:2::{i}") for i in range(1, 4)] == [True, True, False]
    assert _admitted(access, "2001:db8:1:3::1")  # another /64: another count
    assert [_admitted(access, a) for a in ("::ffff:1.2.3.4", "1.2.3.4", "1.2.3.4")] == [
        True,
        True,
        False,
    ]
    assert _admitted(access, "1.2.3.5")  # IPv4: each address alone
    exact = Access(AccessSettings(req_limit=1, ipv6_prefix=128))
    assert _admitted(exact, "2001:db8::1") and _admitted(exact, "2001:db8::2")


def test_ipv6_addresses_rotated_within_a_64_share_a_limit_through_the_server():
    access = AccessSettings(req_limit=2, forwarded_allow_ips="127.0.0.1")
    with served_as_mt_serve(ServeSettings(access=access)) as client:
        rotated = [_ask(client, forwarded=f"2001:db8:1:2::{i:x}") for i in range(1, 4)]
        assert [r.status_code for r in rotated] == [200, 200, 429]
        assert _ask(client, forwarded="2001:db8:1:3::1").status_code == 200
        mapped = [_ask(client, forwarded=a) for a in ("::ffff:203.0.113.9", "203.0.113.9")]
        assert [r.status_code for r in mapped] == [200, 200]
        assert _ask(client, forwarded="::ffff:203.0.113.9").status_code == 429


@pytest.mark.parametrize("value", ["localhost", "10.0.0.0/33", "1.2.3.4,,x"])
def test_a_bad_forwarded_allow_ips_is_one_line_before_loading(value):
    result = runner.invoke(
        cli_app, ["serve", "-c", str(FIXTURE / "old_last.pt"), "--forwarded-allow-ips", value]
    )
    assert result.exit_code == 1 and "--forwarded-allow-ips" in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1
    with pytest.raises(MTError, match="not an IP address or network"):
        AccessSettings(forwarded_allow_ips=value)


# --- --char-limit: a batch counts as a whole ---------------------------------------------------


def test_the_char_limit_counts_a_batch_as_a_whole():
    def batch(client, texts):
        return client.post("/translate", json={"q": texts, "source": "en", "target": "es"})

    with serving(ServeSettings(access=AccessSettings(char_limit=10))) as (client, engine):
        calls = len(engine.calls)
        refused = batch(client, ["Hello", "there", "again"])
        assert refused.status_code == 400
        assert refused.json() == {"error": "Invalid request: request (15) exceeds text limit (10)"}
        many = batch(client, ["123456789"] * 64)
        assert many.json() == {"error": "Invalid request: request (576) exceeds text limit (10)"}
        assert len(engine.calls) == calls, "a refused batch was decoded"
        assert batch(client, ["Hi", "you"]).json() == {"translatedText": ["HI", "YOU"]}


def test_a_keys_own_char_limit_counts_a_batch_as_a_whole(tmp_path):
    keys = tmp_path / "keys.json"
    key = add_key(keys, "team", char_limit=12)
    access = AccessSettings(api_keys=keys, char_limit=100)

    def batch(texts):
        body = {"q": texts, "source": "en", "target": "es", "api_key": key}
        return client.post("/translate", json=body)

    with serving(ServeSettings(access=access)) as (client, engine):
        refused = batch(["Hello", "there", "again"])  # 5 characters each, 15 together
        assert refused.status_code == 400, refused.text
        assert refused.json() == {"error": "Invalid request: request (15) exceeds text limit (12)"}
        assert engine.calls == [], "a refused batch was decoded"
        assert batch(["Hello", "there!"]).json() == {"translatedText": ["HELLO", "THERE!"]}


# --- --key-free-origin: the whole origin, matched in linear time ----------------------------


@pytest.fixture
def keys(tmp_path):
    path = tmp_path / "keys.json"
    return path, add_key(path, "team")


@needs_re2
def test_a_key_free_origin_must_match_the_whole_origin(keys):
    path, _ = keys
    access = AccessSettings(
        api_keys=path, require_api_key=True, key_free_origin=r"https://ok\.example"
    )
    with serving(ServeSettings(access=access)) as (client, _):
        assert _ask(client, origin="https://ok.example").status_code == 200
        for origin in (
            "https://ok.example.evil.com",
            "https://ok.example:8443",
            "xhttps://ok.example",
        ):
            refused = _ask(client, origin=origin)
            assert refused.status_code == 400 and refused.json() == {"error": NEED_KEY}, origin


@needs_re2
def test_an_origin_built_to_backtrack_is_answered_at_once(keys):
    """``(a+)+$`` backtracks exponentially in Python's re on "aaa...!"; RE2 matches in linear
    time, so the server answers that Origin and the next request at once."""
    path, key = keys
    access = AccessSettings(api_keys=path, require_api_key=True, key_free_origin="(a+)+$")
    with serving(ServeSettings(access=access)) as (client, _):
        start = time.monotonic()
        crafted = _ask(client, origin="a" * 4000 + "!")
        assert crafted.status_code == 400 and crafted.json() == {"error": NEED_KEY}
        assert _ask(client, origin="aaaa").status_code == 200
        assert _ask(client, key=key).status_code == 200
        assert time.monotonic() - start < 5


@needs_re2
@pytest.mark.parametrize("pattern", [r"(a)\1", "(?=x)y", "("])
def test_a_key_free_origin_re2_cannot_match_in_linear_time_is_one_line(keys, pattern):
    path, _ = keys
    options = ["--api-keys", str(path), "--require-api-key", "--key-free-origin", pattern]
    result = runner.invoke(cli_app, ["serve", "-c", str(FIXTURE / "old_last.pt"), *options])
    assert result.exit_code == 1, result.output
    assert result.output.startswith(f"error: --key-free-origin {pattern!r}: ")
    assert len(result.output.strip().splitlines()) == 1


def test_without_re2_a_key_free_origin_is_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "re2", None)  # as if not installed
    with pytest.raises(
        MTError, match=r"^--key-free-origin needs google-re2 .*transformer-mt\[serve\]"
    ):
        origin_pattern("https://mine")
    assert origin_pattern(None) is None  # no pattern, no need


# --- the keys file: removed, it revokes its keys --------------------------------------------


@needs_re2
def test_a_removed_keys_file_revokes_its_keys_and_coming_back_restores_them(keys, caplog):
    path, key = keys
    saved = path.read_bytes()
    access = AccessSettings(api_keys=path, require_api_key=True, key_free_origin="https://mine")
    with serving(ServeSettings(access=access)) as (client, engine):
        assert _ask(client, key=key).status_code == 200
        path.unlink()
        calls = len(engine.calls)
        revoked = _ask(client, key=key)
        assert revoked.status_code == 403 and revoked.json() == {"error": INVALID_KEY}
        assert _ask(client).json() == {"error": NEED_KEY}  # a key is required, none can be had
        assert _ask(client, origin="https://mine").status_code == 200  # key-free pages go on
        assert len(engine.calls) == calls + 1
        assert "every key is revoked" in caplog.text
        path.write_bytes(saved)
        assert _ask(client, key=key).status_code == 200
        other = add_key(path, "other")  # a new file: the same check, at the next request
        remove_key(path, "team")
        assert _ask(client, key=key).status_code == 403
        assert _ask(client, key=other).status_code == 200


def test_without_require_api_key_a_removed_file_leaves_keyless_requests_alone(keys):
    path, key = keys
    with serving(ServeSettings(access=AccessSettings(api_keys=path))) as (client, _):
        path.unlink()
        assert _ask(client).status_code == 200
        assert _ask(client, key=key).status_code == 403


# --- translatedFileUrl: never from the Host header ------------------------------------------


def _upload(client, headers=None):
    reply = client.post(
        "/translate_file",
        data={"source": "en", "target": "es"},
        files={"file": ("a.txt", b"hello\n")},
        headers=headers or {},
    )
    assert reply.status_code == 200, reply.text
    return reply.json()["translatedFileUrl"]


def test_the_file_url_is_where_the_request_came_in_never_the_host_header():
    with served_as_mt_serve(ServeSettings()) as client:
        url = _upload(client, {"Host": "evil.example", "X-Forwarded-Host": "evil.example"})
        assert url.startswith(f"{client.base_url}/download_file/"), url
        assert "evil" not in url
        assert client.get(url).content == b"HELLO\n"


def test_the_file_url_starts_with_the_public_url():
    files = FileSettings(public_url="https://mt.example.org/mt/")
    with serving(ServeSettings(files=files)) as (client, _):
        url = _upload(client, {"Host": "evil.example"})
        assert url.startswith("https://mt.example.org/mt/download_file/"), url
        name = url.rsplit("/", 1)[1]
        assert client.get(f"/download_file/{name}").content == b"HELLO\n"


@pytest.mark.parametrize(
    "url", ["mt.example.org", "ftp://mt.example.org", "https://", "https://h/?a=1", "https://u:p@h"]
)
def test_a_bad_public_url_is_one_line_before_loading(url):
    result = runner.invoke(
        cli_app, ["serve", "-c", str(FIXTURE / "old_last.pt"), "--public-url", url]
    )
    assert result.exit_code == 1 and f"--public-url {url!r}" in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1


# --- key names: printable, in a keys file as from serve-keys add ----------------------------


@pytest.mark.parametrize("name", ["", "  ", "a\nb", "tab\there", "nul\x00"])
def test_a_keys_file_entry_whose_name_cannot_be_listed_is_refused_and_removable(tmp_path, name):
    path = tmp_path / "keys.json"
    good = add_key(path, "good")
    data = json.loads(path.read_text())
    data["keys"].append({"name": name, "sha256": "b" * 64, "req_limit": None, "char_limit": None})
    path.write_text(json.dumps(data))
    with pytest.raises(MTError, match=r"keys\[1\]: key name"):
        read_keys(path)
    listed = runner.invoke(cli_app, ["serve-keys", "list", str(path)])
    assert listed.exit_code == 1 and "keys[1]: key name" in listed.output
    assert len(listed.output.strip().splitlines()) == 1
    started = runner.invoke(
        cli_app, ["serve", "-c", str(FIXTURE / "old_last.pt"), "--api-keys", str(path)]
    )
    assert started.exit_code == 1 and "keys[1]: key name" in started.output
    added = runner.invoke(cli_app, ["serve-keys", "add", str(path), name])
    assert added.exit_code == 1 and "key name" in added.output
    assert runner.invoke(cli_app, ["serve-keys", "remove", str(path), name]).exit_code == 0
    assert [k.name for k in read_keys(path)] == ["good"]
    assert Access(AccessSettings(api_keys=path)).lookup(good) is not None
