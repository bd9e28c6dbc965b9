"""Translate with a model exported by `mt export --format ctranslate2` (``--engine ct2``).

The line contract is the one of :func:`transformer_mt.decoding.text.translate_texts`: one result
per input line, in order, empty in -> empty out, over-long lines truncated with a warning. Each
sentence gets the same length budget as in our own search (``a + b * source length``, capped by the
position table): sentences are grouped by their budget, which CTranslate2 takes per call.
"""

import json
import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from transformer_mt.config import DecodeConfig, config_from_dict
from transformer_mt.data.tokenizer import Tokenizer
from transformer_mt.decoding.text import Translation, encode_sources
from transformer_mt.errors import MTError
from transformer_mt.inference.export import SETTINGS_FILE, import_ctranslate2
from transformer_mt.inference.loading import check_device


@dataclass
class CT2Model:
    """An exported model directory, loaded: the translator, tokenizers and decode defaults."""

    translator: object  # ctranslate2.Translator
    src_tok: Tokenizer
    trg_tok: Tokenizer
    decode: DecodeConfig  # the run's decode settings, stored at export time
    max_len: int  # the position table: longest source and target


def load_ct2(directory: Path, device: str = "cpu", threads: int = 0) -> CT2Model:
    """Load a directory written by ``export_ctranslate2``."""
    directory = Path(directory)
    device_type = check_device(device).type  # CTranslate2 takes "cpu" or "cuda"
    settings_path = directory / SETTINGS_FILE
    if not settings_path.is_file():
        raise MTError(f"{directory} is not a model exported by `mt export` (no {SETTINGS_FILE})")
    ctranslate2 = import_ctranslate2()
    settings = json.loads(settings_path.read_text(encoding="utf-8"))
    src_tok = Tokenizer((directory / "spm.src.model").read_bytes())
    trg_tok = (
        src_tok
        if settings["joint_vocabulary"]
        else Tokenizer((directory / "spm.trg.model").read_bytes())
    )
    translator = ctranslate2.Translator(
        str(directory), device=device_type, inter_threads=1, intra_threads=threads
    )
    decode = config_from_dict({"decode": settings["decode"]}).decode
    return CT2Model(translator, src_tok, trg_tok, decode, int(settings["max_len"]))


def translate_lines_ct2(
    model: CT2Model, lines: list[str], decode: DecodeConfig
) -> list[Translation]:
    """Translate ``lines`` with CTranslate2; per line, ``decode.nbest`` (text, score) pairs.

    Scores are CTranslate2's: log-probability sums normalized by ``length ** len_penalty``
    (ours use GNMT's penalty), so they are comparable among one model's outputs only.
    """
    if decode.sampling:
        raise MTError("--engine ct2 does not sample here; use --engine torch for --sample")
    sources = encode_sources(model.src_tok, lines, model.max_len)
    results: list[Translation] = [[("", 0.0)] * decode.nbest for _ in lines]
    by_budget: dict[int, list[int]] = defaultdict(list)
    for i, ids in sources.items():
        budget = math.floor(decode.max_len_a + decode.max_len_b * len(ids))
        by_budget[min(max(budget, 1), model.max_len)].append(i)
    for budget, indices in sorted(by_budget.items()):
        # CTranslate2 appends EOS itself (add_source_eos): hand it the pieces without ours.
        pieces = [model.src_tok.id_to_piece(sources[i][:-1]) for i in indices]
        outputs = model.translator.translate_batch(
            pieces,
            beam_size=decode.beam_size,
            num_hypotheses=decode.nbest,
            length_penalty=decode.len_penalty,
            max_decoding_length=budget,
            max_batch_size=decode.batch_tokens,
            batch_type="tokens",
            return_scores=True,
        )
        for i, output in zip(indices, outputs, strict=True):
            results[i] = [
                (model.trg_tok.sp.decode_pieces(hyp), float(score))
                for hyp, score in zip(output.hypotheses, output.scores, strict=True)
            ]
    return results
