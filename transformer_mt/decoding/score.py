"""`mt score` as a library call: forced decoding of given (source, target) pairs.

Each pair's score is what the model assigns to the target under teacher forcing, as in training
without label smoothing: the sum of log p(piece | source, earlier pieces) over the target's pieces
and the closing EOS, in fp32. The sum over pairs equals the plain NLL that training's validation
computes (``label_smoothed_nll`` with epsilon 0) on the same pairs, negated.

The line contract is `mt translate`'s: one result per pair, in input order; a pair whose source or
target is empty (or whitespace only, or nothing after normalization) gets ``None`` without running
the model. A side that fits the model's position table is scored whole; a longer source keeps its
first ``max_len - 1`` pieces (+ EOS), a longer target its first ``max_len - 1`` pieces (+ EOS),
each with a warning naming the line: the score then covers only what was kept.
"""

import json
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from tqdm import tqdm

from transformer_mt.data.batching import longest_first_batches, pad_batch
from transformer_mt.data.tokenizer import BOS_ID, EOS_ID, Tokenizer
from transformer_mt.decoding.text import encode_lines, encode_sources
from transformer_mt.errors import MTError
from transformer_mt.model import Transformer


@dataclass(frozen=True)
class PairScore:
    """The model's log-probability of one target given its source."""

    logprob: float  # sum of the natural-log probabilities of the target pieces and EOS
    tokens: int  # how many were scored: target pieces + EOS

    @property
    def avg(self) -> float:
        """Log-probability per token (its negation is the pair's NLL per token)."""
        return self.logprob / self.tokens


def check_pairs(
    sources: Sequence[str], src_name: str, targets: Sequence[str], trg_name: str
) -> None:
    """Raise a one-line MTError naming both files and their line counts when they differ."""
    if len(sources) != len(targets):
        raise MTError(
            f"line counts differ: {src_name} has {len(sources)} lines, {trg_name} has "
            f"{len(targets)}; each source line needs one target line"
        )


def score_pairs(
    model: Transformer | Sequence[Transformer],
    src_tok: Tokenizer,
    trg_tok: Tokenizer,
    sources: Iterable[str],
    targets: Iterable[str],
    *,
    batch_tokens: int = 4096,
    progress: bool = False,
    src_prefix: Sequence[int] = (),
) -> list[PairScore | None]:
    """Score each (source, target) pair by teacher forcing.

    One result per pair, in order, None
    for a pair with an empty side.

    Args:
        model: the Transformer in eval mode (it runs where its parameters are), or several
            sharing one vocabulary (an ensemble, as in search: each token's log-probability is
            the mean of the models' log-probabilities).
        src_tok, trg_tok: source and target tokenizers.
        sources, targets: the same number of lines (else a ValueError; the CLI checks first).
        batch_tokens: padded tokens per batch, counted on the wider side of each pair (the
            source, or the target + 1); a pair wider than the budget gets a batch alone.
        progress: a tqdm bar (pairs) on stderr.
        src_prefix: ids that start every source (a multilingual model's target-language tag).
    """
    models = [model] if isinstance(model, Transformer) else list(model)
    model = models[0]
    sources, targets = list(sources), list(targets)
    if len(sources) != len(targets):
        raise ValueError(f"{len(sources)} sources but {len(targets)} targets")
    if batch_tokens < 1:
        raise ValueError(f"batch_tokens must be >= 1, got {batch_tokens}")
    table = min(m.positions.max_len for m in models)
    src_ids = encode_sources(src_tok, sources, table, prefix=src_prefix)
    # The decoder reads BOS + pieces: pieces + 1 must fit the table, as with EOS.
    trg_ids = encode_lines(trg_tok, targets, table, "target pieces (with EOS)")
    todo = [i for i in src_ids if i in trg_ids]  # pairs with something on both sides
    results: list[PairScore | None] = [None] * len(sources)
    device = next(model.parameters()).device
    widths = [max(len(src_ids[i]), len(trg_ids[i])) for i in todo]  # trg_in = BOS + pieces
    bar = tqdm(total=len(todo), unit="pair", disable=not progress, file=sys.stderr)
    with bar, torch.no_grad():
        for batch in longest_first_batches(widths, batch_tokens):
            lines = [todo[p] for p in batch.tolist()]
            batch_src, batch_trg = [src_ids[i] for i in lines], [trg_ids[i] for i in lines]
            sums = _score_batch(models, batch_src, batch_trg, device)
            for i, total in zip(lines, sums, strict=True):
                results[i] = PairScore(logprob=total, tokens=len(trg_ids[i]))
            bar.update(len(lines))
    return results


def _score_batch(
    models: list[Transformer],
    sources: list[list[int]],
    targets: list[list[int]],
    device: torch.device,
) -> list[float]:
    """The summed target log-probabilities of one batch.

    Summed target log-probabilities of one batch: one teacher-forced pass per model,
    log-softmax in fp32 over the non-pad positions only (padding never reaches the output
    projection), averaged over the models."""
    first = models[0]
    pad_src, pad_trg = first.src_pad_idx, first.trg_pad_idx
    src = pad_batch(sources, pad_src).to(device)  # (B, S), sources end with EOS
    pieces = [t[:-1] for t in targets]
    trg_in = pad_batch(pieces, pad_trg, bos=BOS_ID).to(device)  # (B, T)
    trg_out = pad_batch(pieces, pad_trg, eos=EOS_ID).to(device)  # (B, T)
    keep = trg_out != pad_trg  # (B, T)
    token_lp = sum(_token_log_probs(m, src, trg_in, trg_out, keep) for m in models) / len(models)
    per_token = torch.zeros(keep.shape, dtype=torch.float32, device=device)  # (B, T)
    per_token[keep] = token_lp
    return per_token.sum(dim=1).tolist()


def _token_log_probs(
    model: Transformer,
    src: torch.Tensor,
    trg_in: torch.Tensor,
    trg_out: torch.Tensor,
    keep: torch.Tensor,
) -> torch.Tensor:
    """One model's log-probability (N,) of each real target token."""
    hidden = model(src, trg_in, features_only=True)  # (B, T, D), after the final norm
    logits = model.out(hidden[keep])  # (N, V), N = real target tokens in the batch
    lprobs = F.log_softmax(logits.float(), dim=-1)  # (N, V) in fp32
    return lprobs.gather(1, trg_out[keep][:, None]).squeeze(1)  # (N,)


def format_scores(scores: Iterable[PairScore | None], *, as_json: bool = False) -> Iterator[str]:
    """Output lines of scores, one per pair.

    Output lines, one per pair: ``logprob<TAB>tokens<TAB>avg`` (4 decimals), or with
    ``as_json`` ``{"logprob": ..., "tokens": ..., "avg": ...}`` at full precision. An empty pair
    gives an empty line, or ``{"logprob": null, "tokens": 0, "avg": null}``."""
    for s in scores:
        if as_json:
            record = (
                {"logprob": None, "tokens": 0, "avg": None}
                if s is None
                else {"logprob": s.logprob, "tokens": s.tokens, "avg": s.avg}
            )
            yield json.dumps(record)
        else:
            yield "" if s is None else f"{s.logprob:.4f}\t{s.tokens}\t{s.avg:.4f}"
