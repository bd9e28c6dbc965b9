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

import dataclasses
import itertools
import logging
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from transformer_mt.config import Config
from transformer_mt.data.binarized import (
    REPORT_FILE,
    BinarizedPair,
    build_binarized,
    cache_key,
    load_binarized,
)
from transformer_mt.data.corpus import CleanConfig, CleanReport, clean_parallel, iter_clean_pairs
from transformer_mt.data.extract import SplitSource
from transformer_mt.data.languages import pair_name, target_tags, training_pairs
from transformer_mt.data.locking import exclusive_lock, lock_path
from transformer_mt.data.mixing import MixedCorpus
from transformer_mt.data.sampling import SampledEpochs, SamplingSettings
from transformer_mt.data.sources import SplitFiles, for_pair, split_sources
from transformer_mt.data.tokenizer import EOS_ID, Tokenizer, TokenizerSettings
from transformer_mt.errors import MTError
from transformer_mt.fileio import write_text_atomic

log = logging.getLogger(__name__)

_ENCODE_CHUNK = 10_000  # sentences encoded per sentencepiece call (it runs them in parallel);
# with subword sampling, draws x pairs: it bounds the memory of one chunk's ids
# REPORT_FILE (imported above): beside a binarized split, its cleaning report, shown on reuse


@dataclass
class ValidSet:
    """One language pair's validation data: binarized ids and the text its BLEU is scored on."""

    name: str  # the pair, "de-en"
    data: BinarizedPair
    src: list[str]  # cleaned validation text that tokenizes, translated for BLEU
    trg: list[str]
    prefix: tuple[int, ...] = ()  # the target-language tag that starts each source, if any


@dataclass
class PreparedData:
    """The tokenizers, the binarized training and validation ids, and the raw validation text."""

    src_tok: Tokenizer
    trg_tok: Tokenizer
    train: BinarizedPair | MixedCorpus  # several (or weighted) sources: a MixedCorpus
    valid: BinarizedPair
    valid_src: list[str]  # cleaned validation text that tokenizes, translated for BLEU
    valid_trg: list[str]
    files: SplitFiles  # split -> (source file, target file); the first of several train sources
    sampler: SampledEpochs | MixedCorpus | None = None  # what each epoch reads, when it is not
    # all of `train` once: sampled segmentations (tokenizer.sample_alpha > 0) or weighted sources
    valid_sets: list[ValidSet] = field(default_factory=list)  # one per language pair (the first
    # is valid / valid_src / valid_trg); empty = that one set alone
    lang_tags: dict[str, str] = field(default_factory=dict)  # target language -> its tag piece,
    # when the model has several target languages


def temperature_weights(
    sizes: list[int], weights: list[float], pairs: list[tuple[str, str]], temperature: float
) -> list[float]:
    """Each source's weight once the language pairs are sampled by temperature.

    Pair k holds p_k of the epoch at T = 1 (its sources' weight x size over all of them); at
    temperature T it gets q_k = p_k^(1/T) / sum_j p_j^(1/T) of the same epoch size, shared among
    its sources as before: a source's weight is scaled by q_k / p_k. T = 1 changes nothing.
    """
    mass = [w * n for w, n in zip(weights, sizes, strict=True)]
    total = sum(mass)
    share = {pair: 0.0 for pair in pairs}
    for pair, m in zip(pairs, mass, strict=True):
        share[pair] += m / total
    flat = {pair: p ** (1.0 / temperature) for pair, p in share.items()}
    norm = sum(flat.values())
    return [w * (flat[pair] / norm) / share[pair] for w, pair in zip(weights, pairs, strict=True)]


def one_pair(cfg: Config, split: str, sources: list[SplitSource]) -> tuple[Path, Path]:
    """The text pair of a split.

    Its one source's, or (valid, test) its sources' pairs read
    one after the other into one pair in the cache; a train split of several gives its first."""
    if len(sources) == 1 or split == "train":
        return sources[0].files
    from transformer_mt.data.limits import ReadLimits
    from transformer_mt.data.readers import Location, iter_text_pairs, write_pairs

    key = cache_key(*(p for s in sources for p in s.files))[:16]
    out = Path(cfg.data.cache_dir) / "sources" / f"{split}-joined-{key}"
    files = (out / f"{split}.{cfg.data.src_lang}", out / f"{split}.{cfg.data.trg_lang}")
    if not all(p.is_file() for p in files):
        out.mkdir(parents=True, exist_ok=True)
        with exclusive_lock(out / "extract.lock"):
            if not all(p.is_file() for p in files):
                limits = ReadLimits.of(cfg.data)
                pairs = itertools.chain.from_iterable(
                    iter_text_pairs(Location(s.files[0]), Location(s.files[1]), limits=limits)
                    for s in sources
                )
                write_pairs(pairs, *files)
    return files


