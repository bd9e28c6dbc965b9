"""`mt translate`, `mt evaluate` and `mt score`: each through one engine (engines.load_engine)."""

import dataclasses
import json
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from transformer_mt.cli.common import (
    BatchTokensOpt,
    BeamOpt,
    CheckpointsOpt,
    LenPenaltyOpt,
    app,
    decode_settings,
    model_option,
    note,
    read_input,
    stdin_stat,
    user_errors,
    write_lines,
)
from transformer_mt.config import option_help
from transformer_mt.engines.options import ModelOptions, TranslateExtras, check_source_lang
from transformer_mt.errors import MTError

if TYPE_CHECKING:
    from transformer_mt.config import DecodeConfig
    from transformer_mt.engines.engine import Engine


def _load_engine(checkpoints: list[Path], model: ModelOptions) -> "Engine":
    """The engine that translates for `mt translate` / `mt evaluate`, loaded once.

    ``torch``: checkpoints (several: an ensemble); ``ct2``: one directory written by `mt export`.
    A multilingual model's target language is checked here, before any work."""
    from transformer_mt.engines.engine import load_engine

    engine = load_engine(model.engine, checkpoints, model.device, model.quantize, model.precision)
    why = str(engine.info.get("precision_why", ""))
    if why.startswith("auto"):  # a choice this machine made: say which, and why
        logging.getLogger("transformer_mt").info(
            f"linear layers in {engine.info['precision']} ({why})"
        )
    engine.source_prefix(model.target_lang)
    return engine


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
def translate(
    checkpoints: CheckpointsOpt,
    input: Annotated[Path | None, typer.Option("--input", "-i", help="Default: stdin.")] = None,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Default: stdout.")] = None,
    beam: BeamOpt = None,
    nbest: Annotated[int | None, typer.Option("--nbest", help=option_help("nbest"))] = None,
    len_penalty: LenPenaltyOpt = None,
    batch_tokens: BatchTokensOpt = None,
    device: str = model_option("device"),
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
    engine: str = model_option("engine"),
    quantize: str | None = model_option("quantize"),
    precision: str | None = model_option("precision"),
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
    target_lang: str | None = model_option("target_lang"),
    no_split: Annotated[
        bool,
        typer.Option(
            "--no-split",
            help="Translate each line as one segment. By default a line holding several "
            "sentences is cut into them, they are translated, and joined back with the line's own "
            "spaces (not with --prefix-file, --alignments or --attention-dir, which are per line).",
        ),
    ] = False,
    source_lang: Annotated[
        str | None,
        typer.Option(
            "--source-lang",
            help="The input's language code, for the sentence splitting rules (default: the "
            "model's source language); auto: each line's, detected among the model's source "
            "languages (the text extra).",
        ),
    ] = None,
    glossary: Annotated[
        Path | None,
        typer.Option(
            "--glossary",
            help="A TSV file of terms, 'source term<TAB>target term' a line ('#' comments): "
            "where a source term occurs (case-sensitive, whole words), the translation holds its "
            "target term (constrained beam search: --beam 2 or more; --engine torch).",
        ),
    ] = None,
    protect: Annotated[
        bool,
        typer.Option(
            "--protect",
            help="Carry URLs, e-mail addresses, numbers, `code` and text between <keep> and "
            "</keep> (the marks dropped) through unchanged, as terms the translation must hold "
            "(constrained beam search: --beam 2 or more; --engine torch).",
        ),
    ] = False,
) -> None:
    """Translate text or a document, line by line in order.

    Translate text in order: one output line per input line (K with --nbest K); empty in, empty
    out. A document (-i page.html, .docx, .odt, .pptx, .epub) becomes one of its format (-o)."""
    model = ModelOptions(
        engine=engine,
        device=device,
        quantize=quantize,
        precision=precision,
        target_lang=target_lang,
    )
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
        no_split,
        source_lang,
        glossary,
        protect,
    )
    if input is not None and _is_document(input):
        _translate_document(input, output, checkpoints, model, options, text)
    else:
        _translate_text(input, output, checkpoints, model, options, text)


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
    no_split: bool = False
    source_lang: str | None = None
    glossary: Path | None = None
    protect: bool = False

    def extras(self) -> TranslateExtras:
        """What the engine is asked for besides the lines (the prefixes: read later).

        Read before the model loads: a bad glossary file or --source-lang is one line first."""
        from transformer_mt.text.glossary import read_glossary

        if self.source_lang is not None:
            check_source_lang(self.source_lang)
        return TranslateExtras(
            alignments=self.alignments,
            alignment_layer=self.alignment_layer,
            alignment_units=self.alignment_units or "pieces",
            attention_dir=self.attention_dir,
            attention_layer=self.attention_layer,
            split=not self.no_split,
            source_lang=self.source_lang,
            glossary=read_glossary(self.glossary) if self.glossary is not None else None,
            protect=self.protect,
        )

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
    checkpoints: list[Path],
    model: ModelOptions,
    options: dict,
    text: _TextOptions,
) -> None:
    """Translate lines from a file or stdin to a file or stdout.

    `mt translate` on lines: a file or stdin (at a terminal or with --interactive, line by
    line) to a file or stdout."""
    from transformer_mt.engines.lines import format_results

    inputs = _check_translate_paths(
        input,
        output,
        checkpoints,
        text.prefix_file,
        text.attention_dir,
        text.attention_layer,
        text.alignments,
        text.alignment_layer,
        text.alignment_units,
    )
    if text.glossary is not None and output is not None:
        from transformer_mt.fileio import check_output

        check_output(output, [text.glossary])
        inputs.append(text.glossary)
    extras = text.extras()  # a bad glossary file: one line, before the model loads
    extras.check_engine(model.engine)
    at_terminal = input is None and text.prefix_file is None and sys.stdin is not None
    at_terminal = at_terminal and sys.stdin.isatty()
    if text.interactive or at_terminal:
        _check_interactive(input, output, text.prefix_file, implied=not text.interactive)
        engine = _load_engine(checkpoints, model)
        decode = decode_settings(engine.run_decode, **options)
        _translate_interactively(engine, decode, model.target_lang, extras)
        return
    lines = read_input(input)
    prefixes = _read_prefixes(text.prefix_file, lines, str(input or "stdin"))
    engine = _load_engine(checkpoints, model)
    decode = decode_settings(engine.run_decode, **options)
    extras = dataclasses.replace(extras, prefixes=prefixes, progress=input is not None)
    results = engine.translate(lines, decode, target=model.target_lang, extras=extras)
    write_lines(output, format_results(results, decode.nbest), inputs=inputs)


