"""Access control for a server opened beyond localhost: API keys, request and character limits.

A keys file (``mt serve --api-keys FILE``, managed with ``mt serve-keys add/list/remove``) is
JSON: ``{"keys": [{"name", "sha256", "req_limit", "char_limit"}]}``; fields this version does not
read (a newer version's), in the file or in an entry, are kept as they are. It holds each key's
SHA-256, never the key itself: the key is printed once, when it is added. A key given in a
request is hashed and compared with every entry in constant time (:func:`hmac.compare_digest`);
keys are never logged. A running server reads the file again when it changes; a file that is removed
revokes every key (a file that cannot be read keeps the keys read before, with a warning).

What a translating request meets, in LibreTranslate's order and with its answers:

1. a key that is given but unknown: 403 "Invalid API key";
2. no key where one is required (``require_api_key``, unless the request's whole Origin matches
   ``key_free_origin``, an RE2 pattern: linear-time matching, so that no Origin header can
   stall the server): 400 "Please contact the server operator to get an API key";
3. more requests in the last minute than the limit (per key: the key's own; otherwise per
   client address: ``req_limit``): 429 "Slowdown: N per 1 minute" with ``Retry-After``. The
   client address is the connection's peer; X-Forwarded-For, or else RFC 7239's Forwarded, is
   read only from the proxies ``forwarded_allow_ips`` names (:meth:`Access.client`). An IPv4
   client is counted by its address, an IPv6 one by its network of ``ipv6_prefix`` bits (a /64:
   one host usually owns a whole /64, and would otherwise get a new limit with each address it
   takes from it; :func:`rate_group`);
4. more characters than the character limit (the key's, or ``char_limit``), the texts of a
   batch summed: 400 "Invalid request: request (N) exceeds text limit (L)".

Each check comes before any decoding. With ``mt serve --workers N`` the request counts are the
server's, not each worker's: the workers keep them in one SQLite file (:class:`SharedRateLimiter`).
"""

import hashlib
import hmac
import ipaddress
import json
import logging
import math
import os
import re
import secrets
import threading
import time
import unicodedata
from collections import deque
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from transformer_mt.errors import MTError
from transformer_mt.fileio import atomic_write
from transformer_mt.serve import shared_sqlite
from transformer_mt.serve.settings import AccessSettings, ApiError

logger = logging.getLogger(__name__)

WINDOW_S = 60.0  # the request limits count the requests of the last minute
# Set by `mt serve --workers N` for its workers: the SQLite file of the request counts they share.
SHARED_LIMITS_ENV = "MT_SERVE_SHARED_LIMITS"
NEED_KEY = "Please contact the server operator to get an API key"
INVALID_KEY = "Invalid API key"


@dataclass(frozen=True)
class ApiKey:
    """One key's entry in a keys file.

    One key's entry: a name to manage it by, its hash, and its own limits (None: the
    server's)."""

    name: str
    sha256: str
    req_limit: int | None = None  # requests per minute
    char_limit: int | None = None  # characters per request, the texts of a batch together


def key_hash(key: str) -> str:
    """The hex SHA-256 of a key, as the keys file stores it."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def read_keys(path: Path) -> list[ApiKey]:
    """The keys of a keys file (an absent file: none), or an MTError naming the file and entry."""
    return [_entry(path, i, entry) for i, entry in enumerate(_document(path)["keys"])]


def _document(path: Path) -> dict:
    """The keys file's JSON object as it is (fields this version does not know included)."""
    if not path.exists():
        return {"keys": []}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise MTError(
            f"{path}: not a keys file (JSON: {err}); manage it with `mt serve-keys`"
        ) from None
    if not isinstance(data, dict) or not isinstance(data.get("keys"), list):
        raise MTError(f'{path}: a keys file is {{"keys": [...]}}; manage it with `mt serve-keys`')
    return data