def _mix_line(train: MixedCorpus, i: int) -> str:
    """``europarl 1,234 pairs x 0.5 = 617 an epoch``: one source of the mix, for the log."""
    return (
        f"{train.labels[i]} {len(train.parts[i]):,} pairs x {train.weights[i]:g} = "
        f"{train.counts()[i]:,} an epoch"
    )


# --- sentencepiece --------------------------------------------------------------------------------


def _clean_cfg(cfg: Config) -> CleanConfig:
    return CleanConfig(
        max_words=cfg.data.max_words,
        max_ratio=cfg.data.max_ratio,
        skip_bad_lines=cfg.data.skip_bad_lines,
        max_line_bytes=cfg.data.max_line_bytes,
    )


def _clean_key(clean: CleanConfig) -> dict[str, Any]:
    """The cleaning settings as the cache keys hash them.

    ``max_words`` keeps its former name ``max_len`` here, so that caches built before the rename are
    still found. ``max_line_bytes`` is left out: a bound on reading, it changes no output."""
    settings = asdict(clean)
    settings["max_len"] = settings.pop("max_words")
    del settings["max_line_bytes"]
    return settings


def _no_pairs_error(name: str, files: tuple[Path, Path], why: str) -> MTError:
    return MTError(
        f"{name} split ({files[0]} / {files[1]}) has no pairs left after {why}; check the data "
        "or loosen data.max_words / data.max_ratio / data.max_tokens_per_side"
    )


def _training_sentences(
    sources: list[SplitSource], clean: CleanConfig, sides: tuple[int, ...]
) -> Iterator[str]:
    """Stream the cleaned training sentences of the given sides (0 = source, 1 = target).

    A joint vocabulary gets both sides of each pair, interleaved, so that sentencepiece's sample
    (when the corpus exceeds ``input_sentence_size``) keeps the two languages balanced. Several
    sources are streamed one after the other, each pair as often as its source's weight says
    (weight 2: twice; 0.5: with probability one half, from a fixed seed), so that
    sentencepiece's uniform sample of the stream is a weighted sample of the sources.
    """
    rng = np.random.default_rng(0x5EED)
    for source in sources:
        whole, frac = divmod(source.weight, 1.0)
        n_pairs = 0
        for pair in iter_clean_pairs(source.files[0], source.files[1], clean):
            n_pairs += 1
            for _ in range(int(whole) + (frac > 0 and rng.random() < frac)):
                for side in sides:
                    yield pair[side]
        if n_pairs == 0:
            raise _no_pairs_error(_split_name("train", sources, source), source.files, "cleaning")


def _split_name(split: str, sources: list[SplitSource], source: SplitSource) -> str:
    """``train`` for a split of one source, ``train source europarl`` for one of several."""
    return split if len(sources) == 1 else f"{split} source {source.label}"


