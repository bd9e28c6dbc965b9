"""Word alignments from cross-attention matrices; numpy only (documents read them without torch).

Alignments (`mt translate --alignments`): the same matrices, read as a word alignment in the
fast_align / Pharaoh format: space-separated ``i-j`` pairs, 0-based, ``i`` a source index and
``j`` a target index. Each target piece ``j`` is aligned to the one source piece ``i`` it
attends to most (the argmax of its row; the first on a tie), so with ``units="pieces"`` every
target index 0..T-1 appears exactly once, in order. What the indices count:

- ``pieces`` (default): the sentencepiece pieces of the source as the model read it (after any
  truncation of an over-long line), EOS excluded, and the pieces of the target hypothesis, EOS
  excluded (an ``<unk>`` piece, which the detokenized text drops, still counts). The column of
  the source EOS is left out of the argmax; the row that predicts the target EOS is dropped.
- ``words``: whitespace words, as the tokenizer's word-start marker "▁" delimits them: a piece
  starting with "▁" starts a new word (a first piece without it is word 0). Piece pairs are
  mapped to word pairs and deduplicated, sorted by target then source word: a target word may
  then be aligned to several source words, and every target word appears at least once. These
  are the words of the text the tokenizer normalized (usually the input split on whitespace).

A line with nothing to translate, or a hypothesis with no pieces, has the empty alignment.
"""

import numpy as np

Alignment = list[tuple[int, int]]
"""(source index, target index) pairs, 0-based, in target order; see the module's docstring."""
ALIGNMENT_UNITS = ("pieces", "words")
WORD_START = "\u2581"  # sentencepiece's "▁": the piece starts a whitespace word


def alignment(weights: np.ndarray, n_src: int, n_trg: int) -> Alignment:
    """The piece alignment of one (T, S) attention matrix.

    ``(i, j)`` for each target piece
    ``j < n_trg``, ``i`` the source piece ``< n_src`` with the highest weight in row ``j``
    (the first on a tie). ``n_src``/``n_trg``: the pieces without EOS (the EOS column and the
    rows past ``n_trg`` are ignored); empty when either is 0."""
    if n_src <= 0 or n_trg <= 0:
        return []
    best = weights[:n_trg, :n_src].argmax(axis=1)
    return [(int(i), j) for j, i in enumerate(best.tolist())]


def word_indices(pieces: list[str]) -> list[int]:
    """The whitespace word of each piece: a new word at every piece starting with "▁"."""
    words, word = [], -1
    for piece in pieces:
        if piece.startswith(WORD_START) or word < 0:
            word += 1
        words.append(word)
    return words


def to_words(pairs: Alignment, src_pieces: list[str], trg_pieces: list[str]) -> Alignment:
    """A piece alignment as a word alignment (see the module's docstring).

    Each pair is mapped to its words, duplicates dropped, sorted by target then source word."""
    src_word, trg_word = word_indices(src_pieces), word_indices(trg_pieces)
    words = {(src_word[i], trg_word[j]) for i, j in pairs}
    return sorted(words, key=lambda pair: (pair[1], pair[0]))


def format_alignment(pairs: Alignment) -> str:
    """Pharaoh format: ``"0-0 1-2 ..."``; "" for no pairs."""
    return " ".join(f"{i}-{j}" for i, j in pairs)
