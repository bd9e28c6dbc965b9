"""`mt plot`: training loss, learning rate and validation BLEU of a run, in one PNG."""

import json
from pathlib import Path

from transformer_mt.errors import MTError


def read_metrics(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise MTError(f"no metrics.jsonl in {run_dir}; pass a run directory written by `mt train`")
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def plot_metrics(run_dir: Path, output: Path | None = None) -> Path:
    """Loss, learning rate and validation BLEU against the optimizer step, and BLEU against
    training time (minutes, when the run logged ``time_s``); returns the PNG's path."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    records = read_metrics(run_dir)
    train = [r for r in records if "loss" in r]
    valid = [r for r in records if any(k.startswith("val") for k in r)]
    bleu = [r for r in valid if "val_bleu" in r]
    timed = [r for r in bleu if "time_s" in r]
    fig = Figure(figsize=(16 if timed else 12, 3.5))
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 4 if timed else 3)
    # Both curves are plain NLL per target token: the training "loss" includes label smoothing
    # and would sit above the validation curve for that reason alone.
    axes[0].plot([r["step"] for r in train], [r["nll"] for r in train], label="train")
    if valid:
        axes[0].plot(
            [r["step"] for r in valid], [r["val_loss"] for r in valid], "o-", label="valid"
        )
    axes[0].set(title="NLL per target token", xlabel="step")
    axes[0].legend()
    axes[1].plot([r["step"] for r in train], [r["lr"] for r in train])
    axes[1].set(title="learning rate", xlabel="step")
    axes[2].plot([r["step"] for r in bleu], [r["val_bleu"] for r in bleu], "o-")
    axes[2].set(title="validation BLEU", xlabel="step")
    if timed:
        axes[3].plot([r["time_s"] / 60 for r in timed], [r["val_bleu"] for r in timed], "o-")
        axes[3].set(title="validation BLEU", xlabel="training minutes")
    fig.tight_layout()
    out = Path(output) if output else Path(run_dir) / "metrics.png"
    fig.savefig(out, dpi=100)
    return out
