"""Our own engine: a checkpoint of `mt train` (or several, an ensemble) and our search.

:class:`TorchEngine` computes exactly what ``mt translate`` computes; ``load_engine("torch", ...)``
(:mod:`transformer_mt.engines.engine`) makes one.
"""

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import torch

from transformer_mt.config import DecodeConfig
from transformer_mt.data.tokenizer import EOS_ID
from transformer_mt.decoding import DecodeResult, Hypothesis, length_penalty
from transformer_mt.decoding.continuous import ContinuousSearch
from transformer_mt.decoding.ensemble import Ensemble
from transformer_mt.decoding.score import PairScore, score_pairs
from transformer_mt.decoding.text import check_beam, encode_sources, untranslatable
from transformer_mt.devices import resolve_device
from transformer_mt.engines.attention import Alignments, attention_matrices
from transformer_mt.engines.base import Engine
from transformer_mt.engines.lines import ensemble_model, translate_lines
from transformer_mt.engines.loading import load_for_inference, validation_report
from transformer_mt.engines.options import ModelOptions, TranslateExtras
from transformer_mt.engines.results import (
    Attention,
    LineResult,
    StopCheck,
    check_stop,
    empty_result,
    to_line_result,
)
from transformer_mt.errors import MTError


class TorchEngine(Engine):
    """Our own model and search: exactly what ``mt translate`` computes.

    ``checkpoint``: one, or several (an ensemble averaging their next-token log-probabilities;
    tokenizers, languages and decode settings from the first)."""

    def __init__(
        self,
        checkpoint: Path | str | Sequence[Path | str],
        device: str = ModelOptions.device,
        quantization: str | None = None,
        precision: str | None = None,
    ) -> None:
        paths = [checkpoint] if isinstance(checkpoint, str | Path) else list(checkpoint)
        every = [load_for_inference(p, device, quantization, precision=precision) for p in paths]
        loaded = every[0]
        self.model = ensemble_model(every, [str(p) for p in paths])
        self.first = loaded.model  # attention and alignments: one model's, not an ensemble's
        self.ensemble = len(every) > 1
        data = loaded.config.data
        super().__init__(
            name="torch",
            src_tok=loaded.src_tok,
            trg_tok=loaded.trg_tok,
            decode=dataclasses.replace(loaded.config.decode, nbest=1, sampling=False),
            model_decode=loaded.config.decode,
            src_lang=data.src_lang,
            trg_lang=data.trg_lang,
            info={
                "device": str(resolve_device(device)),  # "auto" as what it chose
                "precision": loaded.precision,
                "precision_why": loaded.precision_why,
                "model_args": loaded.model_args,
                "step": loaded.step,
                "validation": validation_report(loaded),
            },
            max_src_len=self.first.config.model.max_len,
            pairs=loaded.pairs,
            lang_tags=loaded.lang_tags,
        )

    def continuous_search(self, decode: DecodeConfig) -> ContinuousSearch | None:
        if decode.sampling or self.ensemble:
            return None
        return ContinuousSearch(self.first, decode.beam_size)

    def encode_lines(
        self, lines: Sequence[str], decode: DecodeConfig, target: str | None = None
    ) -> dict[int, list[int]]:
        """Source ids (EOS included) of the lines with something to translate, by line index.

        As :meth:`translate` encodes them; checks ``decode``'s beam against the vocabulary."""
        check_beam(decode, self.trg_tok.vocab_size)
        prefix = self.source_prefix(target)
        lines = list(lines)
        kept = untranslatable(lines)
        todo = ["" if i in kept else line for i, line in enumerate(lines)]
        return encode_sources(self.src_tok, todo, self.first.config.model.max_len, 1, prefix)

    def line_result(self, result: DecodeResult, decode: DecodeConfig) -> LineResult:
        """A search result of ``decode``'s search as :meth:`translate` returns it (no attention)."""
        out = to_line_result([(self.trg_tok.decode(h.tokens), h.score) for h in result.nbest], None)
        out.logprobs = [_logprob(h, decode.len_penalty) for h in result.nbest]
        return out

    def _translate(
        self,
        lines: Sequence[str],
        decode: DecodeConfig,
        attention: bool,
        stop: StopCheck | None,
        target: str | None,
        extras: TranslateExtras,
    ) -> list[LineResult]:
        """Our search over ``lines`` (:func:`~transformer_mt.engines.lines.translate_lines`).

        It keeps the lines with nothing to translate as they are, and keeps, per decoded batch,
        the log-probabilities, the word alignments and the attention asked for."""
        self._check_extras(extras, attention)
        lines = list(lines)
        prefix = self.source_prefix(target)
        aligner = self._aligner(extras, len(prefix))
        matrices: dict[int, Attention] = {}
        logprobs: dict[int, list[tuple[float, int]]] = {}
        done: set[int] = set()

        def on_batch(
            batch_lines: list[int], src: torch.Tensor, decoded: list[DecodeResult]
        ) -> None:
            if aligner is not None:
                aligner(batch_lines, src, decoded)
            done.update(batch_lines)
            for i, result in zip(batch_lines, decoded, strict=True):
                logprobs[i] = [_logprob(h, decode.len_penalty) for h in result.nbest]
            if attention:
                self._keep_attention(matrices, batch_lines, src, decoded, len(prefix))
            check_stop(stop, lines, done)  # raised through the search: no further batch

        results = translate_lines(
            self.model,
            self.src_tok,
            self.trg_tok,
            lines,
            decode,
            progress=extras.progress,
            attention_dir=extras.attention_dir,
            attention_layer=extras.attention_layer,
            prefixes=extras.prefixes,
            first_line=extras.first_line,
            src_prefix=prefix,
            on_batch=on_batch,
            constraints=extras.line_terms(lines),
        )
        aligned = None if aligner is None else aligner.per_line(len(lines), decode.nbest)
        out = []
        for i, nbest in enumerate(results):
            if attention and i not in matrices:  # nothing to translate on this line
                out.append(empty_result(decode.nbest, attention, lines[i]))
            else:
                out.append(to_line_result(nbest, matrices.get(i)))
            if aligned is not None:
                out[-1].alignments = aligned[i]
            out[-1].logprobs = logprobs.get(i)
        return out

    def _aligner(self, extras: TranslateExtras, prefix: int) -> Alignments | None:
        """What collects the word alignments of each decoded batch, where ``extras`` asks.

        One model's (not an ensemble's), leaving out the ``prefix`` source pieces before the
        text (a language tag)."""
        if not extras.alignments:
            return None
        if self.ensemble:
            raise MTError("alignments need one checkpoint, not an ensemble")
        units = extras.alignment_units
        return Alignments(
            self.first, self.src_tok, self.trg_tok, extras.alignment_layer, units, skip=prefix
        )

    def _check_extras(self, extras: TranslateExtras, attention: bool) -> None:
        """One-line MTErrors for what this engine cannot give.

        A decoder layer it lacks, or one model's attention from an ensemble."""
        n_layers = self.first.n_dec_layers
        for option, layer in (
            ("--attention-layer", extras.attention_layer),
            ("--alignment-layer", extras.alignment_layer),
        ):
            if layer is not None and not -n_layers <= layer < n_layers:
                raise MTError(
                    f"{option} {layer}: the model's decoder layers are 0 to "
                    f"{n_layers - 1} (negative counts from the end); leave it out for their mean"
                )
        if attention and self.ensemble:
            raise MTError("attention needs one checkpoint, not an ensemble")

    def score(
        self,
        sources: Sequence[str],
        targets: Sequence[str],
        batch_tokens: int,
        progress: bool = False,
        target: str | None = None,
    ) -> list[PairScore | None]:
        """Forced decoding with our model; an ensemble scores with its models' mean."""
        models = self.model.models if isinstance(self.model, Ensemble) else [self.model]
        return score_pairs(
            models,
            self.src_tok,
            self.trg_tok,
            list(sources),
            list(targets),
            batch_tokens=batch_tokens,
            progress=progress,
            src_prefix=self.source_prefix(target),
        )

    def _keep_attention(
        self,
        matrices: dict[int, Attention],
        batch_lines: list[int],
        src: torch.Tensor,
        decoded: list[DecodeResult],
        prefix: int,
    ) -> None:
        """Put the cross-attention of each best hypothesis of a decoded batch in ``matrices``."""
        hyps = [res.nbest[0] for res in decoded]
        weights = attention_matrices(self.first, src, hyps)
        for line, hyp, ids, w in zip(batch_lines, hyps, src.tolist(), weights, strict=True):
            matrices[line] = Attention(
                source=self.src_tok.id_to_piece(ids[: w.shape[1]]),
                target=self.trg_tok.id_to_piece([*hyp.tokens, EOS_ID][: w.shape[0]]),
                weights=w.tolist(),
                prefix=prefix,
            )


def _logprob(hypothesis: Hypothesis, alpha: float) -> tuple[float, int]:
    """A hypothesis' log-probability and the pieces it sums over (EOS where it ended).

    Its score is that log-probability over GNMT's length penalty of those pieces."""
    pieces = len(hypothesis.tokens) + int(hypothesis.finished)
    return hypothesis.score * length_penalty(pieces, alpha), pieces