def train_tokenizers(
    cfg: Config, train: list[SplitSource], train_key: str, cache: Path, tags: tuple[str, ...] = ()
) -> tuple[Tokenizer, Tokenizer]:
    """The (source, target) tokenizers: one joint model used twice, or two separate ones.

    Cached as ``spm-<key>-joint.model`` or ``spm-<key>-{src,trg}.model``, keyed by the training
    sources' contents and weights (``train_key``), the cleaning thresholds and the tokenizer
    settings. ``tags`` (a multilingual model's target-language tags) become whole pieces of the
    model that reads sources.
    """
    tok_cfg = cfg.tokenizer
    settings = TokenizerSettings(
        tok_cfg.vocab_size, tok_cfg.model_type, tok_cfg.character_coverage, user_symbols=tags
    )
    clean = _clean_cfg(cfg)
    described = asdict(settings)
    if not tags:  # the key of a model without tags is the one it always had
        del described["user_symbols"]
    key = cache_key(
        train_key, {"tokenizer": described, "joint": tok_cfg.joint, "clean": _clean_key(clean)}
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
    train: list[SplitSource],
    clean: CleanConfig,
    settings: TokenizerSettings,
    sides: list[tuple[str, tuple[int, ...]]],
    paths: list[Path],
) -> list[Tokenizer]:
    """Train and save one sentencepiece model per entry of ``sides``.

    Train one model per entry of ``sides`` (its name, the corpus sides it reads) on the
    cleaned training pairs, and save each to its path."""
    on = ", ".join(f"{s.files[0].name} / {s.files[1].name}" for s in train)
    log.info(
        f"tokenizer: training sentencepiece ({settings.model_type}, vocab {settings.vocab_size}, "
        f"{'joint' if len(sides) == 1 else 'separate'}) on {on}"
    )
    # Streamed: sentencepiece keeps only a sample, so the corpus is never loaded whole. Both
    # models are trained before either is saved, so a bad line leaves no model behind.
    no_tags = dataclasses.replace(settings, user_symbols=())  # a separate target vocabulary
    toks = [
        Tokenizer.train(
            _training_sentences(train, clean, idx), no_tags if name == "trg" else settings
        )
        for name, idx in sides
    ]
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
    """Whether one side's ids make a usable side for the model.

    With the EOS (source) or BOS/EOS (target) that the model adds, a usable side has at least one
    piece and at most ``max_tokens`` ids."""
    return 1 <= len(ids) <= max_tokens - 1


def _encoded_pairs(
    pairs: Iterator[tuple[str, str]],
    src_tok: Tokenizer,
    trg_tok: Tokenizer,
    max_tokens: int,
    count: _EncodeCount,
    sampling: SamplingSettings | None = None,
    src_prefix: tuple[int, ...] = (),
) -> Iterator[tuple[list[int], list[int]]]:
    """Source ids end with EOS; target ids are stored bare (the trainer adds BOS and EOS).

    Pairs with a side that encodes to no piece at all (text that sentencepiece's normalization
    removes: a zero-width space, control characters) or whose source + EOS or target + BOS/EOS
    exceed ``max_tokens`` are dropped and counted.

    With ``sampling``, each kept pair is yielded ``sampling.draws`` times, in sampled
    segmentations; a sampled side that is empty or over the limit is replaced by that side's best
    segmentation. Which pairs are kept depends on the best segmentations only. ``src_prefix``
    (a multilingual model's target-language tag) starts every source and counts in its limit.
    """
    draws = sampling.draws if sampling else 1
    src_max = max_tokens - len(src_prefix)
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
            if not (_fits(src_ids, src_max) and _fits(trg_ids, max_tokens)):
                count.too_long += 1
                continue
            count.kept += 1
            if sampling is None:
                yield [*src_prefix, *src_ids, EOS_ID], trg_ids
            for src_draw, trg_draw in samples:
                src_sampled = src_draw[i] if _fits(src_draw[i], src_max) else src_ids
                trg_sampled = trg_draw[i] if _fits(trg_draw[i], max_tokens) else trg_ids
                yield [*src_prefix, *src_sampled, EOS_ID], trg_sampled


