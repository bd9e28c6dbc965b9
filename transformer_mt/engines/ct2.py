"""Translate with a model exported by `mt export --format ctranslate2` (``--engine ct2``).

The line contract is the one of :func:`transformer_mt.decoding.text.translate_texts`: one result
per input line, in order, empty in -> empty out, over-long lines truncated with a warning. Each
sentence gets the same length budget as in our own search (``a + b * source length``, capped by the
position table), and batches are cut by the same token budget.
"""

import json
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from transformer_mt.config import DecodeConfig, config_from_dict
from transformer_mt.data.batching import longest_first_batches
from transformer_mt.data.languages import source_prefix, tag_ids
from transformer_mt.data.tokenizer import Tokenizer
from transformer_mt.decoding.text import Translation, encode_sources, keep_untranslatable
from transformer_mt.devices import resolve_device
from transformer_mt.errors import MTError

# The file an export carries beside CTranslate2's (written by transformer_mt.convert.ctranslate2):
# the run's decode settings, the export's source and the list of the files it wrote.
SETTINGS_FILE = "transformer_mt.json"


def import_ctranslate2() -> ModuleType:
    """The ctranslate2 module, or a one-line error saying how to install it."""
    try:
        import ctranslate2
    except ImportError as err:
        raise MTError(
            "a CTranslate2 model needs the ctranslate2 package: "
            "pip install 'transformer-mt[ct2]' (in a checkout: pip install -e '.[ct2]')"
        ) from err
    return ctranslate2


def read_settings(directory: Path) -> dict[str, Any]:
    """The settings file of the export in ``directory`` (a dict), or a one-line MTError."""
    path = Path(directory) / SETTINGS_FILE
    try:
        settings = json.loads(path.read_bytes())
    except (ValueError, UnicodeDecodeError):
        settings = None
    if not isinstance(settings, dict):
        raise MTError(f"{path} is not the settings of an export (not a JSON object); export again")
    return settings


@dataclass
class CT2Model:
    """An exported model directory, loaded: the translator, tokenizers and decode defaults."""

    translator: Any  # a ctranslate2.Translator (an optional extra, without type hints)
    src_tok: Tokenizer
    trg_tok: Tokenizer
    decode: DecodeConfig  # the run's decode settings, stored at export time
    max_len: int  # the position table: longest source and target
    pairs: list[tuple[str, str]] = field(default_factory=list)  # the language pairs it knows
    lang_tags: dict[str, str] = field(default_factory=dict)  # a multilingual model's tags

    def source_prefix(self, target: str | None) -> list[int]:
        """The tag ids that start every source asking for ``target``.

        See :func:`transformer_mt.data.languages.source_prefix`."""
        return source_prefix(self.src_tok, self.lang_tags, self.pairs, target)

    def never_emit(self) -> list[list[str]] | None:
        """The language tags as CTranslate2's ``suppress_sequences``.

        Suppressing them keeps tags out of every translation, as our search does; None where the
        target vocabulary has no tags."""
        ids = tag_ids(self.trg_tok, self.lang_tags)
        return [[self.trg_tok.id_to_piece([i])[0]] for i in ids] or None


def check_export_directory(directory: Path) -> None:
    """A one-line MTError unless ``directory`` holds an export's settings file."""
    if not (directory / SETTINGS_FILE).is_file():
        hint = (
            ": a checkpoint of `mt train` runs with --engine torch (an export is a directory; "
            "this file is not a directory)"
            if directory.is_file()
            else ""
        )
        raise MTError(
            f"{directory} is not a model exported by `mt export` (no {SETTINGS_FILE}){hint}"
        )


