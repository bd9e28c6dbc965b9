"""The checkpoint file: atomic save, safe load, averaging. Shared by training and inference.

A checkpoint is a plain dict that ``torch.load(weights_only=True)`` accepts (tensors, numbers,
strings, bytes, lists, dicts), so nothing in it can run code when loaded:

- ``model``: the state dict; ``model_args``: the Transformer's keyword arguments;
- ``config``: the resolved config as a dict; ``src_spm`` / ``trg_spm``: sentencepiece model bytes;
  ``special_ids``: the ids the vocabularies were built with;
- written by training: ``step`` and ``train_state`` (optimizer, scaler, RNG streams, data position,
  best metric); by averaging: ``averaged_from``.

State dicts of older versions (other parameter names) are upgraded when a model loads them
(``transformer_mt.model.upgrade_state_dict``).
"""

from pathlib import Path
from typing import Any

import torch

from transformer_mt.data.tokenizer import SPECIAL_IDS
from transformer_mt.errors import MTError
from transformer_mt.fileio import atomic_write
from transformer_mt.model import upgrade_state_dict

REQUIRED_KEYS = ("model", "model_args", "config", "src_spm", "trg_spm")


def save_checkpoint(ckpt: dict[str, Any], path: Path) -> None:
    """Write ``ckpt`` beside ``path``, flush it to disk, then rename it over ``path``: a crash
    mid-write leaves the previous file intact, never a truncated one."""
    with atomic_write(path, "wb", durable=True) as f:
        torch.save(ckpt, f)


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
    missing = [k for k in REQUIRED_KEYS if not isinstance(ckpt, dict) or k not in ckpt]
    if missing:
        raise MTError(f"{path} is not a transformer-mt checkpoint (missing {', '.join(missing)})")
    if ckpt.get("special_ids", SPECIAL_IDS) != SPECIAL_IDS:
        raise MTError(f"{path}: special ids {ckpt['special_ids']} differ from {SPECIAL_IDS}")
    return ckpt


def average_checkpoints(paths: list[Path], output: Path) -> None:
    """Average the weights of several checkpoints of the same model into ``output`` (without
    training state: the average is for translating, not for resuming)."""
    if not paths:
        raise MTError("mt average needs at least one checkpoint")
    first = load_checkpoint(paths[0])
    first_weights = upgrade_state_dict(first["model"])
    total = {k: v.double() for k, v in first_weights.items()}
    for path in paths[1:]:
        ckpt = load_checkpoint(path)
        weights = upgrade_state_dict(ckpt["model"])
        if ckpt["model_args"] != first["model_args"] or weights.keys() != total.keys():
            raise MTError(
                f"{path}: a different model than {paths[0]}; average only one run's files"
            )
        for k, v in weights.items():
            total[k] += v.double()
    averaged = {k: (v / len(paths)).to(first_weights[k].dtype) for k, v in total.items()}
    out = {k: v for k, v in first.items() if k != "train_state"}
    out["model"] = averaged
    out["averaged_from"] = [str(p) for p in paths]
    save_checkpoint(out, output)
