"""`mt train`, `prepare`, `config`, `download`, `average` and `plot`: runs and their data."""

import os
from pathlib import Path
from typing import Annotated

import typer

from transformer_mt.cli.common import ConfigOpt, SetOpt, app, load_config, note, user_errors
from transformer_mt.errors import MTError


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

    cfg = load_config(config, set_)
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
    note(f"done: step {state.step}{best}; checkpoints in {run_dir}/ (best.pt, last.pt)")


@app.command()
@user_errors
def prepare(config: ConfigOpt = None, set_: SetOpt = None) -> None:
    """Download, clean, tokenize and binarize the corpus of a config, without training."""
    from transformer_mt.data.prepare import prepare as run_prepare

    data = run_prepare(load_config(config, set_))
    from transformer_mt.data.mixing import MixedCorpus

    train = data.train
    what = f"{len(train):,} training"
    if isinstance(train, MixedCorpus):
        what += f" pairs in {len(train.parts)} sources ({train.epoch_size():,} an epoch)"
    note(f"ready: {what} and {len(data.valid):,} validation pairs")


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

    typer.echo(config_yaml(load_config(config, set_)), nl=False)


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
    note(f"wrote {output} (average of {len(checkpoints)} checkpoints)")


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
    note(f"wrote {out}")
