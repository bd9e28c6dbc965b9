"""`mt serve` from the top: bind the port, then serve in this process or supervise workers.

The port is bound before the model loads (one in use is a one-line error at once); with
``--workers N`` the bound sockets go to N worker processes (:mod:`transformer_mt.serve.workers`),
each serving the application of :mod:`transformer_mt.serve.app`.
"""

import errno
import socket
from pathlib import Path

from transformer_mt.documents.limits import DocumentLimits
from transformer_mt.engines.engine import check_engine
from transformer_mt.errors import MTError
from transformer_mt.serve.access import Access
from transformer_mt.serve.app import serve_process
from transformer_mt.serve.metrics import ServerMetrics
from transformer_mt.serve.settings import ServeSettings
from transformer_mt.serve.state import ProcessState, Readiness, load_glossaries
from transformer_mt.serve.workers import supervise


def serve(path: Path | str, settings: ServeSettings) -> None:
    """Load the model and serve it in ``settings.workers`` processes until SIGINT/SIGTERM.

    Requests in flight finish first, for at most ``settings.shutdown_timeout_s``. The port is
    bound first: one in use is an MTError before the model loads; so are a missing keys file, a
    mistake in the options or in an MT_DOC_MAX_* variable, and a model that fails to load ends the server with its error."""
    check_engine(  # the options first
        settings.engine, path, settings.quantize, settings.precision, settings.device
    )
    Access(settings.access)  # the keys file, read and checked
    load_glossaries(settings.glossaries)  # each file read and checked
    DocumentLimits.from_env()  # the documents' bounds (MT_DOC_MAX_*), each variable checked
    sockets = bind_sockets(settings.host, settings.port)
    try:
        for sock in sockets:  # connections wait in the backlog until a worker accepts them
            sock.listen(_BACKLOG)
        if settings.workers > 1:
            supervise(path, settings, sockets)
        else:
            process = ProcessState(0, Readiness(1), ServerMetrics())
            serve_process(path, settings, sockets, process)
    finally:
        for sock in sockets:
            sock.close()


_BACKLOG = 2048  # as uvicorn's


def bind_sockets(host: str, port: int) -> list[socket.socket]:
    """Bind ``host``:``port`` on each of its addresses, for uvicorn.

    Sockets bound to ``port`` on each address of ``host`` (as asyncio's ``create_server``
    binds them, for uvicorn to listen on); an MTError naming host and port when one is in use,
    or ``host`` is not an address of this machine."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as err:
        raise MTError(f"--host {host}: not an address or a known name ({err.strerror})") from None
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:  # as asyncio: IPv6 only, "::" is not 0.0.0.0 too
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
    except OSError as err:
        for sock in sockets:
            sock.close()
        raise MTError(_bind_error(host, port, err)) from None
    return sockets


def _bind_error(host: str, port: int, err: OSError) -> str:
    """One line for a port that cannot be bound."""
    if err.errno == errno.EADDRINUSE:
        return (
            f"port {port} on {host} is in use (another `mt serve`, or another program); stop "
            "it or choose another --port"
        )
    if err.errno == errno.EACCES:
        return f"port {port} on {host} needs privileges here; choose a --port of 1024 or above"
    if err.errno == errno.EADDRNOTAVAIL:
        return f"--host {host} is not an address of this machine; use 127.0.0.1 or 0.0.0.0"
    return f"cannot listen on port {port} on {host}: {err.strerror or err}"
