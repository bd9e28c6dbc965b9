"""The `mt` command line: each command parses options, loads a config, calls one library function.

A user's mistake prints one line ``error: ...`` to stderr and exits with code 1 (:func:`user_errors`,
the one place that decides): an :class:`MTError`, or an ordinary failure of a user's path (permission
denied, a directory where a file is expected, a full disk). Anything else is a bug and keeps its
traceback; ``MT_DEBUG=1`` shows the traceback of a user's mistake too. A reader of stdout that went
away (``mt translate ... | head``) ends the command quietly, as Unix tools do. The library reports
progress through :mod:`logging` (logger ``transformer_mt``); the CLI prints those messages as bare
lines on stderr.
"""

import dataclasses
import functools
import io
import json
import logging
import os
import sys
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from tqdm import tqdm
from typer.core import TyperGroup

from transformer_mt.config import option_help
from transformer_mt.errors import MTError
from transformer_mt.inference.serve_settings import (
    ServeSettings,
    serve_options,
    settings_from_options,
)

if TYPE_CHECKING:
    from transformer_mt.inference.attention import Alignment


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
# The decode options: names, ranges and help from DecodeConfig's declaration (config.py).
BeamOpt = Annotated[int | None, typer.Option("--beam", help=option_help("beam_size"))]
LenPenaltyOpt = Annotated[
    float | None, typer.Option("--len-penalty", help=option_help("len_penalty"))
]
BatchTokensOpt = Annotated[
    int | None, typer.Option("--batch-tokens", help=option_help("batch_tokens"))
]
EngineOpt = Annotated[
    str,
    typer.Option(help="torch (a .pt checkpoint) or ct2 (a directory written by `mt export`)."),
]
QuantizeOpt = Annotated[
    str | None,
    typer.Option(
        help="int8: int8 linear layers, weights rounded per output row, activations per input "
        "row (a line's output does not depend on its batch, up to float rounding; CPU, torch "
        "engine)."
    ),
]
PrecisionOpt = Annotated[str | None, typer.Option("--precision", help=option_help("precision"))]
DeviceOpt = Annotated[str, typer.Option(help="cpu, cuda, cuda:1, ...")]
TargetLangOpt = Annotated[
    str | None,
    typer.Option(
        "--target-lang",
        help="The language to translate into: needed by a model trained into several (its "
        "error lists them); /v1/model lists a served model's pairs.",
    ),
]
DEFAULT_CONFIG = "toy"  # the shipped recipe (transformer_mt/configs/toy.yaml) without --config


SIGPIPE_EXIT = 141  # 128 + SIGPIPE: what the shell reports for a tool whose reader went away


def user_errors(fn):
    """Turn a user's mistake into one ``error:`` line and exit code 1 (see the module's doc)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
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


def _load_config(config: Path | None, overrides: list[str] | None):
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


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))  # as warnings name its files


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Show a warning: the package's as a ``warning:`` line, others as Python does.

    The package's own warnings (a line cut to the model's length, a skipped step) as bare
    ``warning:`` lines through the logger, like its other messages; others as Python shows them."""
    if str(filename).startswith(_PACKAGE_DIR):
        logging.getLogger("transformer_mt").warning(f"warning: {message}")
    else:
        _python_show_warning(message, category, filename, lineno, file, line)


def _note(message: str) -> None:
    typer.echo(message, err=True)


def _decode_settings(base, **options):
    """The model's decode settings ``base`` with the command line's options applied, checked.

    An option left out (None) keeps the model's value; the values are checked as the config's
    and the server's requests are."""
    from transformer_mt.config import apply_overrides

    return apply_overrides(base, options)


def _translate(
    engine: str, model_paths: list[Path], device: str, lines: list[str], options: dict, **kw
):
    """Translate ``lines`` with the chosen engine.

    ``(results, decode settings)``; see
    :func:`_translator`."""
    quantization, target = kw.pop("quantize", None), kw.pop("target_lang", None)
    precision = kw.pop("precision", None)
    translate, decode = _translator(
        engine, model_paths, device, options, quantization, target, precision
    )
    return translate(lines, **kw), decode