def load_ct2(directory: Path, device: str = "cpu", threads: int = 0) -> CT2Model:
    """Load a directory written by ``export_ctranslate2``.

    A one-line MTError for one that is not
    an export, or an export that was interrupted or whose settings file is damaged."""
    directory = Path(directory)
    dev = resolve_device(device, "--device")
    if dev.type not in ("cpu", "cuda"):
        raise MTError(f"--engine ct2 runs on cpu or cuda, not {dev.type}: use --engine torch")
    check_export_directory(directory)
    ctranslate2 = import_ctranslate2()
    settings = read_settings(directory)
    if settings.get("incomplete"):
        raise MTError(
            f"{directory} holds an export that was interrupted; run `mt export` into it again"
        )
    try:
        joint, max_len = bool(settings["joint_vocabulary"]), int(settings["max_len"])
        decode = config_from_dict({"decode": settings["decode"]}).decode
        # Exports from before multilingual models name one pair and no tags.
        pair = (str(settings.get("src_lang", "")), str(settings.get("trg_lang", "")))
        pairs = [(str(a), str(b)) for a, b in settings.get("pairs") or [pair]]
        lang_tags = {str(k): str(v) for k, v in (settings.get("lang_tags") or {}).items()}
    except (KeyError, TypeError, ValueError, MTError) as err:
        raise MTError(
            f"{directory / SETTINGS_FILE} is damaged ({type(err).__name__}: {err}); run `mt export` again"
        ) from None
    src_tok = Tokenizer((directory / "spm.src.model").read_bytes())
    trg_tok = src_tok if joint else Tokenizer((directory / "spm.trg.model").read_bytes())
    translator = ctranslate2.Translator(
        str(directory),
        device=dev.type,
        device_index=dev.index or 0,  # cuda:1 is GPU 1, not CTranslate2's default GPU 0
        inter_threads=1,
        intra_threads=threads,
    )
    return CT2Model(translator, src_tok, trg_tok, decode, max_len, pairs, lang_tags)


LogProbs = list[tuple[float, int]]
"""Per n-best hypothesis: its log-probability and the pieces it sums over (EOS where it ended)."""


def hypothesis_logprob(
    score: float, pieces: Sequence[str], limit: int, alpha: float
) -> tuple[float, int]:
    """A CTranslate2 hypothesis' log-probability and the pieces it sums over, from its score.

    CTranslate2's score (``return_scores``) is the sum of the log-probabilities of every piece it
    wrote, EOS included where the hypothesis ended with it, over ``n ** alpha`` (``alpha`` the
    ``length_penalty``), where ``n`` counts those same pieces, EOS included: it decodes with EOS in
    the hypothesis and strips it from ``pieces`` afterwards. A hypothesis ended with EOS unless
    it reached ``limit`` (the call's ``max_decoding_length``, which counts EOS)."""
    n = len(pieces) + int(len(pieces) < limit)
    return float(score) * n**alpha, n


def translate_lines_ct2(
    model: CT2Model,
    lines: list[str],
    decode: DecodeConfig,
    first_line: int = 1,
    src_prefix: Sequence[int] = (),
) -> list[Translation]:
    """Translate ``lines`` with CTranslate2; per line, ``decode.nbest`` (text, score) pairs.

    Batches are cut as ours are (longest first, ``decode.batch_tokens`` padded source tokens).
    CTranslate2 takes one length limit per call, and each sentence has its own (``a + b *
    source length``), so a batch runs to its longest sentence's limit. A sentence with a
    hypothesis as long as its own limit or longer (CTranslate2 counts EOS in the limit) is decoded
    again, with the sentences of the same limit, in a call of that limit: a cut beam could leave
    duplicate hypotheses with the scores of their longer versions, a cut greedy output the score
    of its longer version, and the translation would depend on the lines batched with it (a
    server batches other requests'). One call per limit in every batch
    would be exact in all cases but costs CTranslate2 about 6x in batches of 32 (a call has a
    fixed cost); what is left is a sentence whose beams outgrow its limit in the long call while
    every hypothesis returned still fits (rare: it needs a beam alive at its limit).
    ``first_line`` is the number warnings give ``lines[0]``; ``src_prefix`` (a multilingual
    model's target-language tag, :meth:`CT2Model.source_prefix`) starts every source. Scores are
    CTranslate2's: log-probability sums normalized by ``length ** len_penalty``, EOS counted in
    both (ours use GNMT's penalty), so they compare among one model's outputs only;
    :func:`translate_lines_ct2_logprobs` gives the log-probabilities themselves.
    """
    return [
        nbest
        for nbest, _ in translate_lines_ct2_logprobs(model, lines, decode, first_line, src_prefix)
    ]


