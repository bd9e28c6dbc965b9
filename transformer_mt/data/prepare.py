"""From a config to training-ready data: raw files -> clean -> sentencepiece -> binarized ids.

Every step is cached under ``data.cache_dir`` by a hash of its inputs and settings, so a second
``mt train`` or ``mt prepare`` with nothing changed reuses the tokenizer and the token ids, and any
change (a file's contents, a vocabulary size, a cleaning threshold) rebuilds what depends on it.
"""

import itertools
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from transformer_mt.config import Config
from transformer_mt.data.binarized import BinarizedPair, build_binarized, cache_key, load_binarized
from transformer_mt.data.corpus import CleanConfig, CleanReport, clean_parallel, iter_clean_pairs
from transformer_mt.data.tokenizer import EOS_ID, Tokenizer, TokenizerSettings
from transformer_mt.data.toy import toy_splits
from transformer_mt.errors import MTError

SPLITS = ("train", "valid", "test")
_MULTI30K_SPLITS = {"train": "train", "valid": "val", "test": "test_2016_flickr"}
_ENCODE_CHUNK = 10_000  # sentences encoded per sentencepiece call (it runs them in parallel)


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


def corpus_files(cfg: Config, progress: bool = True) -> dict[str, tuple[Path, Path]]:
    """The (source, target) file pair of each split, generating or downloading what is missing."""
    d = cfg.data
    if d.corpus == "toy":
        return _write_toy(cfg)
    if d.corpus == "multi30k":
        from transformer_mt.data.download import download_corpus

        dest = Path(d.download_dir) / "multi30k"
        names = [
            f"{s}.{lang}.gz" for s in _MULTI30K_SPLITS.values() for lang in (d.src_lang, d.trg_lang)
        ]
        download_corpus("multi30k", dest, d.base_url, only=names, progress=progress)
        return {
            split: (dest / f"{name}.{d.src_lang}", dest / f"{name}.{d.trg_lang}")
            for split, name in _MULTI30K_SPLITS.items()
        }
    files = {}
    for split in SPLITS:
        src, trg = getattr(d, f"{split}_src"), getattr(d, f"{split}_trg")
        if (src is None) != (trg is None) or (src is None and split != "test"):
            raise MTError(f"data.corpus=local needs data.{split}_src and data.{split}_trg")
        if src is not None:
            files[split] = (Path(src), Path(trg))
    return files


def _write_toy(cfg: Config) -> dict[str, tuple[Path, Path]]:
    """Write the built-in corpus as plain text files (so users can read what the model learns)."""
    d = cfg.data
    sizes = (d.toy_train_size, d.toy_valid_size, d.toy_test_size)
    out = Path(d.cache_dir) / (f"toy-seed{d.toy_seed}-" + "-".join(map(str, sizes)))
    files = {s: (out / f"{s}.{d.src_lang}", out / f"{s}.{d.trg_lang}") for s in SPLITS}
    if all(p.is_file() for pair in files.values() for p in pair):
        return files
    out.mkdir(parents=True, exist_ok=True)
    for split, pairs in toy_splits(*sizes, seed=d.toy_seed).items():
        for side, path in enumerate(files[split]):
            tmp = path.with_suffix(path.suffix + ".tmp")
            tmp.write_text("".join(p[side] + "\n" for p in pairs), encoding="utf-8")
            tmp.replace(path)  # a killed run never leaves a half-written corpus file
    return files


def _clean_cfg(cfg: Config) -> CleanConfig:
    return CleanConfig(
        max_len=cfg.data.max_words,
        max_ratio=cfg.data.max_ratio,
        skip_bad_lines=cfg.data.skip_bad_lines,
    )