def _translator(
    engine: str,
    model_paths: list[Path],
    device: str,
    options: dict,
    quantization: str | None,
    target_lang: str | None = None,
    precision: str | None = None,
):
    """Load the model(s) once: ``(translate(lines, **kw) -> results, decode settings)``.

    ``torch``: ``model_paths`` are checkpoints (several: an ensemble averaging their next-token
    log-probabilities; decode defaults from the first); ``ct2``: one directory written by
    `mt export`. ``options`` are decode options (None keeps the model's); ``kw`` of ``translate``
    goes to translate_lines (progress, attention pictures, prefixes, alignments), which the
    torch engine handles. ``target_lang``: the language a multilingual model translates into.
    ``quantization`` and ``precision`` (None: each checkpoint's decode.precision): what the
    linear layers multiply in (:func:`~transformer_mt.inference.load_for_inference`).
    """
    if engine == "ct2":
        return _ct2_translator(model_paths, device, options, quantization, target_lang, precision)
    if engine != "torch":
        raise MTError(f"--engine {engine!r}: expected torch or ct2")
    from transformer_mt.inference import load_for_inference, translate_lines
    from transformer_mt.inference.translate import ensemble_model

    loaded = [
        load_for_inference(path, device, quantization, precision=precision) for path in model_paths
    ]
    first = loaded[0]
    if first.precision_why.startswith("auto"):  # a choice this machine made: say which, and why
        logging.getLogger("transformer_mt").info(
            f"linear layers in {first.precision} ({first.precision_why})"
        )
    model = ensemble_model(loaded, [str(path) for path in model_paths])
    decode = _decode_settings(first.config.decode, **options)
    src_prefix = first.source_prefix(target_lang)  # a multilingual model's tag, before any work

    def translate(lines: list[str], **kw):
        n_layers = first.model.n_dec_layers
        for key in ("attention_layer", "alignment_layer"):
            layer = kw.get(key)
            if layer is not None and not -n_layers <= layer < n_layers:
                option = "--" + key.replace("_", "-")
                raise MTError(
                    f"{option} {layer}: the model's decoder layers are 0 to "
                    f"{n_layers - 1} (negative counts from the end); leave it out for their mean"
                )
        return translate_lines(
            model, first.src_tok, first.trg_tok, lines, decode, src_prefix=src_prefix, **kw
        )

    return translate, decode


def _ct2_translator(
    model_paths: list[Path],
    device: str,
    options: dict,
    quantization,
    target_lang: str | None,
    precision: str | None = None,
):
    """:func:`_translator` for a CTranslate2 export."""
    from transformer_mt.inference.ct2 import load_ct2, translate_lines_ct2

    refused = (("--quantize", quantization), ("--precision", precision))
    for option, given in (*refused, ("several --checkpoint", model_paths[1:])):
        if given:
            raise MTError(f"{option} needs --engine torch (checkpoints, not an export)")
    model = load_ct2(model_paths[0], device)
    decode = _decode_settings(model.decode, **options)
    src_prefix = model.source_prefix(target_lang)

    def translate(lines: list[str], **kw):
        for option, key in (
            ("--attention-dir", "attention_dir"),
            ("--prefix-file", "prefixes"),
            ("--alignments", "alignments"),
        ):
            if kw.get(key) is not None:
                raise MTError(f"{option} needs --engine torch (checkpoints, not an export)")
        return translate_lines_ct2(model, lines, decode, kw.get("first_line", 1), src_prefix)

    return translate, decode


def _read_prefixes(path: Path | None, lines: list[str], input_name: str) -> list[str] | None:
    """One target prefix per input line (`--prefix-file`), or None."""
    if path is None:
        return None
    from transformer_mt.fileio import read_lines

    prefixes = read_lines(path)
    if len(prefixes) != len(lines):
        raise MTError(
            f"{path} has {len(prefixes)} lines, {input_name} has {len(lines)}: give one prefix "
            "per input line (an empty line for none)"
        )
    return prefixes


@app.command()
@user_errors
def train(
    config: ConfigOpt = None,
    set_: SetOpt = None,
    run_dir: Annotated[
        Path | None, typer.Option(help="Run directory; default runs/<config name>.")
    ] = None,
    resume: Annotated[
        bool, typer.Option(help="Continue the run in --run-dir if it has a last.pt.")
    ] = True,
    progress: Annotated[bool, typer.Option(help="Show progress bars.")] = True,
    allow_data_change: Annotated[
        bool,
        typer.Option(
            "--allow-data-change",
            help="Resume even though the data or tokenizer differ from the checkpoint's.",
        ),
    ] = False,
    init_from: Annotated[
        Path | None,
        typer.Option(
            "--init-from",
            help="Fine-tune: start from this checkpoint's weights, tokenizers and shape, with a "
            "new optimizer and schedule (sets train.init_from).",
        ),
    ] = None,
) -> None:
    """Prepare the data (if needed) and train a Transformer; writes checkpoints and metrics.

    With no options: the built-in toy corpus and configs/toy.yaml, on CPU in a few minutes.
    Running it again on the same run directory continues the run (on the same data: see
    --allow-data-change). Ctrl-C or SIGTERM saves a checkpoint and exits with 130 or 143.
    With --init-from CKPT, a new run continues training a trained model on the config's data.
    """
    from transformer_mt.training.state import StoppedBySignal
    from transformer_mt.training.trainer import train as run_training

    cfg = _load_config(config, set_)
    if init_from is not None:
        cfg.train.init_from = str(init_from)
    run_dir = run_dir or Path("runs") / cfg.name
    try:
        state = run_training(
            cfg, run_dir, resume=resume, progress=progress, allow_data_change=allow_data_change
        )
    except StoppedBySignal as stopped:  # saved and resumable, but not done: `&& next` stops
        raise typer.Exit(stopped.exit_code) from None
    if int(os.environ.get("RANK", "0")) != 0:  # under torchrun only rank 0 reports
        return
    best = f", best val {cfg.train.best_metric} {state.best:.2f}" if state.best is not None else ""
    _note(f"done: step {state.step}{best}; checkpoints in {run_dir}/ (best.pt, last.pt)")


