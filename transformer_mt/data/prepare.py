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
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from transformer_mt.config import Config
from transformer_mt.data.binarized import BinarizedPair, build_binarized, cache_key, load_binarized
from transformer_mt.data.corpus import CleanConfig, CleanReport, clean_parallel, iter_clean_pairs
from transformer_mt.data.sampling import SampledEpochs, SamplingSettings
from transformer_mt.data.tokenizer import EOS_ID, Tokenizer, TokenizerSettings
from transformer_mt.data.toy import TOY_VERSION, toy_splits
from transformer_mt.errors import MTError
from transformer_mt.fileio import write_text_atomic

Say = Callable[[str], None]
"""Where progress messages go (``print``, ``typer.echo`` to stderr, or a no-op on other ranks)."""

SPLITS = ("train", "valid", "test")
_MULTI30K_SPLITS = {"train": "train", "valid": "val", "test": "test_2016_flickr"}
_ENCODE_CHUNK = 10_000  # sentences encoded per sentencepiece call (it runs them in parallel);
# with subword sampling, draws x pairs: it bounds the memory of one chunk's ids
REPORT_FILE = "clean_report.txt"  # beside a binarized split: its cleaning report, shown on reuse


@dataclass
class PreparedData:
    """The tokenizers, the binarized training and validation ids, and the raw validation text."""

    src_tok: Tokenizer
    trg_tok: Tokenizer
    train: BinarizedPair
    valid: BinarizedPair
    valid_src: list[str]  # cleaned validation text, decoded for BLEU during training
    valid_trg: list[str]
    files: dict[str, tuple[Path, Path]]  # split -> (source file, target file)
    sampler: SampledEpochs | None = None  # tokenizer.sample_alpha > 0: each epoch's sampled ids


# --- where the text comes from ------------------------------------------------------------------


def corpus_files(cfg: Config, progress: bool = True) -> dict[str, tuple[Path, Path]]:
    """The (source, target) file pair of each split, generating or downloading what is missing."""
    corpus = cfg.data.corpus
    if corpus == "toy":
        return _write_toy(cfg)
    if corpus == "multi30k":
        return _multi30k_files(cfg, progress)
    return _local_files(cfg)


def _local_files(cfg: Config) -> dict[str, tuple[Path, Path]]:
    """The files a local corpus names; all are checked now, so that a typo in ``test_src`` fails
    before the training split is tokenized rather than later in ``mt evaluate``."""
    d = cfg.data
    files: dict[str, tuple[Path, Path]] = {}
    for split in SPLITS:
        src, trg = getattr(d, f"{split}_src"), getattr(d, f"{split}_trg")
        if (src is None) != (trg is None) or (src is None and split != "test"):
            raise MTError(f"data.corpus=local needs data.{split}_src and data.{split}_trg")
        if src is not None:
            files[split] = (Path(src), Path(trg))
    for split, pair in files.items():
        for side, path in zip(("src", "trg"), pair, strict=True):
            if not path.is_file():
                raise MTError(f"data.{split}_{side}: {path} is not a file; check the path")
    return files


def _multi30k_files(cfg: Config, progress: bool) -> dict[str, tuple[Path, Path]]:
    """Download (once) only the six files the language pair needs, and return the unpacked ones."""
    # Imported here: urllib and the registry are only needed when a corpus is downloaded.
    from transformer_mt.data.download import download_corpus
    from transformer_mt.data.registry import get_corpus

    d = cfg.data
    # The languages that have all three splits (the registry lists cs for fewer test sets).
    by_split: dict[str, set[str]] = {}
    for f in get_corpus("multi30k").files:
        split, lang = f.local_name.removesuffix(".gz").rsplit(".", 1)
        by_split.setdefault(split, set()).add(lang)
    langs = sorted(set.intersection(*(by_split.get(s, set()) for s in _MULTI30K_SPLITS.values())))
    for key, lang in (("src_lang", d.src_lang), ("trg_lang", d.trg_lang)):
        # Checked here: the downloader's own message would talk about --only patterns.
        if lang not in langs:
            raise MTError(
                f"data.{key}={lang!r}: Multi30k task 1 has train/val/test_2016_flickr only in "
                f"{', '.join(langs)}; choose one of them"
            )
    if d.src_lang == d.trg_lang:
        raise MTError(f"data.src_lang and data.trg_lang are both {d.src_lang!r}; pick two")
    names = [
        f"{split}.{lang}.gz"
        for split in _MULTI30K_SPLITS.values()
        for lang in (d.src_lang, d.trg_lang)
    ]
    dest = Path(d.download_dir) / "multi30k"
    outputs = download_corpus("multi30k", dest, base_url=d.base_url, only=names, progress=progress)
    by_name = {p.name: p for p in outputs}  # gunzipped beside the .gz: "train.de", ...
    return {
        split: (by_name[f"{name}.{d.src_lang}"], by_name[f"{name}.{d.trg_lang}"])
        for split, name in _MULTI30K_SPLITS.items()
    }


