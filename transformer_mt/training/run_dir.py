"""The files of one training run, written by rank 0: config.yaml, the tokenizers, checkpoints
(last.pt, best.pt, the newest ``keep_last`` step_N.pt, average.pt) and metrics.jsonl."""

import logging
from pathlib import Path
from typing import Any

from transformer_mt.checkpoint import average_checkpoints, save_checkpoint
from transformer_mt.config import Config, save_config
from transformer_mt.data.tokenizer import Tokenizer
from transformer_mt.training.metrics import MetricsLog

log = logging.getLogger(__name__)


class RunDirectory:
    """Where a run keeps its files; see the module docstring for what it holds."""

    def __init__(self, path: Path, cfg: Config, is_main: bool) -> None:
        self.path = Path(path)
        self.keep_last = cfg.train.keep_last
        self.metrics = MetricsLog(self.path, is_main, cfg.train.tensorboard)

    @property
    def last(self) -> Path:
        return self.path / "last.pt"

    def write_setup(self, cfg: Config, src_tok: Tokenizer, trg_tok: Tokenizer, step: int) -> None:
        """The resolved config and the tokenizers; on resume, metrics.jsonl cut back to ``step``."""
        self.path.mkdir(parents=True, exist_ok=True)
        save_config(cfg, self.path / "config.yaml")
        for side, tok in (("src", src_tok), ("trg", trg_tok)):
            tok.save(self.path / f"spm.{side}.model")
        self.metrics.trim(step)

    def step_checkpoints(self) -> list[Path]:
        """The step_N.pt files, oldest first."""
        return sorted(self.path.glob("step_*.pt"), key=lambda p: int(p.stem.removeprefix("step_")))

    def save(self, ckpt: dict[str, Any], step: int, best: bool) -> None:
        """step_N.pt, last.pt (and best.pt); then only the newest ``keep_last`` step files stay."""
        save_checkpoint(ckpt, self.path / f"step_{step}.pt")
        save_checkpoint(ckpt, self.last)
        if best:
            save_checkpoint(ckpt, self.path / "best.pt")
        step_files = self.step_checkpoints()
        for old in step_files[: max(0, len(step_files) - self.keep_last)]:
            old.unlink()

    def write_average(self, n_last: int) -> None:
        """average.pt: the weights averaged over the newest ``n_last`` step checkpoints. Averaging
        the last few checkpoints of a run usually adds BLEU for free."""
        chosen = self.step_checkpoints()[-n_last:]
        average_checkpoints(chosen, self.path / "average.pt")
        names = ", ".join(p.name for p in chosen)
        log.info(f"wrote {self.path / 'average.pt'}: the average of {names}")
