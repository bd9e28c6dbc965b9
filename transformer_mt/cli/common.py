"""What every `mt` command shares: the app, one-line errors, logging, the shared options.

A user's mistake prints one line ``error: ...`` to stderr and exits with code 1 (:func:`user_errors`,
the one place that decides): an :class:`MTError`, or an ordinary failure of a user's path (permission
denied, a directory where a file is expected, a full disk). Anything else is a bug and keeps its
traceback; ``MT_DEBUG=1`` shows the traceback of a user's mistake too. A reader of stdout that went
away (``mt translate ... | head``) ends the command quietly, as Unix tools do. The library reports
progress through :mod:`logging` (logger ``transformer_mt``); the CLI prints those messages as bare
lines on stderr.
"""

import functools
import io
import logging
import os
import sys
import warnings
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Annotated, Any, ParamSpec, TextIO, TypeVar

import typer
from tqdm import tqdm
from typer.core import TyperGroup

from transformer_mt.config import Config, DecodeConfig, option_help
from transformer_mt.engines.options import declared, option_text
from transformer_mt.errors import MTError


class _OneLineUsageErrors(TyperGroup):
    """A command group whose usage errors print as one ``error:`` line.

    A mistyped command line (an unknown option, a value that is not a number, a missing
    argument) as one ``error:`` line naming the command's --help, with click's exit code 2 for
    usage errors, instead of a framed box."""

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        windows_expand_args: bool = True,
        **extra: Any,
    ) -> Any:
        """Run the command line; a usage error ends it with one line (see the class)."""
        given = (args, prog_name, complete_var)
        if not standalone_mode:
            return super().main(*given, False, windows_expand_args, **extra)
        try:
            code = super().main(*given, False, windows_expand_args, **extra)
        except typer.Abort:
            typer.echo("Aborted!", err=True)
            sys.exit(1)
        except typer.TyperException as err:  # click's ClickException and its usage errors
            no_message = not hasattr(err, "format_message")
            if hasattr(err, "show") and (type(err).__name__ == "NoArgsIsHelpError" or no_message):
                err.show()  # `mt translate` alone: the command's help
                sys.exit(err.exit_code)
            ctx = getattr(err, "ctx", None)
            see = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
            message = " ".join(err.format_message().split()).rstrip(".")
            typer.echo(f"error: {message}{see}", err=True)
            sys.exit(err.exit_code)
        sys.exit(code if isinstance(code, int) else 0)


app = typer.Typer(
    cls=_OneLineUsageErrors,
    help="transformer-mt: download, train, translate and evaluate Transformer translation models.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

CheckpointOpt = Annotated[
    Path, typer.Option("--checkpoint", "-c", help="A .pt file written by `mt train`.")
]
CheckpointsOpt = Annotated[
    list[Path],
    typer.Option(
        "--checkpoint",
        "-c",
        help="A .pt file written by `mt train`; repeat it for an ensemble (same tokenizers); "
        "with --engine ct2, a directory written by `mt export`.",
    ),
]
ConfigOpt = Annotated[
    Path | None,
    typer.Option(
        "--config",
        help="YAML config, or the name of a shipped recipe (toy, multi30k_de_en, ...); default: toy.",
    ),
]
SetOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--set", help="Override a config key, e.g. --set train.max_steps=100 (repeatable)."
    ),
]
# The decode options: names, ranges and help from DecodeConfig's declaration (config/schema.py).
BeamOpt = Annotated[int | None, typer.Option("--beam", help=option_help("beam_size"))]
LenPenaltyOpt = Annotated[
    float | None, typer.Option("--len-penalty", help=option_help("len_penalty"))
]
BatchTokensOpt = Annotated[
    int | None, typer.Option("--batch-tokens", help=option_help("batch_tokens"))
]


def model_option(name: str) -> Any:
    """The typer option that sets the model option ``name``, from its one declaration.

    Its flag, default and help (with the values it accepts) are those of the field ``name`` of
    :class:`~transformer_mt.engines.options.ModelOptions`, which the server's settings read too;
    a command builds a ``ModelOptions`` from the values, which checks them. A parameter
    ``device: str = model_option("device")``."""
    field = declared(name)
    return typer.Option(field.default, field.metadata["option"], help=option_text(name))


DEFAULT_CONFIG = "toy"  # the shipped recipe (transformer_mt/configs/toy.yaml) without --config


SIGPIPE_EXIT = 141  # 128 + SIGPIPE: what the shell reports for a tool whose reader went away


_P = ParamSpec("_P")
_R = TypeVar("_R")


