"""Translate lines of text: tokenize, batch by length, search, detokenize, restore input order.

The promise behind ``mt translate``: exactly one result per input line, in input order. An empty or
whitespace-only line gives an empty translation without running the model; an over-long line is
truncated (with a warning naming its line number), never dropped. Inside, sentences are sorted by
length and batched by a token budget, so a batch carries little padding.

Optionally writes cross-attention pictures: one PNG heatmap per sentence, source pieces on x,
target pieces on y, for one decoder layer or the average of all layers (always averaged over heads).
"""

import sys
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from transformer_mt.data.tokenizer import EOS_ID, Tokenizer
from transformer_mt.decoding import (
    DecodeResult,
    Hypothesis,
    SamplingOptions,
    beam_search,
    greedy_search,
    sample,
)
from transformer_mt.model import Transformer

Translation = list[tuple[str, float]]  # n-best (text, score) pairs of one input line, best first


def translate_lines(
    model: Transformer,
    src_tok: Tokenizer,
    trg_tok: Tokenizer,
    lines: Iterable[str],
    *,
    beam: int = 1,
    nbest: int = 1,
    len_penalty: float = 1.0,
    max_len_a: float = 10.0,
    max_len_b: float = 1.5,
    batch_tokens: int = 4096,
    max_src_len: int | None = None,
    device: str | torch.device | None = None,
    progress: bool = False,
    attention_dir: Path | None = None,
    attention_layer: int | None = None,
    sampling: SamplingOptions | None = None,
) -> list[Translation]:
    """Translate ``lines``; returns, per input line and in input order, ``nbest`` (text, score).

    Args:
        model: the Transformer, already in eval mode (``model.eval()``); it is moved to ``device``.
        src_tok, trg_tok: source and target tokenizers (the same object for a joint vocabulary).
        lines: input sentences; trailing newlines and surrounding whitespace are ignored.
        beam: beam size; 1 runs greedy search.
        nbest: hypotheses returned per line (at most ``beam``), best first. An empty line gives
            ``nbest`` pairs ("", 0.0).
        len_penalty: GNMT length-penalty alpha (0 = raw log-probability sums).
        max_len_a, max_len_b: at most ``a + b * source length`` target tokens per sentence.
        batch_tokens: budget of padded source tokens per batch (at least one sentence per batch).
        max_src_len: longest source in pieces, EOS included (default and cap: the model's max_len);
            longer lines are truncated with a warning.
        device: where to run (default: where the model is).
        progress: show a tqdm progress bar (sentences) on stderr.
        attention_dir: if set, write ``<line number>.png`` cross-attention heatmaps there
            (line numbers start at 1, zero-padded to 6 digits).
        attention_layer: decoder layer for the pictures (negative counts from the end); None
            averages all layers.
        sampling: draw each token instead of searching (back-translation); needs beam == 1.
    """
    if sampling is not None and beam != 1:
        raise ValueError("sampling draws one hypothesis per line: use it with beam=1")
    generator = None
    if sampling is not None:
        generator = torch.Generator(device=device or next(model.parameters()).device)
        generator.manual_seed(sampling.seed)
    if not 1 <= nbest <= beam:
        raise ValueError(f"need 1 <= nbest <= beam, got nbest={nbest}, beam={beam}")
    n_layers = model.n_dec_layers
    if attention_layer is not None and not -n_layers <= attention_layer < n_layers:
        raise ValueError(f"attention_layer={attention_layer} outside the model's {n_layers} layers")
    limit = model.positions.max_len if max_src_len is None else max_src_len
    limit = min(limit, model.positions.max_len)
    if limit < 2:
        raise ValueError(f"max_src_len must be >= 2 (a piece and EOS), got {limit}")
    dev = torch.device(device) if device is not None else next(model.parameters()).device
    model.to(dev)
    if attention_dir is not None:
        Path(attention_dir).mkdir(parents=True, exist_ok=True)

    texts = [line.strip() for line in lines]
    todo = [i for i, text in enumerate(texts) if text]
    sources: dict[int, list[int]] = {}
    for i, ids in zip(todo, src_tok.encode_batch([texts[i] for i in todo]), strict=True):
        if not ids:  # normalization removed everything (e.g. only control characters)
            continue
        if len(ids) + 1 > limit:
            warnings.warn(
                f"line {i + 1}: {len(ids) + 1} source pieces (with EOS) exceed "
                f"max_src_len={limit}; translating its first {limit - 1} pieces only",
                stacklevel=2,
            )
            ids = ids[: limit - 1]
        sources[i] = [*ids, EOS_ID]
    # Lines with nothing to translate are answered now, without the model.
    results: list[Translation | None] = [
        None if i in sources else [("", 0.0)] * nbest for i in range(len(texts))
    ]

    with tqdm(total=len(sources), unit="sent", disable=not progress, file=sys.stderr) as bar:
        for batch in _token_batches(sources, batch_tokens):
            src = _pad([sources[i] for i in batch], model.src_pad_idx, dev)  # (B, S)
            if sampling is not None:
                decoded = sample(
                    model, src, temperature=sampling.temperature, top_k=sampling.top_k,
                    top_p=sampling.top_p, generator=generator, max_len_a=max_len_a,
                    max_len_b=max_len_b, len_penalty=len_penalty,
                )  # fmt: skip
            elif beam == 1:
                decoded = greedy_search(
                    model, src, max_len_a=max_len_a, max_len_b=max_len_b, len_penalty=len_penalty
                )
            else:
                decoded = beam_search(
                    model,
                    src,
                    beam=beam,
                    nbest=nbest,
                    len_penalty=len_penalty,
                    max_len_a=max_len_a,
                    max_len_b=max_len_b,
                )
            for i, res in zip(batch, decoded, strict=True):
                results[i] = [(trg_tok.decode(h.tokens), h.score) for h in res.nbest]
            if attention_dir is not None:
                _write_attention(
                    model, src, decoded, batch, src_tok, trg_tok, attention_dir, attention_layer
                )
            bar.update(len(batch))
    assert all(r is not None for r in results)
    return results  # type: ignore[return-value]