def _entry(path: Path, i: int, entry: object, check_name: bool = True) -> ApiKey:
    """One entry of a keys file, checked (its name too, unless ``check_name`` is False)."""
    where = f"{path}: keys[{i}]"
    if not isinstance(entry, dict):
        raise MTError(f"{where}: an entry is an object of name, sha256, req_limit and char_limit")
    name, digest = entry.get("name"), entry.get("sha256")
    if not isinstance(name, str) or not isinstance(digest, str):
        raise MTError(f"{where}: name and sha256 must be strings")
    if check_name and _name_problem(name):
        raise MTError(
            f"{where}: key name {name!r}: {_name_problem(name)}; remove the entry "
            "(mt serve-keys remove) and add the key again under another name"
        )
    if not re.fullmatch(r"[0-9a-f]{64}", digest):
        raise MTError(f"{where}: sha256 must be 64 lowercase hex digits")
    for limit in ("req_limit", "char_limit"):
        value = entry.get(limit)
        if value is not None and (type(value) is not int or value < 1):
            raise MTError(f"{where}: {limit} must be a positive integer or null")
    return ApiKey(name, digest, entry.get("req_limit"), entry.get("char_limit"))


def check_key_name(name: str) -> None:
    """A key name is printable text with something in it (it is listed one per line)."""
    problem = _name_problem(name)
    if problem:
        raise MTError(f"key name {name!r}: {problem}")


def _name_problem(name: str) -> str | None:
    """What makes ``name`` no key name (None: nothing)."""
    if not name.strip() or any(unicodedata.category(char).startswith("C") for char in name):
        return (
            "use printable characters (no tabs, line breaks or other control characters), "
            "and at least one that is not a space"
        )
    return None


def _write_document(path: Path, data: dict) -> None:
    """Replace the keys file's content atomically: a new file is readable by its owner only.

    An existing file keeps its permissions (a group the server runs as may read it). Through a
    symlink: the link stays a link and its target gets the change. The new content is a new
    file renamed over the old one, so that a server never reads half a file: a hard link to the
    old file keeps the old content."""
    target = Path(os.path.realpath(path))
    new = not target.exists()
    with atomic_write(target) as out:
        out.write(json.dumps(data, indent=2) + "\n")
    if new:
        target.chmod(0o600)


def add_key(
    path: Path, name: str, req_limit: int | None = None, char_limit: int | None = None
) -> str:
    """Add a new random key named ``name`` to the keys file, created if absent.

    Every other field and entry of the file stays as it was. Returns the key, which is stored
    nowhere else."""
    check_key_name(name)
    data = _document(path)
    if any(key.name == name for key in read_keys(path)):
        raise MTError(f"{path}: a key named {name!r} exists; remove it first or choose a name")
    key = secrets.token_urlsafe(24)
    data["keys"].append(asdict(ApiKey(name, key_hash(key), req_limit, char_limit)))
    _write_document(path, data)
    return key


def remove_key(path: Path, name: str) -> None:
    """Remove the key named ``name`` from the keys file; everything else stays as it was.

    An entry whose name a keys file may not hold (a line break, nothing) can be removed too."""
    data = _document(path)
    keys = [_entry(path, i, entry, check_name=False) for i, entry in enumerate(data["keys"])]
    if not any(key.name == name for key in keys):
        have = ", ".join(repr(key.name) if _name_problem(key.name) else key.name for key in keys)
        raise MTError(f"{path}: no key named {name!r} (keys: {have or 'none'})")
    data["keys"] = [entry for entry in data["keys"] if entry["name"] != name]
    _write_document(path, data)


class RateLimiter:
    """Requests per client in a moving window of a minute; thread-safe."""

    def __init__(self, window_s: float = WINDOW_S) -> None:
        self.window_s = window_s
        self._seen: dict[str, deque[float]] = {}
        self._lock = threading.Lock()

    def admit(self, client: str, limit: int) -> float | None:
        """Count a request of ``client`` within ``limit``, or say when it may come.

        Returns None when the request is within ``limit``; otherwise the seconds until it would be,
        and the request is not counted."""
        now = time.monotonic()
        with self._lock:
            if len(self._seen) > 10_000:  # many clients seen once: forget the quiet ones
                self._forget(now)
            times = self._seen.setdefault(client, deque())
            while times and times[0] <= now - self.window_s:
                times.popleft()
            if len(times) >= limit:
                return times[0] + self.window_s - now
            times.append(now)
            return None

    def _forget(self, now: float) -> None:
        for client in [c for c, t in self._seen.items() if not t or t[-1] <= now - self.window_s]:
            del self._seen[client]