@app.command()
@user_errors
def prepare(config: ConfigOpt = None, set_: SetOpt = None) -> None:
    """Download, clean, tokenize and binarize the corpus of a config, without training."""
    from transformer_mt.data.prepare import prepare as run_prepare

    data = run_prepare(_load_config(config, set_))
    from transformer_mt.data.mixing import MixedCorpus

    train = data.train
    what = f"{len(train):,} training"
    if isinstance(train, MixedCorpus):
        what += f" pairs in {len(train.parts)} sources ({train.epoch_size():,} an epoch)"
    _note(f"ready: {what} and {len(data.valid):,} validation pairs")


@app.command("config")
@user_errors
def show_config(
    config: Annotated[
        Path | None,
        typer.Argument(help="A YAML config, or a shipped recipe's name; default: toy."),
    ] = None,
    set_: SetOpt = None,
) -> None:
    """Print the resolved config as YAML, with each key's help.

    Every key appears with its value (defaults included) and its help as a comment: exactly what
    `mt train` would run with, which `mt train --config` reads back. Every key is listed in
    docs/CONFIG.md."""
    from transformer_mt.config import config_yaml

    typer.echo(config_yaml(_load_config(config, set_)), nl=False)


def _read_input(path: Path | None) -> list[str]:
    from transformer_mt.fileio import decode_utf8, read_lines, split_lines

    if path is not None:
        return read_lines(path)
    if sys.stdin is None:
        raise MTError("stdin is closed: pass --input FILE, or pipe the text in")
    stream = getattr(sys.stdin, "buffer", None)
    return split_lines(decode_utf8(stream.read(), "stdin") if stream else sys.stdin.read())


def _stdin_stat() -> list[os.stat_result]:
    """stdin's file status when it is a file (``mt translate -o x < x`` must not replace x)."""
    try:
        return [os.fstat(sys.stdin.fileno())]
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        return []


@app.command()
@user_errors
def translate(
    checkpoints: CheckpointsOpt,
    input: Annotated[Path | None, typer.Option("--input", "-i", help="Default: stdin.")] = None,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Default: stdout.")] = None,
    beam: BeamOpt = None,
    nbest: Annotated[int | None, typer.Option("--nbest", help=option_help("nbest"))] = None,
    len_penalty: LenPenaltyOpt = None,
    batch_tokens: BatchTokensOpt = None,
    device: DeviceOpt = "cpu",
    attention_dir: Annotated[
        Path | None, typer.Option(help="Write a cross-attention heatmap PNG per sentence here.")
    ] = None,
    attention_layer: Annotated[
        int | None, typer.Option(help="Decoder layer for the heatmaps; default: average of all.")
    ] = None,
    sample: Annotated[
        bool, typer.Option("--sample", help=option_help("sampling", run_default=False))
    ] = False,
    temperature: Annotated[
        float | None, typer.Option("--temperature", help=option_help("temperature"))
    ] = None,
    top_k: Annotated[int | None, typer.Option("--top-k", help=option_help("top_k"))] = None,
    top_p: Annotated[float | None, typer.Option("--top-p", help=option_help("top_p"))] = None,
    seed: Annotated[int | None, typer.Option("--seed", help=option_help("sample_seed"))] = None,
    prefix_file: Annotated[
        Path | None,
        typer.Option(help="One target prefix per input line (empty: none); outputs start with it."),
    ] = None,
    engine: EngineOpt = "torch",
    quantize: QuantizeOpt = None,
    precision: PrecisionOpt = None,
    interactive: Annotated[
        bool,
        typer.Option(
            "--interactive",
            help="Answer each line as soon as it is read (the default when stdin is a terminal).",
        ),
    ] = False,
    alignments: Annotated[
        bool,
        typer.Option(
            "--alignments",
            help="After each output line (with --nbest, after its score): a tab and the word "
            "alignment in fast_align/Pharaoh format, space-separated 0-based 'i-j' pairs, i a "
            "source and j a target index; each target piece aligned to the source piece its "
            "cross-attention (mean of heads) weighs most. Indices count sentencepiece pieces, "
            "EOS excluded (or words: --alignment-units). An empty line gives just the tab. "
            "One checkpoint, --engine torch.",
        ),
    ] = False,
    alignment_layer: Annotated[
        int | None,
        typer.Option(help="Decoder layer for --alignments; default: average of all layers."),
    ] = None,
    alignment_units: Annotated[
        str | None,
        typer.Option(
            help="What --alignments indices count: 'pieces' (default; every target piece "
            "appears once) or 'words' (whitespace words, by the '▁' word-start marker; piece "
            "links mapped to word links, duplicates dropped).",
        ),
    ] = None,
    target_lang: TargetLangOpt = None,
) -> None:
    """Translate text or a document, line by line in order.

    Translate text in order: one output line per input line (K with --nbest K); empty in, empty
    out. A document (-i page.html, .docx, .odt, .pptx, .epub) becomes one of its format (-o)."""
    model = _ModelOptions(checkpoints, engine, device, quantize, target_lang, precision)
    options = _decode_options(
        beam, nbest, len_penalty, batch_tokens, sample, temperature, top_k, top_p, seed
    )
    text = _TextOptions(
        nbest,
        prefix_file,
        attention_dir,
        attention_layer,
        alignments,
        alignment_layer,
        alignment_units,
        interactive,
    )
    if input is not None and _is_document(input):
        _translate_document(input, output, model, options, text.given())
    else:
        _translate_text(input, output, model, options, text)


