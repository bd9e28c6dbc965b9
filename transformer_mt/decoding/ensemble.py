"""Decode with several models at once: at every step, the mean of their next-token log-probs.

An :class:`Ensemble` stands where search takes one Transformer (``greedy_search``,
``beam_search``, ``sample``, ``decode_sources``, ``translate_texts``): each model keeps its own
encoder output and KV cache (one :class:`~transformer_mt.decoding.state.ModelState` each), and
every row move of the search (finished sentences leaving, beams reordering) is applied to all of
them. The combined score of a token is the arithmetic mean of the models' log-softmax outputs
(OpenNMT-py's default and Marian's, with equal weights; fairseq instead averages probabilities).
Hypothesis scores are sums of these means, so an ensemble of one model, or of a model with
itself, scores exactly as that model does.

All models read the same source ids and write the same target ids: they must share both
sentencepiece models (:func:`check_ensemble` says which checkpoints differ).
"""

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from transformer_mt.data.tokenizer import Tokenizer
from transformer_mt.decoding.state import ModelState
from transformer_mt.errors import MTError
from transformer_mt.model import Transformer


@dataclass(frozen=True)
class PositionLimit:
    """Stands for a Transformer's ``positions`` where only its size is read: ``max_len``."""

    max_len: int


class Ensemble:
    """Several Transformers decoding together, as one model.

    Several Transformers decoding together; offers what search reads of a Transformer:
    ``src_pad_idx``, ``trg_pad_idx``, ``trg_sos_idx``, ``positions.max_len`` (the smallest position
    table: every model must be able to place every position), ``training``, ``parameters()``
    (for the device) and :meth:`start` (the decoder state of a source batch).

    The models must agree on special ids and target vocabulary size (``ValueError`` otherwise);
    that they share the tokenizers is :func:`check_ensemble`'s job, which names the checkpoints.
    """

    def __init__(self, models: Sequence[Transformer]) -> None:
        if not models:
            raise ValueError("an ensemble needs at least one model")
        first = models[0]
        for i, model in enumerate(models[1:], start=1):
            if _signature(model) != _signature(first):
                raise ValueError(
                    f"ensemble model {i} has (src pad, trg pad, BOS, target vocabulary) = "
                    f"{_signature(model)}, model 0 has {_signature(first)}"
                )
        self.models = list(models)
        self.src_pad_idx = first.src_pad_idx
        self.trg_pad_idx = first.trg_pad_idx
        self.trg_sos_idx = first.trg_sos_idx
        self.positions = PositionLimit(min(m.positions.max_len for m in models))

    def __len__(self) -> int:
        return len(self.models)

    @property
    def training(self) -> bool:
        """True while any model is in training mode (search refuses it: dropout)."""
        return any(m.training for m in self.models)

    def eval(self) -> "Ensemble":
        """Every model in eval mode; returns the ensemble."""
        for model in self.models:
            model.eval()
        return self

    def parameters(self) -> Iterator[torch.nn.Parameter]:
        """The parameters of every model, the first model's first (its device is the batch's)."""
        for model in self.models:
            yield from model.parameters()

    def start(self, src: torch.Tensor, use_cache: bool) -> "EnsembleState":
        """Encode the source batch (B, S) with every model; one row per sentence."""
        return EnsembleState([ModelState.start(m, src, use_cache) for m in self.models])


class EnsembleState:
    """One :class:`ModelState` per model, moved together; log-probs are their mean."""

    def __init__(self, members: list[ModelState]) -> None:
        self.members = members

    def log_probs(self, tokens: torch.Tensor) -> torch.Tensor:
        """The mean over the models of their next-token log-probs.

        Mean over the models of their next-token log-probs (R, V) after ``tokens`` (R, t);
        -inf where any model has -inf (PAD and BOS)."""
        total = self.members[0].log_probs(tokens)  # (R, V), a fresh tensor: summed in place
        for member in self.members[1:]:
            total += member.log_probs(tokens)
        return total.div_(len(self.members))

    def repeat_beams(self, k: int) -> None:
        """K copies of each row in every model's state."""
        for member in self.members:
            member.repeat_beams(k)

    def select(self, index: torch.Tensor) -> None:
        """Keep or reorder rows ``index`` (R',) in every model's state."""
        for member in self.members:
            member.select(index)

    def reorder_beams(self, index: torch.Tensor) -> None:
        """Reorder beams ``index`` (R,) within their sentences in every model's state."""
        for member in self.members:
            member.reorder_beams(index)


# What search may take as "the model": one Transformer or an ensemble of them.
SearchModel = Transformer | Ensemble


def _signature(model: Transformer) -> tuple[int, int, int, int]:
    """Special ids and target vocabulary size: what must agree for log-probs to be averaged."""
    vocab = model.trg_emb.num_embeddings
    return (model.src_pad_idx, model.trg_pad_idx, model.trg_sos_idx, vocab)


def check_ensemble(
    names: Sequence[str],
    models: Sequence[Transformer],
    src_toks: Sequence[Tokenizer],
    trg_toks: Sequence[Tokenizer],
) -> None:
    """Check that the models can decode together as one ensemble.

    Raise a one-line :class:`MTError` unless the models can decode as one ensemble: the same
    source sentencepiece model (one encoding of the input feeds them all), the same target one
    (their log-probs are averaged id by id), the same special ids and output vocabulary size.
    ``names`` (e.g. checkpoint paths) name the models in the message; each model is compared with
    the first."""
    if not len(names) == len(models) == len(src_toks) == len(trg_toks):
        raise ValueError("check_ensemble: one name, model and tokenizer pair per model")
    advice = "an ensemble needs models trained with the same tokenizers (one run, or one data set)"
    for i in range(1, len(models)):
        pair = f"{names[0]} and {names[i]}"
        for side, toks in (("target", trg_toks), ("source", src_toks)):
            if toks[i].model_proto != toks[0].model_proto:
                sizes = f"{toks[0].vocab_size} vs {toks[i].vocab_size} pieces"
                raise MTError(
                    f"{pair} have different {side} sentencepiece models ({sizes}); {advice}"
                )
        if _signature(models[i]) != _signature(models[0]):
            raise MTError(
                f"{pair} have different output vocabularies or special ids (target vocabulary "
                f"{_signature(models[0])[3]} vs {_signature(models[i])[3]}); {advice}"
            )