class SharedRateLimiter:
    """:class:`RateLimiter`'s counts in an SQLite file that several processes open: one limit.

    Each admission is one write transaction (``BEGIN IMMEDIATE``: the processes take turns), on
    the system-wide monotonic clock. Thread-safe within a process too."""

    SCHEMA = (
        "CREATE TABLE IF NOT EXISTS hits (client TEXT NOT NULL, t REAL NOT NULL)",
        "CREATE INDEX IF NOT EXISTS hits_by_client ON hits (client, t)",
        "CREATE INDEX IF NOT EXISTS hits_by_time ON hits (t)",
    )

    def __init__(self, path: Path, window_s: float = WINDOW_S) -> None:
        self.window_s = window_s
        self._lock = threading.Lock()
        self._db = shared_sqlite.connect(path, self.SCHEMA)

    def admit(self, client: str, limit: int) -> float | None:
        """As :meth:`RateLimiter.admit`, counting every process's requests."""
        now = time.monotonic()
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.execute("DELETE FROM hits WHERE t <= ?", (now - self.window_s,))
                count, first = self._db.execute(
                    "SELECT COUNT(*), MIN(t) FROM hits WHERE client = ?", (client,)
                ).fetchone()
                if count >= limit:
                    return first + self.window_s - now
                self._db.execute("INSERT INTO hits VALUES (?, ?)", (client, now))
                return None
            finally:
                self._db.execute("COMMIT")