@dataclasses.dataclass
class _ModelOptions:
    """The options that choose what translates.

    What translates: --checkpoint (several: an ensemble), --engine, --device, --quantize,
    --target-lang, --precision."""

    checkpoints: list[Path]
    engine: str
    device: str
    quantize: str | None
    target_lang: str | None
    precision: str | None = None


@dataclasses.dataclass
class _TextOptions:
    """The options of `mt translate` for lines of text (a document takes none of them)."""

    nbest: int | None
    prefix_file: Path | None
    attention_dir: Path | None
    attention_layer: int | None
    alignments: bool
    alignment_layer: int | None
    alignment_units: str | None
    interactive: bool

    def given(self) -> list[str]:
        """The options given, as written on the command line."""
        values = dataclasses.asdict(self)
        values["nbest"] = None if self.nbest in (None, 1) else self.nbest
        return [
            "--" + key.replace("_", "-")
            for key, value in values.items()
            if value not in (None, False)
        ]


def _translate_text(
    input: Path | None,
    output: Path | None,
    model: _ModelOptions,
    options: dict,
    text: _TextOptions,
) -> None:
    """Translate lines from a file or stdin to a file or stdout.

    `mt translate` on lines: a file or stdin (at a terminal or with --interactive, line by
    line) to a file or stdout."""
    from transformer_mt.inference import format_best, format_nbest

    inputs = _check_translate_paths(
        input,
        output,
        model.checkpoints,
        text.prefix_file,
        text.attention_dir,
        text.attention_layer,
        text.alignments,
        text.alignment_layer,
        text.alignment_units,
    )
    align_kw = {
        "alignment_layer": text.alignment_layer,
        "alignment_units": text.alignment_units or "pieces",
    }
    at_terminal = input is None and text.prefix_file is None and sys.stdin is not None
    at_terminal = at_terminal and sys.stdin.isatty()
    load = (
        model.engine,
        model.checkpoints,
        model.device,
        options,
        model.quantize,
        model.target_lang,
        model.precision,
    )
    if text.interactive or at_terminal:
        _check_interactive(input, output, text.prefix_file, implied=not text.interactive)
        translate, decode = _translator(*load)
        _translate_interactively(
            translate,
            decode.nbest,
            text.alignments,
            attention_dir=text.attention_dir,
            attention_layer=text.attention_layer,
            **align_kw,
        )
        return
    lines = _read_input(input)
    prefixes = _read_prefixes(text.prefix_file, lines, str(input or "stdin"))
    aligned: list[list[Alignment]] | None = [] if text.alignments else None
    translate, decode = _translator(*load)
    results = translate(
        lines,
        progress=input is not None,
        attention_dir=text.attention_dir,
        attention_layer=text.attention_layer,
        prefixes=prefixes,
        alignments=aligned,
        **align_kw,
    )
    out = format_nbest(results, aligned) if decode.nbest > 1 else format_best(results, aligned)
    _write_lines(output, out, inputs=inputs)


def _decode_options(
    beam, nbest, len_penalty, batch_tokens, sample, temperature, top_k, top_p, seed
) -> dict:
    """The decode options of `mt translate` as changes of a model's DecodeConfig.

    An option left out (None) keeps the model's value; the sampling options are allowed only with
    --sample."""
    if not sample:
        for option, value in (
            ("--temperature", temperature),
            ("--top-k", top_k),
            ("--top-p", top_p),
            ("--seed", seed),
        ):
            if value is not None:
                raise MTError(f"{option} applies to sampling: add --sample, or drop {option}")
    options = {
        "beam_size": beam,
        "nbest": nbest,
        "len_penalty": len_penalty,
        "batch_tokens": batch_tokens,
    }
    if sample:  # one draw per line: a beam of one unless --beam says otherwise (an error)
        options.update(sampling=True, temperature=temperature, top_k=top_k, top_p=top_p)
        options.update(sample_seed=seed, beam_size=beam or 1)
    return options


