"""`mt serve` and `mt serve-keys`: the HTTP server's options and its keys file."""

from pathlib import Path
from typing import Annotated, Any

import typer

from transformer_mt.cli.common import app, note, user_errors
from transformer_mt.errors import MTError
from transformer_mt.serve.settings import (
    serve_options,
    settings_from_options,
)


def _serve_option(flag: str) -> Any:
    """The `mt serve` option ``flag``, read from the declaration of the setting it sets.

    Its default and help (with its unit and range) come from serve/settings.py; a
    yes/no setting also gets its ``--no-`` form.
    """
    option = serve_options()[flag]
    names = f"{flag}/--no-{flag[2:]}" if option.type is bool else flag
    return typer.Option(option.default, names, help=option.help)


@app.command()
@user_errors
def serve(
    checkpoint: Annotated[
        Path,
        typer.Option(
            "--checkpoint",
            "-c",
            help="A .pt file written by `mt train`; with --engine ct2, a directory written by "
            "`mt export --format ctranslate2`.",
        ),
    ],
    host: str = _serve_option("--host"),
    port: int = _serve_option("--port"),
    engine: str = _serve_option("--engine"),
    device: str = _serve_option("--device"),
    batching: bool = _serve_option("--batching"),
    continuous: bool = _serve_option("--continuous"),
    batch_window_ms: float = _serve_option("--batch-window-ms"),
    batch_max_wait_ms: float = _serve_option("--batch-max-wait-ms"),
    max_lines: int = _serve_option("--max-lines"),
    max_chars: int = _serve_option("--max-chars"),
    max_body_kib: int = _serve_option("--max-body-kib"),
    body_timeout: float = _serve_option("--body-timeout"),
    shutdown_timeout: float = _serve_option("--shutdown-timeout"),
    drain_seconds: float = _serve_option("--drain-seconds"),
    workers: int = _serve_option("--workers"),
    max_beam: int = _serve_option("--max-beam"),
    access_log: bool = _serve_option("--access-log"),
    quantize: str | None = _serve_option("--quantize"),
    precision: str | None = _serve_option("--precision"),
    api_keys: Path | None = _serve_option("--api-keys"),
    require_api_key: bool = _serve_option("--require-api-key"),
    key_free_origin: str | None = _serve_option("--key-free-origin"),
    req_limit: int = _serve_option("--req-limit"),
    ipv6_prefix: int = _serve_option("--ipv6-prefix"),
    char_limit: int = _serve_option("--char-limit"),
    forwarded_allow_ips: str | None = _serve_option("--forwarded-allow-ips"),
    files: bool = _serve_option("--files"),
    files_dir: Path | None = _serve_option("--files-dir"),
    files_ttl: float = _serve_option("--files-ttl"),
    cache_lines: int = _serve_option("--cache-lines"),
    glossary: list[str] | None = _serve_option("--glossary"),
    public_url: str | None = _serve_option("--public-url"),
    parse_processes: int = _serve_option("--parse-processes"),
    parse_waiting: int = _serve_option("--parse-waiting"),
    parse_memory_mib: int = _serve_option("--parse-memory-mib"),
) -> None:
    """Serve the model over HTTP.

    LibreTranslate's API (/translate, /languages, /detect, /translate_file, /frontend/settings),
    POST /v1/translate (n-best, attention), GET /v1/model, /health, API docs at /docs and a
    translation page at /; for load balancers and monitoring, /health/live, /health/ready (503
    while the model loads and while draining) and /metrics (Prometheus).

    Requests that arrive together are gathered into batches and decoded together; with
    --engine torch, --continuous lets them join the running search between steps instead.
    Opened beyond localhost: --api-keys, --req-limit and --char-limit; behind a proxy,
    --forwarded-allow-ips and --public-url. Ctrl-C or SIGTERM lets the requests in flight
    finish (at most --shutdown-timeout), then stops.
    """
    from transformer_mt.serve.launch import serve as serve_model

    # Each option by name: settings_from_options converts units and checks every range and rule.

    settings = settings_from_options(
        {
            "host": host,
            "port": port,
            "engine": engine,
            "device": device,
            "batching": batching,
            "continuous": continuous,
            "batch_window_ms": batch_window_ms,
            "batch_max_wait_ms": batch_max_wait_ms,
            "max_lines": max_lines,
            "max_chars": max_chars,
            "max_body_kib": max_body_kib,
            "body_timeout": body_timeout,
            "shutdown_timeout": shutdown_timeout,
            "drain_seconds": drain_seconds,
            "workers": workers,
            "max_beam": max_beam,
            "access_log": access_log,
            "quantize": quantize,
            "precision": precision,
            "api_keys": api_keys,
            "require_api_key": require_api_key,
            "key_free_origin": key_free_origin,
            "req_limit": req_limit,
            "ipv6_prefix": ipv6_prefix,
            "char_limit": char_limit,
            "forwarded_allow_ips": forwarded_allow_ips,
            "files": files,
            "files_dir": files_dir,
            "files_ttl": files_ttl,
            "cache_lines": cache_lines,
            "glossary": tuple(glossary) if glossary else None,
            "public_url": public_url,
            "parse_processes": parse_processes,
            "parse_waiting": parse_waiting,
            "parse_memory_mib": parse_memory_mib,
        }
    )
    serve_model(checkpoint, settings)


serve_keys = typer.Typer(
    help="Manage the API keys of `mt serve --api-keys FILE` (the file keeps their hashes only).",
    no_args_is_help=True,
)
app.add_typer(serve_keys, name="serve-keys")


@serve_keys.command("add")
@user_errors
def serve_keys_add(
    keys_file: Annotated[Path, typer.Argument(help="The keys file (created if absent).")],
    name: Annotated[str, typer.Argument(help="A name to manage the key by (a client, a team).")],
    req_limit: Annotated[
        int | None, typer.Option(min=1, help="Its requests per minute (default: --req-limit).")
    ] = None,
    char_limit: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Its characters per request, a batch's texts together (default: --char-limit).",
        ),
    ] = None,
) -> None:
    """Add a new random key and print it (the only time it is shown)."""
    from transformer_mt.serve.access import add_key

    typer.echo(add_key(keys_file, name, req_limit, char_limit))
    note(f"added key {name!r} to {keys_file}")


@serve_keys.command("list")
@user_errors
def serve_keys_list(keys_file: Annotated[Path, typer.Argument(help="The keys file.")]) -> None:
    """List the keys' names and limits (never the keys)."""
    from transformer_mt.serve.access import read_keys

    if not keys_file.is_file():
        raise MTError(f"{keys_file}: no such keys file (create it: mt serve-keys add FILE NAME)")
    for key in read_keys(keys_file):
        limits = f"req_limit={key.req_limit or '-'}\tchar_limit={key.char_limit or '-'}"
        typer.echo(f"{key.name}\t{limits}")


@serve_keys.command("remove")
@user_errors
def serve_keys_remove(
    keys_file: Annotated[Path, typer.Argument(help="The keys file.")],
    name: Annotated[str, typer.Argument(help="The key's name.")],
) -> None:
    """Remove a key (a running server reads the changed file at its next request)."""
    from transformer_mt.serve.access import remove_key

    remove_key(keys_file, name)
    note(f"removed key {name!r} from {keys_file}")