def _decode_options(
    beam: int | None,
    nbest: int | None,
    len_penalty: float | None,
    batch_tokens: int | None,
    sample: bool,
    temperature: float | None,
    top_k: int | None,
    top_p: float | None,
    seed: int | None,
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
    from transformer_mt.documents.translate import is_document

    return is_document(path)


def _translate_document(
    input: Path,
    output: Path | None,
    checkpoints: list[Path],
    model: ModelOptions,
    options: dict,
    text: _TextOptions,
) -> None:
    """Translate a document into a document of its format.

    `mt translate -i DOC -o DOC`: a document into one of its format, its markup kept (the
    model's cross-attention places it), a --glossary held in each sentence; the other options
    for lines (``text``) are refused."""
    from transformer_mt.documents.document import read_document_file
    from transformer_mt.documents.translate import check_document_output, translate_file
    from transformer_mt.fileio import check_output

    unused = [option for option in text.given() if option != "--glossary"]
    if unused:
        raise MTError(f"{unused[0]} is for lines of text; {input} is a document: drop {unused[0]}")
    if output is None:
        raise MTError(f"--input {input} is a document: name its translation with --output FILE")
    if len(checkpoints) > 1:
        raise MTError("a document is translated with one --checkpoint (no ensemble)")
    inputs = [input, *checkpoints, *([text.glossary] if text.glossary else [])]
    check_output(output, inputs)
    extras = text.extras()  # a bad glossary file: one line, before the model loads
    extras.check_engine(model.engine)
    document = read_document_file(input)
    check_document_output(document, output)
    engine = _load_engine(checkpoints, model)
    decode = decode_settings(engine.decode, **options)
    target = model.target_lang
    translate_file(engine, document, output, decode, target, inputs, extras.glossary)
    note(f"wrote {output}: {len(document.segments)} segments translated")


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


def _translate_interactively(
    engine: "Engine", decode: "DecodeConfig", target: str | None, extras: TranslateExtras
) -> None:
    """Translate line by line, each answer written as soon as it is ready.

    Read a line, translate it, write and flush its answer, then read the next (a terminal,
    or `--interactive` on a pipe); the model is loaded once. Ends at the end of the input."""
    from transformer_mt.engines.lines import format_results

    stream = getattr(sys.stdin, "buffer", None)
    number = 0
    while raw := (stream.readline() if stream is not None else sys.stdin.readline().encode()):
        number += 1
        try:
            line = raw.decode("utf-8").rstrip("\n").rstrip("\r")
        except UnicodeDecodeError:
            raise MTError(f"stdin:{number}: invalid UTF-8; type or pipe UTF-8 text") from None
        each = dataclasses.replace(extras, first_line=number)
        results = engine.translate([line], decode, target=target, extras=each)
        write_lines(None, format_results(results, decode.nbest))


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
    inputs: list[Path | os.stat_result] = [input] if input is not None else [*stdin_stat()]
    inputs += [*checkpoints, *([prefix_file] if prefix_file is not None else [])]
    if output is not None:
        from transformer_mt.fileio import check_output

        check_output(output, inputs)
    return inputs


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
    device: str = model_option("device"),
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    engine: str = model_option("engine"),
    quantize: str | None = model_option("quantize"),
    precision: str | None = model_option("precision"),
    tokenize: Annotated[
        str,
        typer.Option(
            help="sacrebleu's BLEU tokenizer: 13a (European languages, the default), zh, "
            "ja-mecab, ko-mecab (pip install 'sacrebleu\\[ja]' / '\\[ko]'), char, intl or none; "
            "the signature names it."
        ),
    ] = "13a",
    target_lang: str | None = model_option("target_lang"),
) -> None:
    """BLEU, chrF and TER (sacrebleu, detokenized text) with their signatures.

    Either score --hyp, or translate --src with --checkpoint first; against one or more --ref.
    """
    from transformer_mt.evaluation import bleu_metric, check_same_length, score_all
    from transformer_mt.fileio import read_lines

    bleu_metric(tokenize)  # a tokenizer sacrebleu cannot load fails before any translating
    model = ModelOptions(
        engine=engine,
        device=device,
        quantize=quantize,
        precision=precision,
        target_lang=target_lang,
    )
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
        translator = _load_engine(checkpoint, model)
        options = {"beam_size": beam, "nbest": 1, "len_penalty": len_penalty}
        decode = decode_settings(translator.run_decode, **options)
        extras = TranslateExtras(progress=True)
        results = translator.translate(sources, decode, target=model.target_lang, extras=extras)
        hyps, hyp_name = [result.text for result in results], str(src)
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
    device: str = model_option("device"),
    batch_tokens: BatchTokensOpt = None,
    target_lang: str | None = model_option("target_lang"),
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
    from transformer_mt.decoding.score import check_pairs, format_scores
    from transformer_mt.engines.engine import load_engine
    from transformer_mt.fileio import read_lines

    if output is not None:
        from transformer_mt.fileio import check_output

        check_output(output, [src, trg, *checkpoints])  # before any work
    sources, targets = read_lines(src), read_lines(trg)
    check_pairs(sources, str(src), targets, str(trg))
    # fp32: `auto` could choose bf16 on one machine and fp32 on another (see the docstring)
    engine = load_engine("torch", checkpoints, device, precision="fp32")
    decode = decode_settings(engine.run_decode, batch_tokens=batch_tokens)
    scores = engine.score(sources, targets, decode.batch_tokens, True, target_lang)
    write_lines(output, format_scores(scores, as_json=as_json), inputs=[src, trg, *checkpoints])
