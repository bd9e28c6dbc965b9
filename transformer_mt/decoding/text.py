"""Text in, text out: the line contract of translation, over the batched search.

Exactly one result per input line, in input order. An empty or whitespace-only line gives an empty
translation without running the model; an over-long line is truncated (with a warning naming its
line number), never dropped. Inside, sentences are sorted by length and batched by a token budget
(:func:`transformer_mt.decoding.batched.decode_sources`), so a batch carries little padding.

Target prefixes (optional, one text per input line, possibly empty) are tokenized with the target
tokenizer (no EOS): each translation then starts with the prefix's pieces, so with its text as that
tokenizer normalizes it. The search may continue the prefix's last word: "the ca" may become "the cat
sat", and "the cat" may become "the cats sat".
A line with nothing to translate still gives an empty translation, whatever its prefix.

Lexical constraints (optional, per input line a list of target texts, e.g. a glossary's terms):
each term is tokenized alone with the target tokenizer (no EOS), and every finished translation
of the line contains each term's pieces (:mod:`~transformer_mt.decoding.constraints`). A term
tokenized alone starts with a word-start piece, so it matches where the translation writes it as
a word of its own, ends one (the piece after it never continues a word: the term "Haus" is
not met inside "Hauses") and, once started, is not left half way through one. Lines with
nothing to translate ignore theirs. A term the target vocabulary cannot spell (a character it
never saw, which becomes ``<unk>``) is still forced as its pieces, and the translation shows the
term as given where those pieces are (:func:`respelled`). A line's terms must fit in its
translation: their pieces, its prefix's and EOS within the model's target positions (the search
raises the length rule's budget to hold them), else an MTError naming the line and the term,
before any search. A line's n-best hold only translations that contain every term, fewer than
asked where fewer do; where none does (rare: the search found no way to write a term), its one
translation lacks some, with a warning naming the line and those terms.

A line with no words to translate (:func:`has_text`: emoji, punctuation, numbers or a link alone)
is its own translation, unchanged but for surrounding whitespace, with the score 0.0; the model
never sees it.

Used by `mt translate` / `mt evaluate` (through :mod:`transformer_mt.engines`) and by the
validation BLEU of training: both translate the same way.
"""

import sys
import warnings
from collections.abc import Callable, Iterable, Sequence

import torch
from tqdm import tqdm

from transformer_mt.config import DecodeConfig
from transformer_mt.data.tokenizer import EOS_ID, Tokenizer
from transformer_mt.decoding.batched import BatchCallback, decode_sources
from transformer_mt.decoding.constraints import Words, unmet
from transformer_mt.decoding.ensemble import SearchModel
from transformer_mt.decoding.search import DecodeResult
from transformer_mt.errors import MTError
from transformer_mt.text._scripts import continues_word
from transformer_mt.text.content import untranslatable

Translation = list[tuple[str, float]]  # n-best (text, score) pairs of one input line, best first
OnBatch = BatchCallback
"""Called after each batch with its line indices, its padded source ids (B, S) and its results."""


def keep_untranslatable(
    lines: Sequence[str],
    nbest: int,
    translate: Callable[[list[str]], list[Translation]],
) -> list[Translation]:
    """Wrap a translator so that lines with nothing to translate come back unchanged.

    ``translate(lines)`` for a translator that knows only the empty-line rule (CTranslate2's):
    the lines with nothing to translate go to it blank, and come back unchanged (score 0.0)."""
    kept = untranslatable(lines)
    results = translate(["" if i in kept else line for i, line in enumerate(lines)])
    for i, text in kept.items():
        results[i] = [(text, 0.0)] * nbest
    return results


def encode_sources(
    src_tok: Tokenizer,
    lines: list[str],
    max_src_len: int,
    first_line: int = 1,
    prefix: Sequence[int] = (),
) -> dict[int, list[int]]:
    """Source ids (ending with EOS) of every line that has something to translate, by line index.

    Surrounding whitespace is ignored; a line longer than ``max_src_len`` pieces (EOS and
    ``prefix`` included) keeps its first pieces, with a warning (``first_line``: the number it
    gives ``lines[0]``). ``prefix``: ids that start every source (a multilingual model's
    target-language tag).
    """
    what = "source pieces (with EOS)"
    return encode_lines(src_tok, lines, max_src_len, what, first_line, prefix)