def user_errors(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    """Turn a user's mistake into one ``error:`` line and exit code 1 (see the module's doc)."""

    @functools.wraps(fn)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            result = fn(*args, **kwargs)
            sys.stdout.flush()  # a closed pipe or a full disk shows here, not at exit
            return result
        except BrokenPipeError:
            _silence_stdout()
            raise typer.Exit(SIGPIPE_EXIT) from None
        except Exception as err:
            message = _user_message(err)
            if message is None or _debugging():
                raise
            typer.echo(f"error: {message}", err=True)
            raise typer.Exit(1) from None

    return wrapper


def _user_message(err: Exception) -> str | None:
    """The one line for a user's mistake, or None for a bug (which keeps its traceback)."""
    from transformer_mt.fileio import os_error_message

    if isinstance(err, MTError):
        return " ".join(str(err).split("\n"))
    if isinstance(err, typer.Exit | typer.Abort):
        return None  # typer's own exits pass through unchanged
    return os_error_message(err)


def _debugging() -> bool:
    return os.environ.get("MT_DEBUG", "") not in ("", "0")


def _silence_stdout() -> None:
    """Point stdout at /dev/null before a closed pipe's final flush.

    Otherwise the interpreter's final flush to the closed pipe prints an error of its own."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        pass  # not a real file descriptor (e.g. under typer's CliRunner)


def load_config(config: Path | None, overrides: list[str] | None) -> Config:
    from transformer_mt.config import load_config, recipe_path

    # Read through the package, not a path beside it: an installed `mt` trains the same recipe.
    return load_config(config if config is not None else recipe_path(DEFAULT_CONFIG), overrides)


_python_show_warning = warnings.showwarning


class _StderrLines(logging.Handler):
    """Log records as bare lines on stderr, written above any live progress bar."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            tqdm.write(self.format(record), file=sys.stderr)
        except Exception:
            self.handleError(record)


@app.callback()
def _setup_logging() -> None:
    """Show the library's messages (once per process, however many commands run in it).

    Under torchrun only rank 0 reports progress; the other ranks still print warnings."""
    logger = logging.getLogger("transformer_mt")
    for handler in [h for h in logger.handlers if isinstance(h, _StderrLines)]:
        logger.removeHandler(handler)
    handler = _StderrLines()
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger.addHandler(handler)
    main_rank = int(os.environ.get("RANK", "0")) == 0
    logger.setLevel(logging.INFO if main_rank else logging.WARNING)
    warnings.showwarning = _show_warning


# The package's directory (this file is in its cli/), as warnings name its files.
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _show_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: TextIO | None = None,
    line: str | None = None,
) -> None:
    """Show a warning: the package's as a ``warning:`` line, others as Python does.

    The package's own warnings (a line cut to the model's length, a skipped step) as bare
    ``warning:`` lines through the logger, like its other messages; others as Python shows them."""
    if str(filename).startswith(_PACKAGE_DIR):
        logging.getLogger("transformer_mt").warning(f"warning: {message}")
    else:
        _python_show_warning(message, category, filename, lineno, file, line)


def note(message: str) -> None:
    typer.echo(message, err=True)


def decode_settings(base: DecodeConfig, **options: object) -> DecodeConfig:
    """The model's decode settings ``base`` with the command line's options applied, checked.

    An option left out (None) keeps the model's value; the values are checked as the config's
    and the server's requests are."""
    from transformer_mt.config import apply_overrides

    return apply_overrides(base, options)


def read_input(path: Path | None) -> list[str]:
    from transformer_mt.fileio import decode_utf8, read_lines, split_lines

    if path is not None:
        return read_lines(path)
    if sys.stdin is None:
        raise MTError("stdin is closed: pass --input FILE, or pipe the text in")
    stream = getattr(sys.stdin, "buffer", None)
    return split_lines(decode_utf8(stream.read(), "stdin") if stream else sys.stdin.read())


def stdin_stat() -> list[os.stat_result]:
    """stdin's file status when it is a file (``mt translate -o x < x`` must not replace x)."""
    try:
        return [os.fstat(sys.stdin.fileno())]
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        return []


def write_lines(output: Path | None, lines: Iterable[str], inputs: Iterable = ()) -> None:
    """Write lines to stdout or, whole and atomically, to a file.

    Lines to stdout, or to the file ``output`` written whole (:func:`fileio.write_output`:
    atomically, never over one of ``inputs``), as UTF-8."""
    from transformer_mt.fileio import NO_SPACE, no_space_error, write_output

    text = "".join(line + "\n" for line in lines)
    if output is not None:
        write_output(output, text, inputs=inputs)
        return
    data = text.encode("utf-8")
    stream = getattr(sys.stdout, "buffer", None)
    try:
        if stream is None:
            sys.stdout.write(text)
        else:
            sys.stdout.flush()
            stream.write(data)
        sys.stdout.flush()
    except OSError as err:
        if err.errno in NO_SPACE:
            _silence_stdout()  # what did not fit would fail again at exit
            raise no_space_error("stdout", len(data)) from err
        raise
