"""`mt translate` as a library call: lines in, n-best translations out, optional attention pictures.

The line contract (one result per input line, in order; empty in, empty out; over-long lines
truncated with a warning) is kept by :func:`transformer_mt.decoding.text.translate_texts`, which
training's validation uses too; this module adds the pictures and the output formats.
"""

from collections.abc import Iterable, Iterator
from pathlib import Path

from transformer_mt.config import DecodeConfig
from transformer_mt.data.tokenizer import Tokenizer
from transformer_mt.decoding.text import Translation, translate_texts
from transformer_mt.inference.attention import AttentionPictures
from transformer_mt.model import Transformer


def translate_lines(
    model: Transformer,
    src_tok: Tokenizer,
    trg_tok: Tokenizer,
    lines: Iterable[str],
    decode: DecodeConfig | None = None,
    *,
    max_src_len: int | None = None,
    progress: bool = False,
    attention_dir: Path | None = None,
    attention_layer: int | None = None,
) -> list[Translation]:
    """Translate ``lines``; returns, per input line and in input order, ``decode.nbest``
    (text, score) pairs, best first.

    Args:
        model: the Transformer in eval mode; it runs where its parameters are.
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
    """
    pictures = None
    if attention_dir is not None:
        pictures = AttentionPictures(model, src_tok, trg_tok, Path(attention_dir), attention_layer)
    return translate_texts(
        model,
        src_tok,
        trg_tok,
        lines,
        decode or DecodeConfig(),
        max_src_len=max_src_len,
        progress=progress,
        on_batch=pictures,
    )


def format_nbest(results: Iterable[Translation]) -> Iterator[str]:
    """Output lines for n-best results: K lines per input, ``translation<TAB>score``.

    Tabs and line breaks inside a translation become spaces, so the line count always holds.
    """
    for nbest in results:
        for text, score in nbest:
            yield f"{_one_line(text)}\t{score:.4f}"


def format_best(results: Iterable[Translation]) -> Iterator[str]:
    """Output lines with the best translation only: one line per input."""
    for nbest in results:
        yield _one_line(nbest[0][0])


def _one_line(text: str) -> str:
    return " ".join(text.replace("\t", " ").splitlines())