def _is_document(path: Path) -> bool:
    from transformer_mt.inference.translate import is_document

    return is_document(path)


def _translate_document(
    input: Path, output: Path | None, model: _ModelOptions, options: dict, unused: list[str]
) -> None:
    """Translate a document into a document of its format.

    `mt translate -i DOC -o DOC`: a document into one of its format, its markup kept (the
    model's cross-attention places it); ``unused``: options for lines, refused."""
    from transformer_mt.fileio import check_output
    from transformer_mt.inference.documents import read_document_file
    from transformer_mt.inference.engines import load_engine
    from transformer_mt.inference.translate import check_document_output, translate_file

    if unused:
        raise MTError(f"{unused[0]} is for lines of text; {input} is a document: drop {unused[0]}")
    if output is None:
        raise MTError(f"--input {input} is a document: name its translation with --output FILE")
    if len(model.checkpoints) > 1:
        raise MTError("a document is translated with one --checkpoint (no ensemble)")
    inputs = [input, *model.checkpoints]
    check_output(output, inputs)
    document = read_document_file(input)
    check_document_output(document, output)
    engine = load_engine(
        model.engine, model.checkpoints[0], model.device, model.quantize, model.precision
    )
    decode = _decode_settings(engine.decode, **options)
    translate_file(engine, document, output, decode, model.target_lang, inputs=inputs)
    _note(f"wrote {output}: {len(document.segments)} segments translated")


def _check_interactive(
    input: Path | None, output: Path | None, prefix_file: Path | None, implied: bool = False
) -> None:
    """--interactive reads stdin and answers on stdout, line by line: no file options.

    (It is also what a terminal on stdin means; ``implied``: it was not asked for.)"""
    if sys.stdin is None:
        raise MTError("stdin is closed: --interactive reads it; pipe the text in")
    if implied and output is not None:
        raise MTError(
            f"stdin is a terminal, read line by line with answers on stdout: to write --output "
            f"{output}, give --input FILE or pipe the text in"
        )
    for option, given, what in (
        ("--input", input, "reads stdin"),
        ("--output", output, "answers on stdout"),
        ("--prefix-file", prefix_file, "has no file lines to pair prefixes with"),
    ):
        if given is not None:
            raise MTError(
                f"--interactive {what}: drop {option} {given}, or drop --interactive to "
                "translate a file"
            )


def _translate_interactively(translate, nbest: int, alignments: bool, **kw) -> None:
    """Translate line by line, each answer written as soon as it is ready.

    Read a line, translate it, write and flush its answer, then read the next (a terminal,
    or `--interactive` on a pipe); the model is loaded once. Ends at the end of the input.
    ``kw`` goes to ``translate`` (attention pictures, alignment settings)."""
    from transformer_mt.inference import format_best, format_nbest

    stream = getattr(sys.stdin, "buffer", None)
    number = 0
    while raw := (stream.readline() if stream is not None else sys.stdin.readline().encode()):
        number += 1
        try:
            line = raw.decode("utf-8").rstrip("\n").rstrip("\r")
        except UnicodeDecodeError:
            raise MTError(f"stdin:{number}: invalid UTF-8; type or pipe UTF-8 text") from None
        aligned: list[list[Alignment]] | None = [] if alignments else None
        results = translate([line], alignments=aligned, first_line=number, **kw)
        formats = format_nbest if nbest > 1 else format_best
        _write_lines(None, formats(results, aligned))


def _check_translate_paths(
    input: Path | None,
    output: Path | None,
    checkpoints: list[Path],
    prefix_file: Path | None,
    attention_dir: Path | None,
    attention_layer: int | None,
    alignments: bool = False,
    alignment_layer: int | None = None,
    alignment_units: str | None = None,
) -> list:
    """Check the paths and options of `mt translate` before any work.

    The option checks of `mt translate` that need no model, before any work; returns the
    inputs an output must not overwrite."""
    if attention_layer is not None and attention_dir is None:
        raise MTError(
            "--attention-layer chooses the layer of the heatmaps: add --attention-dir DIR"
        )
    for option, given in (
        ("--alignment-layer", alignment_layer),
        ("--alignment-units", alignment_units),
    ):
        if given is not None and not alignments:
            raise MTError(f"{option} is a setting of --alignments: add --alignments")
    if alignment_units not in (None, "pieces", "words"):
        raise MTError(f"--alignment-units {alignment_units!r}: expected pieces or words")
    inputs: list[Path | os.stat_result] = [input] if input is not None else [*_stdin_stat()]
    inputs += [*checkpoints, *([prefix_file] if prefix_file is not None else [])]
    if output is not None:
        from transformer_mt.fileio import check_output

        check_output(output, inputs)
    return inputs


