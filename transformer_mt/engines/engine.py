"""Engines: one interface over the ways a trained model can translate.

Our PyTorch model (one checkpoint or an ensemble), or a CTranslate2 export. Every front door
translates through it: `mt translate`, `mt evaluate`, documents and the server, and a Python user
with two calls::

    engine = load_engine("torch", "runs/toy/best.pt")
    results = engine.translate(["a line", "another"], engine.run_decode)

``engine.translate(lines, decode, attention)`` keeps the line contract of ``mt translate`` (one
result per line, in order, empty in -> empty out, a line with nothing to translate -- emoji,
numbers, a link alone -- out unchanged without decoding) and returns, per line, the best text and
score, the n-best list and, when asked, the cross-attention matrix with the pieces on both of its
axes. Given ``stop`` (a function of no arguments), it asks it after each decode batch and, when it
says True with lines still to decode, gives up with :class:`DecodeStopped`: the server's way of not
decoding the rest of a request whose client has gone.
"""

import dataclasses
import math
from abc import ABC, abstractmethod
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from transformer_mt.checkpoint import check_checkpoint_path
from transformer_mt.config import DecodeConfig
from transformer_mt.data.batching import longest_first_batches
from transformer_mt.data.languages import source_prefix
from transformer_mt.data.tokenizer import EOS_ID, Tokenizer
from transformer_mt.decoding import DecodeResult
from transformer_mt.decoding.continuous import ContinuousSearch
from transformer_mt.decoding.ensemble import Ensemble
from transformer_mt.decoding.score import PairScore, score_pairs
from transformer_mt.decoding.text import (
    check_beam,
    encode_sources,
    untranslatable,
)
from transformer_mt.engines.alignment import Alignment
from transformer_mt.engines.attention import attention_matrices
from transformer_mt.engines.lines import ensemble_model, translate_lines
from transformer_mt.engines.loading import load_for_inference, validation_report
from transformer_mt.engines.options import TranslateExtras
from transformer_mt.engines.paragraphs import translate_split
from transformer_mt.engines.results import (
    Attention,
    LineResult,
    StopCheck,
    check_stop,
    empty_result,
    to_line_result,
)
from transformer_mt.errors import MTError

EOS_PIECE = "</s>"


@dataclass
class Engine(ABC):
    """What the server needs of a model.

    Its languages, tokenizers, decode defaults, a description, and ``translate`` (each engine's own:
    :class:`TorchEngine`, :class:`CT2Engine`)."""

    name: str  # "torch" or "ct2"
    src_tok: Tokenizer
    trg_tok: Tokenizer
    decode: DecodeConfig  # the model's decode defaults (beam, length penalty, batch tokens)
    src_lang: str
    trg_lang: str
    info: dict[str, Any] = field(default_factory=dict)  # GET /v1/model, besides the above
    max_src_len: int = 0  # longest source in pieces, EOS included (the position table); 0: any
    pairs: list[tuple[str, str]] = field(default_factory=list)  # the pairs it translates
    lang_tags: dict[str, str] = field(default_factory=dict)  # a multilingual model's tags
    model_decode: DecodeConfig | None = None  # the run's own, where they differ from decode

    def __post_init__(self) -> None:
        if not self.pairs:  # a model that lists no pairs translates its one pair
            self.pairs = [(self.src_lang, self.trg_lang)]

    @property
    def run_decode(self) -> DecodeConfig:
        """The run's own decode settings: `mt translate`'s defaults.

        ``decode`` is the server's: the same with one best and no sampling."""
        return self.model_decode or self.decode

    @property
    def targets(self) -> list[str]:
        """The languages it translates into (several: a request names one)."""
        return list(dict.fromkeys(trg for _, trg in self.pairs))

    def source_prefix(self, target: str | None, name: str = "--target-lang") -> list[int]:
        """The ids that start each source asking for ``target`` (a multilingual model's tag).

        An MTError, calling the target ``name``, for a target it does not know, or for none
        where it has several.
        """
        return source_prefix(self.src_tok, self.lang_tags, self.pairs, target, name)

    @abstractmethod
    def translate(
        self,
        lines: Sequence[str],
        decode: DecodeConfig,
        attention: bool = False,
        stop: StopCheck | None = None,
        target: str | None = None,
        extras: "TranslateExtras | None" = None,
    ) -> list[LineResult]:
        """One result per line, in order (empty in, empty out).

        With ``attention``, the best hypothesis' cross-attention over its source pieces. ``stop`` is
        asked after each decode batch; when it says True and lines are left, :class:`DecodeStopped`
        names them. ``target``: the language a multilingual model translates into. ``extras``:
        what `mt translate` may ask besides (:class:`TranslateExtras`); an engine that cannot
        give one says so in a one-line MTError."""

    def score(
        self,
        sources: Sequence[str],
        targets: Sequence[str],
        batch_tokens: int,
        progress: bool = False,
        target: str | None = None,
    ) -> list[PairScore | None]:
        """Forced decoding: each target's log-probability given its source (`mt score`).

        None for a pair with an empty side. Our torch engine computes it; others say they
        cannot."""
        raise MTError(f"forced decoding (mt score) needs --engine torch, not {self.name}")

    def continuous_search(self, decode: DecodeConfig) -> ContinuousSearch | None:
        """A search that requests with ``decode``'s beam can join between steps.

        Continuous batching, see :mod:`~transformer_mt.serve.batcher`); None where this engine
        has none (then requests decode in batches through :meth:`translate`)."""
        return None

    def too_long(self, lines: Sequence[str]) -> tuple[int, int] | None:
        """The first line longer than the model takes, and its pieces (EOS included), or None.

        ``mt translate`` cuts such a line with a warning; a server refuses it instead."""
        if not self.max_src_len:
            return None
        texts = [line.strip() for line in lines]
        for i, ids in enumerate(self.src_tok.encode_batch(texts)):
            if len(ids) + 1 > self.max_src_len:
                return i, len(ids) + 1
        return None

    def count_tokens(self, lines: Sequence[str]) -> int:
        """Source pieces of ``lines`` (EOS included): what a batch's token budget counts."""
        texts = [line.strip() for line in lines]
        return sum(len(ids) + 1 for ids in self.src_tok.encode_batch(texts) if ids)

    def describe(self) -> dict[str, Any]:
        """The body of GET /v1/model."""
        return {
            "engine": self.name,
            "languages": {"source": self.src_lang, "target": self.trg_lang},
            "pairs": [list(pair) for pair in self.pairs],
            "lang_tags": self.lang_tags,
            "vocabulary": {
                "source": self.src_tok.vocab_size,
                "target": self.trg_tok.vocab_size,
                "joint": self.src_tok is self.trg_tok,
            },
            "decode": {
                "beam_size": self.decode.beam_size,
                "nbest": self.decode.nbest,
                "len_penalty": self.decode.len_penalty,
                "max_len_a": self.decode.max_len_a,
                "max_len_b": self.decode.max_len_b,
                "batch_tokens": self.decode.batch_tokens,
            },
            **self.info,
        }