def binarize_split(
    cfg: Config,
    files: tuple[Path, Path],
    files_key: str,
    src_tok: Tokenizer,
    trg_tok: Tokenizer,
    name: str,
    sampling: SamplingSettings | None = None,
    src_prefix: tuple[int, ...] = (),
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
    if src_prefix:
        settings["src_prefix"] = list(src_prefix)
    key = cache_key(files_key, src_tok.model_proto, trg_tok.model_proto, settings)
    out = Path(cfg.data.cache_dir) / f"{cfg.name}-{name}"
    cached = load_binarized(out, key)
    if cached is None:
        # Another process may be building the same split (runs started in parallel on one
        # cache): one builds it under the lock, the others wait, then find it built.
        with exclusive_lock(lock_path(out)):
            cached = load_binarized(out, key)
            if cached is None:
                toks = (src_tok, trg_tok)
                return _build_split(cfg, files, out, key, toks, name, sampling, src_prefix)
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
    src_prefix: tuple[int, ...] = (),
) -> BinarizedPair:
    """Clean, encode and binarize one split into ``out``, then write and log its report."""
    clean = _clean_cfg(cfg)
    max_tokens = cfg.data.max_tokens_per_side
    src_tok, trg_tok = toks
    report = CleanReport()
    count = _EncodeCount()

    def pairs() -> Iterator[tuple[list[int], list[int]]]:
        texts = iter_clean_pairs(files[0], files[1], clean, report)
        yield from _encoded_pairs(texts, src_tok, trg_tok, max_tokens, count, sampling, src_prefix)
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
    srcs: list[str],
    trgs: list[str],
    src_tok: Tokenizer,
    trg_tok: Tokenizer,
    max_tokens: int,
    src_prefix: tuple[int, ...] = (),
) -> tuple[list[str], list[str]]:
    """The pairs that a binarized split keeps.

    The pairs that the binarized split keeps (:func:`_fits`: no empty side, none longer than
    ``max_tokens``): validation BLEU is scored on the pairs the validation loss is, sources and
    references alike."""
    keep = [
        _fits(src_ids, max_tokens - len(src_prefix)) and _fits(trg_ids, max_tokens)
        for src_ids, trg_ids in zip(
            src_tok.encode_batch(srcs), trg_tok.encode_batch(trgs), strict=True
        )
    ]
    return (
        [s for s, k in zip(srcs, keep, strict=True) if k],
        [t for t, k in zip(trgs, keep, strict=True) if k],
    )


def _tokenizer_sources(
    cfg: Config, sources: list[SplitSource], keys: list[str]
) -> tuple[list[SplitSource], list[str]]:
    """The training sources that sentencepiece learns from, with their cache keys.

    The training sources sentencepiece learns from (``tokenizer.train_on``; all by default),
    with their cache keys."""
    names = cfg.tokenizer.train_on
    if names is None:
        return sources, keys
    labels = [s.label for s in sources]
    unknown = [n for n in names if n not in labels]
    if unknown or not names:
        raise MTError(
            f"tokenizer.train_on names {unknown or 'no source'}; the training sources are "
            f"{', '.join(labels)}"
        )
    chosen = [i for i, s in enumerate(sources) if s.label in names]
    return [sources[i] for i in chosen], [keys[i] for i in chosen]


def _mixed_train(
    cfg: Config,
    sources: list[SplitSource],
    keys: list[str],
    tokenizers: tuple[Tokenizer, Tokenizer],
    prefixes: dict[str, tuple[int, ...]],
) -> MixedCorpus:
    """The training sources binarized one by one and mixed by their weights.

    Each training source binarized into its own cache entry (its sources starting with their
    target's tag, when there are several targets), mixed by the sources' weights and, across
    language pairs, ``data.temperature``."""
    parts = []
    for s, key in zip(sources, keys, strict=True):
        prefix = prefixes.get(s.pair[1], ()) if s.pair else ()
        name = f"train.{s.label}"
        parts.append(binarize_split(cfg, s.files, key, *tokenizers, name, src_prefix=prefix))
    pairs = [s.pair or (cfg.data.src_lang, cfg.data.trg_lang) for s in sources]
    weights = temperature_weights(
        [len(p) for p in parts], [s.weight for s in sources], pairs, cfg.data.temperature
    )
    train = MixedCorpus(parts, weights, cfg.train.seed, [s.label for s in sources])
    log.info("train: " + ", ".join(_mix_line(train, i) for i in range(len(parts))))
    return train


def _sampled_epochs(
    cfg: Config,
    files: tuple[Path, Path],
    key: str,
    train: BinarizedPair,
    toks: tuple[Tokenizer, Tokenizer],
    prefix: tuple[int, ...] = (),
) -> SampledEpochs | None:
    """The cached subword-sampling draws of each pair, when sampling is on.

    With subword sampling (tokenizer.sample_alpha > 0), the cached draws of each pair (each
    source starting with ``prefix``, a fine-tuned multilingual model's tag)."""
    tok_cfg = cfg.tokenizer
    if tok_cfg.sample_alpha <= 0:
        return None
    sampling = SamplingSettings(tok_cfg.sample_alpha, tok_cfg.sample_nbest, tok_cfg.sample_draws)
    draws = binarize_split(cfg, files, key, *toks, "train-sampled", sampling, prefix)
    sampler = SampledEpochs(draws, sampling.draws, cfg.train.seed)
    if sampler.n_pairs != len(train):  # the same cleaning and limit keep the same pairs
        raise MTError(
            f"{draws.path} holds {sampler.n_pairs:,} pairs, {train.path} {len(train):,}; "
            "delete both and run again"
        )
    return sampler


