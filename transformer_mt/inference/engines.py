"""Engines: one interface over the ways a trained model can translate.

Our PyTorch model, or a CTranslate2 export, for the HTTP server and its benchmark.

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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from transformer_mt.config import DecodeConfig
from transformer_mt.data.batching import longest_first_batches
from transformer_mt.data.languages import source_prefix
from transformer_mt.data.tokenizer import EOS_ID, Tokenizer
from transformer_mt.decoding import DecodeResult
from transformer_mt.decoding.continuous import ContinuousSearch
from transformer_mt.decoding.text import (
    check_beam,
    encode_sources,
    has_text,
    translate_texts,
    untranslatable,
)
from transformer_mt.errors import MTError
from transformer_mt.inference.attention import attention_matrices
from transformer_mt.inference.loading import load_for_inference, validation_report

EOS_PIECE = "</s>"

StopCheck = Callable[[], bool]
"""Asked between decode batches: True to decode no further (see :class:`DecodeStopped`)."""


class DecodeStopped(Exception):
    """``translate`` gave up between two decode batches because its ``stop`` check said so."""

    def __init__(self, left: list[int], lines: int) -> None:
        super().__init__(f"stopped with {len(left)} of {lines} lines left undecoded")
        self.left = left  # indices of the input lines not decoded (lines with text in them)


def _check_stop(stop: StopCheck | None, lines: Sequence[str], done: set[int]) -> None:
    """Raise :class:`DecodeStopped` if ``stop`` says so and a line with text is not in ``done``."""
    if stop is None or not stop():
        return
    left = [i for i, line in enumerate(lines) if has_text(line) and i not in done]
    if left:  # after the last batch there is nothing left to spare
        raise DecodeStopped(left, len(lines))


@dataclass
class Attention:
    """Cross-attention of one translation.

    ``weights[t][s]`` is how much target piece t looked at source piece s (rows sum to 1)."""

    source: list[str]  # source pieces, EOS included
    target: list[str]  # target pieces, EOS included when the hypothesis ended with it
    weights: list[list[float]]  # (len(target), len(source))
    prefix: int = 0  # source pieces before the text (a multilingual model's target-language tag)


@dataclass
class LineResult:
    """One input line, translated."""

    text: str  # the best translation ("" for an empty line)
    score: float  # its score (length-normalized log-probability)
    nbest: list[tuple[str, float]]  # ``decode.nbest`` (text, score) pairs, best first
    attention: Attention | None = None  # of the best hypothesis, only when asked


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

    def __post_init__(self) -> None:
        if not self.pairs:  # a model that lists no pairs translates its one pair
            self.pairs = [(self.src_lang, self.trg_lang)]

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
    ) -> list[LineResult]:
        """One result per line, in order (empty in, empty out).

        With ``attention``, the best hypothesis' cross-attention over its source pieces. ``stop`` is
        asked after each decode batch; when it says True and lines are left, :class:`DecodeStopped`
        names them. ``target``: the language a multilingual model translates into."""

    def continuous_search(self, decode: DecodeConfig) -> ContinuousSearch | None:
        """A search that requests with ``decode``'s beam can join between steps.

        Continuous batching, see :mod:`~transformer_mt.inference.batcher`); None where this engine
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


def empty_result(nbest: int, attention: bool, line: str = "") -> LineResult:
    """The result of a line that is not decoded.

    "" for an empty line, the line itself (without surrounding whitespace) for one with nothing to
    translate; score 0.0, empty attention."""
    text = "" if has_text(line) else line.strip()
    return LineResult(
        text, 0.0, [(text, 0.0)] * nbest, Attention([], [], []) if attention else None
    )


def _result(nbest: list[tuple[str, float]], attn: Attention | None) -> LineResult:
    return LineResult(nbest[0][0], float(nbest[0][1]), [(t, float(s)) for t, s in nbest], attn)


