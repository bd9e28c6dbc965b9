"""What a run was trained on, recorded in each checkpoint and checked on resume.

Resuming after the corpus, its cleaning, the tokenizer or the toy corpus's seed changed (with the
same model shape) would go on training on other data, or with another vocabulary behind the same
ids, without a word. So each checkpoint records hashes of the prepared data and the tokenizer
models, and a resume that finds them changed stops with what differs and what to do, unless the
user accepts the change (`mt train --allow-data-change`).
"""

import hashlib
import logging
from collections.abc import Collection
from pathlib import Path
from typing import Any

import numpy as np

from transformer_mt.config import Config
from transformer_mt.data.binarized import BinarizedPair
from transformer_mt.data.mixing import MixedCorpus
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
_HASH_CHUNK = 1 << 22  # token ids hashed at a time
# Config keys that change where files live or come from, not what they hold.
# Where data lives, and what reading it may cost (a raised bound changes no data it read).
_NOT_DATA = {"cache_dir", "download_dir", "base_url"} | {
    "max_line_bytes",
    "max_archive_bytes",
    "max_archive_members",
    "max_nesting",
}
# Tokenizer keys of the training-time sampling of segmentations: they change no prepared data.
_SAMPLING = {"sample_alpha", "sample_nbest", "sample_draws"}


def data_fingerprint(data: PreparedData) -> dict[str, str]:
    """Hashes of the tokenizer models and of the binarized splits' token ids.

    What the model
    reads, whatever the corpus files, cleaning or limits were, and independent of the cache's
    own key (which also changes with the cache layout, not only with the data)."""
    return {
        "src_tokenizer": hashlib.sha256(data.src_tok.model_proto).hexdigest()[:16],
        "trg_tokenizer": hashlib.sha256(data.trg_tok.model_proto).hexdigest()[:16],
        "train_data": _ids_digest(data.train),
        "valid_data": _ids_digest(data.valid)
        if len(data.valid_sets) <= 1
        else hashlib.sha256(
            " ".join(_ids_digest(vs.data) for vs in data.valid_sets).encode()
        ).hexdigest()[:16],
    }


def _ids_digest(pair: BinarizedPair | MixedCorpus) -> str:
    """SHA-256 of every sentence's ids, both sides.

    Streamed from the memory-mapped cache; of
    several sources, each source's digest with its weight (a new weight is other data)."""
    if isinstance(pair, MixedCorpus):
        parts = [f"{_ids_digest(p)}x{w!r}" for p, w in zip(pair.parts, pair.weights, strict=True)]
        return hashlib.sha256(" ".join(parts).encode()).hexdigest()[:16]
    digest = hashlib.sha256()
    for tokens, offsets in pair.sides:
        digest.update(np.ascontiguousarray(offsets, dtype=np.int64).tobytes())
        for start in range(0, len(tokens), _HASH_CHUNK):  # no whole copy of a large corpus
            digest.update(np.asarray(tokens[start : start + _HASH_CHUNK], np.int64).tobytes())
    return digest.hexdigest()[:16]


def check_fingerprint(
    path: Path, ckpt: dict[str, Any], current: dict[str, str], cfg: Config, allow_change: bool
) -> bool:
    """Check that ``ckpt`` was trained on the data ``current`` describes.

    Raise an MTError when ``ckpt`` was trained on other data than ``current`` describes (or
    warn, with ``allow_change``, and return True); a checkpoint from before fingerprints resumes
    with a note. False: the same data, as far as the checkpoint tells."""
    saved = ckpt.get("train_state", {}).get("data_fingerprint")
    if saved is None:
        log.info(
            f"{path} records no fingerprint of its data (written by an older version): resuming "
            "without checking that the data and tokenizer are unchanged"
        )
        return False
    differ = [WHAT.get(k, k) for k in current if k in saved and saved[k] != current[k]]
    if not differ:
        return False
    what = ", ".join(differ)
    changes = _config_changes(ckpt.get("config", {}), cfg)
    because = f" ({changes})" if changes else ""
    if allow_change:
        log.warning(f"resuming {path} although {what} changed{because} (--allow-data-change)")
        return True
    raise MTError(
        f"{path} was trained on other data: {what} changed{because}; use a new --run-dir, or "
        "restore the data and config it was trained with, or pass --allow-data-change to go on "
        "with the new data"
    )


def check_data_settings(path: Path, ckpt: dict[str, Any], cfg: Config, allow_change: bool) -> None:
    """Refuse, before any data is prepared, a resume whose data or tokenizer settings changed.

    The same refusal as :func:`check_fingerprint`'s, minutes earlier on a large corpus: a config
    that names other data (another corpus, cleaning, toy seed, vocabulary) would prepare it only to
    be refused. With ``allow_change`` nothing is refused here; the fingerprint check then warns.
    Changes the config cannot show (the files themselves) are left to the fingerprint. A
    checkpoint from before fingerprints is not judged here either (its version's config may
    differ in ways that are not data): it resumes with :func:`check_fingerprint`'s note."""
    if ckpt.get("train_state", {}).get("data_fingerprint") is None:
        return
    changes = _config_changes(ckpt.get("config", {}), cfg, skip=_SAMPLING)
    if changes and not allow_change:
        raise MTError(
            f"{path} was trained with other data settings ({changes}); use a new --run-dir, "
            "or restore the settings it was trained with, or pass --allow-data-change to go on "
            "with the new data"
        )


def _config_changes(saved: dict[str, Any], cfg: Config, skip: Collection[str] = ()) -> str:
    """The data and tokenizer config keys that differ from the checkpoint's.

    E.g.
    "data.toy_seed 1 -> 2": most changed fingerprints are explained by one of them."""
    now = cfg.to_dict()
    changes = []
    for section in ("data", "tokenizer"):
        before, after = saved.get(section, {}), now[section]
        for key, value in after.items():
            if key not in _NOT_DATA and key not in skip and key in before and before[key] != value:
                changes.append(f"{section}.{key} {before[key]!r} -> {value!r}")
    return ", ".join(changes)