def _token_batches(sources: dict[int, list[int]], batch_tokens: int) -> Iterator[list[int]]:
    """Line indices in batches of similar length, longest first, each within ``batch_tokens``
    padded tokens (a longer single sentence still gets its own batch)."""
    order = sorted(sources, key=lambda i: len(sources[i]), reverse=True)
    batch: list[int] = []
    for i in order:
        # Longest first: the batch's padded width is the length of its first sentence.
        width = len(sources[batch[0]]) if batch else len(sources[i])
        if batch and (len(batch) + 1) * width > batch_tokens:
            yield batch
            batch = []
        batch.append(i)
    if batch:
        yield batch


def _pad(seqs: list[list[int]], pad: int, device: torch.device) -> torch.Tensor:
    out = torch.full((len(seqs), max(map(len, seqs))), pad, dtype=torch.long)  # (B, S)
    for row, seq in enumerate(seqs):
        out[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
    return out.to(device)


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


# --- attention pictures ----------------------------------------------------------------------


@torch.inference_mode()
def attention_matrices(
    model: Transformer,
    src: torch.Tensor,
    hyps: list[Hypothesis],
    layer: int | None = None,
) -> list[np.ndarray]:
    """Cross-attention of each hypothesis over its source, averaged over heads (and over layers
    when ``layer`` is None): one (T, S) array per sentence, S = the source's pieces with EOS,
    T = the hypothesis' tokens plus EOS if it ended with one. One teacher-forced pass."""
    src_len = (src != model.src_pad_idx).sum(dim=1).tolist()
    rows = [len(h.tokens) + int(h.finished) for h in hyps]
    # Decoder input BOS + tokens: position t predicts token t (and EOS after the last one).
    trg = _pad([[model.trg_sos_idx, *h.tokens] for h in hyps], model.trg_pad_idx, src.device)
    weights = model.cross_attention(src, trg)  # (L, B, H, T, S)
    weights = weights.mean(dim=(0, 2)) if layer is None else weights[layer].mean(dim=1)  # (B, T, S)
    weights = weights.float().cpu().numpy()
    return [weights[b, : rows[b], : src_len[b]] for b in range(len(hyps))]


def plot_attention(
    weights: np.ndarray, src_pieces: list[str], trg_pieces: list[str], path: Path, title: str = ""
) -> None:
    """Save a heatmap of ``weights`` (T, S): source pieces on x, target pieces on y, as a PNG."""
    # Imported here: matplotlib costs ~0.5 s at start-up and only pictures need it.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    n_trg, n_src = weights.shape
    # Plain Figure + Agg canvas: no pyplot global state, works headless and in threads.
    fig = Figure(figsize=(max(4.0, 0.35 * n_src + 2.0), max(3.0, 0.35 * n_trg + 1.5)))
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    image = ax.imshow(weights, cmap="viridis", aspect="auto", vmin=0.0)
    ax.set_xticks(range(n_src), src_pieces, rotation=90, fontsize=8)
    ax.set_yticks(range(n_trg), trg_pieces, fontsize=8)
    ax.set_xlabel("source")
    ax.set_ylabel("target")
    if title:
        ax.set_title(title, fontsize=9)
    fig.colorbar(image, ax=ax)
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=100)


def _write_attention(
    model: Transformer,
    src: torch.Tensor,
    decoded: list[DecodeResult],
    line_ids: list[int],
    src_tok: Tokenizer,
    trg_tok: Tokenizer,
    out_dir: Path,
    layer: int | None,
) -> None:
    """One PNG per sentence of a batch, for its best hypothesis."""
    hyps = [res.nbest[0] for res in decoded]
    which = "mean of layers" if layer is None else f"layer {layer}"
    for line, hyp, ids, weights in zip(
        line_ids, hyps, src.tolist(), attention_matrices(model, src, hyps, layer), strict=True
    ):
        src_pieces = src_tok.id_to_piece(ids[: weights.shape[1]])
        trg_pieces = trg_tok.id_to_piece([*hyp.tokens, EOS_ID][: weights.shape[0]])
        title = f"line {line + 1}, cross-attention, {which}, mean of heads"
        plot_attention(
            weights, src_pieces, trg_pieces, Path(out_dir) / f"{line + 1:06d}.png", title
        )