class TorchEngine(Engine):
    """Our own model and search: exactly what ``mt translate`` computes.

    ``checkpoint``: one, or several (an ensemble averaging their next-token log-probabilities;
    tokenizers, languages and decode settings from the first)."""

    def __init__(
        self,
        checkpoint: Path | str | Sequence[Path | str],
        device: str = "cpu",
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
                "device": str(torch.device(device)),
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

    def line_result(self, result: DecodeResult) -> LineResult:
        """A search result as :meth:`translate` returns it (no attention)."""
        return to_line_result(
            [(self.trg_tok.decode(h.tokens), h.score) for h in result.nbest], None
        )

    def translate(
        self,
        lines: Sequence[str],
        decode: DecodeConfig,
        attention: bool = False,
        stop: StopCheck | None = None,
        target: str | None = None,
        extras: TranslateExtras | None = None,
    ) -> list[LineResult]:
        extras = extras or TranslateExtras()
        if extras.splits(attention):
            return translate_split(self, lines, decode, stop, target, extras)
        self._check_extras(extras, attention)
        lines = list(lines)
        prefix = self.source_prefix(target)
        matrices: dict[int, Attention] = {}
        done: set[int] = set()

        def on_batch(
            batch_lines: list[int], src: torch.Tensor, decoded: list[DecodeResult]
        ) -> None:
            done.update(batch_lines)
            if attention:
                self._keep_attention(matrices, batch_lines, src, decoded, len(prefix))
            check_stop(stop, lines, done)  # raised through the search: no further batch

        aligned: list[list[Alignment]] | None = [] if extras.alignments else None
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
            alignments=aligned,
            alignment_layer=extras.alignment_layer,
            alignment_units=extras.alignment_units,
            first_line=extras.first_line,
            src_prefix=prefix,
            on_batch=on_batch,
            constraints=extras.line_terms(lines),
        )
        out = []
        for i, nbest in enumerate(results):
            if attention and i not in matrices:  # nothing to translate on this line
                out.append(empty_result(decode.nbest, attention, lines[i]))
            else:
                out.append(to_line_result(nbest, matrices.get(i)))
            if aligned is not None:
                out[-1].alignments = aligned[i]
        return out

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


