"""What a run was trained on, recorded in each checkpoint and checked on resume.

Resuming after the corpus, its cleaning, the tokenizer or the toy corpus's seed changed (with the
same model shape) would go on training on other data, or with another vocabulary behind the same
ids, without a word. So each checkpoint records hashes of the prepared data and the tokenizer
models, and a resume that finds them changed stops with what differs and what to do, unless the
user accepts the change (`mt train --allow-data-change`).
"""

import hashlib
import logging
from pathlib import Path
from typing import Any

from transformer_mt.config import Config
from transformer_mt.data.prepare import PreparedData
from transformer_mt.errors import MTError

log = logging.getLogger(__name__)

# Fingerprint entries, in the order a message names them.
WHAT = {
    "src_tokenizer": "the source tokenizer",
    "trg_tokenizer": "the target tokenizer",
    "train_data": "the training data",
    "valid_data": "the validation data",
}
# Config keys that change where files live, not what they hold.
_NOT_DATA = {"cache_dir"}


def data_fingerprint(data: PreparedData) -> dict[str, str]:
    """Hashes of the tokenizer models and the binarized splits' cache keys (which cover the
    corpus files' contents, the cleaning settings and the tokenizers)."""
    return {
        "src_tokenizer": hashlib.sha256(data.src_tok.model_proto).hexdigest()[:16],
        "trg_tokenizer": hashlib.sha256(data.trg_tok.model_proto).hexdigest()[:16],
        "train_data": data.train.key,
        "valid_data": data.valid.key,
    }


def check_fingerprint(
    path: Path, ckpt: dict[str, Any], current: dict[str, str], cfg: Config, allow_change: bool
) -> None:
    """Raise an MTError when ``ckpt`` was trained on other data than ``current`` describes (or
    warn, with ``allow_change``); a checkpoint from before fingerprints resumes with a note."""
    saved = ckpt.get("train_state", {}).get("data_fingerprint")
    if saved is None:
        log.info(
            f"{path} records no fingerprint of its data (written by an older version): resuming "
            "without checking that the data and tokenizer are unchanged"
        )
        return
    differ = [WHAT.get(k, k) for k in current if k in saved and saved[k] != current[k]]
    if not differ:
        return
    what = ", ".join(differ)
    changes = _config_changes(ckpt.get("config", {}), cfg)
    because = f" ({changes})" if changes else ""
    if allow_change:
        log.warning(f"resuming {path} although {what} changed{because} (--allow-data-change)")
        return
    raise MTError(
        f"{path} was trained on other data: {what} changed{because}; use a new --run-dir, or "
        "restore the data and config it was trained with, or pass --allow-data-change to go on "
        "with the new data"
    )


def _config_changes(saved: dict[str, Any], cfg: Config) -> str:
    """The data and tokenizer config keys that differ from the checkpoint's, e.g.
    "data.toy_seed 1 -> 2": most changed fingerprints are explained by one of them."""
    now = cfg.to_dict()
    changes = []
    for section in ("data", "tokenizer"):
        before, after = saved.get(section, {}), now[section]
        for key, value in after.items():
            if key not in _NOT_DATA and key in before and before[key] != value:
                changes.append(f"{section}.{key} {before[key]!r} -> {value!r}")
    return ", ".join(changes)