def encode_lines(
    tok: Tokenizer,
    lines: list[str],
    limit: int,
    what: str,
    first_line: int = 1,
    prefix: Sequence[int] = (),
) -> dict[int, list[int]]:
    """The source ids of every line with something in it, by line index.

    ``prefix``, the ids and EOS of every line with something in it, by line index (a line that
    is empty, blank, or empty after the tokenizer's normalization has none). A line over ``limit``
    ids (EOS and prefix included) keeps its first pieces, with a warning: "line N: M <what>
    exceed the limit", where ``lines[0]`` is line ``first_line``."""
    texts = [line.strip() for line in lines]
    todo = [i for i, text in enumerate(texts) if text]
    encoded: dict[int, list[int]] = {}
    room = limit - len(prefix)
    for i, ids in zip(todo, tok.encode_batch([texts[i] for i in todo]), strict=True):
        if not ids:  # normalization removed everything (e.g. only control characters)
            continue
        if len(ids) + 1 > room:
            warnings.warn(
                f"line {i + first_line}: {len(ids) + 1 + len(prefix)} {what} exceed the limit of "
                f"{limit}; using its first {room - 1} pieces only",
                stacklevel=3,
            )
            ids = ids[: room - 1]
        encoded[i] = [*prefix, *ids, EOS_ID]
    return encoded


def encode_prefixes(
    trg_tok: Tokenizer,
    prefixes: Sequence[str],
    lines: list[int],
    max_pieces: int,
    first_line: int = 1,
) -> list[list[int]]:
    """The target ids of the prefixes of input lines ``lines``.

    Target ids (no EOS) of the prefixes of input lines ``lines`` (indices into ``prefixes``),
    in that order. Surrounding whitespace is ignored; a prefix longer than ``max_pieces`` keeps
    its first ``max_pieces`` pieces, with a warning naming its line (``prefixes[0]``'s is
    ``first_line``)."""
    encoded = trg_tok.encode_batch([prefixes[i].strip() for i in lines])
    for i, ids in zip(lines, encoded, strict=True):
        if len(ids) > max_pieces:
            warnings.warn(
                f"line {i + first_line}: a prefix of {len(ids)} target pieces leaves no room in the "
                f"model's {max_pieces + 1} target positions; forcing its first {max_pieces} only",
                stacklevel=3,
            )
            del ids[max_pieces:]
    return encoded


def encode_constraints(
    trg_tok: Tokenizer,
    constraints: Sequence[Sequence[str]],
    lines: list[int],
    first_line: int = 1,
) -> list[list[tuple[str, list[int]]]]:
    """The target ids of the constraint terms of input lines ``lines``.

    Per line of ``lines`` (indices into ``constraints``), in that order, each of its terms
    (surrounding whitespace removed) with its target ids (no EOS). A blank term is an MTError
    naming its line (``constraints[0]``'s is ``first_line``); one the tokenizer writes as no
    pieces at all is left out, with a warning."""
    terms = [(i, j, term.strip()) for i in lines for j, term in enumerate(constraints[i])]
    encoded = trg_tok.encode_batch([term for _, _, term in terms]) if terms else []
    by_line: dict[int, list[tuple[str, list[int]]]] = {i: [] for i in lines}
    for (i, j, term), ids in zip(terms, encoded, strict=True):
        if not term:
            raise MTError(
                f"line {i + first_line}: constraint {j + 1} is empty: give each term some text"
            )
        if not ids:  # the tokenizer drops every character of it: the model cannot write it
            warnings.warn(
                f"line {i + first_line}: constraint {j + 1} ({term!r}) has no target pieces in "
                "this model's vocabulary; the line is translated without it",
                stacklevel=2,
            )
            continue
        by_line[i].append((term, ids))
    return [by_line[i] for i in lines]