def _write_lines(output: Path | None, lines: Iterable[str], inputs: Iterable = ()) -> None:
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


def _refuse_with_hyp(options: dict[str, object]) -> None:
    """--hyp scores translations made already: an option for translating is a mistake."""
    for option, value in options.items():
        if value not in (None, []):
            raise MTError(
                f"--hyp scores translations made already; {option} is for translating "
                "--src: drop it, or give --src instead of --hyp"
            )


@app.command()
@user_errors
def evaluate(
    ref: Annotated[
        list[Path], typer.Option("--ref", "-r", help="Reference file (repeat for several).")
    ],
    hyp: Annotated[Path | None, typer.Option(help="Score this file of translations.")] = None,
    src: Annotated[Path | None, typer.Option(help="Translate this file with --checkpoint.")] = None,
    checkpoint: Annotated[
        list[Path] | None,
        typer.Option(
            "--checkpoint",
            "-c",
            help="Model to translate --src with (repeat: an ensemble); with --engine ct2, a "
            "directory written by `mt export`.",
        ),
    ] = None,
    beam: BeamOpt = None,
    len_penalty: LenPenaltyOpt = None,
    device: DeviceOpt = "cpu",
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    engine: EngineOpt = "torch",
    quantize: QuantizeOpt = None,
    precision: PrecisionOpt = None,
    tokenize: Annotated[
        str,
        typer.Option(
            help="sacrebleu's BLEU tokenizer: 13a (European languages, the default), zh, "
            "ja-mecab, ko-mecab (pip install 'sacrebleu\\[ja]' / '\\[ko]'), char, intl or none; "
            "the signature names it."
        ),
    ] = "13a",
    target_lang: TargetLangOpt = None,
) -> None:
    """BLEU, chrF and TER (sacrebleu, detokenized text) with their signatures.

    Either score --hyp, or translate --src with --checkpoint first; against one or more --ref.
    """
    from transformer_mt.evaluation import bleu_metric, check_same_length, score_all
    from transformer_mt.fileio import read_lines

    bleu_metric(tokenize)  # a tokenizer sacrebleu cannot load fails before any translating
    if (hyp is None) == (src is None):
        raise MTError("give either --hyp FILE, or --src FILE with --checkpoint")
    if hyp is not None:
        translating = {"--checkpoint": checkpoint, "--beam": beam}
        quantization = {"--quantize": quantize, "--precision": precision}
        _refuse_with_hyp({**translating, "--len-penalty": len_penalty, **quantization})
    refs = [read_lines(r) for r in ref]
    if hyp is not None:
        hyps, hyp_name = read_lines(hyp), str(hyp)
    else:
        if not checkpoint:
            raise MTError("--src needs --checkpoint")
        assert src is not None  # exactly one of --hyp and --src, checked above
        sources = read_lines(src)
        check_same_length(sources, str(src), refs, [str(r) for r in ref])
        options = {"beam_size": beam, "nbest": 1, "len_penalty": len_penalty}
        results, _ = _translate(
            engine,
            checkpoint,
            device,
            sources,
            options,
            progress=True,
            quantize=quantize,
            precision=precision,
            target_lang=target_lang,
        )
        hyps, hyp_name = [r[0][0] for r in results], str(src)
    check_same_length(hyps, hyp_name, refs, [str(r) for r in ref])
    scores = score_all(hyps, refs, tokenize)
    typer.echo(json.dumps(scores.to_dict()) if as_json else scores.format())


@app.command()
@user_errors
def score(
    checkpoints: Annotated[
        list[Path],
        typer.Option(
            "--checkpoint", "-c", help="A .pt file written by `mt train`; repeat for an ensemble."
        ),
    ],
    src: Annotated[Path, typer.Option("--src", help="Source sentences, one per line.")],
    trg: Annotated[Path, typer.Option("--trg", help="Their target sentences, one per line.")],
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Default: stdout.")] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help='One {"logprob", "tokens", "avg"} object per line.')
    ] = False,
    device: DeviceOpt = "cpu",
    batch_tokens: BatchTokensOpt = None,
    target_lang: TargetLangOpt = None,
) -> None:
    """Forced decoding: the model's log-probability of each target given its source.

    One line per pair, in order: the summed log-probability of the target pieces and EOS, their
    count, and the average per token, tab separated (e.g. -12.3456<TAB>9<TAB>-1.3717). A pair
    with an empty source or target gives an empty line (with --json: {"logprob": null, "tokens":
    0, "avg": null}). A side longer than the model's max_len is truncated with a warning.

    A target is scored as its text tokenizes now, EOS included: an `mt translate` output may
    score otherwise than its search did when the search's pieces spell the same text another
    way, or when it stopped at the length limit without EOS. Scores are computed in fp32 whatever
    the checkpoint's decode.precision, so that they compare across machines.
    """
    from transformer_mt.fileio import read_lines
    from transformer_mt.inference import load_for_inference
    from transformer_mt.inference.score import check_pairs, format_scores, score_pairs

    if output is not None:
        from transformer_mt.fileio import check_output

        check_output(output, [src, trg, *checkpoints])  # before any work
    sources, targets = read_lines(src), read_lines(trg)
    check_pairs(sources, str(src), targets, str(trg))
    # fp32: `auto` could choose bf16 on one machine and fp32 on another (see the docstring)
    loaded = [load_for_inference(path, device, precision="fp32") for path in checkpoints]
    if len(loaded) > 1:  # one vocabulary for all, or a one-line error naming the two that differ
        from transformer_mt.decoding import check_ensemble

        check_ensemble(
            [str(p) for p in checkpoints],
            [x.model for x in loaded],
            [x.src_tok for x in loaded],
            [x.trg_tok for x in loaded],
        )
    first = loaded[0]
    decode = _decode_settings(first.config.decode, batch_tokens=batch_tokens)
    scores = score_pairs(
        [x.model for x in loaded],
        first.src_tok,
        first.trg_tok,
        sources,
        targets,
        batch_tokens=decode.batch_tokens,
        progress=True,
        src_prefix=first.source_prefix(target_lang),
    )
    _write_lines(output, format_scores(scores, as_json=as_json), inputs=[src, trg, *checkpoints])