def prepare(
    cfg: Config,
    progress: bool = True,
    tokenizers: tuple[Tokenizer, Tokenizer] | None = None,
    tags: dict[str, str] | None = None,
) -> PreparedData:
    """Everything training needs, reusing the caches when nothing changed.

    Progress goes to the ``transformer_mt.data`` loggers (INFO); ``progress`` shows download bars.
    The data source is checked first (:func:`transformer_mt.data.sources.check_source`).

    Several training sources are cleaned, encoded and binarized one by one, each into its own
    cache entry (``<name>-train.<label>``), and mixed by their weights (and, across language
    pairs, ``data.temperature``) each epoch (:class:`transformer_mt.data.mixing.MixedCorpus`).
    Validation sources are read as one set per language pair; test sources as one set.

    ``tokenizers`` (source, target), when given, encode the data instead of tokenizers trained
    on it: a fine-tuned model keeps the vocabulary it was trained with. ``tags`` (target
    language -> tag), when given, are the language tags such a model was trained with: its
    sources start with them even where the config has a single target.

    Raises:
        MTError: a file is missing or bad (naming the file and line), a split is empty after
            cleaning, or a download fails. Nothing half-written is left in the cache.
    """
    sources = split_sources(cfg, progress)
    # Validation first: it is small, it is needed in memory anyway (for BLEU), and a bad line in it
    # should fail before the long tokenizer training rather than after.
    valid_texts = _valid_texts(cfg, sources["valid"])
    files = {
        split: one_pair(cfg, split, listed) for split, listed in sources.items() if split != "valid"
    }
    files["valid"] = next(iter(valid_texts.values()))[0]
    tags = _checked_tags(cfg, tags)
    train_sources = sources["train"]
    train_keys = [cache_key(*s.files) for s in train_sources]
    mixed = len(train_sources) > 1 or train_sources[0].weight != 1.0
    if mixed and cfg.tokenizer.sample_alpha > 0:
        raise MTError(
            "tokenizer.sample_alpha (subword sampling) works with one training source of "
            "weight 1; set it to 0 or list one source"
        )
    if tokenizers is None:
        tokenizers = _tokenizers(cfg, train_sources, train_keys, mixed, tuple(tags.values()))
    prefixes = _tag_ids(tokenizers[0], tags)
    train: BinarizedPair | MixedCorpus
    if mixed:
        train = _mixed_train(cfg, train_sources, train_keys, tokenizers, prefixes)
        sampler: SampledEpochs | MixedCorpus | None = train
    else:
        train, sampler = _single_train(cfg, train_sources[0], train_keys[0], tokenizers, prefixes)
    sets = [
        _valid_set(
            cfg, pair, pair_files, texts, tokenizers, prefixes.get(pair[1], ()), len(valid_texts)
        )
        for pair, (pair_files, texts) in valid_texts.items()
    ]
    first = sets[0]
    return PreparedData(
        *tokenizers, train, first.data, first.src, first.trg, files, sampler, sets, tags
    )


def _checked_tags(cfg: Config, tags: dict[str, str] | None) -> dict[str, str]:
    """The target-language tags, checked against the trained targets.

    The target-language tags: ``tags`` (a fine-tuned model's) or the config's; an MTError
    when a trained target has none (a model cannot learn to translate into it)."""
    tags = target_tags(cfg.data) if tags is None else tags
    untagged = sorted({trg for _, trg in training_pairs(cfg.data)} - set(tags)) if tags else []
    if untagged:
        raise MTError(
            f"the model has language tags for {', '.join(sorted(tags))}, not for "
            f"{', '.join(untagged)}: it cannot be trained to translate into those"
        )
    return tags


