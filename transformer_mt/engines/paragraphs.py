"""Paragraphs translated sentence by sentence, and joined back with their own whitespace.

A model trained on sentences translates a pasted paragraph as if it were one long sentence, and
badly. With ``TranslateExtras.split`` an engine cuts each line into sentences
(:func:`transformer_mt.text.split.split_text`), translates the sentences of all lines in one
call (so they are batched together), and puts each line's translations back between its original
separators: spaces, line breaks and empty lines between sentences come back byte for byte. The
whitespace around the whole line is dropped, as the line contract drops it (a line of spaces
translates to an empty line), except where the caller keeps it (the server's texts).

The language that chooses the splitting rules is ``TranslateExtras.source_lang``; none: the
model's source language; ``"auto"``: each line's own, detected among the model's source
languages (:func:`transformer_mt.text.detect.detect`; the model's first when unsure).

A paragraph's n-best: the k-th alternative joins each sentence's k-th hypothesis (its last where
it has fewer); its score is the mean of those sentences' scores. Per-line extras (target
prefixes, alignments, attention) do not split: their callers translate line by line.
"""

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from transformer_mt.engines.results import LineResult
from transformer_mt.errors import MTError
from transformer_mt.text.split import SplitText, split_text

if TYPE_CHECKING:
    from transformer_mt.config import DecodeConfig
    from transformer_mt.engines.options import TranslateExtras
    from transformer_mt.engines.results import StopCheck


class Translator(Protocol):
    """What splitting needs of an engine (:class:`~transformer_mt.engines.engine.Engine`)."""

    @property
    def pairs(self) -> Sequence[tuple[str, str]]:
        """The (source, target) languages it translates."""
        ...

    @property
    def src_lang(self) -> str:
        """Its (first) source language."""
        ...

    def translate(
        self,
        lines: Sequence[str],
        decode: "DecodeConfig",
        attention: bool = False,
        stop: "StopCheck | None" = None,
        target: str | None = None,
        extras: "TranslateExtras | None" = None,
    ) -> list[LineResult]:
        """One result per line (see :meth:`Engine.translate`)."""
        ...


AUTO = "auto"  # source_lang: detect each line's language among the model's


@dataclass(frozen=True)
class Paragraphs:
    """Lines cut into sentences; :meth:`join` puts their translations back."""

    splits: list[SplitText]

    @property
    def sentences(self) -> list[str]:
        """Every line's sentences, in order."""
        return [sentence for split in self.splits for sentence in split.sentences]

    def join(
        self, results: Sequence[LineResult], nbest: int, outer: bool = False
    ) -> list[LineResult]:
        """One result per line from one result per sentence (in :attr:`sentences`' order).

        ``outer``: keep the whitespace around each line too (the server's texts), not only
        between its sentences (the line contract's lines)."""
        out, start = [], 0
        for split in self.splits:
            mine = results[start : start + len(split.sentences)]
            start += len(split.sentences)
            out.append(_joined(split, mine, nbest, outer))
        return out


def _joined(split: SplitText, results: Sequence[LineResult], nbest: int, outer: bool) -> LineResult:
    """One line's result from its sentences' results (see the module's docstring)."""
    if not results:  # nothing but whitespace
        text = split.join([]) if outer else ""
        return LineResult(text, 0.0, [(text, 0.0)] * nbest)
    inner = split if outer else SplitText(split.sentences, ["", *split.separators[1:-1], ""])
    alternatives = []
    for k in range(nbest):
        picked = [r.nbest[min(k, len(r.nbest) - 1)] for r in results]
        score = sum(s for _, s in picked) / len(picked)
        alternatives.append((inner.join([t for t, _ in picked]), score))
    return LineResult(alternatives[0][0], alternatives[0][1], alternatives)


def split_lines(lines: Sequence[str], languages: Sequence[str]) -> Paragraphs:
    """Each line cut into sentences by the rules of its language (one language per line)."""
    return Paragraphs([split_text(line, lang) for line, lang in zip(lines, languages, strict=True)])


def line_languages(engine: Translator, lines: Sequence[str], source_lang: str | None) -> list[str]:
    """The language of each line, for its splitting rules (see the module's docstring)."""
    sources = list(dict.fromkeys(src for src, _ in engine.pairs if src)) or [engine.src_lang]
    if source_lang != AUTO:
        return [source_lang or sources[0]] * len(lines)
    from transformer_mt.text.detect import detect

    try:
        return [detect(line, sources, sources[0])[0].language for line in lines]
    except MTError:  # no detector installed (the text extra): the model's first language
        return [sources[0]] * len(lines)


def translate_split(
    engine: Translator,
    lines: Sequence[str],
    decode: "DecodeConfig",
    stop: "StopCheck | None",
    target: str | None,
    extras: "TranslateExtras",
) -> list[LineResult]:
    """``engine.translate`` on the sentences of ``lines``, joined back into one result a line."""
    paragraphs = split_lines(lines, line_languages(engine, lines, extras.source_lang))
    each = dataclasses.replace(extras, split=False)
    if all(len(split.sentences) <= 1 for split in paragraphs.splits):
        # A sentence a line (a corpus): the lines as they are, so that each keeps its index
        # (a sampled line's draws depend on it) and nothing changes.
        return engine.translate(lines, decode, stop=stop, target=target, extras=each)
    results = engine.translate(paragraphs.sentences, decode, stop=stop, target=target, extras=each)
    return paragraphs.join(results, decode.nbest)
