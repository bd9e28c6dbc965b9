"""Validation during training: loss, perplexity and BLEU.

Validation during training: loss and perplexity on the binarized split, BLEU of greedy
translations of the validation text (translated as `mt translate --beam 1` would)."""

import dataclasses
import math

import torch

from transformer_mt.config import Config
from transformer_mt.data.batching import make_batches, shard_batches
from transformer_mt.data.prepare import PreparedData, ValidSet
from transformer_mt.data.tokenizer import PAD_ID
from transformer_mt.decoding.text import translate_texts
from transformer_mt.evaluation import corpus_bleu
from transformer_mt.model import Transformer
from transformer_mt.training import distributed
from transformer_mt.training.batches import collate
from transformer_mt.training.device import autocast
from transformer_mt.training.loss import label_smoothed_nll


@torch.no_grad()
def validate(
    model: Transformer,
    data: PreparedData,
    cfg: Config,
    info: distributed.DistInfo,
    device: torch.device,
    autocast_dtype: torch.dtype | None,
) -> dict[str, float]:
    """Validate: loss, perplexity and, when asked, BLEU.

    ``val_loss`` (NLL per target token), ``val_ppl`` and, with ``train.valid_bleu``,
    ``val_bleu``. A multilingual model reports them per language pair too (``val_loss/de-en``,
    ``val_bleu/de-en``), and ``val_loss`` / ``val_bleu`` are the means over its pairs, which
    ``train.best_metric`` then compares.

    Every rank scores and decodes its share, and every rank computes the same result from the
    gathered sums and hypotheses, so all of them take the same early-stopping decision. The model
    is left in training mode.
    """
    model.eval()
    sets = data.valid_sets or [ValidSet("", data.valid, data.valid_src, data.valid_trg)]
    per_set = [_validate_set(model, vs, data, cfg, info, device, autocast_dtype) for vs in sets]
    model.train()
    if len(per_set) == 1:
        return per_set[0]
    result = {}
    for vs, metrics in zip(sets, per_set, strict=True):
        result.update({f"{key}/{vs.name}": value for key, value in metrics.items()})
    for key in per_set[0]:
        result[key] = sum(m[key] for m in per_set) / len(per_set)
    result["val_ppl"] = math.exp(min(result["val_loss"], 50.0))
    return result


def _validate_set(
    model: Transformer,
    vs: ValidSet,
    data: PreparedData,
    cfg: Config,
    info: distributed.DistInfo,
    device: torch.device,
    autocast_dtype: torch.dtype | None,
) -> dict[str, float]:
    """Loss, perplexity and (with ``train.valid_bleu``) greedy BLEU of one validation set."""
    nll_sum = tokens = 0.0
    batches = make_batches(
        vs.data.src_lengths,
        vs.data.trg_lengths + 1,
        cfg.train.batch_tokens,
        seed=0,
        epoch=0,
        shuffle=False,
    )
    for index in shard_batches(batches, info.rank, info.world_size):
        src, trg_in, trg_out = (x.to(device) for x in collate(vs.data, index))
        with autocast(device, autocast_dtype):
            logits = model(src, trg_in, right_padded=True)  # trg_in is BOS + target + padding
        _, nll = label_smoothed_nll(logits, trg_out, PAD_ID, 0.0)
        nll_sum += nll.item()
        tokens += (trg_out != PAD_ID).sum().item()
    nll_sum, tokens = distributed.all_reduce_sum([nll_sum, tokens], info, device)
    result = {"val_loss": nll_sum / tokens, "val_ppl": math.exp(min(nll_sum / tokens, 50.0))}
    if cfg.train.valid_bleu:
        greedy = dataclasses.replace(cfg.decode, beam_size=1, nbest=1, sampling=False)
        rank, world = info.rank, info.world_size
        # Rank r decodes lines r, r + world, ...: shares of similar length and cost.
        translations = translate_texts(
            model, data.src_tok, data.trg_tok, vs.src[rank::world], greedy, src_prefix=vs.prefix
        )
        shares = distributed.all_gather_objects([t[0][0] for t in translations], info)
        ordered = [""] * len(vs.src)
        for r, share in enumerate(shares):
            ordered[r::world] = share
        result["val_bleu"] = corpus_bleu(ordered, vs.trg, cfg.train.valid_bleu_tokenize)
    return result