class Access:
    """The checks of a translating request, from :class:`AccessSettings` and its keys file."""

    def __init__(self, settings: AccessSettings) -> None:
        self.settings = settings
        if settings.api_keys and not settings.api_keys.is_file():
            raise MTError(
                f"--api-keys {settings.api_keys}: no such file; create it with "
                f"`mt serve-keys add {settings.api_keys} NAME`"
            )
        self.keys: list[ApiKey] = []
        self._file_stamp: tuple[int, ...] | None = None  # the keys file's stat, as read
        self._reload(strict=True)
        self._free_origin = origin_pattern(settings.key_free_origin)
        self._trust_every, self._proxies = settings.trusted_proxies()
        shared = os.environ.get(SHARED_LIMITS_ENV)
        self.limiter: RateLimiter | SharedRateLimiter = (
            SharedRateLimiter(Path(shared)) if shared else RateLimiter()
        )

    def _reload(self, strict: bool = False) -> None:
        """Read the keys file again where it changed (`mt serve-keys` works on a running server).

        A removed file revokes every key: no key is valid until the file is back (with
        ``require_api_key``, only a key-free Origin is then served). A file that became
        unreadable keeps the keys read before, with one warning per change; with ``strict`` (at
        start), its MTError is raised instead."""
        path = self.settings.api_keys
        if path is None:
            return
        try:
            stat = path.stat()
            stamp: tuple[int, ...] = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
        except FileNotFoundError:
            stamp = ()  # gone: no keys
        except OSError:
            stamp = (-1,)  # cannot be looked at: the keys read before stay
        if stamp == self._file_stamp:
            return
        self._file_stamp = stamp
        if stamp == ():
            self.keys = []
            logger.warning("the keys file %s is gone: every key is revoked until it is back", path)
            return
        try:
            self.keys = read_keys(path) if stamp != (-1,) else self.keys
        except (OSError, MTError) as err:
            if strict:
                raise
            logger.warning("the keys file changed and cannot be read; keeping its keys: %s", err)

    def lookup(self, key: str) -> ApiKey | None:
        """The entry of ``key``, comparing with every entry in constant time."""
        self._reload()
        digest, found = key_hash(key), None
        for entry in self.keys:
            if hmac.compare_digest(digest, entry.sha256):
                found = entry
        return found

    def client(
        self, peer: str, forwarded_for: list[str], forwarded: list[str] | None = None
    ) -> str:
        """The address a request's limit counts: its peer's, or the client its proxies name.

        Only a peer that ``forwarded_allow_ips`` trusts may name another client. Its
        X-Forwarded-For addresses (``forwarded_for``: the header's values), or, where it sent
        none, the ``for=`` nodes of its Forwarded header (``forwarded``: RFC 7239, read by
        :func:`forwarded_nodes`), are read from the right, as each proxy appends the address it
        got the request from: the first one that is not a trusted proxy is the client. An entry
        that is no IP address (junk; in Forwarded also ``for=unknown``, an obfuscated ``_hidden``,
        an element without ``for=``) ends the reading: the last trusted proxy counts, the peer
        where it is the only one. Addresses are written as :mod:`ipaddress` writes them (an
        IPv4-mapped IPv6 address as IPv4), so that one client has one name.

        Where both headers are sent, X-Forwarded-For wins and Forwarded is not read. The proxies
        in common use (nginx, Apache, HAProxy, Traefik, Caddy, cloud load balancers) write
        X-Forwarded-For and pass a Forwarded header that a client wrote on untouched: were
        Forwarded to win, such a client could name itself anew with each request. uvicorn's
        ProxyHeadersMiddleware reads X-Forwarded-For alone. A proxy that writes Forwarded only
        must drop the X-Forwarded-For a client sends."""
        client = _address(peer) or peer
        if not self._trusts(client):
            return client
        if any(value.strip() for value in forwarded_for):
            hops = [_address(hop) for value in forwarded_for for hop in value.split(",")]
        else:
            hops = forwarded_nodes(forwarded or [])
        for address in reversed(hops):
            if address is None:
                break
            client = address
            if not self._trusts(address):
                break
        return client

    def _trusts(self, address: str) -> bool:
        """Whether ``address`` is a proxy of ``forwarded_allow_ips``."""
        if self._trust_every:
            return True
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        return any(ip in network for network in self._proxies)

    def check(self, api_key: str | None, origin: str, client: str, texts: list[str]) -> None:
        """Refuse a request that may not go on; count it otherwise.

        Raise the :class:`ApiError` LibreTranslate answers when this request may not go on
        (see the module's docstring); count it against its request limit otherwise."""
        if not self.settings.enabled:
            return
        entry = self.lookup(api_key) if api_key else None
        if api_key and entry is None:
            raise ApiError(403, INVALID_KEY)
        if entry is None and self.settings.require_api_key and not self._key_free(origin):
            raise ApiError(400, NEED_KEY)
        self._count(entry, client)
        char_limit = (entry and entry.char_limit) or self.settings.char_limit
        total = sum(len(text) for text in texts)  # a batch counts as a whole, as LibreTranslate's
        if char_limit and total > char_limit:
            raise ApiError(
                400, f"Invalid request: request ({total}) exceeds text limit ({char_limit})"
            )

    def _key_free(self, origin: str) -> bool:
        """Whether the whole of ``origin`` matches ``key_free_origin`` (in linear time)."""
        return self._free_origin is not None and self._free_origin.fullmatch(origin) is not None

    def _count(self, entry: ApiKey | None, client: str) -> None:
        """The request limit: a key's own, per key; else the server's, per client address."""
        limit = (entry and entry.req_limit) or self.settings.req_limit
        if not limit:
            return
        who = (
            f"key:{entry.sha256}"
            if entry
            else f"client:{rate_group(client, self.settings.ipv6_prefix)}"
        )
        wait = self.limiter.admit(who, limit)
        if wait is not None:
            retry = str(max(1, math.ceil(wait)))
            raise ApiError(429, f"Slowdown: {limit} per 1 minute", {"Retry-After": retry})


def _address(text: str) -> str | None:
    """The IP address ``text`` holds (``1.2.3.4``, ``1.2.3.4:5``, ``[::1]:5``), or None.

    Written as :mod:`ipaddress` writes it; an IPv4-mapped IPv6 address as its IPv4 address."""
    text = text.strip()
    if text.startswith("["):  # [v6] or [v6]:port
        text = text[1:].partition("]")[0]
    elif text.count(":") == 1:  # v4:port
        text = text.partition(":")[0]
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return None
    mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
    return str(mapped or ip)