class TorchEngine(Engine):
    """Our own model and search: exactly what ``mt translate`` computes."""

    def __init__(
        self,
        checkpoint: Path | str,
        device: str = "cpu",
        quantization: str | None = None,
        precision: str | None = None,
    ) -> None:
        loaded = load_for_inference(checkpoint, device, quantization, precision=precision)
        self.model = loaded.model
        data = loaded.config.data
        super().__init__(
            name="torch",
            src_tok=loaded.src_tok,
            trg_tok=loaded.trg_tok,
            decode=dataclasses.replace(loaded.config.decode, nbest=1, sampling=False),
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
            max_src_len=self.model.config.model.max_len,
            pairs=loaded.pairs,
            lang_tags=loaded.lang_tags,
        )

    def continuous_search(self, decode: DecodeConfig) -> ContinuousSearch | None:
        return None if decode.sampling else ContinuousSearch(self.model, decode.beam_size)

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
        return encode_sources(self.src_tok, todo, self.model.config.model.max_len, 1, prefix)

    def line_result(self, result: DecodeResult) -> LineResult:
        """A search result as :meth:`translate` returns it (no attention)."""
        return _result([(self.trg_tok.decode(h.tokens), h.score) for h in result.nbest], None)

    def translate(
        self,
        lines: Sequence[str],
        decode: DecodeConfig,
        attention: bool = False,
        stop: StopCheck | None = None,
        target: str | None = None,
    ) -> list[LineResult]:
        lines = list(lines)
        prefix = self.source_prefix(target)
        matrices: dict[int, Attention] = {}
        done: set[int] = set()

        def on_batch(batch_lines: list[int], src: torch.Tensor, decoded) -> None:
            done.update(batch_lines)
            if attention:
                self._keep_attention(matrices, batch_lines, src, decoded, len(prefix))
            _check_stop(stop, lines, done)  # raised through the search: no further batch

        results = translate_texts(
            self.model,
            self.src_tok,
            self.trg_tok,
            lines,
            decode,
            on_batch=on_batch,
            src_prefix=prefix,
        )
        out = []
        for i, nbest in enumerate(results):
            if attention and i not in matrices:  # nothing to translate on this line
                out.append(empty_result(decode.nbest, attention, lines[i]))
            else:
                out.append(_result(nbest, matrices.get(i)))
        return out

    def _keep_attention(
        self,
        matrices: dict[int, Attention],
        batch_lines: list[int],
        src: torch.Tensor,
        decoded,
        prefix: int,
    ) -> None:
        """Put the cross-attention of each best hypothesis of a decoded batch in ``matrices``."""
        hyps = [res.nbest[0] for res in decoded]
        weights = attention_matrices(self.model, src, hyps)
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
        from transformer_mt.inference.ct2 import load_ct2
        from transformer_mt.inference.export import read_settings

        self.model = load_ct2(Path(directory), device=device, threads=threads)
        settings = read_settings(Path(directory))  # a JSON object: load_ct2 checked the rest
        step = settings.get("step")
        super().__init__(
            name="ct2",
            src_tok=self.model.src_tok,
            trg_tok=self.model.trg_tok,
            decode=dataclasses.replace(self.model.decode, nbest=1, sampling=False),
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
    ) -> list[LineResult]:
        from transformer_mt.inference.ct2 import translate_lines_ct2

        prefix = self.source_prefix(target)
        kept = untranslatable(lines)  # CTranslate2 would decode them: they go to it blank
        todo = ["" if i in kept else line for i, line in enumerate(lines)]
        if attention:
            out = self._translate_with_attention(todo, decode, stop, prefix)
        elif stop is None:
            results = translate_lines_ct2(self.model, todo, decode, 1, prefix)
            out = [_result(nbest, None) for nbest in results]
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
        from transformer_mt.inference.ct2 import translate_lines_ct2

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
                out[i] = _result(nbest, None)
            done.update(indices)
            _check_stop(stop, lines, done)
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
                out[i] = _result(nbest, attn)
            done.update(indices)
            _check_stop(stop, lines, done)
        return out


def load_engine(
    kind: str,
    path: Path | str,
    device: str = "cpu",
    quantize: str | None = None,
    precision: str | None = None,
) -> Engine:
    """Load the engine ``kind`` from ``path``.

    ``kind`` "torch" (``path``: a checkpoint) or "ct2" (``path``: an exported directory);
    ``quantize`` ("int8", torch only): dynamic int8 linear layers; ``precision`` (torch only;
    None: the checkpoint's decode.precision): see :func:`load_for_inference`."""
    check_engine(kind, path, quantize, precision)
    if kind == "torch":
        return TorchEngine(path, device, quantize, precision)
    return CT2Engine(path, device)


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
        if Path(path).is_dir():
            raise MTError(
                f"--checkpoint {path} is a directory: for a CTranslate2 export pass --engine ct2"
            )
    elif kind == "ct2":
        if not Path(path).is_dir():
            raise MTError(
                f"--engine ct2 runs a directory written by `mt export --format ctranslate2`; "
                f"{path} is not a directory"
            )
    else:
        raise MTError(f"--engine {kind!r}: expected torch or ct2")