def misspelled_terms(
    trg_tok: Tokenizer, lines: list[int], encoded: list[list[tuple[str, list[int]]]]
) -> dict[int, list[tuple[list[int], str]]]:
    """Per line index, (its pieces, the term) of each term that its target pieces misspell.

    A term with characters the target vocabulary lacks (``@`` in a model never trained on
    e-mail addresses) is searched for as its pieces, ``<unk>`` included, and those pieces read
    otherwise (``anna ⁇ mail.de``); so does one the tokenizer normalizes (a no-break space).
    ``encoded``: :func:`encode_constraints` of ``lines``."""
    respell: dict[int, list[tuple[list[int], str]]] = {}
    for i, terms in zip(lines, encoded, strict=True):
        for term, ids in terms:
            if trg_tok.decode(ids).strip() != term:
                respell.setdefault(i, []).append((ids, term))
    return respell


def check_room(
    encoded: list[list[tuple[str, list[int]]]],
    lines: list[int],
    prefixes: Sequence[Sequence[int]] | None,
    table: int,
    first_line: int = 1,
) -> None:
    """Check that each line's terms fit in its translation, before any search.

    ``encoded``: :func:`encode_constraints` of input lines ``lines``; ``prefixes``: their
    forced prefixes' ids (None: none); ``table``: the model's target positions. A line's terms,
    its prefix and EOS must fit in them (the search raises the length rule's budget to hold
    them, never beyond); where they do not, an MTError names the line and the term that does
    not fit: a term too long alone, or the first one past the room the line's terms leave."""
    for n, (i, terms) in enumerate(zip(lines, encoded, strict=True)):
        prefix = 0 if prefixes is None else len(prefixes[n])
        room = table - 1 - prefix
        why = f"the model's {table} target positions less EOS" + (
            f" and its prefix's {prefix} pieces" if prefix else ""
        )
        total = 0
        for term, ids in terms:
            total += len(ids)
            if total <= room:
                continue
            name = term if len(term) <= 40 else term[:40] + "\u2026"
            if len(ids) > room:
                raise MTError(
                    f"line {i + first_line}: the term {name!r} has {len(ids)} target pieces, and "
                    f"a translation of this line has room for {max(room, 0)} ({why}): shorten "
                    "it or leave it out"
                )
            raise MTError(
                f"line {i + first_line}: the line's terms up to {name!r} have {total} target "
                f"pieces, and a translation of this line has room for {room} ({why}): give the "
                "line fewer terms"
            )


def _constraint_ids(
    trg_tok: Tokenizer,
    constraints: Sequence[Sequence[str]] | None,
    lines: list[int],
    first_line: int,
    prefixes: Sequence[Sequence[int]] | None,
    table: int,
) -> tuple[list[list[tuple[str, list[int]]]] | None, dict[int, list[tuple[list[int], str]]]]:
    """The terms and their ids of input lines ``lines`` for the search, and the misspelled ones.

    (:func:`encode_constraints`, checked by :func:`check_room` against the lines' ``prefixes``
    and the ``table`` target positions; :func:`misspelled_terms`); None and none without
    constraints."""
    if constraints is None:
        return None, {}
    encoded = encode_constraints(trg_tok, constraints, lines, first_line)
    check_room(encoded, lines, prefixes, table, first_line)
    return encoded, misspelled_terms(trg_tok, lines, encoded)


def _warn_unmet(
    line: int, terms: list[tuple[str, list[int]]], result: DecodeResult, first_line: int
) -> None:
    """Warn where the best translation of input line ``line`` lacks some of its ``terms``."""
    best = result.nbest[0]
    if best.constraints_met:
        return
    missing = unmet([ids for _, ids in terms], best.tokens)
    names = ", ".join(repr(terms[j][0]) for j in missing)
    warnings.warn(
        f"line {line + first_line}: no translation holds every term; the best one, given, "
        f"lacks {names}",
        stacklevel=3,
    )