def _train_tokenizers(
    cfg: Config, train: tuple[Path, Path], cache: Path, say
) -> tuple[Tokenizer, Tokenizer]:
    t = cfg.tokenizer
    settings = TokenizerSettings(t.vocab_size, t.model_type, t.character_coverage)
    key = cache_key(
        train[0],
        train[1],
        {"tokenizer": asdict(settings), "joint": t.joint, "clean": asdict(_clean_cfg(cfg))},
    )[:16]
    names = ["joint"] if t.joint else ["src", "trg"]
    paths = [cache / f"spm-{key}-{n}.model" for n in names]
    if all(p.is_file() for p in paths):
        toks = [Tokenizer.load(p) for p in paths]
    else:
        say(
            f"training sentencepiece ({t.model_type}, vocab {t.vocab_size}, "
            f"{'joint' if t.joint else 'separate'}) on {train[0].name} / {train[1].name}"
        )
        src, trg, _ = clean_parallel(*train, _clean_cfg(cfg))
        texts = [src + trg] if t.joint else [src, trg]
        toks = [Tokenizer.train(x, settings) for x in texts]
        cache.mkdir(parents=True, exist_ok=True)
        for tok, p in zip(toks, paths, strict=True):
            tmp = p.with_suffix(".tmp")
            tok.save(tmp)
            tmp.replace(p)
    return toks[0], toks[-1]


def _encoded_pairs(
    pairs: Iterator[tuple[str, str]],
    src_tok: Tokenizer,
    trg_tok: Tokenizer,
    max_tokens: int,
    dropped: list[int],
) -> Iterator[tuple[list[int], list[int]]]:
    """Source ids end with EOS; target ids are stored bare (the trainer adds BOS and EOS). Pairs
    whose source + EOS or target + BOS/EOS exceed ``max_tokens`` are dropped and counted."""
    while chunk := list(itertools.islice(pairs, _ENCODE_CHUNK)):
        srcs = src_tok.encode_batch([s for s, _ in chunk])
        trgs = trg_tok.encode_batch([t for _, t in chunk])
        for s, t in zip(srcs, trgs, strict=True):
            if len(s) + 1 > max_tokens or len(t) + 1 > max_tokens:
                dropped[0] += 1
                continue
            yield s + [EOS_ID], t


def binarize_split(
    cfg: Config, files: tuple[Path, Path], src_tok: Tokenizer, trg_tok: Tokenizer, name: str, say
) -> BinarizedPair:
    """The cached token ids of one split, built (streaming, atomically) when missing or stale."""
    settings = {"clean": asdict(_clean_cfg(cfg)), "max_tokens": cfg.data.max_tokens_per_side}
    key = cache_key(files[0], files[1], src_tok.model_proto, trg_tok.model_proto, settings)
    out = Path(cfg.data.cache_dir) / f"{cfg.name}-{name}"
    cached = load_binarized(out, key)
    if cached is not None:
        return cached
    report = CleanReport()
    dropped = [0]
    pairs = iter_clean_pairs(files[0], files[1], _clean_cfg(cfg), report)
    encoded = _encoded_pairs(pairs, src_tok, trg_tok, cfg.data.max_tokens_per_side, dropped)
    data = build_binarized(out, key, encoded, max(src_tok.vocab_size, trg_tok.vocab_size))
    say(f"{name}: {files[0]} / {files[1]}\n  " + report.format().replace("\n", "\n  "))
    if dropped[0]:
        say(f"  dropped {dropped[0]:,} pairs over {cfg.data.max_tokens_per_side} subword tokens")
    if len(data) == 0:
        raise MTError(
            f"{name} split of {files[0]} has no pairs left after cleaning; check the data"
        )
    return data


def prepare(cfg: Config, say=print, progress: bool = True) -> PreparedData:
    """Everything training needs, reusing the caches when nothing changed."""
    files = corpus_files(cfg, progress)
    cache = Path(cfg.data.cache_dir)
    src_tok, trg_tok = _train_tokenizers(cfg, files["train"], cache, say)
    train = binarize_split(cfg, files["train"], src_tok, trg_tok, "train", say)
    valid = binarize_split(cfg, files["valid"], src_tok, trg_tok, "valid", say)
    valid_src, valid_trg, _ = clean_parallel(*files["valid"], _clean_cfg(cfg))
    return PreparedData(src_tok, trg_tok, train, valid, valid_src, valid_trg, files)
