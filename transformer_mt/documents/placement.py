"""Where the formatting of a source sentence goes in its translation, by the model's attention.

A document's sentence may carry markup inside it: a bold word, a link around two words, runs of a
word processor with their own fonts. The model translates the plain text; this module carries each
marked span of source words over to the target words that were aligned to them. The alignment is
the argmax of each target piece's cross-attention (:func:`~transformer_mt.engines.attention.alignment`),
mapped to whitespace words (:func:`~transformer_mt.engines.attention.to_words`). Where a
translation has no usable attention (none was returned, or its pieces do not match the words of the
texts), spans are placed in proportion to their position instead. Attention is a hint, not an
alignment model: a span lands on the words the model looked at while writing them, which for a
small model is often only approximately where a person would put it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from transformer_mt.engines.alignment import alignment, to_words, word_indices
from transformer_mt.engines.results import LineResult

EOS_PIECE = "</s>"


@dataclass
class WordLinks:
    """Which target words each source word of a sentence was aligned to."""

    n_src: int  # source words
    n_trg: int  # target words (the translation split on whitespace)
    links: list[list[int]] | None  # per source word, its target words, sorted; None: proportional

    def span(self, s0: int, s1: int) -> tuple[int, int]:
        """The target words ``[t0, t1)`` for the non-empty source words ``[s0, s1)``.

        They run from the first to the last target word aligned to any of them, or are placed in
        proportion where none is."""
        if self.links is not None:
            aligned = [t for s in range(s0, s1) for t in self.links[s]]
            if aligned:
                return min(aligned), max(aligned) + 1
        t0 = self.point(s0)
        return t0, max(t0 + 1, min(self.n_trg, round(s1 * self.n_trg / max(self.n_src, 1))))

    def point(self, s: int) -> int:
        """The target boundary for the boundary before source word ``s`` (0..n_src).

        It comes after the target words aligned to the source word before it, else in proportion."""
        if s <= 0 or self.n_trg == 0:
            return 0
        if s >= self.n_src:
            return self.n_trg
        if self.links is not None and self.links[s - 1]:
            return min(max(self.links[s - 1]) + 1, self.n_trg)
        return min(self.n_trg, round(s * self.n_trg / max(self.n_src, 1)))


def word_links(result: LineResult, n_src: int) -> WordLinks:
    """The word links of a translated sentence of ``n_src`` whitespace words, from its attention.

    ``links`` is None when it has none, or its pieces do not make those words."""
    n_trg = len(result.text.split())
    attn = result.attention
    if attn is None or not attn.weights or n_src == 0 or n_trg == 0:
        return WordLinks(n_src, n_trg, None)
    skip = attn.prefix  # a multilingual model's target-language tag before the text
    src = [p for p in attn.source[skip:] if p != EOS_PIECE]
    trg = [p for p in attn.target if p != EOS_PIECE]
    if not src or not trg or _words(src) != n_src or _words(trg) != n_trg:
        return WordLinks(n_src, n_trg, None)
    weights = np.asarray(attn.weights, dtype=np.float32)[:, skip:]
    pairs = to_words(alignment(weights, len(src), len(trg)), src, trg)
    links: list[list[int]] = [[] for _ in range(n_src)]
    for s, t in pairs:
        links[s].append(t)
    return WordLinks(n_src, n_trg, links)


def _words(pieces: list[str]) -> int:
    """How many whitespace words ``pieces`` make."""
    return word_indices(pieces)[-1] + 1 if pieces else 0


def words_of(texts: list[str]) -> tuple[list[str], list[int]]:
    """The whitespace words of ``"".join(texts)`` and the text holding each.

    Each word comes with the index of the text holding its first character (a word may run on
    into the next texts)."""
    words: list[str] = []
    owners: list[int] = []
    current = ""
    for k, text in enumerate(texts):
        for ch in text:
            if ch.isspace():
                if current:
                    words.append(current)
                current = ""
            else:
                if not current:
                    owners.append(k)
                current += ch
    if current:
        words.append(current)
    return words, owners


def distribute(texts: list[str], fixed: list[bool], result: LineResult) -> list[str]:
    """Cut the translation of ``"".join(texts)`` into new texts, one per text.

    The translation ``result`` of ``"".join(texts)`` cut into new texts, one per text (a
    word processor's runs, in order): each run gets the target words aligned to its own words,
    runs keep their order (where the translation reorders them, a run may come out empty), and
    every target word lands in some run. ``fixed`` texts (a tab, a line break) are kept; a space
    ends a run whose words the next run's continue, unless a fixed text lies between them. Leading and
    trailing whitespace of the whole stay where they were."""
    words, owners = words_of(texts)
    target = result.text.split()
    out = ["" for _ in texts]
    if not words:
        return list(texts)
    links = word_links(result, len(words))
    first_word: dict[int, int] = {}
    for s, k in enumerate(owners):
        first_word.setdefault(k, s)
    runs = sorted(first_word)  # the texts that hold a word's start, in order
    starts: list[int] = []
    for n, k in enumerate(runs):
        s0 = first_word[k]
        s1 = first_word[runs[n + 1]] if n + 1 < len(runs) else len(words)
        t0 = 0 if n == 0 else max(links.span(s0, s1)[0], starts[-1])
        starts.append(min(t0, len(target)))
    previous = -1
    for n, k in enumerate(runs):
        end = starts[n + 1] if n + 1 < len(runs) else len(target)
        out[k] = " ".join(target[starts[n] : end])
        if out[k] and previous >= 0 and not any(fixed[previous + 1 : k]):
            out[previous] += " "  # the space between two runs' words ends the first run
        if out[k]:
            previous = k
    joined = "".join(texts)
    lead = joined[: len(joined) - len(joined.lstrip())]
    trail = joined[len(joined.rstrip()) :]
    filled = [k for k in range(len(texts)) if out[k]]
    if filled:
        out[filled[0]] = lead + out[filled[0]]
        out[filled[-1]] += trail
    for k, is_fixed in enumerate(fixed):
        if is_fixed:
            out[k] = texts[k]
    return out
