"""From a config to training-ready data: raw files -> clean -> sentencepiece -> binarized ids.

Every step is cached under ``data.cache_dir`` by a hash of its inputs and settings, so a second
``mt train`` or ``mt prepare`` with nothing changed reuses the tokenizer and the token ids, and any
change (a file's contents, a vocabulary size, a cleaning threshold) rebuilds what depends on it.

Memory stays bounded by the corpus's largest *sample*, never the corpus: the training files are
streamed once into sentencepiece (which keeps a uniform sample of ``input_sentence_size``
sentences) and once more into the binarized cache. Only the validation split is held in memory,
as text, for the BLEU that training reports.

Failure leaves nothing half-made: the small validation split is checked first (a bad line there
fails in a second, not after an hour of tokenizer training), the training files are read to the end
by the tokenizer training before any model file is written, and every file or directory of the
cache is written aside and renamed into place only when complete.

Processes that share the cache (runs started in parallel on a fresh machine) build each part of it
once: the one building it holds a lock beside it (:mod:`transformer_mt.data.locking`), the others
wait, then find it built and reuse it.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from transformer_mt.config import Config
from transformer_mt.data.binarized import (
    REPORT_FILE,
    BinarizedPair,
    build_binarized,
    cache_key,
    load_binarized,
)
from transformer_mt.data.corpus import CleanConfig, CleanReport, clean_parallel, iter_clean_pairs
from transformer_mt.data.locking import exclusive_lock, lock_path
from transformer_mt.data.sampling import SampledEpochs, SamplingSettings
from transformer_mt.data.sources import SplitFiles, corpus_files
from transformer_mt.data.tokenizer import EOS_ID, Tokenizer, TokenizerSettings
from transformer_mt.errors import MTError
from transformer_mt.fileio import write_text_atomic

log = logging.getLogger(__name__)

_ENCODE_CHUNK = 10_000  # sentences encoded per sentencepiece call (it runs them in parallel);
# with subword sampling, draws x pairs: it bounds the memory of one chunk's ids
# REPORT_FILE (imported above): beside a binarized split, its cleaning report, shown on reuse


@dataclass
class PreparedData:
    """The tokenizers, the binarized training and validation ids, and the raw validation text."""

    src_tok: Tokenizer
    trg_tok: Tokenizer
    train: BinarizedPair
    valid: BinarizedPair
    valid_src: list[str]  # cleaned validation text that tokenizes, translated for BLEU
    valid_trg: list[str]
    files: SplitFiles  # split -> (source file, target file)
    sampler: SampledEpochs | None = None  # tokenizer.sample_alpha > 0: each epoch's sampled ids


# --- sentencepiece --------------------------------------------------------------------------------


def _clean_cfg(cfg: Config) -> CleanConfig:
    return CleanConfig(
        max_words=cfg.data.max_words,
        max_ratio=cfg.data.max_ratio,
        skip_bad_lines=cfg.data.skip_bad_lines,
    )


def _clean_key(clean: CleanConfig) -> dict[str, Any]:
    """The cleaning settings as the cache keys hash them. ``max_words`` keeps its former name
    ``max_len`` here, so that caches built before the rename are still found."""
    settings = asdict(clean)
    settings["max_len"] = settings.pop("max_words")
    return settings


def _no_pairs_error(name: str, files: tuple[Path, Path], why: str) -> MTError:
    return MTError(
        f"{name} split ({files[0]} / {files[1]}) has no pairs left after {why}; check the data "
        "or loosen data.max_words / data.max_ratio / data.max_tokens_per_side"
    )


def _training_sentences(
    files: tuple[Path, Path], clean: CleanConfig, sides: tuple[int, ...]
) -> Iterator[str]:
    """Stream the cleaned training sentences of the given sides (0 = source, 1 = target).

    A joint vocabulary gets both sides of each pair, interleaved, so that sentencepiece's sample
    (when the corpus exceeds ``input_sentence_size``) keeps the two languages balanced.
    """
    n_pairs = 0
    for pair in iter_clean_pairs(files[0], files[1], clean):
        n_pairs += 1
        for side in sides:
            yield pair[side]
    if n_pairs == 0:
        raise _no_pairs_error("train", files, "cleaning")


def train_tokenizers(
    cfg: Config, train: tuple[Path, Path], train_key: str, cache: Path
) -> tuple[Tokenizer, Tokenizer]:
    """The (source, target) tokenizers: one joint model used twice, or two separate ones.

    Cached as ``spm-<key>-joint.model`` or ``spm-<key>-{src,trg}.model``, keyed by the training
    files' contents (``train_key``), the cleaning thresholds and the tokenizer settings.
    """
    tok_cfg = cfg.tokenizer
    settings = TokenizerSettings(tok_cfg.vocab_size, tok_cfg.model_type, tok_cfg.character_coverage)
    clean = _clean_cfg(cfg)
    key = cache_key(
        train_key,
        {"tokenizer": asdict(settings), "joint": tok_cfg.joint, "clean": _clean_key(clean)},
    )[:16]
    sides: list[tuple[str, tuple[int, ...]]] = (
        [("joint", (0, 1))] if tok_cfg.joint else [("src", (0,)), ("trg", (1,))]
    )
    paths = [cache / f"spm-{key}-{name}.model" for name, _ in sides]
    if not all(p.is_file() for p in paths):
        # Another process may be training the same models: wait for it, then look again.
        with exclusive_lock(cache / f"spm-{key}.lock"):
            if not all(p.is_file() for p in paths):
                toks = _train_and_save(train, clean, settings, sides, paths)
                return toks[0], toks[-1]
    log.info(f"tokenizer: reusing {', '.join(str(p) for p in paths)}")
    toks = [Tokenizer.load(p) for p in paths]
    return toks[0], toks[-1]


def _train_and_save(
    train: tuple[Path, Path],
    clean: CleanConfig,
    settings: TokenizerSettings,
    sides: list[tuple[str, tuple[int, ...]]],
    paths: list[Path],
) -> list[Tokenizer]:
    """Train one model per entry of ``sides`` (its name, the corpus sides it reads) on the
    cleaned training pairs, and save each to its path."""
    log.info(
        f"tokenizer: training sentencepiece ({settings.model_type}, vocab {settings.vocab_size}, "
        f"{'joint' if len(sides) == 1 else 'separate'}) on {train[0].name} / {train[1].name}"
    )
    # Streamed: sentencepiece keeps only a sample, so the corpus is never loaded whole. Both
    # models are trained before either is saved, so a bad line leaves no model behind.
    toks = [Tokenizer.train(_training_sentences(train, clean, idx), settings) for _, idx in sides]
    for tok, path in zip(toks, paths, strict=True):
        tok.save(path)  # atomic: a killed run leaves no half-written model to be reused
    return toks


# --- binarized ids --------------------------------------------------------------------------------


@dataclass
class _EncodeCount:
    kept: int = 0
    too_long: int = 0
    empty: int = 0  # a side that sentencepiece's normalization leaves without a single piece


def _fits(ids: list[int], max_tokens: int) -> bool:
    """Whether one side's ids, with the EOS (source) or BOS/EOS (target) that the model adds,
    make a usable side: at least one piece, at most ``max_tokens`` ids."""
    return 1 <= len(ids) <= max_tokens - 1


def _encoded_pairs(
    pairs: Iterator[tuple[str, str]],
    src_tok: Tokenizer,
    trg_tok: Tokenizer,
    max_tokens: int,
    count: _EncodeCount,
    sampling: SamplingSettings | None = None,
) -> Iterator[tuple[list[int], list[int]]]:
    """Source ids end with EOS; target ids are stored bare (the trainer adds BOS and EOS). Pairs
    with a side that encodes to no piece at all (text that sentencepiece's normalization removes:
    a zero-width space, control characters) or whose source + EOS or target + BOS/EOS exceed
    ``max_tokens`` are dropped and counted.

    With ``sampling``, each kept pair is yielded ``sampling.draws`` times, in sampled
    segmentations; a sampled side that is empty or over the limit is replaced by that side's best
    segmentation. Which pairs are kept depends on the best segmentations only.
    """
    draws = sampling.draws if sampling else 1
    while chunk := list(itertools.islice(pairs, max(1, _ENCODE_CHUNK // draws))):
        src_texts, trg_texts = [src for src, _ in chunk], [trg for _, trg in chunk]
        src_best, trg_best = src_tok.encode_batch(src_texts), trg_tok.encode_batch(trg_texts)
        samples = []  # per draw: every pair's sampled (source ids, target ids)
        if sampling is not None:
            alpha, nbest = sampling.alpha, sampling.nbest
            samples = [
                (
                    src_tok.sample_batch(src_texts, alpha, nbest),
                    trg_tok.sample_batch(trg_texts, alpha, nbest),
                )
                for _ in range(draws)
            ]
        for i, (src_ids, trg_ids) in enumerate(zip(src_best, trg_best, strict=True)):
            if not src_ids or not trg_ids:
                count.empty += 1
                continue
            if not (_fits(src_ids, max_tokens) and _fits(trg_ids, max_tokens)):
                count.too_long += 1
                continue
            count.kept += 1
            if sampling is None:
                yield [*src_ids, EOS_ID], trg_ids
            for src_draw, trg_draw in samples:
                src_sampled = src_draw[i] if _fits(src_draw[i], max_tokens) else src_ids
                trg_sampled = trg_draw[i] if _fits(trg_draw[i], max_tokens) else trg_ids
                yield [*src_sampled, EOS_ID], trg_sampled


def binarize_split(
    cfg: Config,
    files: tuple[Path, Path],
    files_key: str,
    src_tok: Tokenizer,
    trg_tok: Tokenizer,
    name: str,
    sampling: SamplingSettings | None = None,
) -> BinarizedPair:
    """The cached token ids of one split, built (streaming, atomically) when missing or stale.

    ``files_key`` is :func:`cache_key` of the two files (computed once by the caller: hashing a
    large corpus takes a while). The split's cleaning report is logged when it is built, and
    kept beside the ids to be logged again when the cache is reused. With ``sampling``, the
    cache holds ``sampling.draws`` sampled segmentations of each pair instead of its best one.
    """
    settings: dict[str, Any] = {
        "clean": _clean_key(_clean_cfg(cfg)),
        "max_tokens": cfg.data.max_tokens_per_side,
        # Caches built before pairs with an empty side were dropped may hold some: another key.
        "drop_empty_sides": True,
    }
    if sampling is not None:
        settings["sampling"] = asdict(sampling)
    key = cache_key(files_key, src_tok.model_proto, trg_tok.model_proto, settings)
    out = Path(cfg.data.cache_dir) / f"{cfg.name}-{name}"
    cached = load_binarized(out, key)
    if cached is None:
        # Another process may be building the same split (runs started in parallel on one
        # cache): one builds it under the lock, the others wait, then find it built.
        with exclusive_lock(lock_path(out)):
            cached = load_binarized(out, key)
            if cached is None:
                return _build_split(cfg, files, out, key, (src_tok, trg_tok), name, sampling)
    report_path = out / REPORT_FILE
    stored = report_path.read_text(encoding="utf-8") if report_path.is_file() else ""
    log.info(f"{name}: reusing {out} ({len(cached):,} pairs; inputs and settings unchanged)")
    if stored:
        log.info("  " + stored.rstrip("\n").replace("\n", "\n  "))
    return cached


def _build_split(
    cfg: Config,
    files: tuple[Path, Path],
    out: Path,
    key: str,
    toks: tuple[Tokenizer, Tokenizer],
    name: str,
    sampling: SamplingSettings | None,
) -> BinarizedPair:
    """Clean, encode and binarize one split into ``out``, then write and log its report."""
    clean = _clean_cfg(cfg)
    max_tokens = cfg.data.max_tokens_per_side
    src_tok, trg_tok = toks
    report = CleanReport()
    count = _EncodeCount()

    def pairs() -> Iterator[tuple[list[int], list[int]]]:
        texts = iter_clean_pairs(files[0], files[1], clean, report)
        yield from _encoded_pairs(texts, src_tok, trg_tok, max_tokens, count, sampling)
        # Raised inside the stream, so build_binarized discards the build: no empty cache.
        if count.kept == 0:
            raise _no_pairs_error(
                name, files, f"cleaning, tokenization and the {max_tokens}-token limit"
            )

    data = build_binarized(out, key, pairs(), max(src_tok.vocab_size, trg_tok.vocab_size))
    lines = [f"{files[0]} / {files[1]}", *report.format().splitlines()]
    if count.empty:
        lines.append(f"dropped {count.empty:,} pairs with a side empty after subword tokenization")
    if count.too_long:
        lines.append(f"dropped {count.too_long:,} pairs over {max_tokens} subword tokens a side")
    n_src, n_trg = data.n_tokens
    if sampling is None:
        lines.append(f"-> {len(data):,} pairs, {n_src:,} / {n_trg:,} tokens, in {out}")
    else:
        n_draws = sampling.draws
        lines.append(
            f"-> {len(data) // n_draws:,} pairs x {n_draws} sampled segmentations, "
            f"{n_src // n_draws:,} / {n_trg // n_draws:,} tokens per draw, in {out}"
        )
    text = "\n".join(lines) + "\n"
    write_text_atomic(out / REPORT_FILE, text)
    log.info(f"{name}: " + text.rstrip("\n").replace("\n", "\n  "))
    return data


# --- all of it --------------------------------------------------------------------------------


def _tokenizable(
    srcs: list[str], trgs: list[str], src_tok: Tokenizer, trg_tok: Tokenizer, max_tokens: int
) -> tuple[list[str], list[str]]:
    """The pairs that the binarized split keeps (:func:`_fits`: no empty side, none longer than
    ``max_tokens``): validation BLEU is scored on the pairs the validation loss is, sources and
    references alike."""
    keep = [
        _fits(src_ids, max_tokens) and _fits(trg_ids, max_tokens)
        for src_ids, trg_ids in zip(
            src_tok.encode_batch(srcs), trg_tok.encode_batch(trgs), strict=True
        )
    ]
    return (
        [s for s, k in zip(srcs, keep, strict=True) if k],
        [t for t, k in zip(trgs, keep, strict=True) if k],
    )


def prepare(cfg: Config, progress: bool = True) -> PreparedData:
    """Everything training needs, reusing the caches when nothing changed.

    Progress goes to the ``transformer_mt.data`` loggers (INFO); ``progress`` shows download bars.
    The data source is checked first (:func:`transformer_mt.data.sources.check_source`).

    Raises:
        MTError: a file is missing or bad (naming the file and line), a split is empty after
            cleaning, or a download fails. Nothing half-written is left in the cache.
    """
    files = corpus_files(cfg, progress)
    clean = _clean_cfg(cfg)
    # Validation first: it is small, it is needed in memory anyway (for BLEU), and a bad line in it
    # should fail before the long tokenizer training rather than after.
    valid_src, valid_trg, valid_report = clean_parallel(*files["valid"], clean)
    if valid_report.kept == 0:
        raise _no_pairs_error("valid", files["valid"], "cleaning")
    keys = {split: cache_key(*files[split]) for split in ("train", "valid")}
    cache = Path(cfg.data.cache_dir)
    src_tok, trg_tok = train_tokenizers(cfg, files["train"], keys["train"], cache)
    train = binarize_split(cfg, files["train"], keys["train"], src_tok, trg_tok, "train")
    valid = binarize_split(cfg, files["valid"], keys["valid"], src_tok, trg_tok, "valid")
    valid_src, valid_trg = _tokenizable(
        valid_src, valid_trg, src_tok, trg_tok, cfg.data.max_tokens_per_side
    )
    tok_cfg = cfg.tokenizer
    sampler = None
    if tok_cfg.sample_alpha > 0:
        sampling = SamplingSettings(
            tok_cfg.sample_alpha, tok_cfg.sample_nbest, tok_cfg.sample_draws
        )
        draws = binarize_split(
            cfg, files["train"], keys["train"], src_tok, trg_tok, "train-sampled", sampling
        )
        sampler = SampledEpochs(draws, sampling.draws, cfg.train.seed)
        if sampler.n_pairs != len(train):  # the same cleaning and limit keep the same pairs
            raise MTError(
                f"{draws.path} holds {sampler.n_pairs:,} pairs, {train.path} {len(train):,}; "
                "delete both and run again"
            )
    return PreparedData(src_tok, trg_tok, train, valid, valid_src, valid_trg, files, sampler)
