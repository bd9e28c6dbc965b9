"""`mt serve`'s settings, grouped by concern, and the one error a route raises.

Plain Python (no FastAPI): `mt serve-keys` and the CLI's option parsing use these without the
``serve`` extra. :class:`ServeSettings` is what the ``serve`` command builds from its options;
each part goes to the piece of the server that owns it (limits to the body reader and the
routes, access to :mod:`~transformer_mt.inference.access`, files to
:mod:`~transformer_mt.inference.file_store`).
"""

from dataclasses import dataclass, field
from pathlib import Path

from transformer_mt.config import AT_LEAST_1, POSITIVE, Limit, Range, setting
from transformer_mt.inference.batcher import BatchSettings

# On SIGTERM uvicorn waits for every open connection; a client that never finishes sending its
# body (or never reads its answer) would keep the process alive for good. After this long
# (`mt serve --shutdown-timeout`) the requests left are cancelled and their connections closed;
# the decode worker still answers what was submitted before exiting.
SHUTDOWN_TIMEOUT_S = 30.0


class ApiError(Exception):
    """A refused request: its HTTP status, one line for ``{"error": ...}``, extra headers."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers


@dataclass(frozen=True)
class Limits:
    """What one request may ask for; beyond it, a 4xx JSON error naming the limit."""

    max_body_bytes: int = setting(
        1 << 20, "request body in bytes (1 MiB); /translate_file: FileSettings", range=AT_LEAST_1
    )
    max_lines: int = setting(64, "lines per request", range=AT_LEAST_1)
    max_chars: int = setting(2000, "characters per line", range=AT_LEAST_1)
    max_beam: int = setting(
        16,
        "the widest beam a request may ask for (and n-best up to it): a config allows beams up "
        "to 128, a server protects its memory and its other clients' latency",
        range=Range(1, 64),
    )
    max_waiting: int = setting(
        1024, "requests waiting for the decode worker; more get a 503", range=AT_LEAST_1
    )
    body_timeout_s: float = setting(
        30.0, "seconds to receive a request's body; slower gets a 408", range=POSITIVE
    )

    def decode_limits(self) -> dict[str, Limit]:
        """The decode settings this server bounds more tightly than a config does.

        Each comes with the server setting that bounds it, named in a request's error.
        """
        return {"beam_size": Limit(self.max_beam, "this server's max_beam: mt serve --max-beam")}


@dataclass(frozen=True)
class AccessSettings:
    """Who may call the translating routes, and how much (LibreTranslate's keys and limits)."""

    api_keys: Path | None = None  # a keys file (`mt serve-keys`); None: no keys
    require_api_key: bool = False  # a request without a key is refused (400)...
    key_free_origin: str | None = None  # ...unless its Origin header matches this regex
    req_limit: int = 0  # requests per minute per client (per key: the key's own); 0: none
    char_limit: int = 0  # characters per text (per key: the key's own); 0: none

    @property
    def enabled(self) -> bool:
        """Whether any check applies (otherwise every request passes untouched)."""
        return bool(self.api_keys or self.require_api_key or self.req_limit or self.char_limit)


@dataclass(frozen=True)
class FileSettings:
    """File translation (/translate_file): its size and the downloads it keeps."""

    enabled: bool = True
    directory: Path | None = None  # where downloads are kept; None: a temporary directory
    ttl_s: float = 1800.0  # a translated file can be downloaded for this long
    max_files: int = 100  # downloads kept at most (the oldest go first)
    max_total_bytes: int = 256 << 20  # and their bytes together at most
    max_file_bytes: int = 8 << 20  # one uploaded file at most (its request body)


@dataclass(frozen=True)
class ServeSettings:
    """Everything `mt serve` is told: where to listen, which model, and each part's settings."""

    host: str = "127.0.0.1"
    port: int = 8000
    engine: str = "torch"  # torch (a checkpoint) or ct2 (an export)
    device: str = "cpu"
    quantize: str | None = None  # "int8": dynamic int8 linear layers (torch engine, CPU)
    access_log: bool = False
    shutdown_timeout_s: float = SHUTDOWN_TIMEOUT_S
    # On SIGTERM, keep serving this long with /health/ready answering 503 (draining), so that a
    # load balancer's health checks take the server out of rotation before it stops accepting.
    drain_s: float = 0.0
    workers: int = 1  # processes, each with its own model and decode worker, on one port
    frontend_timeout_ms: int = 500  # /frontend/settings' frontendTimeout (a page's typing delay)
    limits: Limits = field(default_factory=Limits)
    batching: BatchSettings = field(default_factory=BatchSettings)
    access: AccessSettings = field(default_factory=AccessSettings)
    files: FileSettings = field(default_factory=FileSettings)
