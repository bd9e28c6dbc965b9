"""`mt plot`: a run's training curves in one PNG.

`mt plot`: training loss, learning rate and validation BLEU of one run or several (overlaid,
one colour per run), in one PNG."""

import io
import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from transformer_mt.errors import MTError
from transformer_mt.fileio import check_output, write_output
from transformer_mt.training.metrics import read_records

if TYPE_CHECKING:
    from matplotlib.axes import Axes

log = logging.getLogger(__name__)
NEEDED = ("step", "nll", "lr")  # what a training line ("loss" in it) must carry to be drawn
DRAWN = ("nll", "lr", "val_loss", "val_bleu", "time_s")  # numbers, where a line has them


def read_metrics(run_dir: Path) -> list[dict]:
    """The records of RUN_DIR/metrics.jsonl.

    Read as a resumed run reads them
    (:func:`transformer_mt.training.metrics.read_records`: a half-written last line is skipped
    with a warning, a bad line elsewhere is an error naming it). A one-line MTError when there
    is nothing to draw (no metrics.jsonl yet, or not one record in it), for a bad last line
    that was written whole (it ends with a newline: not a killed run's), and for a line
    without the numbers a plot draws."""
    run_dir = Path(run_dir)
    path = run_dir / "metrics.jsonl"
    if not path.is_file() and not run_dir.is_dir():
        raise MTError(f"no metrics.jsonl in {run_dir}; pass a run directory written by `mt train`")
    if not path.is_file():
        raise MTError(f"{run_dir} has no metrics yet (no metrics.jsonl); plot it once it logged")
    _refuse_a_whole_bad_last_line(path)
    records = read_records(path)
    if not records:
        raise MTError(f"{run_dir} has no metrics yet (no record in {path}); plot it once it logged")
    for record in records:
        missing = [k for k in NEEDED if "loss" in record and k not in record]
        if missing:
            raise MTError(
                f"{path}: the training line of step {record['step']} has no {', '.join(missing)}; "
                "was it written by `mt train`?"
            )
        per_pair = [k for k in record if k.startswith(("val_loss/", "val_bleu/"))]
        for key in (*DRAWN, *per_pair):
            value = record.get(key, 0)
            if not isinstance(value, int | float) or isinstance(value, bool):
                raise MTError(
                    f"{path}: the line of step {record['step']} has {key} {json.dumps(value)}, "
                    "expected a number; was it written by `mt train`?"
                )
    return records


def _refuse_a_whole_bad_last_line(path: Path) -> None:
    """Refuse a bad last line that was written whole.

    A last line that is no metrics record but ends with a newline was written whole, by
    something other than a killed run: an MTError naming FILE:LINE, as for a bad line elsewhere.
    (Only a last line without its newline is taken for a killed run's half line.)"""
    data = path.read_bytes()
    lines = data.split(b"\n")
    numbered = [(i + 1, line) for i, line in enumerate(lines) if line.strip()]
    if not numbered or not data.rstrip(b" \t\r").endswith(b"\n"):
        return
    number, last = numbered[-1]
    try:
        record = json.loads(last.decode("utf-8"))
    except ValueError as err:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        why = str(err)
    else:
        if isinstance(record, dict) and isinstance(record.get("step"), int):
            return
        why = "not a JSON object with an integer step"
    raise MTError(
        f"{path}:{number}: not a metrics record ({why}); a complete line, not a killed run's "
        "half line: delete or fix that line"
    )


def plot_metrics(run_dirs: list[Path], output: Path | None = None) -> Path:
    """Plot loss, learning rate and validation BLEU of one run or several.

    Loss, learning rate and validation BLEU against the optimizer step, and BLEU against
    training time (minutes, when a run logged ``time_s``); returns the PNG's path, by default
    RUN_DIR/metrics.png of a single run (several runs need ``output``)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if not run_dirs:
        raise MTError("name at least one run directory to plot")
    if output is None and len(run_dirs) > 1:
        raise MTError(f"{len(run_dirs)} runs to plot: say where the PNG goes with --output")
    out = Path(output) if output else Path(run_dirs[0]) / "metrics.png"
    inputs = [Path(d) / "metrics.jsonl" for d in run_dirs]
    runs = [(Path(d).name, read_metrics(d)) for d in run_dirs]  # all read before drawing
    check_output(out, inputs)
    kind = out.suffix[1:].lower() or "png"  # as matplotlib's savefig(path) picks it
    timed = any("time_s" in r and "val_bleu" in r for _, records in runs for r in records)
    fig = Figure(figsize=(16 if timed else 12, 3.5))
    if kind not in FigureCanvasAgg(fig).get_supported_filetypes():
        raise MTError(
            f"--output {out}: unknown image type {kind!r}; use a .png (or .svg, .pdf) name"
        )
    axes = fig.subplots(1, 4 if timed else 3)
    for i, (name, records) in enumerate(runs):
        colour = f"C{i}"
        train = [r for r in records if "loss" in r]
        valid = [r for r in records if "val_loss" in r]  # a BLEU-only line has no loss to draw
        bleu = [r for r in records if "val_bleu" in r]
        # Both curves are plain NLL per target token: the training "loss" includes label
        # smoothing and would sit above the validation curve for that reason alone.
        steps, nll = [r["step"] for r in train], [r["nll"] for r in train]
        axes[0].plot(steps, nll, color=colour, alpha=0.6, label=f"{name} train")
        if valid:
            val_steps, val_nll = [r["step"] for r in valid], [r["val_loss"] for r in valid]
            axes[0].plot(val_steps, val_nll, "o-", color=colour, label=f"{name} valid")
        axes[1].plot(steps, [r["lr"] for r in train], color=colour, label=name)
        bleu_steps, bleu_values = [r["step"] for r in bleu], [r["val_bleu"] for r in bleu]
        several = any("/" in key for r in bleu for key in r)  # a multilingual run: its mean
        axes[2].plot(bleu_steps, bleu_values, "o-", color=colour, label=name + " mean" * several)
        _pair_curves(axes[0], valid, "val_loss", colour, name)
        _pair_curves(axes[2], bleu, "val_bleu", colour, name)
        if timed:
            minutes = [r["time_s"] / 60 for r in bleu if "time_s" in r]
            values = [r["val_bleu"] for r in bleu if "time_s" in r]
            axes[3].plot(minutes, values, "o-", color=colour, label=name)
    axes[0].set(title="NLL per target token", xlabel="step")
    axes[1].set(title="learning rate", xlabel="step")
    axes[2].set(title="validation BLEU", xlabel="step")
    if timed:
        axes[3].set(title="validation BLEU", xlabel="training minutes")
    for ax in axes:
        ax.legend(fontsize="small")
    fig.tight_layout()
    image = io.BytesIO()
    fig.savefig(image, format=kind, dpi=100)
    write_output(out, image.getvalue(), inputs=inputs)
    return out


def _pair_curves(ax: "Axes", records: list[dict], key: str, colour: str, name: str) -> None:
    """A multilingual run's per-pair values (``val_bleu/de-en``), dashed beside their mean."""
    pairs = sorted({k.split("/", 1)[1] for r in records for k in r if k.startswith(key + "/")})
    for j, pair in enumerate(pairs):
        points = [(r["step"], r[f"{key}/{pair}"]) for r in records if f"{key}/{pair}" in r]
        steps, values = zip(*points, strict=True)
        style = ("x--", "+:", "s-.")[j % 3]  # a marker: one validation is a point, not a line
        ax.plot(steps, values, style, color=colour, alpha=0.8, label=f"{name} {pair}")
