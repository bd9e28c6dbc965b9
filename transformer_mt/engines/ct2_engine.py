"""The CTranslate2 engine: a directory written by ``mt export --format ctranslate2``.

:class:`CT2Engine` runs the export through :mod:`transformer_mt.engines.ct2` (which loads the
ctranslate2 package only when a model loads); ``load_engine("ct2", ...)``
(:mod:`transformer_mt.engines.engine`) makes one.
"""

import dataclasses
import math
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from transformer_mt.config import DecodeConfig
from transformer_mt.data.batching import longest_first_batches
from transformer_mt.decoding.text import Translation, encode_sources, untranslatable
from transformer_mt.engines.base import Engine
from transformer_mt.engines.ct2 import (
    LogProbs,
    hypothesis_logprob,
    load_ct2,
    read_settings,
    translate_lines_ct2_logprobs,
)
from transformer_mt.engines.options import TranslateExtras
from transformer_mt.engines.results import (
    Attention,
    LineResult,
    StopCheck,
    check_stop,
    empty_result,
    to_line_result,
)

EOS_PIECE = "</s>"


class CT2Engine(Engine):
    """A directory written by ``mt export --format ctranslate2``.

    It computes what ``mt translate --engine ct2`` computes. Its attention is CTranslate2's
    alignment attention (the last decoder layer, the heads the export chose: the first one by
    default), not our mean over layers and heads; its matrices leave out the source's EOS column
    (rows sum to a little under 1) and the EOS row. Its ``LineResult.logprobs`` come from
    CTranslate2's scores (:func:`~transformer_mt.engines.ct2.hypothesis_logprob`): what our torch
    engine gives for the same output, to float precision."""

    def __init__(self, directory: Path | str, device: str = "cpu", threads: int = 0) -> None:
        self.model = load_ct2(Path(directory), device=device, threads=threads)
        settings = read_settings(Path(directory))  # a JSON object: load_ct2 checked the rest
        step = settings.get("step")
        super().__init__(
            name="ct2",
            src_tok=self.model.src_tok,
            trg_tok=self.model.trg_tok,
            decode=dataclasses.replace(self.model.decode, nbest=1, sampling=False),
            model_decode=self.model.decode,
            src_lang=str(settings.get("src_lang", "")),
            trg_lang=str(settings.get("trg_lang", "")),
            info={
                "device": device,
                "quantization": settings.get("quantization"),
                "model_args": settings.get("model_args"),
                "step": step if isinstance(step, int) and not isinstance(step, bool) else 0,
                "validation": settings.get("validation"),
            },
            max_src_len=self.model.max_len,
            pairs=self.model.pairs,
            lang_tags=self.model.lang_tags,
        )

    def _translate(
        self,
        lines: Sequence[str],
        decode: DecodeConfig,
        attention: bool,
        stop: StopCheck | None,
        target: str | None,
        extras: TranslateExtras,
    ) -> list[LineResult]:
        """CTranslate2 over ``lines``: in one call, batch by batch (a ``stop``), or with attention.

        The lines with nothing to translate go to it blank and come back as they were."""
        prefix = self.source_prefix(target)
        kept = untranslatable(lines)  # CTranslate2 would decode them: they go to it blank
        todo = ["" if i in kept else line for i, line in enumerate(lines)]
        if attention:
            out = self._translate_with_attention(todo, decode, stop, prefix)
        elif stop is None:
            results = translate_lines_ct2_logprobs(
                self.model, todo, decode, extras.first_line, prefix
            )
            out = [_line_result(nbest, logprobs) for nbest, logprobs in results]
        else:
            out = self._translate_batch_by_batch(todo, decode, stop, prefix)
        for i in kept:
            out[i] = empty_result(decode.nbest, attention, lines[i])
        return out

    def _translate_batch_by_batch(
        self, lines: list[str], decode: DecodeConfig, stop: StopCheck, prefix: list[int]
    ) -> list[LineResult]:
        """Run ``translate_lines_ct2_logprobs`` one of its batches at a time.

        The same batches (longest first within ``decode.batch_tokens``; a batch alone is cut as
        one), asking ``stop`` after each."""
        sources = encode_sources(self.src_tok, lines, self.model.max_len, 1, prefix)
        line_of = list(sources)
        out = [empty_result(decode.nbest, False) for _ in lines]
        done: set[int] = set()
        lengths = [len(ids) for ids in sources.values()]
        for batch in longest_first_batches(lengths, decode.batch_tokens):
            indices = [line_of[p] for p in batch.tolist()]
            batch_lines = [lines[i] for i in indices]
            results = translate_lines_ct2_logprobs(self.model, batch_lines, decode, 1, prefix)
            for i, (nbest, logprobs) in zip(indices, results, strict=True):
                out[i] = _line_result(nbest, logprobs)
            done.update(indices)
            check_stop(stop, lines, done)
        return out

    def _translate_with_attention(
        self,
        lines: list[str],
        decode: DecodeConfig,
        stop: StopCheck | None = None,
        prefix: Sequence[int] = (),
    ) -> list[LineResult]:
        """Run CTranslate2 with ``return_attention``.

        The same grouping by length budget (``stop`` asked after each group)."""
        model = self.model
        sources = encode_sources(model.src_tok, lines, model.max_len, 1, prefix)
        out = [empty_result(decode.nbest, True) for _ in lines]
        done: set[int] = set()
        by_budget: dict[int, list[int]] = defaultdict(list)
        for i, ids in sources.items():
            budget = math.floor(decode.max_len_a + decode.max_len_b * len(ids))
            by_budget[min(max(budget, 1), model.max_len)].append(i)
        for budget, indices in sorted(by_budget.items()):
            pieces = [model.src_tok.id_to_piece(sources[i][:-1]) for i in indices]
            outputs = model.translator.translate_batch(
                pieces,
                beam_size=decode.beam_size,
                num_hypotheses=decode.nbest,
                length_penalty=decode.len_penalty,
                max_decoding_length=budget,
                min_decoding_length=0,  # EOS may come first, as in our search (its default is 1)
                suppress_sequences=model.never_emit(),
                max_batch_size=decode.batch_tokens,
                batch_type="tokens",
                return_scores=True,
                return_attention=True,
            )
            for i, src_pieces, output in zip(indices, pieces, outputs, strict=True):
                nbest = [
                    (model.trg_tok.decode_pieces(hyp), float(score))
                    for hyp, score in zip(output.hypotheses, output.scores, strict=True)
                ]
                weights = [list(map(float, row)) for row in output.attention[0]]
                width = len(weights[0]) if weights else 0
                attn = Attention(
                    source=[*src_pieces, EOS_PIECE][:width],
                    target=[*output.hypotheses[0], EOS_PIECE][: len(weights)],
                    weights=weights,
                    prefix=len(prefix),
                )
                out[i] = to_line_result(nbest, attn)
                out[i].logprobs = [
                    hypothesis_logprob(score, hyp, budget, decode.len_penalty)
                    for hyp, score in zip(output.hypotheses, output.scores, strict=True)
                ]
            done.update(indices)
            check_stop(stop, lines, done)
        return out


def _line_result(nbest: Translation, logprobs: LogProbs | None) -> LineResult:
    """A line's n-best (no attention) with its log-probabilities (None: a line not decoded)."""
    out = to_line_result(nbest, None)
    out.logprobs = logprobs
    return out