def _single_train(
    cfg: Config,
    only: SplitSource,
    key: str,
    tokenizers: tuple[Tokenizer, Tokenizer],
    prefixes: dict[str, tuple[int, ...]],
) -> tuple[BinarizedPair, SampledEpochs | None]:
    """The binarized pairs of one training source of weight 1.

    One training source of weight 1: its binarized pairs and, with subword sampling, their
    cached draws."""
    prefix = prefixes.get((only.pair or (cfg.data.src_lang, cfg.data.trg_lang))[1], ())
    # A listed source keeps the cache entry it has when sources are added: train.<label>.
    name = "train" if cfg.data.train is None else f"train.{only.label}"
    train = binarize_split(cfg, only.files, key, *tokenizers, name, src_prefix=prefix)
    return train, _sampled_epochs(cfg, only.files, key, train, tokenizers, prefix)


def _tokenizers(
    cfg: Config, sources: list[SplitSource], keys: list[str], mixed: bool, tags: tuple[str, ...]
) -> tuple[Tokenizer, Tokenizer]:
    """The tokenizers trained on the sources (or those ``tokenizer.train_on`` names)."""
    tok_sources, tok_keys = _tokenizer_sources(cfg, sources, keys)
    pairs = [[k, s.weight] for k, s in zip(tok_keys, tok_sources, strict=True)]
    named = cfg.tokenizer.train_on is not None  # then adding a source keeps the key
    tok_key = cache_key({"sources": pairs}) if mixed or named else keys[0]
    return train_tokenizers(cfg, tok_sources, tok_key, Path(cfg.data.cache_dir), tags)


def _tag_ids(src_tok: Tokenizer, tags: dict[str, str]) -> dict[str, tuple[int, ...]]:
    """Target language -> the id of its tag, which starts every source asking for it."""
    ids: dict[str, tuple[int, ...]] = {}
    for lang, tag in tags.items():
        piece = src_tok.piece_id(tag)
        if piece is None:  # a tokenizer given from elsewhere (a fine-tuned model's)
            raise MTError(
                f"the tokenizer has no tag {tag} for the target language {lang}; a model "
                "translates only into the languages it was trained with a tag for"
            )
        ids[lang] = (piece,)
    return ids


_Texts = tuple[list[str], list[str]]


def _valid_texts(
    cfg: Config, sources: list[SplitSource]
) -> dict[tuple[str, str], tuple[tuple[Path, Path], _Texts]]:
    """Each language pair's validation files (its sources read as one pair) and cleaned text."""
    by_pair: dict[tuple[str, str], list[SplitSource]] = {}
    for source in sources:
        by_pair.setdefault(source.pair or (cfg.data.src_lang, cfg.data.trg_lang), []).append(source)
    trained = training_pairs(cfg.data)
    untrained = [pair_name(p) for p in by_pair if p not in trained]
    if untrained:
        raise MTError(
            f"data.valid has {', '.join(untrained)}, which no training source has; the training "
            f"pairs are {', '.join(pair_name(p) for p in trained)}"
        )
    out = {}
    for pair in sorted(by_pair, key=trained.index):
        pair_files = one_pair(for_pair(cfg, pair), "valid", by_pair[pair])
        src, trg, report = clean_parallel(*pair_files, _clean_cfg(cfg))
        if report.kept == 0:
            raise _no_pairs_error("valid", pair_files, "cleaning")
        out[pair] = (pair_files, (src, trg))
    missing = [pair_name(p) for p in trained if p not in out]
    if missing:
        log.warning(f"no validation source for {', '.join(missing)}: it is trained, not validated")
    return out


def _valid_set(
    cfg: Config,
    pair: tuple[str, str],
    files: tuple[Path, Path],
    texts: _Texts,
    tokenizers: tuple[Tokenizer, Tokenizer],
    prefix: tuple[int, ...],
    n_sets: int,
) -> ValidSet:
    """One pair's binarized validation split and the texts its BLEU is scored on."""
    name = "valid" if n_sets == 1 else f"valid.{pair_name(pair)}"
    data = binarize_split(cfg, files, cache_key(*files), *tokenizers, name, src_prefix=prefix)
    src, trg = _tokenizable(*texts, *tokenizers, cfg.data.max_tokens_per_side, prefix)
    return ValidSet(pair_name(pair), data, src, trg, prefix)