def translate_lines_ct2_logprobs(
    model: CT2Model,
    lines: list[str],
    decode: DecodeConfig,
    first_line: int = 1,
    src_prefix: Sequence[int] = (),
) -> list[tuple[Translation, LogProbs | None]]:
    """:func:`translate_lines_ct2`, each line's n-best with its :data:`LogProbs`.

    From CTranslate2's scores (:func:`hypothesis_logprob`); None for a line not decoded (nothing
    to translate in it)."""
    if decode.sampling:
        raise MTError("--engine ct2 does not sample here; use --engine torch for --sample")
    logprobs: dict[int, LogProbs] = {}
    # CTranslate2 knows only the empty-line rule: lines with nothing to translate go to it blank
    # and come back as they are, as in our own line contract.
    results = keep_untranslatable(
        lines,
        decode.nbest,
        lambda todo: _translate(model, todo, decode, first_line, src_prefix, logprobs),
    )
    return [(nbest, logprobs.get(i)) for i, nbest in enumerate(results)]


def _translate(
    model: CT2Model,
    lines: list[str],
    decode: DecodeConfig,
    first_line: int,
    src_prefix: Sequence[int],
    logprobs: dict[int, LogProbs],
) -> list[Translation]:
    """:func:`translate_lines_ct2` of lines that each have something to translate, or nothing.

    It puts the :data:`LogProbs` of each line it decodes in ``logprobs``, by line index."""
    sources = encode_sources(model.src_tok, lines, model.max_len, first_line, src_prefix)
    line_of = list(sources)
    ids = list(sources.values())
    budgets = [
        min(max(math.floor(decode.max_len_a + decode.max_len_b * len(s)), 1), model.max_len)
        for s in ids
    ]
    results: list[Translation] = [[("", 0.0)] * decode.nbest for _ in lines]

    def run(group: list[int]) -> list[int]:
        """Decode ``group`` to its longest limit; the positions whose outputs reached their own."""
        # CTranslate2 appends EOS itself (add_source_eos): hand it the pieces without ours.
        call_limit = max(budgets[p] for p in group)
        outputs = model.translator.translate_batch(
            [model.src_tok.id_to_piece(ids[p][:-1]) for p in group],
            beam_size=decode.beam_size,
            num_hypotheses=decode.nbest,
            length_penalty=decode.len_penalty,
            max_decoding_length=call_limit,
            min_decoding_length=0,  # EOS may come first, as in our search (its default is 1)
            suppress_sequences=model.never_emit(),
            max_batch_size=len(group),
            return_scores=True,
        )
        again = []
        for p, output in zip(group, outputs, strict=True):
            # CTranslate2 counts EOS in the limit: a hypothesis as long as this sentence's own
            # limit may have ended with an EOS that its own call would not have allowed.
            if max(map(len, output.hypotheses)) >= budgets[p] and call_limit > budgets[p]:
                again.append(p)
            results[line_of[p]] = [
                (model.trg_tok.decode_pieces(hyp[: budgets[p]]), float(score))
                for hyp, score in zip(output.hypotheses, output.scores, strict=True)
            ]
            logprobs[line_of[p]] = [
                hypothesis_logprob(score, hyp, call_limit, decode.len_penalty)
                for hyp, score in zip(output.hypotheses, output.scores, strict=True)
            ]
        return again

    for batch in longest_first_batches([len(s) for s in ids], decode.batch_tokens):
        by_limit: dict[int, list[int]] = defaultdict(list)
        for p in run(batch.tolist()):
            by_limit[budgets[p]].append(p)
        for group in by_limit.values():
            run(group)  # each at its own limit: nothing outgrows it
    return results