class CT2Engine(Engine):
    """A directory written by ``mt export --format ctranslate2``.

    It computes what ``mt translate --engine ct2`` computes. Its attention is CTranslate2's
    alignment attention (the last decoder layer, the heads the export chose: the first one by
    default), not our mean over layers and heads; its matrices leave out the source's EOS column
    (rows sum to a little under 1) and the EOS row."""

    def __init__(self, directory: Path | str, device: str = "cpu", threads: int = 0) -> None:
        from transformer_mt.engines.ct2 import load_ct2, read_settings

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

    def translate(
        self,
        lines: Sequence[str],
        decode: DecodeConfig,
        attention: bool = False,
        stop: StopCheck | None = None,
        target: str | None = None,
        extras: TranslateExtras | None = None,
    ) -> list[LineResult]:
        from transformer_mt.engines.ct2 import translate_lines_ct2

        extras = extras or TranslateExtras()
        extras.check_engine(self.name)
        if extras.splits(attention):
            return translate_split(self, lines, decode, stop, target, extras)
        prefix = self.source_prefix(target)
        kept = untranslatable(lines)  # CTranslate2 would decode them: they go to it blank
        todo = ["" if i in kept else line for i, line in enumerate(lines)]
        if attention:
            out = self._translate_with_attention(todo, decode, stop, prefix)
        elif stop is None:
            results = translate_lines_ct2(self.model, todo, decode, extras.first_line, prefix)
            out = [to_line_result(nbest, None) for nbest in results]
        else:
            out = self._translate_batch_by_batch(todo, decode, stop, prefix)
        for i in kept:
            out[i] = empty_result(decode.nbest, attention, lines[i])
        return out

    def _translate_batch_by_batch(
        self, lines: list[str], decode: DecodeConfig, stop: StopCheck, prefix: list[int]
    ) -> list[LineResult]:
        """Run ``translate_lines_ct2`` one of its batches at a time.

        The same batches (longest first within ``decode.batch_tokens``; a batch alone is cut as
        one), asking ``stop`` after each."""
        from transformer_mt.engines.ct2 import translate_lines_ct2

        sources = encode_sources(self.src_tok, lines, self.model.max_len, 1, prefix)
        line_of = list(sources)
        out = [empty_result(decode.nbest, False) for _ in lines]
        done: set[int] = set()
        lengths = [len(ids) for ids in sources.values()]
        for batch in longest_first_batches(lengths, decode.batch_tokens):
            indices = [line_of[p] for p in batch.tolist()]
            batch_lines = [lines[i] for i in indices]
            results = translate_lines_ct2(self.model, batch_lines, decode, 1, prefix)
            for i, nbest in zip(indices, results, strict=True):
                out[i] = to_line_result(nbest, None)
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
        """Run ``translate_lines_ct2`` with ``return_attention``.

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
            done.update(indices)
            check_stop(stop, lines, done)
        return out


def load_engine(
    kind: str,
    path: Path | str | Sequence[Path | str],
    device: str = "cpu",
    quantize: str | None = None,
    precision: str | None = None,
) -> Engine:
    """Load the engine ``kind`` from ``path``.

    ``kind`` "torch" (``path``: a checkpoint, or several: an ensemble) or "ct2" (``path``: an
    exported directory); ``quantize`` ("int8", torch only): dynamic int8 linear layers;
    ``precision`` (torch only; None: the checkpoint's decode.precision): see
    :func:`load_for_inference`."""
    paths = [path] if isinstance(path, str | Path) else list(path)
    if not paths:
        raise MTError("no model given: name a checkpoint (or an export directory) to load")
    if kind == "ct2" and len(paths) > 1:
        raise MTError("several --checkpoint needs --engine torch (checkpoints, not an export)")
    for each in paths:
        check_engine(kind, each, quantize, precision)
    if kind == "torch":
        return TorchEngine(paths, device, quantize, precision)
    return CT2Engine(paths[0], device)


def check_engine(
    kind: str, path: Path | str, quantize: str | None = None, precision: str | None = None
) -> None:
    """The checks of :func:`load_engine` that load nothing.

    The engine's name, a file or a directory for it, quantization and precision: an MTError
    naming the option at fault."""
    for option, value in (("--quantize", quantize), ("--precision", precision)):
        if value is not None and kind != "torch":
            raise MTError(
                f"{option} is for --engine torch; CTranslate2 models are quantized by "
                "`mt export --quantization`"
            )
    if kind == "torch":
        check_checkpoint_path(path)
    elif kind == "ct2":
        from transformer_mt.engines.ct2 import check_export_directory

        check_export_directory(Path(path))
    else:
        raise MTError(f"--engine {kind!r}: expected torch or ct2")
