"""`mt serve`'s settings, grouped by concern, each declared once; and the one error a route raises.

Plain Python (no FastAPI, no torch): `mt serve-keys` and the CLI's option parsing use these
without the ``serve`` extra. :class:`ServeSettings` is what the ``serve`` command builds from its
options; each part goes to the piece of the server that owns it (limits to the body reader and
the routes, batching to :mod:`~transformer_mt.serve.batcher`, access to
:mod:`~transformer_mt.serve.access`, files to :mod:`~transformer_mt.serve.file_store`).

Every field is a :func:`~transformer_mt.config.setting`: its default, help and allowed values,
and (``option=``) the `mt serve` option that sets it. The command's options are read from these
declarations (:func:`serve_options`), and each settings object checks its fields when it is
built, in code as from the command line, with one line naming the option
(``--max-beam is 0; it must be 1 to 64``). A field kept in bytes or seconds whose option is
given in KiB, MiB or milliseconds says so with :func:`unit_setting`: the one conversion between
them.
"""

import dataclasses
import functools
import ipaddress
import typing
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from transformer_mt.config import (
    AT_LEAST_0,
    AT_LEAST_1,
    POSITIVE,
    Limit,
    Range,
    check_settings,
    setting,
)
from transformer_mt.engines.options import model_setting
from transformer_mt.errors import MTError

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# On SIGTERM uvicorn waits for every open connection; a client that never finishes sending its
# body (or never reads its answer) would keep the process alive for good. After this long
# (`mt serve --shutdown-timeout`) the requests left are cancelled and their connections closed;
# the decode worker still answers what was submitted before exiting.
SHUTDOWN_TIMEOUT_S = 30.0