def _write_toy(cfg: Config) -> dict[str, tuple[Path, Path]]:
    """Write the built-in corpus as plain text files (so users can read what the model learns)."""
    d = cfg.data
    sizes = (d.toy_train_size, d.toy_valid_size, d.toy_test_size)
    out = Path(d.cache_dir) / (f"toy-v{TOY_VERSION}-seed{d.toy_seed}-" + "-".join(map(str, sizes)))
    files = {s: (out / f"{s}.{d.src_lang}", out / f"{s}.{d.trg_lang}") for s in SPLITS}
    if all(p.is_file() for pair in files.values() for p in pair):
        return files
    out.mkdir(parents=True, exist_ok=True)
    for split, pairs in toy_splits(*sizes, seed=d.toy_seed).items():
        for side, path in enumerate(files[split]):
            # Atomic: a killed run never leaves a half-written corpus file to be reused.
            write_text_atomic(path, "".join(p[side] + "\n" for p in pairs))
    return files


# --- sentencepiece --------------------------------------------------------------------------------


def _clean_cfg(cfg: Config) -> CleanConfig:
    return CleanConfig(
        max_len=cfg.data.max_words,
        max_ratio=cfg.data.max_ratio,
        skip_bad_lines=cfg.data.skip_bad_lines,
    )


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


