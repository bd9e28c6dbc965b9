"""Checkpoints: atomic save, safe load, and rebuilding a model for inference.

A checkpoint is a plain dict that ``torch.load(weights_only=True)`` accepts (tensors, numbers,
strings, bytes, lists, dicts): ``model`` (state dict), ``model_args`` (the Transformer's keyword
arguments), ``config`` (the resolved config as a dict), ``src_spm``/``trg_spm`` (sentencepiece model
bytes), ``special_ids``, and for training ``step`` plus ``train_state`` (optimizer, RNG, data
position, best metric). Nothing in it can run code when loaded.
"""

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from transformer_mt.config import Config, config_from_dict
from transformer_mt.data.tokenizer import SPECIAL_IDS, Tokenizer
from transformer_mt.errors import MTError
from transformer_mt.model import Transformer


def save_atomic(obj: dict[str, Any], path: Path) -> None:
    """Write ``obj`` to a temporary file beside ``path``, flush it to disk, then rename it over
    ``path``: a crash mid-write leaves the previous file intact, never a truncated one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_checkpoint(path: Path | str, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Load a checkpoint safely (``weights_only=True``), with a one-line error for the user."""
    path = Path(path)
    if not path.is_file():
        raise MTError(f"checkpoint not found: {path}; pass a .pt file written by `mt train`")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as err:  # a truncated file, a foreign pickle, ...
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise MTError(f"cannot load checkpoint {path}: {first}") from err
    missing = [k for k in ("model", "model_args", "config", "src_spm", "trg_spm") if k not in ckpt]
    if not isinstance(ckpt, dict) or missing:
        raise MTError(f"{path} is not a transformer-mt checkpoint (missing {', '.join(missing)})")
    if ckpt.get("special_ids", SPECIAL_IDS) != SPECIAL_IDS:
        raise MTError(f"{path}: special ids {ckpt['special_ids']} differ from {SPECIAL_IDS}")
    return ckpt


@dataclass
class LoadedModel:
    """Everything inference needs, rebuilt from one checkpoint file."""

    model: Transformer
    src_tok: Tokenizer
    trg_tok: Tokenizer
    config: Config
    step: int


def load_for_inference(path: Path | str, device: str | torch.device = "cpu") -> LoadedModel:
    """Rebuild the model (in eval mode, on ``device``) and tokenizers from a checkpoint."""
    ckpt = load_checkpoint(path)
    model = Transformer(**ckpt["model_args"])
    model.load_state_dict(ckpt["model"])
    model.to(device).eval()
    src_tok = Tokenizer(ckpt["src_spm"])
    trg_tok = src_tok if ckpt["trg_spm"] == ckpt["src_spm"] else Tokenizer(ckpt["trg_spm"])
    return LoadedModel(
        model=model,
        src_tok=src_tok,
        trg_tok=trg_tok,
        config=config_from_dict(ckpt["config"]),
        step=int(ckpt.get("step", 0)),
    )


def average_checkpoints(paths: list[Path], output: Path) -> None:
    """Average the weights of several checkpoints of the same model into ``output``."""
    if not paths:
        raise MTError("mt average needs at least one checkpoint")
    first = load_checkpoint(paths[0])
    total = {k: v.double() for k, v in first["model"].items()}
    for p in paths[1:]:
        ckpt = load_checkpoint(p)
        if ckpt["model_args"] != first["model_args"] or ckpt["model"].keys() != total.keys():
            raise MTError(f"{p}: a different model than {paths[0]}; average only one run's files")
        for k, v in ckpt["model"].items():
            total[k] += v.double()
    avg = {k: (v / len(paths)).to(first["model"][k].dtype) for k, v in total.items()}
    out = {k: v for k, v in first.items() if k != "train_state"}
    out["model"] = avg
    out["averaged_from"] = [str(p) for p in paths]
    save_atomic(out, output)
