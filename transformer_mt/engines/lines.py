"""Lines in, n-best translations out, with our model: what the torch engine's search runs.

Optional attention pictures, and the output formats of `mt translate` (a line's word alignments
after its text, where the results carry them). A library user calls
``load_engine(...).translate`` (:mod:`transformer_mt.engines.engine`), which runs this for a
checkpoint and adds what is kept per batch (word alignments, attention, log-probabilities).

The line contract (one result per input line, in order; empty in, empty out; over-long lines
truncated with a warning) is kept by :func:`transformer_mt.decoding.text.translate_texts`, which
training's validation uses too; this module adds the pictures, ensembles and the output
formats. Documents go through :mod:`transformer_mt.documents.translate`.
"""

from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from transformer_mt.config import DecodeConfig
from transformer_mt.data.tokenizer import Tokenizer
from transformer_mt.decoding.ensemble import Ensemble, SearchModel, check_ensemble
from transformer_mt.decoding.text import OnBatch, Translation, translate_texts
from transformer_mt.engines.alignment import Alignment, format_alignment
from transformer_mt.engines.attention import AttentionPictures
from transformer_mt.engines.loading import LoadedModel
from transformer_mt.engines.results import LineResult
from transformer_mt.errors import MTError
from transformer_mt.model import Transformer

if TYPE_CHECKING:
    import torch

    from transformer_mt.decoding import DecodeResult


def ensemble_model(loaded: Sequence[LoadedModel], names: Sequence[str]) -> SearchModel:
    """The model to translate with, from one or more loaded checkpoints.

    The model itself for one, else an :class:`Ensemble` of them all, after :func:`check_ensemble`
    (a one-line MTError when their tokenizers or vocabularies differ). ``names`` are their paths,
    for messages. Translate with the first checkpoint's tokenizers and decoding settings."""
    if len(loaded) == 1:
        return loaded[0].model
    models = [one.model for one in loaded]
    check_ensemble(
        list(names), models, [one.src_tok for one in loaded], [one.trg_tok for one in loaded]
    )
    return Ensemble(models)


def translate_lines(
    model: SearchModel,
    src_tok: Tokenizer,
    trg_tok: Tokenizer,
    lines: Iterable[str],
    decode: DecodeConfig | None = None,
    *,
    max_src_len: int | None = None,
    progress: bool = False,
    attention_dir: Path | None = None,
    attention_layer: int | None = None,
    prefixes: Sequence[str] | None = None,
    first_line: int = 1,
    src_prefix: Sequence[int] = (),
    on_batch: OnBatch | None = None,
    constraints: Sequence[Sequence[str]] | None = None,
) -> list[Translation]:
    """Translate ``lines`` into ``decode.nbest`` (text, score) pairs per line.

    Translate ``lines``; returns, per input line and in input order, ``decode.nbest``
    (text, score) pairs, best first.

    Args:
        model: the Transformer in eval mode, or an :class:`Ensemble` (see
            :func:`ensemble_model`); it runs where its parameters are.
        src_tok, trg_tok: source and target tokenizers (the same object for a joint vocabulary).
        lines: input sentences; trailing newlines and surrounding whitespace are ignored.
        decode: beam, n-best, length penalty, length limits, batch size or sampling (validated
            with the config); default: ``DecodeConfig()``.
        max_src_len: longest source in pieces, EOS included (default and cap: the model's max_len);
            longer lines are truncated with a warning.
        progress: show a tqdm progress bar (sentences) on stderr.
        attention_dir: if set, write ``<line number>.png`` cross-attention heatmaps there
            (line numbers start at 1, zero-padded to 6 digits).
        attention_layer: decoder layer for the pictures (negative counts from the end); None
            averages all layers.
        prefixes: one target text per input line (empty: none) that its translations start with;
            the prefix's tokens count toward the length budget and their log-probs toward the
            score (see :func:`transformer_mt.decoding.text.translate_texts`).
        first_line: the line number of ``lines[0]`` in pictures and warnings (`mt translate
            --interactive` passes each line's own).
        src_prefix: ids that start every source: a multilingual model's target-language tag
            (:meth:`LoadedModel.source_prefix`).
        on_batch: called after each decoded batch, after the pictures (the engine's word
            alignments, attention and stop checks: what it keeps of each batch).
        constraints: per input line, target texts every translation of it must contain (a
            glossary's terms; see :func:`transformer_mt.decoding.text.translate_texts`).
    """
    callbacks: list = []
    if attention_dir is not None:
        if not isinstance(model, Transformer):
            raise MTError("attention pictures need one checkpoint, not an ensemble")
        callbacks.append(
            AttentionPictures(
                model, src_tok, trg_tok, Path(attention_dir), attention_layer, first_line
            )
        )
    if on_batch is not None:
        callbacks.append(on_batch)

    def each_callback(
        batch_lines: list[int], src: "torch.Tensor", decoded: "list[DecodeResult]"
    ) -> None:
        for callback in callbacks:
            callback(batch_lines, src, decoded)

    lines = list(lines)
    decode = decode or DecodeConfig()
    return translate_texts(
        model,
        src_tok,
        trg_tok,
        lines,
        decode,
        max_src_len=max_src_len,
        progress=progress,
        on_batch=each_callback if callbacks else None,
        prefixes=prefixes,
        src_prefix=src_prefix,
        first_line=first_line,
        constraints=constraints,
    )


def format_nbest(
    results: Iterable[Translation], alignments: Iterable[list[Alignment]] | None = None
) -> Iterator[str]:
    """Output lines for n-best results.

    K lines per input, ``translation<TAB>score``, and
    ``<TAB>alignment`` (Pharaoh format, possibly empty) after each when ``alignments`` (one
    list per input, as :class:`LineResult` carries them) are given.

    Tabs and line breaks inside a translation become spaces, so the line count always holds.
    """
    if alignments is None:
        for nbest in results:
            for text, score in nbest:
                yield f"{_one_line(text)}\t{score:.4f}"
        return
    for nbest, links in zip(results, alignments, strict=True):
        for (text, score), pairs in zip(nbest, links, strict=True):
            yield f"{_one_line(text)}\t{score:.4f}\t{format_alignment(pairs)}"


def format_best(
    results: Iterable[Translation], alignments: Iterable[list[Alignment]] | None = None
) -> Iterator[str]:
    """Output lines with the best translation only.

    One line per input; with ``alignments``,
    ``translation<TAB>alignment`` (an empty line gives a line holding only the tab)."""
    if alignments is None:
        for nbest in results:
            yield _one_line(nbest[0][0])
        return
    for nbest, links in zip(results, alignments, strict=True):
        yield f"{_one_line(nbest[0][0])}\t{format_alignment(links[0])}"


def format_results(results: Sequence[LineResult], nbest: int) -> Iterator[str]:
    """Output lines of an engine's results.

    :func:`format_nbest` when ``nbest`` > 1, else :func:`format_best`; with each line's
    alignments where the results carry them. A line with fewer than ``nbest`` translations (a
    constrained search keeps only those that hold every term) gets empty ones scored -inf, so
    that each input line has its ``nbest`` output lines."""
    missing = ("", float("-inf"))
    translations = [result.nbest + [missing] * (nbest - len(result.nbest)) for result in results]
    aligned = None
    if results and results[0].alignments is not None:
        aligned = [result.alignments or [] for result in results]
        aligned = [a + [[]] * (len(t) - len(a)) for a, t in zip(aligned, translations, strict=True)]
    formats = format_nbest if nbest > 1 else format_best
    return formats(translations, aligned)


def _one_line(text: str) -> str:
    return " ".join(text.replace("\t", " ").splitlines())