def _save_atomic(tok: Tokenizer, path: Path) -> None:
    """Write a model file aside and rename it into place; remove the temporary file on failure."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tok.save(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def train_tokenizers(
    cfg: Config, train: tuple[Path, Path], train_key: str, cache: Path, say: Say
) -> tuple[Tokenizer, Tokenizer]:
    """The (source, target) tokenizers: one joint model used twice, or two separate ones.

    Cached as ``spm-<key>-joint.model`` or ``spm-<key>-{src,trg}.model``, keyed by the training
    files' contents (``train_key``), the cleaning thresholds and the tokenizer settings.
    """
    t = cfg.tokenizer
    settings = TokenizerSettings(t.vocab_size, t.model_type, t.character_coverage)
    clean = _clean_cfg(cfg)
    key = cache_key(
        train_key, {"tokenizer": asdict(settings), "joint": t.joint, "clean": asdict(clean)}
    )[:16]
    sides: list[tuple[str, tuple[int, ...]]] = (
        [("joint", (0, 1))] if t.joint else [("src", (0,)), ("trg", (1,))]
    )
    paths = [cache / f"spm-{key}-{name}.model" for name, _ in sides]
    if all(p.is_file() for p in paths):
        say(f"tokenizer: reusing {', '.join(str(p) for p in paths)}")
        toks = [Tokenizer.load(p) for p in paths]
        return toks[0], toks[-1]
    say(
        f"tokenizer: training sentencepiece ({t.model_type}, vocab {t.vocab_size}, "
        f"{'joint' if t.joint else 'separate'}) on {train[0].name} / {train[1].name}"
    )
    # Streamed: sentencepiece keeps only a sample, so the corpus is never loaded whole. Both
    # models are trained before either is saved, so a bad line leaves no model behind.
    toks = [Tokenizer.train(_training_sentences(train, clean, idx), settings) for _, idx in sides]
    cache.mkdir(parents=True, exist_ok=True)
    for tok, path in zip(toks, paths, strict=True):
        _save_atomic(tok, path)
    return toks[0], toks[-1]


# --- binarized ids --------------------------------------------------------------------------------


@dataclass
class _EncodeCount:
    kept: int = 0
    too_long: int = 0


def _encoded_pairs(
    pairs: Iterator[tuple[str, str]],
    src_tok: Tokenizer,
    trg_tok: Tokenizer,
    max_tokens: int,
    count: _EncodeCount,
    sampling: SamplingSettings | None = None,
) -> Iterator[tuple[list[int], list[int]]]:
    """Source ids end with EOS; target ids are stored bare (the trainer adds BOS and EOS). Pairs
    whose source + EOS or target + BOS/EOS exceed ``max_tokens`` are dropped and counted.

    With ``sampling``, each kept pair is yielded ``sampling.draws`` times, in sampled
    segmentations; a sampled side over the limit is replaced by that side's best segmentation.
    """
    draws = sampling.draws if sampling else 1
    while chunk := list(itertools.islice(pairs, max(1, _ENCODE_CHUNK // draws))):
        src_texts, trg_texts = [s for s, _ in chunk], [t for _, t in chunk]
        srcs, trgs = src_tok.encode_batch(src_texts), trg_tok.encode_batch(trg_texts)
        samples = []  # per draw: every pair's sampled (source ids, target ids)
        if sampling is not None:
            a, n = sampling.alpha, sampling.nbest
            samples = [
                (src_tok.sample_batch(src_texts, a, n), trg_tok.sample_batch(trg_texts, a, n))
                for _ in range(draws)
            ]
        for i, (s, t) in enumerate(zip(srcs, trgs, strict=True)):
            if len(s) + 1 > max_tokens or len(t) + 1 > max_tokens:
                count.too_long += 1
                continue
            count.kept += 1
            if sampling is None:
                yield [*s, EOS_ID], t
            for src_draw, trg_draw in samples:
                s_i = src_draw[i] if len(src_draw[i]) + 1 <= max_tokens else s
                t_i = trg_draw[i] if len(trg_draw[i]) + 1 <= max_tokens else t
                yield [*s_i, EOS_ID], t_i


def binarize_split(
    cfg: Config,
    files: tuple[Path, Path],
    files_key: str,
    src_tok: Tokenizer,
    trg_tok: Tokenizer,
    name: str,
    say: Say,
    sampling: SamplingSettings | None = None,
) -> BinarizedPair:
    """The cached token ids of one split, built (streaming, atomically) when missing or stale.

    ``files_key`` is :func:`cache_key` of the two files (computed once by the caller: hashing a
    large corpus takes a while). The split's cleaning report is printed when it is built, and
    kept beside the ids to be printed again when the cache is reused. With ``sampling``, the
    cache holds ``sampling.draws`` sampled segmentations of each pair instead of its best one.
    """
    clean = _clean_cfg(cfg)
    max_tokens = cfg.data.max_tokens_per_side
    settings = {"clean": asdict(clean), "max_tokens": max_tokens}
    if sampling is not None:
        settings["sampling"] = asdict(sampling)
    key = cache_key(files_key, src_tok.model_proto, trg_tok.model_proto, settings)
    out = Path(cfg.data.cache_dir) / f"{cfg.name}-{name}"
    cached = load_binarized(out, key)
    if cached is not None:
        report_path = out / REPORT_FILE
        stored = report_path.read_text(encoding="utf-8") if report_path.is_file() else ""
        say(f"{name}: reusing {out} ({len(cached):,} pairs; inputs and settings unchanged)")
        if stored:
            say("  " + stored.rstrip("\n").replace("\n", "\n  "))
        return cached

    report = CleanReport()
    count = _EncodeCount()

    def pairs() -> Iterator[tuple[list[int], list[int]]]:
        texts = iter_clean_pairs(files[0], files[1], clean, report)
        yield from _encoded_pairs(texts, src_tok, trg_tok, max_tokens, count, sampling)
        # Raised inside the stream, so build_binarized discards the build: no empty cache.
        if count.kept == 0:
            raise _no_pairs_error(name, files, f"cleaning and the {max_tokens}-token limit")

    data = build_binarized(out, key, pairs(), max(src_tok.vocab_size, trg_tok.vocab_size))
    lines = [f"{files[0]} / {files[1]}", *report.format().splitlines()]
    if count.too_long:
        lines.append(f"dropped {count.too_long:,} pairs over {max_tokens} subword tokens a side")
    n_src, n_trg = data.n_tokens
    if sampling is None:
        lines.append(f"-> {len(data):,} pairs, {n_src:,} / {n_trg:,} tokens, in {out}")
    else:
        k = sampling.draws
        lines.append(
            f"-> {len(data) // k:,} pairs x {k} sampled segmentations, {n_src // k:,} / "
            f"{n_trg // k:,} tokens per draw, in {out}"
        )
    text = "\n".join(lines) + "\n"
    write_text_atomic(out / REPORT_FILE, text)
    say(f"{name}: " + text.rstrip("\n").replace("\n", "\n  "))
    return data


# --- all of it --------------------------------------------------------------------------------


def prepare(cfg: Config, say: Say = print, progress: bool = True) -> PreparedData:
    """Everything training needs, reusing the caches when nothing changed.

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
    src_tok, trg_tok = train_tokenizers(cfg, files["train"], keys["train"], cache, say)
    train = binarize_split(cfg, files["train"], keys["train"], src_tok, trg_tok, "train", say)
    valid = binarize_split(cfg, files["valid"], keys["valid"], src_tok, trg_tok, "valid", say)
    t = cfg.tokenizer
    sampler = None
    if t.sample_alpha > 0:
        sampling = SamplingSettings(t.sample_alpha, t.sample_nbest, t.sample_draws)
        draws = binarize_split(
            cfg, files["train"], keys["train"], src_tok, trg_tok, "train-sampled", say, sampling
        )
        sampler = SampledEpochs(draws, sampling.draws, cfg.train.seed)
        if sampler.n_pairs != len(train):  # the same cleaning and limit keep the same pairs
            raise MTError(
                f"{draws.path} holds {sampler.n_pairs:,} pairs, {train.path} {len(train):,}; "
                "delete both and run again"
            )
    return PreparedData(src_tok, trg_tok, train, valid, valid_src, valid_trg, files, sampler)
