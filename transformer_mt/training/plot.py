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
    """Three panels against the optimizer step; returns the PNG's path."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    records = read_metrics(run_dir)
    train = [r for r in records if "loss" in r]
    valid = [r for r in records if any(k.startswith("val") for k in r)]
    fig = Figure(figsize=(12, 3.5))
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 3)
    axes[0].plot([r["step"] for r in train], [r["loss"] for r in train], label="train (smoothed)")
    if valid:
        axes[0].plot(
            [r["step"] for r in valid], [r["val_loss"] for r in valid], "o-", label="valid"
        )
    axes[0].set(title="loss per target token", xlabel="step")
    axes[0].legend()
    axes[1].plot([r["step"] for r in train], [r["lr"] for r in train])
    axes[1].set(title="learning rate", xlabel="step")
    bleu = [r for r in valid if "val_bleu" in r]
    axes[2].plot([r["step"] for r in bleu], [r["val_bleu"] for r in bleu], "o-")
    axes[2].set(title="validation BLEU", xlabel="step")
    fig.tight_layout()
    out = Path(output) if output else Path(run_dir) / "metrics.png"
    fig.savefig(out, dpi=100)
    return out
