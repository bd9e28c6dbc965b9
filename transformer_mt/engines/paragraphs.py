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
it has fewer); its score is the mean of those sentences' scores. A paragraph has as many as its
decoded sentence with the most: fewer than asked where a constrained search kept fewer (only
those that hold every term). Per-line extras (target
prefixes, alignments, pictures, a line's own terms) do not split: their callers translate line by
line.

Attention does split (``translate_split(..., attention=True)``: a document's segments): a line's
cross-attention is its sentences' matrices joined block-diagonally (:func:`join_attention`), as
if the model had read and written the line at once while each sentence looked only at itself.
Its source pieces are the sentences' pieces in order (one target-language tag before them,
one EOS after them, where the sentences had those), its target pieces likewise, and the
whitespace between sentences brings no piece; so a consumer that maps pieces to the line's
whitespace words (:mod:`~transformer_mt.documents.placement`, by the word-start marker "▁")
reads the joined matrix as it reads one sentence's.
"""

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

from transformer_mt.engines.alignment import WORD_START
from transformer_mt.engines.results import Attention, LineResult
from transformer_mt.errors import MTError
from transformer_mt.text.content import has_text
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
EOS_PIECE = "</s>"  # the end-of-sentence piece in an Attention's pieces
# The most cells a joined matrix may have (about 64 MB as the lists of floats an Attention holds):
# a paragraph of some 1,400 pieces a side. A longer one gets no joined attention (its markup is
# then placed in proportion), rather than a matrix quadratic in its length.
MAX_JOINED_CELLS = 1 << 21


@dataclass(frozen=True)
class Paragraphs:
    """Lines cut into sentences; :meth:`join` puts their translations back."""

    splits: list[SplitText]

    @property
    def sentences(self) -> list[str]:
        """Every line's sentences, in order."""
        return [sentence for split in self.splits for sentence in split.sentences]

    def join(
        self,
        results: Sequence[LineResult],
        nbest: int,
        outer: bool = False,
        attention: bool = False,
    ) -> list[LineResult]:
        """One result per line from one result per sentence (in :attr:`sentences`' order).

        ``outer``: keep the whitespace around each line too (the server's texts), not only
        between its sentences (the line contract's lines). ``attention``: each line's
        attention joined from its sentences' (:func:`join_attention`)."""
        out, start = [], 0
        for split in self.splits:
            mine = results[start : start + len(split.sentences)]
            start += len(split.sentences)
            out.append(_joined(split, mine, nbest, outer, attention))
        return out


def _joined(
    split: SplitText, results: Sequence[LineResult], nbest: int, outer: bool, attention: bool
) -> LineResult:
    """One line's result from its sentences' results (see the module's docstring)."""
    if not results:  # nothing but whitespace
        text = split.join([]) if outer else ""
        return LineResult(
            text, 0.0, [(text, 0.0)] * nbest, Attention([], [], []) if attention else None
        )
    inner = split if outer else SplitText(split.sentences, ["", *split.separators[1:-1], ""])
    # As many alternatives as the decoded sentence with the most (a constrained search keeps
    # only the hypotheses that hold every term): no alternative of other sentences' last ones.
    decoded = [len(r.nbest) for r, s in zip(results, split.sentences, strict=True) if has_text(s)]
    count = min(nbest, max(decoded)) if decoded else nbest
    alternatives = []
    for k in range(count):  # the k-th hypothesis of each sentence, or its last
        picked = [r.nbest[min(k, len(r.nbest) - 1)] for r in results]
        score = sum(s for _, s in picked) / len(picked)
        alternatives.append((inner.join([t for t, _ in picked]), score))
    joined = None
    if attention:
        best = [r.nbest[0][0] if r.nbest else r.text for r in results]
        joined = join_attention(split, best, [r.attention for r in results])
    out = LineResult(alternatives[0][0], alternatives[0][1], alternatives, joined)
    out.logprobs = _joined_logprobs(results, count)
    return out


def _joined_logprobs(results: Sequence[LineResult], nbest: int) -> list[tuple[float, int]] | None:
    """Per alternative, the log-probability and pieces of the sentences' hypotheses it joins.

    Summed over its decoded sentences (the k-th hypothesis of each, or its last; a sentence with
    nothing to translate has none); None where no sentence has them."""
    every = [r.logprobs for r in results if r.logprobs]
    if not every:
        return None
    picked = [[logprobs[min(k, len(logprobs) - 1)] for logprobs in every] for k in range(nbest)]
    return [(sum(lp for lp, _ in p), sum(n for _, n in p)) for p in picked]


@dataclass
class _Block:
    """One sentence's share of a joined :class:`Attention`: its pieces and weights, apart."""

    prefix: list[str]  # source pieces before the text (a multilingual model's target tag)
    source: list[str]  # the text's source pieces (no tag, no EOS)
    target: list[str]  # the translation's pieces (no EOS)
    weights: np.ndarray  # (len(target) [+ EOS row], len(prefix) + len(source) [+ EOS column])
    src_eos: bool  # whether its last column is the source's EOS
    trg_eos: bool  # whether its last row is the one that wrote EOS


def _block(sentence: str, text: str, attention: Attention) -> _Block | None:
    """A sentence's :class:`_Block`; None where its matrix and pieces disagree in shape.

    Either convention: our engine's (the source's EOS column, the EOS row) or CTranslate2's
    (neither). A sentence left untranslated (nothing to translate: no matrix) is its own
    translation: each of its words its own piece, aligned to itself."""
    if not attention.weights:
        words, out = (
            [WORD_START + w for w in sentence.split()],
            [WORD_START + w for w in text.split()],
        )
        if not out:
            return _Block([], [], [], np.zeros((0, 0)), False, False)
        if len(out) == len(words):
            return _Block([], words, out, np.eye(len(out)), False, False)
        return _Block(
            [], words, out, np.full((len(out), len(words)), 1 / max(len(words), 1)), False, False
        )
    weights = np.asarray(attention.weights, dtype=np.float64)
    source, target, skip = attention.source, attention.target, attention.prefix
    if weights.ndim != 2 or weights.shape != (len(target), len(source)) or skip > len(source):
        return None
    src_eos = len(source) > skip and source[-1] == EOS_PIECE
    trg_eos = bool(target) and target[-1] == EOS_PIECE
    return _Block(
        source[:skip],
        source[skip : len(source) - src_eos],
        target[: len(target) - trg_eos],
        weights,
        src_eos,
        trg_eos,
    )


def join_attention(
    split: SplitText, texts: Sequence[str], attentions: Sequence[Attention | None]
) -> Attention | None:
    """One line's attention from its sentences' (see the module's docstring).

    ``texts``: each sentence's translation (the best), ``attentions`` its matrix. The joined
    matrix is block-diagonal over (sentence i's source pieces) x (its target pieces); each
    sentence's tag and EOS columns go to the line's one tag and EOS column, so that every row
    sums as it did; the EOS row kept is the last sentence's. None where a sentence has none, or
    past :data:`MAX_JOINED_CELLS`."""
    blocks = []
    for sentence, text, attention in zip(split.sentences, texts, attentions, strict=True):
        block = None if attention is None else _block(sentence, text, attention)
        if block is None:
            return None
        blocks.append(block)
    if not blocks:
        return Attention([], [], [])
    gaps = ["", *split.separators[1:-1]]  # the whitespace before each sentence, inside the line
    prefix = max((b.prefix for b in blocks), key=len)
    src_eos, trg_eos = any(b.src_eos for b in blocks), blocks[-1].trg_eos
    n_src = len(prefix) + sum(len(b.source) for b in blocks) + src_eos
    n_trg = sum(len(b.target) for b in blocks) + trg_eos
    if n_src * n_trg > MAX_JOINED_CELLS:
        return None
    weights = np.zeros((n_trg, n_src))
    row, column = 0, len(prefix)
    for i, b in enumerate(blocks):
        tag, n_s, n_t = len(b.prefix), len(b.source), len(b.target)
        rows = b.weights[: n_t + (trg_eos and i == len(blocks) - 1)]
        here = slice(row, row + len(rows))
        weights[here, :tag] = rows[:, :tag]
        weights[here, column : column + n_s] = rows[:, tag : tag + n_s]
        if b.src_eos:
            weights[here, n_src - 1] = rows[:, tag + n_s]
        row, column = row + n_t, column + n_s
    return Attention(
        prefix
        + _word_starts(split.sentences, gaps, [b.source for b in blocks])
        + [EOS_PIECE] * src_eos,
        _word_starts(texts, gaps, [b.target for b in blocks]) + [EOS_PIECE] * trg_eos,
        weights.tolist(),
        len(prefix),
    )


def _word_starts(
    texts: Sequence[str], gaps: Sequence[str], pieces: Sequence[list[str]]
) -> list[str]:
    """The pieces of ``texts`` in order, as pieces of ``gaps[0] + texts[0] + gaps[1] + ...``.

    Each text's first piece starts a word ("▁") where whitespace comes before it in the joined
    text and a word before that, and continues the word before it where no whitespace does (a
    sentence of Chinese after another: "。" then the next one's first character)."""
    out: list[str] = []
    started = space = False  # a word before; whitespace right before
    for gap, text, own in zip(gaps, texts, pieces, strict=True):
        space = space or bool(gap)
        if own and started:
            first = own[0].removeprefix(WORD_START)
            own = [(WORD_START + first) if space else first, *own[1:]]
        out += own
        if text:
            started = started or bool(text.strip())
            space = text[-1].isspace()
    return out


def split_lines(lines: Sequence[str], languages: Sequence[str], marks: bool = False) -> Paragraphs:
    """Each line cut into sentences by the rules of its language (one language per line).

    ``marks``: never cut inside a span the user marked (``<keep>Save. Quit.</keep>`` stays in
    one sentence): a ``<keep>`` and the next ``</keep>`` after it, as
    :mod:`transformer_mt.text.protect` pairs them; a ``<keep>`` that no ``</keep>`` closes, or
    a ``</keep>`` that closes none, is text like any other."""
    splits = [split_text(line, lang) for line, lang in zip(lines, languages, strict=True)]
    return Paragraphs([_kept_whole(split) for split in splits] if marks else splits)


def _kept_whole(split: SplitText) -> SplitText:
    """``split`` with the sentences that a marked span runs across joined into one."""
    from transformer_mt.text.protect import find_protected

    sentences = split.sentences
    if not sentences:
        return split
    text = split.join(sentences)
    marked = find_protected(text, ("marked",))
    if not marked:
        return split
    # each sentence's (start, end) in the text; a cut is joined where a marked span crosses it
    bounds, at = [], 0
    for before, sentence in zip(split.separators[:-1], sentences, strict=True):
        at += len(before)
        bounds.append((at, at + len(sentence)))
        at += len(sentence)
    joined = [bounds[0]]
    span = 0
    for start, end in bounds[1:]:
        last_end = joined[-1][1]
        while span < len(marked) and marked[span].end <= last_end:
            span += 1
        if span < len(marked) and marked[span].start < start:  # the span goes on past the cut
            joined[-1] = (joined[-1][0], end)
        else:
            joined.append((start, end))
    return SplitText.at(text, joined)


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
    attention: bool = False,
) -> list[LineResult]:
    """``engine.translate`` on the sentences of ``lines``, joined back into one result a line.

    With ``attention``, each line's result has its attention (its sentences' joined:
    :func:`join_attention`)."""
    languages = line_languages(engine, lines, extras.source_lang)
    paragraphs = split_lines(lines, languages, extras.protect)
    each = dataclasses.replace(extras, split=False)
    if all(len(split.sentences) <= 1 for split in paragraphs.splits):
        # A sentence a line (a corpus): the lines as they are, so that each keeps its index
        # (a sampled line's draws depend on it) and nothing changes.
        return _translate(engine, lines, decode, stop, target, each, attention)
    results = _translate(engine, paragraphs.sentences, decode, stop, target, each, attention)
    return paragraphs.join(results, decode.nbest, attention=attention)


def _translate(
    engine: Translator,
    lines: Sequence[str],
    decode: "DecodeConfig",
    stop: "StopCheck | None",
    target: str | None,
    extras: "TranslateExtras",
    attention: bool,
) -> list[LineResult]:
    """``engine.translate``, asked for attention only where it is wanted."""
    if attention:
        return engine.translate(
            lines, decode, attention=True, stop=stop, target=target, extras=extras
        )
    return engine.translate(lines, decode, stop=stop, target=target, extras=extras)