def rate_group(client: str, ipv6_prefix: int = 64) -> str:
    """What a client's requests are counted under for ``req_limit``.

    An IPv4 address alone; an IPv6 address's network of ``ipv6_prefix`` bits
    (``2001:db8:1:2::/64``: a host is usually given a whole /64, and could take a new address
    from it for each request); an IPv4-mapped IPv6 address (``::ffff:192.0.2.1``) as the IPv4
    address it is. What is no IP address (a test client's name, "unknown") is counted as it is.
    """
    try:
        ip = ipaddress.ip_address(client.strip("[]"))
    except ValueError:
        return client
    if isinstance(ip, ipaddress.IPv4Address):
        return str(ip)
    if ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ipaddress.IPv6Network((ip, ipv6_prefix), strict=False))


# One parameter of a Forwarded element: a name, "=", a token or a quoted string (RFC 7239).
_FORWARDED_PAIR = re.compile(
    r"""\s*([!#$%&'*+.^_`|~0-9A-Za-z-]+)"""  # the name: a token
    r"""\s*=\s*("(?:[^"\\]|\\.)*"|[^\s";,]*)\s*"""  # the value: quoted, or up to the next space
)


def forwarded_nodes(values: list[str]) -> list[str | None]:
    """The client address of each element of RFC 7239 Forwarded headers, left to right.

    ``Forwarded: for=192.0.2.60;proto=http, for="[2001:db8::1]:4711"`` gives ``192.0.2.60``
    and ``2001:db8::1`` (written as :func:`_address` writes them: ports dropped, an
    IPv4-mapped address as IPv4). None for an element whose ``for=`` is no IP address
    (``unknown``, an obfuscated identifier such as ``_hidden``), that has no ``for=`` or
    two, or that does not read as ``name=value`` pairs.

    Each element is read alone, split at every comma (and into pairs at every semicolon): no
    node holds either, and so no quoted string a client opens can join the element its proxy
    appends after it (an element with a quoted comma or semicolon elsewhere reads as None, as
    an unknown client does). Empty elements and pairs are skipped, as RFC 7239 allows.
    """
    nodes: list[str | None] = []
    for element in (part for value in values for part in value.split(",")):
        if element.strip():
            nodes.append(_forwarded_for(element))
    return nodes


def _forwarded_for(element: str) -> str | None:
    """The IP address of one Forwarded element's ``for=`` (None: none, see forwarded_nodes)."""
    found: list[str] = []
    for pair in element.split(";"):
        if not pair.strip():
            continue
        match = _FORWARDED_PAIR.fullmatch(pair)
        if match is None:
            return None  # not RFC 7239's syntax: nothing of this element is believed
        if match.group(1).lower() == "for":
            value = match.group(2)
            if value.startswith('"'):
                value = re.sub(r"\\(.)", r"\1", value[1:-1])
            found.append(value)
    return _address(found[0]) if len(found) == 1 else None


def origin_pattern(pattern: str | None) -> Any:
    """``--key-free-origin`` compiled by RE2 (linear-time matching), or None where none is given.

    Python's ``re`` backtracks: a pattern such as ``(a+)+$`` and one crafted Origin header would
    keep a worker busy for ever. RE2 matches any pattern in time linear in the header, and
    refuses what it cannot match so (backreferences, lookarounds).

    Raises:
        MTError: RE2 is not installed, or the pattern is not one it compiles (naming the option).
    """
    if not pattern:
        return None
    try:
        import re2
    except ImportError:
        raise MTError(
            "--key-free-origin needs google-re2 (linear-time regular expressions, so that no "
            "Origin header can stall the server): pip install google-re2, or 'transformer-mt[serve]'"
        ) from None
    options = re2.Options()
    options.log_errors = False  # RE2 would log its own multi-line complaint on stderr
    try:
        return re2.compile(pattern, options=options)
    except re2.error as err:
        reason = err.args[0] if err.args else err
        reason = reason.decode("utf-8", "replace") if isinstance(reason, bytes) else str(reason)
        raise MTError(
            f"--key-free-origin {pattern!r}: {reason} (RE2's syntax: Python's without "
            "backreferences and lookarounds)"
        ) from None