class ApiError(Exception):
    """A refused request: its HTTP status, one line for ``{"error": ...}``, extra headers.

    ``detail``: ours, in a field of its own (``{"error": ..., "detail": ...}``), so that
    ``error`` is word for word what LibreTranslate answers where it has an answer."""

    def __init__(
        self,
        status: int,
        message: str,
        headers: dict[str, str] | None = None,
        detail: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.headers, self.detail = status, message, headers, detail


@dataclass(frozen=True)
class Unit:
    """The unit an option is given in, where its field keeps another.

    One option unit is ``size`` field units (KiB: 1024 bytes; MiB: 1024 KiB; ms: 0.001 seconds).
    """

    name: str
    size: float

    def to_field(self, value: float) -> Any:
        """An option's value in its field's unit (an int stays an int)."""
        return _tidy(value * self.size, value)

    def to_option(self, value: float) -> Any:
        """A field's value in its option's unit (an int stays an int where it divides)."""
        return _tidy(value / self.size, value)


def _tidy(value: float, like: float) -> float | int:
    """``value`` without the float noise of a unit conversion (0.05 / 0.001 -> 50.0).

    An int where ``like`` (the value converted) is one and the result is whole.
    """
    rounded = float(f"{value:.12g}")
    return int(rounded) if isinstance(like, int) and rounded.is_integer() else rounded


KIB = Unit("KiB", 1024)
MIB = Unit("MiB", 1 << 20)
MS = Unit("ms", 0.001)


def unit_setting(
    unit: Unit, default: Any, help: str, *, range: Range | None = None, option: str
) -> Any:
    """A :func:`~transformer_mt.config.setting` whose option is given in ``unit``.

    The field keeps bytes or seconds, ``option`` takes KiB, MiB or ms (its default, range and
    value converted by :class:`Unit`).
    """
    declared = setting(default, help, range=range, option=option)
    return field(default=default, metadata={**declared.metadata, "unit": unit})


def check_declared(obj: Any) -> None:
    """Refuse a field of the settings object ``obj`` outside its declared range or choices.

    :func:`~transformer_mt.config.check_settings` checks it, naming the option that sets the
    field (or ``Class.field``) with the value and range in the option's unit.

    Raises:
        MTError: one line, e.g. ``--max-beam is 0; it must be 1 to 64``.
    """
    fields = dataclasses.fields(obj)
    names = {f.name: f.metadata["option"] for f in fields if f.metadata.get("option")}
    units = {f.name: f.metadata["unit"].to_option for f in fields if "unit" in f.metadata}
    check_settings(type(obj).__name__, obj, names, units=units)


def _allowed(allowed: Range, unit: Unit | None) -> str:
    """A range in words, in the option's unit: "1 to 64", "at least 0"."""
    return (allowed if unit is None else allowed.converted(unit.to_option)).describe()


@dataclass(frozen=True)
class Limits:
    """What one request may ask for; beyond it, a 4xx JSON error naming the limit."""

    max_body_bytes: int = unit_setting(
        KIB,
        1 << 20,
        "request body size (/translate_file: FileSettings.max_file_bytes)",
        range=Range(lo=1024),
        option="--max-body-kib",
    )
    max_lines: int = setting(64, "lines per request", range=AT_LEAST_1, option="--max-lines")
    max_chars: int = setting(2000, "characters per line", range=AT_LEAST_1, option="--max-chars")
    max_beam: int = setting(
        16,
        "the widest beam a request may ask for (and n-best up to it): a config allows beams up "
        "to 128, a server protects its memory and its other clients' latency",
        range=Range(1, 64),
        option="--max-beam",
    )
    max_waiting: int = setting(
        1024, "requests waiting for the decode worker; more get a 503", range=AT_LEAST_1
    )
    body_timeout_s: float = setting(
        30.0,
        "seconds to receive a request's body; slower gets a 408",
        range=POSITIVE,
        option="--body-timeout",
    )

    def __post_init__(self) -> None:
        check_declared(self)

    def decode_limits(self) -> dict[str, Limit]:
        """The decode settings this server bounds more tightly than a config does.

        Each comes with the server setting that bounds it, named in a request's error.
        """
        return {"beam_size": Limit(self.max_beam, "this server's max_beam: mt serve --max-beam")}


@dataclass(frozen=True)
class BatchSettings:
    """How the decode worker gathers requests into batches."""

    enabled: bool = setting(
        True,
        "decode requests that arrive together as one batch (off: one request per batch, no "
        "waiting; the benchmark's baseline)",
        option="--batching",
    )
    continuous: bool = setting(
        False,
        "with --engine torch: requests join the running search between steps (continuous "
        "batching, no gathering window; slower than batch by batch on 2 CPU cores, see "
        "docs/BENCHMARKS.md)",
        option="--continuous",
    )
    window_s: float = unit_setting(
        MS,
        0.02,
        "gathering a batch ends after this long quiet (at most --batch-max-wait-ms)",
        range=Range(0.0, 1.0),
        option="--batch-window-ms",
    )
    max_wait_s: float = unit_setting(
        MS,
        0.05,
        "gathering a batch ends at the latest this long after it began",
        range=Range(0.0, 10.0),
        option="--batch-max-wait-ms",
    )
    max_tokens: int | None = setting(
        None,
        "source pieces per batch; null: the model's decode.batch_tokens",
        range=Range(lo=1, none_ok=True),
    )

    def __post_init__(self) -> None:
        check_declared(self)
        # A longer window would never apply, and GET /v1/model would report it as if it did.
        if self.window_s > self.max_wait_s:
            window, most = MS.to_option(self.window_s), MS.to_option(self.max_wait_s)
            raise MTError(
                f"--batch-window-ms ({window:g}) exceeds --batch-max-wait-ms ({most:g}): "
                "gathering would never wait that long; lower the window or raise the max wait"
            )


@dataclass(frozen=True)
class AccessSettings:
    """Who may call the translating routes, and how much (LibreTranslate's keys and limits)."""

    api_keys: Path | None = setting(
        None,
        "a keys file (`mt serve-keys add FILE NAME`): keys with their own request and "
        "character limits; none: no keys",
        option="--api-keys",
    )
    require_api_key: bool = setting(
        False, "refuse requests without a key (needs --api-keys)", option="--require-api-key"
    )
    key_free_origin: str | None = setting(
        None,
        "with --require-api-key: requests whose whole Origin matches this regex need no key "
        "(e.g. your own page); RE2 syntax, matched in linear time",
        option="--key-free-origin",
    )
    req_limit: int = setting(
        0,
        "requests per minute per client address (per key: the key's own); 0: no limit",
        range=AT_LEAST_0,
        option="--req-limit",
    )
    ipv6_prefix: int = setting(
        64,
        "--req-limit counts an IPv6 client by the network of this many leading bits of its "
        "address (a host usually owns a whole /64), an IPv4 client by its address",
        range=Range(1, 128),
        option="--ipv6-prefix",
    )
    char_limit: int = setting(
        0,
        "characters per request, the texts of a batch together, LibreTranslate's (per key: the "
        "key's own); 0: no limit",
        range=AT_LEAST_0,
        option="--char-limit",
    )
    forwarded_allow_ips: str | None = setting(
        None,
        "the proxies trusted to name the client in X-Forwarded-For or Forwarded (for "
        "--req-limit): "
        "addresses or networks, comma-separated (127.0.0.1,10.0.0.0/8), or * for every peer; "
        "none: no proxy, the headers are ignored",
        option="--forwarded-allow-ips",
    )

    def __post_init__(self) -> None:
        check_declared(self)
        if self.require_api_key and self.api_keys is None:
            raise MTError("--require-api-key needs --api-keys FILE (create it: mt serve-keys add)")
        self.trusted_proxies()

    def trusted_proxies(self) -> tuple[bool, tuple[IPNetwork, ...]]:
        """``forwarded_allow_ips`` read: (every peer is trusted, the trusted networks).

        An address is a network of one (``127.0.0.1`` is ``127.0.0.1/32``).

        Raises:
            MTError: an entry that is neither ``*`` nor an address or network, naming it.
        """
        entries = [e.strip() for e in (self.forwarded_allow_ips or "").split(",") if e.strip()]
        networks = []
        for entry in entries:
            if entry == "*":
                continue
            try:
                networks.append(ipaddress.ip_network(entry.strip("[]"), strict=False))
            except ValueError:
                raise MTError(
                    f"--forwarded-allow-ips {self.forwarded_allow_ips!r}: {entry!r} is not an "
                    "IP address or network (e.g. 127.0.0.1,10.0.0.0/8,::1, or * for every peer)"
                ) from None
        return "*" in entries, tuple(networks)

    @property
    def enabled(self) -> bool:
        """Whether any check applies (otherwise every request passes untouched)."""
        return bool(self.api_keys or self.require_api_key or self.req_limit or self.char_limit)


@dataclass(frozen=True)
class FileSettings:
    """File translation (/translate_file): its size and the downloads it keeps."""

    enabled: bool = setting(
        True, "file translation (/translate_file, /download_file)", option="--files"
    )
    directory: Path | None = setting(
        None,
        "where translated files wait for download; none: a temporary directory",
        option="--files-dir",
    )
    ttl_s: float = setting(
        1800.0, "seconds a translated file can be downloaded", range=POSITIVE, option="--files-ttl"
    )
    max_files: int = setting(100, "downloads kept at most (the oldest go first)", range=AT_LEAST_1)
    max_total_bytes: int = setting(
        256 << 20, "bytes of the downloads kept, together, at most", range=AT_LEAST_1
    )
    max_file_bytes: int = setting(
        8 << 20, "bytes of one uploaded file (its request body) at most", range=AT_LEAST_1
    )
    public_url: str | None = setting(
        None,
        "the server's URL as its clients reach it (https://mt.example.org, or with the path a "
        "proxy serves it under): /translate_file's translatedFileUrl starts with it; none: the "
        "address and port the request came in on, never its Host header",
        option="--public-url",
    )
    parse_processes: int = setting(
        1,
        "documents (/translate_file) and HTML bodies (/translate with format html) parsed at "
        "once, each in a process of its own at a lower CPU priority, never on the event loop "
        "(small HTML bodies aside); more wait their turn",
        range=Range(1, 64),
        option="--parse-processes",
    )
    parse_waiting: int = setting(
        16,
        "parses waiting for a parsing process; more get a 503",
        range=AT_LEAST_0,
        option="--parse-waiting",
    )
    parse_memory_bytes: int = unit_setting(
        MIB,
        1 << 30,
        "address space of a parsing process: a parse that needs more gets a 413 (the "
        "documents' own bounds, the MT_DOC_MAX_* variables, apply first)",
        range=Range(lo=256 << 20),
        option="--parse-memory-mib",
    )

    def __post_init__(self) -> None:
        check_declared(self)
        if self.public_url is not None:
            url = urllib.parse.urlsplit(self.public_url)
            if url.scheme not in ("http", "https") or not url.hostname or "@" in url.netloc:
                raise MTError(
                    f"--public-url {self.public_url!r}: an http:// or https:// URL with a "
                    "host is needed (e.g. https://mt.example.org)"
                )
            if url.query or url.fragment or self.public_url.rstrip("/").endswith(("?", "#")):
                raise MTError(f"--public-url {self.public_url!r}: no query or fragment")
            try:
                url.port  # noqa: B018 (a port out of range raises)
            except ValueError:
                raise MTError(f"--public-url {self.public_url!r}: a bad port") from None

    def download_url(self, path: str) -> str | None:
        """``path`` (``/download_file/NAME``) under ``public_url``, or None without one."""
        return None if self.public_url is None else self.public_url.rstrip("/") + path


@dataclass(frozen=True)
class ServeSettings:
    """Everything `mt serve` is told: where to listen, which model, and each part's settings."""

    host: str = setting(
        "127.0.0.1", "address to listen on (0.0.0.0: every interface)", option="--host"
    )
    port: int = setting(8000, "TCP port", range=Range(0, 65535), option="--port")
    engine: str = model_setting("engine")
    device: str = model_setting("device")
    quantize: str | None = model_setting("quantize")
    precision: str | None = model_setting("precision")
    access_log: bool = setting(False, "log every request", option="--access-log")
    shutdown_timeout_s: float = setting(
        SHUTDOWN_TIMEOUT_S,
        "on SIGTERM/Ctrl-C, seconds the requests in flight get to finish; then the ones left "
        "are cut off",
        range=AT_LEAST_0,
        option="--shutdown-timeout",
    )
    drain_s: float = setting(
        0.0,
        "on SIGTERM, first keep serving this many seconds with /health/ready answering 503, so "
        "that a load balancer stops sending requests before the server stops",
        range=AT_LEAST_0,
        option="--drain-seconds",
    )
    workers: int = setting(
        1,
        "processes, each with its own model and decode worker, behind the one port (the CPUs "
        "are split among them; /translate_file needs 1)",
        range=Range(1, 64),
        option="--workers",
    )
    frontend_timeout_ms: int = setting(
        500, "/frontend/settings' frontendTimeout (a page's typing delay), ms", range=AT_LEAST_0
    )
    cache_lines: int = setting(
        0,
        "translated lines the server keeps, answering a repeated one from memory (settings, "
        "target and glossary terms included in its key; sampled lines never; 0: no cache, as "
        "LibreTranslate without --translation-cache)",
        range=AT_LEAST_0,
        option="--cache-lines",
    )
    glossaries: tuple[str, ...] | None = setting(
        None,
        "a glossary that requests name in their glossary field: NAME=FILE, the file a TSV of "
        "'source term<TAB>target term' lines (repeat for several)",
        option="--glossary",
    )
    limits: Limits = field(default_factory=Limits)
    batching: BatchSettings = field(default_factory=BatchSettings)
    access: AccessSettings = field(default_factory=AccessSettings)
    files: FileSettings = field(default_factory=FileSettings)

    def __post_init__(self) -> None:
        check_declared(self)


@dataclass(frozen=True)
class ServeOption:
    """One `mt serve` option, as the declaration of the field it sets says."""

    flag: str  # "--max-beam"
    group: str  # the ServeSettings field holding the field's settings object; "" for its own
    declared: dataclasses.Field
    type: Any  # the field's type (an option given in another unit: a number, the same type)

    @property
    def param(self) -> str:
        """The serve command's parameter name: ``--max-beam`` -> ``max_beam``."""
        return self.flag.removeprefix("--").replace("-", "_")

    @property
    def unit(self) -> Unit | None:
        """The unit the option is given in, where it differs from the field's."""
        return self.declared.metadata.get("unit")

    @property
    def default(self) -> Any:
        """The declared default, in the option's unit."""
        value: Any = self.declared.default
        return value if self.unit is None else self.unit.to_option(value)

    @property
    def help(self) -> str:
        """The option's help: the declared help, the option's unit and what it accepts."""
        text = self.declared.metadata["help"]
        text += f", in {self.unit.name}" if self.unit is not None else ""
        allowed, choices = self.declared.metadata["range"], self.declared.metadata["choices"]
        if allowed is not None:
            text += f" ({_allowed(allowed, self.unit)})"
        elif choices is not None:
            text += f" ({' or '.join(choices)})"
        return text[:1].upper() + text[1:] + "."

    def to_field(self, value: Any) -> Any:
        """The option's value ``value`` as its field keeps it."""
        if self.unit is None or value is None:
            return value
        return self.unit.to_field(value)


@functools.cache
def serve_options() -> dict[str, ServeOption]:
    """Every `mt serve` option that a setting declares, by flag, in declaration order.

    The fields of :class:`ServeSettings` and of each of its settings objects (``GROUPS``).
    """
    options, hints = {}, typing.get_type_hints(ServeSettings)
    groups = {"": ServeSettings, **{group: hints[group] for group in GROUPS}}
    for group, cls in groups.items():
        types = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if f.metadata.get("option"):
                options[f.metadata["option"]] = ServeOption(
                    f.metadata["option"], group, f, types[f.name]
                )
    return options


GROUPS = ("limits", "batching", "access", "files")  # ServeSettings' settings objects


def settings_from_options(values: Mapping[str, Any]) -> ServeSettings:
    """The settings that `mt serve`'s option values (by parameter name) give.

    Each value is converted to its field's unit and checked as its settings object is built.
    """
    hints = typing.get_type_hints(ServeSettings)
    fields: dict[str, dict[str, Any]] = {group: {} for group in ("", *GROUPS)}
    for option in serve_options().values():
        fields[option.group][option.declared.name] = option.to_field(values[option.param])
    parts = {group: hints[group](**fields[group]) for group in GROUPS}
    return ServeSettings(**fields[""], **parts)