@app.command()
@user_errors
def download(
    name: Annotated[str | None, typer.Argument(help="Corpus name (see --list).")] = None,
    dest: Annotated[Path | None, typer.Option(help="Destination; default data/<NAME>.")] = None,
    base_url: Annotated[
        str | None, typer.Option(help="Mirror to fetch from instead of the registry's URL.")
    ] = None,
    only: Annotated[
        list[str] | None, typer.Option(help="Only files matching this glob, e.g. 'train.*'.")
    ] = None,
    list_: Annotated[bool, typer.Option("--list", help="List the known corpora.")] = False,
) -> None:
    """Download a known corpus: resumable, unpacked safely; a second run does nothing.

    Files with a known SHA-256 in the registry are verified (--list shows how many each corpus
    has); the others are fetched unverified, with a warning that logs the hash they got.
    """
    from transformer_mt.data.download import download_corpus
    from transformer_mt.data.registry import list_corpora
    from transformer_mt.data.tasks import all_tasks, find_task

    if list_:
        for summary in [
            *(c.summary() for c in list_corpora()),
            *(t.summary() for t in all_tasks()),
        ]:
            typer.echo(summary)
        typer.echo(
            "opus:CORPUS/VERSION: an OPUS corpus through mtdata, e.g. opus:Tatoeba/v2023-04-12"
        )
        return
    if name is None:
        raise MTError("name a corpus to download, or pass --list to see them")
    task = find_task(name)
    if task is not None:  # every source of every split, fetched and read into the cache
        from transformer_mt.data.sources import fetch_task

        for split, sources in fetch_task(task, dest or Path("data"), base_url).items():
            for source in sources:
                typer.echo(f"{split} {source.label}: {source.files[0]} {source.files[1]}")
        return
    files = download_corpus(name, dest or Path("data") / name, base_url, only=only or None)
    for f in files:
        typer.echo(str(f))


@app.command()
@user_errors
def export(
    checkpoint: CheckpointOpt,
    output: Annotated[Path, typer.Option("--output", "-o", help="Directory to write.")],
    format: Annotated[
        str, typer.Option("--format", help="Export format: ctranslate2.")
    ] = "ctranslate2",
    quantization: Annotated[
        str,
        typer.Option(help="float32, int8, int8_float32, int8_bfloat16, bfloat16 or float16."),
    ] = "float32",
) -> None:
    """Export a checkpoint for fast inference elsewhere (CTranslate2: int8 on CPUs).

    Translate with it by `mt translate --engine ct2 -c DIR`, or with CTranslate2 directly; the
    directory holds the sentencepiece models and the run's decode settings too.
    """
    from transformer_mt.inference import load_for_inference
    from transformer_mt.inference.export import check_export_output, export_ctranslate2

    if format != "ctranslate2":
        raise MTError(f"--format {format!r}: the only export format is ctranslate2")
    check_export_output(output, [checkpoint])  # before any work; it never holds the checkpoint
    loaded = load_for_inference(checkpoint, pack=False)  # the checkpoint's own fp32 weights
    out = export_ctranslate2(loaded, output, quantization, str(checkpoint), inputs=[checkpoint])
    _note(
        f"wrote {out} (CTranslate2, {quantization}); translate with: mt translate --engine ct2 -c {out}"
    )