def target_words(trg_tok: Tokenizer) -> Words:
    """Where the target pieces begin words (:class:`~transformer_mt.decoding.constraints.Words`).

    A piece starts a word where it opens with ``▁``; it goes on with the word before it where
    it does not and its first character belongs to a word of a script with spaces (a letter,
    a digit, a combining mark). Computed once per tokenizer."""
    cached = _WORDS.get(id(trg_tok))
    if cached is not None and cached[0] is trg_tok:
        return cached[1]
    pieces = trg_tok.id_to_piece(range(trg_tok.vocab_size))
    starts = [p.startswith("\u2581") for p in pieces]
    goes_on = [
        bool(p) and not start and continues_word(p[0])
        for p, start in zip(pieces, starts, strict=True)
    ]
    words = Words(torch.tensor(starts), torch.tensor(goes_on))
    _WORDS[id(trg_tok)] = (trg_tok, words)
    return words


_WORDS: dict[int, tuple[Tokenizer, Words]] = {}


def respelled(trg_tok: Tokenizer, tokens: Sequence[int], respell: Sequence[tuple]) -> str:
    """``tokens`` as text, each misspelled term (:func:`misspelled_terms`) written as given.

    The first place (left to right, not overlapping; longer terms placed first) where a term's
    pieces are in ``tokens``, which the constrained search put there, reads as the term; a space
    before and after it where the pieces around it start a word."""
    places: list[tuple[int, int, str]] = []
    # Longer terms first: "€" must not take the place of the "€" in "€5" (stable: source order)
    for ids, term in sorted(respell, key=lambda pair: -len(pair[0])):
        taken = [range(start, end) for start, end, _ in places]
        for start in range(len(tokens) - len(ids) + 1):
            free = all(start >= r.stop or start + len(ids) <= r.start for r in taken)
            if free and list(tokens[start : start + len(ids)]) == list(ids):
                places.append((start, start + len(ids), term))
                break
    if not places:
        return trg_tok.decode(tokens)

    def starts_word(at: int) -> bool:
        return at < len(tokens) and trg_tok.id_to_piece([tokens[at]])[0].startswith("\u2581")

    text, at = "", 0
    for start, end, term in sorted(places):
        text = _words(text, trg_tok.decode(tokens[at:start]), starts_word(at))
        text, at = _words(text, term, True), end
    return _words(text, trg_tok.decode(tokens[at:]), starts_word(at))


def _words(text: str, more: str, space: bool) -> str:
    """``more`` after ``text``, with a space between where ``space`` and both have text."""
    return f"{text} {more}" if space and text and more else text + more


def check_beam(decode: DecodeConfig, vocab: int) -> None:
    """Check that the target vocabulary is large enough for the beam.

    Beam search ranks 2K candidates per sentence, never PAD or BOS: a beam K needs a target
    vocabulary of 2K + 2 pieces. An MTError names the widest beam that fits."""
    beam = decode.beam_size
    if not decode.sampling and beam > 1 and 2 * beam + 2 > vocab:
        raise MTError(
            f"beam size {beam} (--beam) needs a target vocabulary of at least {2 * beam + 2} "
            f"pieces; this model's has {vocab}: use a beam of at most {(vocab - 2) // 2}"
        )


