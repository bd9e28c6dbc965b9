"""Cross-attention pictures and word alignments.

What the decoder looked at while writing each
target piece.

Pictures: one PNG heatmap per sentence, source pieces on x, target pieces on y, for one decoder
layer or the average of all layers (always averaged over heads). Search does not keep the
weights (on a GPU, and for long sentences on a CPU, it runs the fused attention kernel, which
never materializes them); the pictures come from one extra teacher-forced pass over the chosen
hypotheses, which gives the same weights.

Alignments (`mt translate --alignments`): the same matrices read as word alignments
(:mod:`transformer_mt.engines.alignment`, torch-free).
"""

import io
from pathlib import Path

import numpy as np
import torch

from transformer_mt.data.batching import pad_batch
from transformer_mt.data.tokenizer import EOS_ID, Tokenizer
from transformer_mt.decoding import DecodeResult, Hypothesis
from transformer_mt.engines.alignment import (
    ALIGNMENT_UNITS,
    Alignment,
    alignment,
    to_words,
)
from transformer_mt.errors import MTError
from transformer_mt.fileio import write_output
from transformer_mt.model import Transformer


@torch.inference_mode()
def attention_matrices(
    model: Transformer,
    src: torch.Tensor,
    hyps: list[Hypothesis],
    layer: int | None = None,
) -> list[np.ndarray]:
    """The cross-attention of each hypothesis over its source.

    Cross-attention of each hypothesis over its source, averaged over heads (and over layers
    when ``layer`` is None): one (T, S) array per sentence, S = the source's pieces with EOS,
    T = the hypothesis' tokens plus EOS if it ended with one. One teacher-forced pass."""
    src_len = (src != model.src_pad_idx).sum(dim=1).tolist()
    rows = [len(h.tokens) + int(h.finished) for h in hyps]
    # Decoder input BOS + tokens: position t predicts token t (and EOS after the last one). A
    # hypothesis cut at the length limit needs no position after its last token (and its
    # tokens may fill the position table).
    inputs = [h.tokens if h.finished else h.tokens[:-1] for h in hyps]
    trg = pad_batch(inputs, model.trg_pad_idx, bos=model.trg_sos_idx)
    weights = model.cross_attention(src, trg.to(src.device))  # (L, B, H, T, S)
    weights = weights.mean(dim=(0, 2)) if layer is None else weights[layer].mean(dim=1)  # (B, T, S)
    array = weights.float().cpu().numpy()
    return [array[b, : rows[b], : src_len[b]] for b in range(len(hyps))]


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
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=100)
    write_output(path, png.getvalue())


class AttentionPictures:
    """Writes one PNG per translated line, for its best hypothesis; called after each batch."""

    def __init__(
        self,
        model: Transformer,
        src_tok: Tokenizer,
        trg_tok: Tokenizer,
        out_dir: Path,
        layer: int | None = None,
        first_line: int = 1,
    ) -> None:
        n_layers = model.n_dec_layers
        if layer is not None and not -n_layers <= layer < n_layers:
            raise ValueError(f"attention_layer={layer} outside the model's {n_layers} layers")
        self.model, self.src_tok, self.trg_tok = model, src_tok, trg_tok
        self.out_dir, self.layer = Path(out_dir), layer
        self.first_line = first_line  # the number of line index 0 (files: 1)
        if self.out_dir.exists() and not self.out_dir.is_dir():
            raise MTError(f"--attention-dir {out_dir} is a file; name a directory for the PNGs")
        self.out_dir.mkdir(parents=True, exist_ok=True)

    def __call__(self, lines: list[int], src: torch.Tensor, decoded: list[DecodeResult]) -> None:
        hyps = [res.nbest[0] for res in decoded]
        which = "mean of layers" if self.layer is None else f"layer {self.layer}"
        matrices = attention_matrices(self.model, src, hyps, self.layer)
        for line, hyp, ids, weights in zip(lines, hyps, src.tolist(), matrices, strict=True):
            src_pieces = self.src_tok.id_to_piece(ids[: weights.shape[1]])
            trg_pieces = self.trg_tok.id_to_piece([*hyp.tokens, EOS_ID][: weights.shape[0]])
            number = line + self.first_line
            title = f"line {number}, cross-attention, {which}, mean of heads"
            path = self.out_dir / f"{number:06d}.png"
            plot_attention(weights, src_pieces, trg_pieces, path, title)


class Alignments:
    """Collect the word alignment of each translated line.

    Collects the word alignment of each translated line (an ``on_batch`` callback, see
    :func:`transformer_mt.decoding.text.translate_texts`): of every n-best hypothesis, from one
    teacher-forced pass per batch (:func:`attention_matrices`, mean over heads; ``layer``: one
    decoder layer, negative counts from the end; None: the mean of all layers)."""

    def __init__(
        self,
        model: Transformer,
        src_tok: Tokenizer,
        trg_tok: Tokenizer,
        layer: int | None = None,
        units: str = "pieces",
        skip: int = 0,
    ) -> None:
        n_layers = model.n_dec_layers
        if layer is not None and not -n_layers <= layer < n_layers:
            raise ValueError(f"alignment layer={layer} outside the model's {n_layers} layers")
        self.skip = skip  # source positions before the user's text (a language tag): not aligned
        if units not in ALIGNMENT_UNITS:
            raise ValueError(f"alignment units {units!r}: expected one of {ALIGNMENT_UNITS}")
        self.model, self.src_tok, self.trg_tok = model, src_tok, trg_tok
        self.layer, self.units = layer, units
        self.by_line: dict[int, list[Alignment]] = {}  # line index -> one per n-best hypothesis

    def __call__(self, lines: list[int], src: torch.Tensor, decoded: list[DecodeResult]) -> None:
        counts = [len(res.nbest) for res in decoded]
        hyps = [hyp for res in decoded for hyp in res.nbest]
        rows = torch.repeat_interleave(torch.arange(len(decoded)), torch.tensor(counts))
        matrices = iter(attention_matrices(self.model, src[rows.to(src.device)], hyps, self.layer))
        for line, ids, res in zip(lines, src.tolist(), decoded, strict=True):
            found = []
            ids = ids[self.skip :]
            for hyp in res.nbest:
                weights = next(matrices)[:, self.skip :]
                n_src = weights.shape[1] - 1  # without the source's EOS
                pairs = alignment(weights, n_src, len(hyp.tokens))
                if self.units == "words" and pairs:
                    src_pieces = self.src_tok.id_to_piece(ids[:n_src])
                    pairs = to_words(pairs, src_pieces, self.trg_tok.id_to_piece(hyp.tokens))
                found.append(pairs)
            self.by_line[line] = found

    def per_line(self, n_lines: int, nbest: int) -> list[list[Alignment]]:
        """The alignments of each input line.

        One entry per input line, each ``nbest`` alignments (empty for a line that had
        nothing to translate)."""
        return [self.by_line.get(i, [[] for _ in range(nbest)]) for i in range(n_lines)]
