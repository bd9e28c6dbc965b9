"""Continuing a run from its own last.pt.

What must match, what the config may change, and how the position, the generators and the settings
carried in the optimizer's state are restored.

The trainer loads the weights and optimizer state (:meth:`Trainer._restore`); these functions
decide the rest. What the data and tokenizers must be is checked by
:mod:`~transformer_mt.training.fingerprint`; the state itself is
:class:`~transformer_mt.training.state.TrainState`.
"""

import logging
from pathlib import Path
from typing import Any

import torch

from transformer_mt.config import TrainConfig
from transformer_mt.errors import MTError
from transformer_mt.training.init_from import DROPOUT_ARGS
from transformer_mt.training.state import TrainState, rank_seed, set_rng_state

log = logging.getLogger(__name__)


def check_training_state(path: Path, ckpt: dict[str, Any]) -> None:
    """Refuse a checkpoint without a training state (weights only) as a run to continue."""
    if "train_state" not in ckpt:
        raise MTError(
            f"{path} holds weights only (written by `mt average`?), not a training state to "
            "resume; move it out of the run directory, or train in a new --run-dir"
        )


def check_model_args(path: Path, saved: dict[str, Any], wanted: dict[str, Any]) -> None:
    """Refuse a checkpoint whose model is not this config's, but for its dropout rates.

    Dropout changes no parameter: a resumed run may drop more or less from here on.
    """
    keys = sorted(saved.keys() | wanted.keys())
    differ = [k for k in keys if saved.get(k) != wanted.get(k)]
    shape = [k for k in differ if k not in DROPOUT_ARGS]
    if shape:
        changes = ", ".join(f"{k} {saved.get(k)} -> {wanted.get(k)}" for k in shape)
        raise MTError(
            f"{path} was trained with another model ({changes}); use a new --run-dir, or "
            "the run's own config"
        )
    if differ:
        changes = ", ".join(f"{k} {saved.get(k)} -> {wanted[k]}" for k in differ)
        log.info(f"resuming {path} with other dropout rates: {changes}")


def apply_optimizer_settings(
    optimizer: torch.optim.Optimizer, train_cfg: TrainConfig, path: Path
) -> None:
    """Put the config's betas, eps and weight decay back into a just-loaded optimizer.

    Loading the optimizer's state brings back the ones it was saved with; the config's hold
    instead (config.yaml and new checkpoints record them).
    """
    wanted = {
        "betas": (train_cfg.adam_beta1, train_cfg.adam_beta2),
        "eps": train_cfg.adam_eps,
        "weight_decay": train_cfg.weight_decay,
    }
    group = optimizer.param_groups[0]  # all groups share them (one group is built)
    before = {k: tuple(group[k]) if k == "betas" else group[k] for k in wanted}
    changed = {k: f"{before[k]} -> {v}" for k, v in wanted.items() if before[k] != v}
    for group in optimizer.param_groups:
        group.update(wanted)
    if changed:
        log.info(f"resuming {path} with other AdamW settings: {changed}")


def check_best_metric(
    state: TrainState, metric: str, path: Path, saved_config_metric: str | None
) -> None:
    """Start the best value over when ``train.best_metric`` changed since the checkpoint.

    ``state.best`` holds a value of the metric the run was validated by (the state records
    it; older ones only in the checkpoint's config); after a change of ``train.best_metric``
    comparing the new metric with it would be meaningless, so the best value and the patience
    count start over (the next validation writes best.pt)."""
    saved = state.best_metric or saved_config_metric
    if saved is not None and saved != metric:
        log.warning(
            f"{path}: train.best_metric {saved} -> {metric}: the best value and "
            "the early-stopping count start over at the next validation"
        )
        state.best, state.bad_validations = None, 0
    state.best_metric = metric


def realign_epoch(
    state: TrainState,
    path: Path,
    saved_cfg: dict[str, Any],
    now_cfg: dict[str, Any],
    worlds: tuple[int, int],
    data_changed: bool,
) -> None:
    """Move a mid-epoch position to the next epoch when its batches are now cut otherwise.

    The saved position counts this rank's batches of an epoch as the run cut them: for
    its process count (``worlds``: saved, now), ``train.batch_tokens``, ``train.seed``,
    ``train.pad_to_multiple`` (the configs hold its resolved value), the subword sampling settings
    (they change the sampled lengths) and its data. Cut otherwise, the same count would repeat or
    skip part of the epoch, so a run resumed mid-epoch with other settings starts the next epoch
    (the rest of this one is skipped, nothing is repeated)."""
    settings = [
        ("train", "batch_tokens"),
        ("train", "seed"),
        ("train", "pad_to_multiple"),
        ("tokenizer", "sample_alpha"),
    ]
    if saved_cfg.get("tokenizer", {}).get("sample_alpha") or now_cfg["tokenizer"]["sample_alpha"]:
        # With sampling off (alpha 0) on both sides the other two settings are unused.
        settings += [("tokenizer", "sample_nbest"), ("tokenizer", "sample_draws")]
    changed = [
        f"{what} {before} -> {after}"
        for what, before, after in (
            ("processes", *worlds),
            *(
                (f"{sec}.{key}", saved_cfg.get(sec, {}).get(key), now_cfg[sec][key])
                for sec, key in settings
            ),
        )
        if before is not None and before != after
    ]
    if data_changed:
        changed.append("the data (--allow-data-change)")
    if changed and state.batch_in_epoch:
        log.warning(
            f"{path}: the batches of epoch {state.epoch} were cut for other settings "
            f"({', '.join(changed)}); resuming at the start of epoch {state.epoch + 1}, the "
            f"rest of epoch {state.epoch} skipped"
        )
        state.epoch, state.batch_in_epoch = state.epoch + 1, 0


def restore_generators(
    per_rank: list[dict[str, Any]],
    rank: int,
    world_size: int,
    device: torch.device,
    reseed: int,
) -> None:
    """Restore this rank's random streams as the run left them.

    With another process count (whose batches differ anyway): rank 0's streams, and on the
    other ranks fresh ones seeded from ``reseed``.
    """
    if len(per_rank) == world_size:
        set_rng_state(per_rank[rank], device)
        return
    log.info(f"resuming with {world_size} process(es) instead of {len(per_rank)}")
    set_rng_state(per_rank[0], device)
    if rank:
        torch.manual_seed(rank_seed(reseed, rank))