def translate_texts(
    model: SearchModel,
    src_tok: Tokenizer,
    trg_tok: Tokenizer,
    lines: Iterable[str],
    decode: DecodeConfig,
    *,
    max_src_len: int | None = None,
    progress: bool = False,
    on_batch: OnBatch | None = None,
    prefixes: Sequence[str] | None = None,
    first_line: int = 1,
    src_prefix: Sequence[int] = (),
    constraints: Sequence[Sequence[str]] | None = None,
) -> list[Translation]:
    """Translate ``lines``: per input line, ``decode.nbest`` (text, score) pairs.

    Translate ``lines``; returns, per input line and in input order, ``decode.nbest``
    (text, score) pairs, best first. An empty line gives ``nbest`` pairs ("", 0.0); a line with
    nothing to translate (:func:`has_text`), ``nbest`` pairs (its text, 0.0).

    Args:
        model: the Transformer, or an :class:`~transformer_mt.decoding.ensemble.Ensemble`
            (tokenizers checked with ``check_ensemble``), in eval mode; it runs where its
            parameters are.
        src_tok, trg_tok: source and target tokenizers (the same object for a joint vocabulary).
        decode: the search and its limits (validated with the config).
        max_src_len: longest source in pieces, EOS included (default and cap: the model's
            position table); longer lines are truncated with a warning.
        progress: a tqdm bar (sentences) on stderr.
        on_batch: see :data:`OnBatch` (e.g. attention pictures).
        prefixes: one target text per line (empty: none) that its translations must start with;
            its tokens count toward the length budget and their log-probs toward the score. A
            prefix is cut (with a warning) to leave one of the model's target positions free.
            A count other than the lines' is an MTError.
        first_line: the number warnings give ``lines[0]``, and the key of its sample's draws
            (a caller feeding lines one at a time passes its own count).
        src_prefix: ids that start every source: a multilingual model's tag of the target
            language (:func:`transformer_mt.data.languages.lang_tag`).
        constraints: per line, target texts (terms) that each of its translations must
            contain (an empty list: none); beam search only (beam >= 2). A count other than the
            lines', a blank term, or terms that do not fit in the line's translation
            (:func:`check_room`) is an MTError. None: no constraints (the search runs exactly
            as without them). The n-best may then be fewer than ``decode.nbest`` (the module's
            text).
    """
    table = model.positions.max_len
    limit = table if max_src_len is None else min(max_src_len, table)
    if limit < 2:
        raise ValueError(f"max_src_len must be >= 2 (a piece and EOS), got {limit}")
    check_beam(decode, trg_tok.vocab_size)
    lines = list(lines)
    if prefixes is not None and len(prefixes) != len(lines):
        raise MTError(
            f"{len(prefixes)} prefixes for {len(lines)} input lines: give one prefix per input "
            "line (an empty line for none)"
        )
    if constraints is not None and len(constraints) != len(lines):
        raise MTError(
            f"{len(constraints)} constraint lists for {len(lines)} input lines: give one list "
            "per input line (an empty list for none)"
        )
    kept = untranslatable(lines)
    todo = ["" if i in kept else line for i, line in enumerate(lines)]
    sources = encode_sources(src_tok, todo, limit, first_line, src_prefix)
    line_of = list(sources)  # position in the batch input -> line index
    forced = (
        None
        if prefixes is None
        else encode_prefixes(trg_tok, prefixes, line_of, table - 1, first_line)
    )
    encoded, respell = _constraint_ids(trg_tok, constraints, line_of, first_line, forced, table)
    terms = None if encoded is None else [[ids for _, ids in line] for line in encoded]
    # Lines with nothing to translate are answered now, without the model.
    results: list[Translation] = [
        [(kept.get(i, ""), 0.0)] * decode.nbest for i in range(len(lines))
    ]

    with tqdm(total=len(sources), unit="sent", disable=not progress, file=sys.stderr) as bar:

        def finished(positions: list[int], src: torch.Tensor, decoded: list[DecodeResult]) -> None:
            batch_lines = [line_of[p] for p in positions]
            for p, i, res in zip(positions, batch_lines, decoded, strict=True):
                if encoded is not None:
                    _warn_unmet(i, encoded[p], res, first_line)
                results[i] = [
                    (respelled(trg_tok, h.tokens, respell.get(i, ())), h.score) for h in res.nbest
                ]
            if on_batch is not None:
                on_batch(batch_lines, src, decoded)
            bar.update(len(positions))

        keys = [first_line + i for i in line_of]  # a line's sample is keyed by its line number
        decode_sources(
            model,
            list(sources.values()),
            decode,
            on_batch=finished,
            prefixes=forced,
            line_keys=keys,
            constraints=terms,
            words=None if terms is None else target_words(trg_tok),
        )
    return results
