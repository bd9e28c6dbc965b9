"""The `mt` command line: each command parses options, loads a config, calls one library function.

A user's mistake (:class:`MTError`) prints one line to stderr and exits with code 1; anything else
is a bug and keeps its traceback.
"""

import functools
import json
import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from transformer_mt.errors import MTError

app = typer.Typer(
    help="transformer-mt: download, train, translate and evaluate Transformer translation models.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

CheckpointOpt = Annotated[
    Path, typer.Option("--checkpoint", "-c", help="A .pt file written by `mt train`.")
]
ConfigOpt = Annotated[
    Path | None,
    typer.Option("--config", help="YAML config (see configs/); default: the built-in toy recipe."),
]
SetOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--set", help="Override a config key, e.g. --set train.max_steps=100 (repeatable)."
    ),
]
DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "toy.yaml"


def user_errors(fn):
    """Turn MTError into a one-line message and exit code 1."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except MTError as err:
            typer.echo(f"error: {err}", err=True)
            raise typer.Exit(1) from None

    return wrapper


def _load_config(config: Path | None, overrides: list[str] | None):
    from transformer_mt.config import load_config

    if config is None and DEFAULT_CONFIG.is_file():
        config = DEFAULT_CONFIG
    return load_config(config, overrides)


def _say(message: str) -> None:
    typer.echo(message, err=True)


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
) -> None:
    """Prepare the data (if needed) and train a Transformer; writes checkpoints and metrics.

    With no options: the built-in toy corpus and configs/toy.yaml, on CPU in a few minutes.
    Running it again on the same run directory continues the run.
    """
    from transformer_mt.training.trainer import train as run_training

    cfg = _load_config(config, set_)
    run_dir = run_dir or Path("runs") / cfg.name
    state = run_training(cfg, run_dir, resume=resume, progress=progress, say=_say)
    if int(os.environ.get("RANK", "0")) != 0:  # under torchrun only rank 0 reports
        return
    best = f", best val {cfg.train.best_metric} {state.best:.2f}" if state.best is not None else ""
    _say(f"done: step {state.step}{best}; checkpoints in {run_dir}/ (best.pt, last.pt)")


@app.command()
@user_errors
def prepare(config: ConfigOpt = None, set_: SetOpt = None) -> None:
    """Download, clean, tokenize and binarize the corpus of a config, without training."""
    from transformer_mt.data.prepare import prepare as run_prepare

    data = run_prepare(_load_config(config, set_), _say)
    _say(f"ready: {len(data.train):,} training and {len(data.valid):,} validation pairs")


def _read_input(path: Path | None) -> list[str]:
    from transformer_mt.fileio import read_lines, split_lines

    if path is None:
        return split_lines(sys.stdin.read())
    return read_lines(path)


@app.command()
@user_errors
def translate(
    checkpoint: CheckpointOpt,
    input: Annotated[Path | None, typer.Option("--input", "-i", help="Default: stdin.")] = None,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Default: stdout.")] = None,
    beam: Annotated[int | None, typer.Option(help="Beam size; 1 = greedy.")] = None,
    nbest: Annotated[int, typer.Option(help="Hypotheses per line, as 'text<TAB>score' lines.")] = 1,
    len_penalty: Annotated[float | None, typer.Option(help="Length penalty alpha.")] = None,
    batch_tokens: Annotated[int | None, typer.Option(help="Source tokens per batch.")] = None,
    device: Annotated[str, typer.Option(help="cpu, cuda, cuda:1, ...")] = "cpu",
    attention_dir: Annotated[
        Path | None, typer.Option(help="Write a cross-attention heatmap PNG per sentence here.")
    ] = None,
    attention_layer: Annotated[
        int | None, typer.Option(help="Decoder layer for the heatmaps; default: average of all.")
    ] = None,
    sample: Annotated[
        bool, typer.Option("--sample", help="Draw tokens instead of searching (back-translation).")
    ] = False,
    temperature: Annotated[float, typer.Option(help="With --sample: softmax temperature.")] = 1.0,
    top_k: Annotated[int, typer.Option(help="With --sample: keep the k best tokens; 0 = all.")] = 0,
    top_p: Annotated[float, typer.Option(help="With --sample: nucleus mass; 1 = all.")] = 1.0,
    seed: Annotated[int, typer.Option(help="With --sample: seed of the draws.")] = 0,
) -> None:
    """Translate text, one output line per input line, in order (empty in, empty out)."""
    from transformer_mt.decoding import SamplingOptions
    from transformer_mt.training.checkpoint import load_for_inference
    from transformer_mt.translation import format_best, format_nbest, translate_lines

    sampling = None
    if sample:
        if beam not in (None, 1) or nbest != 1:
            raise MTError("--sample draws one translation per line: drop --beam / --nbest")
        if temperature <= 0 or not 0 < top_p <= 1 or top_k < 0:
            raise MTError("--sample needs --temperature > 0, 0 < --top-p <= 1 and --top-k >= 0")
        sampling = SamplingOptions(temperature, top_k, top_p, seed)
        beam = 1
    loaded = load_for_inference(checkpoint, device)
    d = loaded.config.decode
    beam = beam or d.beam_size
    if nbest < 1 or nbest > max(beam, 1):
        raise MTError(f"--nbest {nbest} must be between 1 and the beam size ({beam})")
    lines = _read_input(input)
    results = translate_lines(
        loaded.model,
        loaded.src_tok,
        loaded.trg_tok,
        lines,
        beam=beam,
        nbest=nbest,
        len_penalty=d.len_penalty if len_penalty is None else len_penalty,
        max_len_a=d.max_len_a,
        max_len_b=d.max_len_b,
        batch_tokens=batch_tokens or d.batch_tokens,
        device=device,
        progress=input is not None,
        attention_dir=attention_dir,
        attention_layer=attention_layer,
        sampling=sampling,
    )
    out_lines = format_nbest(results) if nbest > 1 else format_best(results)
    text = "".join(line + "\n" for line in out_lines)
    if output is None:
        sys.stdout.write(text)
    else:
        from transformer_mt.fileio import write_text_atomic

        write_text_atomic(output, text)


@app.command()
@user_errors
def evaluate(
    ref: Annotated[
        list[Path], typer.Option("--ref", "-r", help="Reference file (repeat for several).")
    ],
    hyp: Annotated[Path | None, typer.Option(help="Score this file of translations.")] = None,
    src: Annotated[Path | None, typer.Option(help="Translate this file with --checkpoint.")] = None,
    checkpoint: Annotated[
        Path | None, typer.Option("--checkpoint", "-c", help="Model to translate --src with.")
    ] = None,
    beam: Annotated[int | None, typer.Option(help="Beam size for --src; 1 = greedy.")] = None,
    len_penalty: Annotated[
        float | None, typer.Option(help="Length penalty alpha for --src; default: the run's.")
    ] = None,
    device: Annotated[str, typer.Option(help="cpu, cuda, ...")] = "cpu",
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """BLEU, chrF and TER (sacrebleu, detokenized text) with their signatures.

    Either score --hyp, or translate --src with --checkpoint first; against one or more --ref.
    """
    from transformer_mt.evaluation import check_same_length, score_all
    from transformer_mt.fileio import read_lines

    if (hyp is None) == (src is None):
        raise MTError("give either --hyp FILE, or --src FILE with --checkpoint")
    refs = [read_lines(r) for r in ref]
    if hyp is not None:
        hyps, hyp_name = read_lines(hyp), str(hyp)
    else:
        if checkpoint is None:
            raise MTError("--src needs --checkpoint")
        from transformer_mt.training.checkpoint import load_for_inference
        from transformer_mt.translation import translate_lines

        loaded = load_for_inference(checkpoint, device)
        d = loaded.config.decode
        sources = read_lines(src)
        check_same_length(sources, str(src), refs, [str(r) for r in ref])
        results = translate_lines(
            loaded.model, loaded.src_tok, loaded.trg_tok, sources,
            beam=beam or d.beam_size,
            len_penalty=d.len_penalty if len_penalty is None else len_penalty,
            max_len_a=d.max_len_a,
            max_len_b=d.max_len_b, batch_tokens=d.batch_tokens, device=device, progress=True,
        )  # fmt: skip
        hyps, hyp_name = [r[0][0] for r in results], str(src)
    check_same_length(hyps, hyp_name, refs, [str(r) for r in ref])
    scores = score_all(hyps, refs)
    typer.echo(json.dumps(scores.to_dict()) if as_json else scores.format())


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
    """Download a known corpus: resumable, checksummed, unpacked safely; a second run does nothing."""
    from transformer_mt.data.download import download_corpus
    from transformer_mt.data.registry import list_corpora

    if list_:
        for corpus in list_corpora():
            typer.echo(corpus.summary())
        return
    if name is None:
        raise MTError("name a corpus to download, or pass --list to see them")
    files = download_corpus(name, dest or Path("data") / name, base_url, only=only or None)
    for f in files:
        typer.echo(str(f))


@app.command()
@user_errors
def average(
    checkpoints: Annotated[list[Path], typer.Argument(help="Checkpoints of one run.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Where to write the average.")],
) -> None:
    """Average the weights of several checkpoints (e.g. the last few of a run)."""
    from transformer_mt.training.checkpoint import average_checkpoints

    average_checkpoints(checkpoints, output)
    _say(f"wrote {output} (average of {len(checkpoints)} checkpoints)")


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
    _say(f"wrote {out}")


def main() -> None:
    app()