@app.command("import")
@user_errors
def import_(
    source: Annotated[
        str, typer.Argument(help="A model directory, or a name on the Hugging Face hub.")
    ],
    output: Annotated[Path, typer.Option("--output", "-o", help="The checkpoint to write.")],
    from_: Annotated[str, typer.Option("--from", help="The model's format: hf.")] = "hf",
) -> None:
    """Turn a published model into a checkpoint: a Hugging Face MarianMTModel (OPUS-MT).

    The checkpoint then works as a trained one: mt translate, evaluate, score, serve, export,
    and mt train --init-from to fine-tune it. A name that is not a directory is fetched from the
    hub (needs the hf extra: pip install 'transformer-mt\\[hf]').
    """
    from transformer_mt.inference.hf_import import import_marian

    if from_ != "hf":
        raise MTError(f"--from {from_!r}: the only format is hf (a Hugging Face MarianMTModel)")
    summary = import_marian(source, output)
    tags = summary["lang_tags"]
    targets = f"; targets (--target-lang): {', '.join(tags)}" if tags else ""
    _note(f"wrote {output} from {source}{targets}; translate with: mt translate -c {output}")


@app.command()
@user_errors
def average(
    checkpoints: Annotated[
        list[Path] | None, typer.Argument(help="Checkpoints of one run.", show_default=False)
    ] = None,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Where to write the average.")
    ] = None,
    other_runs: Annotated[
        bool,
        typer.Option(
            "--other-runs",
            help="Also average checkpoints of other runs (another seed or data): only for runs "
            "that share their start, e.g. fine-tuned from one checkpoint.",
        ),
    ] = False,
) -> None:
    """Average the weights of several checkpoints (e.g. the last few of a run)."""
    from transformer_mt.checkpoint import average_checkpoints

    if not checkpoints:  # e.g. a shell pattern that matched nothing, or nothing given
        raise MTError("nothing to average: name the checkpoints (e.g. runs/x/step_*.pt)")
    if output is None:
        raise MTError("give --output FILE: where to write the average")
    # refuses an output that is one of the inputs, a file given twice, another run's file
    average_checkpoints(checkpoints, output, other_runs=other_runs)
    _note(f"wrote {output} (average of {len(checkpoints)} checkpoints)")


def _serve_option(flag: str) -> Any:
    """The `mt serve` option ``flag``, read from the declaration of the setting it sets.

    Its default and help (with its unit and range) come from inference/serve_settings.py; a
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
    char_limit: int = _serve_option("--char-limit"),
    files: bool = _serve_option("--files"),
    files_dir: Path | None = _serve_option("--files-dir"),
    files_ttl: float = _serve_option("--files-ttl"),
) -> None:
    """Serve the model over HTTP.

    LibreTranslate's API (/translate, /languages, /detect, /translate_file, /frontend/settings),
    POST /v1/translate (n-best, attention), GET /v1/model, /health, API docs at /docs and a
    translation page at /; for load balancers and monitoring, /health/live, /health/ready (503
    while the model loads and while draining) and /metrics (Prometheus).

    Requests that arrive together are gathered into batches and decoded together; with
    --engine torch, --continuous lets them join the running search between steps instead.
    Opened beyond localhost: --api-keys, --req-limit and --char-limit. Ctrl-C or SIGTERM lets
    the requests in flight finish (at most --shutdown-timeout), then stops.
    """
    from transformer_mt.inference.server import serve as serve_model

    serve_model(checkpoint, _serve_settings(dict(locals())))


def _serve_settings(options: dict[str, Any]) -> ServeSettings:
    """The serve command's options as the server's settings objects.

    Each option's value in its setting's unit (KiB -> bytes, ms -> seconds), each range and
    rule checked as they are built (an MTError naming the option).
    """
    return settings_from_options(options)


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
        int | None, typer.Option(min=1, help="Its characters per text (default: --char-limit).")
    ] = None,
) -> None:
    """Add a new random key and print it (the only time it is shown)."""
    from transformer_mt.inference.access import add_key

    typer.echo(add_key(keys_file, name, req_limit, char_limit))
    _note(f"added key {name!r} to {keys_file}")


@serve_keys.command("list")
@user_errors
def serve_keys_list(keys_file: Annotated[Path, typer.Argument(help="The keys file.")]) -> None:
    """List the keys' names and limits (never the keys)."""
    from transformer_mt.inference.access import read_keys

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
    from transformer_mt.inference.access import remove_key

    remove_key(keys_file, name)
    _note(f"removed key {name!r} from {keys_file}")


@app.command()
@user_errors
def plot(
    run_dirs: Annotated[
        list[Path], typer.Argument(help="Run directories with metrics.jsonl (several: overlaid).")
    ],
    output: Annotated[
        Path | None,
        typer.Option(help="PNG path; default RUN_DIR/metrics.png (needed for several runs)."),
    ] = None,
) -> None:
    """Draw training loss, learning rate and validation BLEU of runs into a PNG."""
    from transformer_mt.training.plot import plot_metrics

    out = plot_metrics(run_dirs, output)
    _note(f"wrote {out}")


def main() -> None:
    app()
