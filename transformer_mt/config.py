"""Typed configuration: dataclasses, YAML loading, dotted overrides and validation.

A YAML file has one mapping per section (``data``, ``tokenizer``, ``model``, ``train``, ``decode``).
Every key must be a field of that section's dataclass and have its type; ``--set train.max_steps=100``
overrides one field. Mistakes raise :class:`MTError` naming the key, before any work starts.
"""

import dataclasses
import functools
import importlib.resources
import math
import os
import re
import textwrap
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from transformer_mt.errors import MTError
from transformer_mt.fileio import decode_utf8, write_text_atomic

# sacrebleu's BLEU tokenizers that need no download (its spm/flores ones fetch a model).
BLEU_TOKENIZERS = ("13a", "intl", "zh", "ja-mecab", "ko-mecab", "char", "none")
MAX_BEAM = 128  # wider beams cost memory in proportion and no longer improve translations
MIN_VOCAB_SIZE = 16  # the 4 special ids and a few pieces: no corpus's alphabet fits in fewer
DEVICE_NAMES = "auto, cpu, cuda, cuda:N or mps"  # what train.device accepts (check_device_name)
_DEVICE_RE = re.compile(r"auto|cpu|cuda(:\d+)?|mps")


@dataclass(frozen=True)
class Range:
    """The values a numeric config field accepts.

    ``lo``/``hi`` bound it (None: unbounded), each bound included unless ``*_open``; ``none_ok``
    also accepts null. Floats must also be finite.
    """

    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False
    none_ok: bool = False

    def holds(self, value: Any) -> bool:
        if value is None:
            return self.none_ok
        if isinstance(value, float) and not math.isfinite(value):
            return False
        above = self.lo is None or (value > self.lo if self.lo_open else value >= self.lo)
        below = self.hi is None or (value < self.hi if self.hi_open else value <= self.hi)
        return above and below

    def converted(self, unit: Callable[[float], float]) -> "Range":
        """The same range in another unit: each bound through ``unit`` (a value -> the same in it)."""
        lo = None if self.lo is None else unit(self.lo)
        hi = None if self.hi is None else unit(self.hi)
        return dataclasses.replace(self, lo=lo, hi=hi)

    def describe(self) -> str:
        """The range in words: "at least 1", "1 to 128", "in [0, 1)", "greater than 0"."""
        lo, hi = _number(self.lo), _number(self.hi)
        if self.lo is None and self.hi is None:
            text = "any number"
        elif self.hi is None:
            text = f"greater than {lo}" if self.lo_open else f"at least {lo}"
        elif self.lo is None:
            text = f"less than {hi}" if self.hi_open else f"at most {hi}"
        elif not self.lo_open and not self.hi_open:
            text = f"{lo} to {hi}"
        else:
            text = f"in {'(' if self.lo_open else '['}{lo}, {hi}{')' if self.hi_open else ']'}"
        return text + (" or null" if self.none_ok else "")


def _number(value: float | None) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


AT_LEAST_1, AT_LEAST_0 = Range(lo=1), Range(lo=0)
POSITIVE = Range(lo=0, lo_open=True)  # > 0
PROBABILITY = Range(lo=0.0, hi=1.0, hi_open=True)  # [0, 1): dropout, label smoothing, betas
SEED_63 = Range(0, 2**63 - 1)  # numpy needs >= 0; torch takes seed + step below 2**64

ANY_NUMBER = Range()  # a numeric field that takes every value (e.g. random.Random's seed)
MAX_SOURCE_WEIGHT = 1000  # a source's weight: the most times an epoch draws each of its pairs


def setting(
    default: Any = dataclasses.MISSING,
    help: str = "",
    *,
    range: Range | None = None,
    choices: tuple[str, ...] | None = None,
    option: str | None = None,
    factory: Callable[[], Any] | None = None,
) -> Any:
    """A config field declared once: its default, its help text and the values it accepts.

    ``range`` bounds a numeric field, ``choices`` lists a text field's values, and ``option``
    names the `mt translate` option that sets a decode field. Validation (:func:`check_settings`),
    the command-line help (:func:`option_help`), `mt config` and docs/CONFIG.md read only this.
    """
    if not help:
        raise TypeError("a setting needs its help text")
    metadata = {"help": help, "range": range, "choices": choices, "option": option}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass(frozen=True)
class Setting:
    """One declared field, as validation and the documentation read it."""

    name: str
    type: Any
    default: Any  # the value a fresh instance has (a factory's result)
    help: str
    range: Range | None
    choices: tuple[str, ...] | None
    option: str | None


@functools.cache
def declared_settings(cls: type) -> dict[str, Setting]:
    """:func:`settings_of` by field name (read once per class)."""
    return {s.name: s for s in settings_of(cls)}


def settings_of(cls: type) -> tuple[Setting, ...]:
    """The declared fields of the config dataclass ``cls``, in their order.

    Read once per class: every request to the server checks its decode settings through them.
    """
    return _settings_of(cls)


@functools.cache
def _settings_of(cls: type) -> tuple[Setting, ...]:
    """:func:`settings_of`, computed (without building a ``cls``: its checks may read these)."""
    hints = typing.get_type_hints(cls)
    return tuple(
        Setting(
            name=f.name,
            type=hints[f.name],
            default=_fresh_value(f),
            help=f.metadata.get("help", ""),
            range=f.metadata.get("range"),
            choices=f.metadata.get("choices"),
            option=f.metadata.get("option"),
        )
        for f in dataclasses.fields(cls)
    )


def _fresh_value(f: dataclasses.Field) -> Any:
    """The value the field ``f`` has in a fresh instance: its default, or its factory's result."""
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


@dataclass
class SourceConfig:
    """One source of parallel text in ``data.train`` / ``data.valid`` / ``data.test``.

    Exactly one of the keys ``src`` (with ``trg``), ``tsv``, ``jsonl``, ``parquet``, ``tmx``,
    ``corpus``, ``mtdata``, ``hf`` and ``sacrebleu`` says what the source is; the other keys
    refine it. The languages are ``data.src_lang`` / ``data.trg_lang``.
    """

    src: str | None = setting(
        None,
        "source-side file: text (plain, .gz, .xz, .bz2), WMT .sgm, or IWSLT .xml / train.tags "
        "(by its name); read inside `archive` when that is set",
    )
    trg: str | None = setting(
        None,
        "target-side file, the same format as `src`",
    )
    tsv: str | None = setting(
        None,
        "a tab-separated file, one pair a line (see `columns`)",
    )
    columns: list[int] = setting(
        help="tsv: the source and target columns, counted from 0",
        factory=lambda: [0, 1],
    )
    jsonl: str | None = setting(
        None,
        "a JSON-lines file, one object a pair (see `fields`)",
    )
    parquet: str | None = setting(
        None,
        "a parquet file, one row a pair (see `fields`); needs [hf]",
    )
    fields: list[str] | None = setting(
        None,
        "jsonl / parquet / hf: the source and target fields, dotted into nested objects; null ="
        " translation.<src_lang> and translation.<trg_lang>",
    )
    tmx: str | None = setting(
        None,
        "a TMX translation memory (units without both languages are skipped)",
    )
    archive: str | None = setting(
        None,
        "read src/trg, tsv, jsonl or tmx as members of this archive (.tar, .tgz, .tar.xz, "
        ".tar.bz2, .zip) without unpacking it",
    )
    corpus: str | None = setting(
        None,
        "a registry corpus by name (`mt download --list`)",
    )
    mtdata: str | None = setting(
        None,
        "an mtdata dataset ID, e.g. Statmt-news_commentary-16-deu-eng (needs the [mtdata] extra)",
    )
    hf: str | None = setting(
        None,
        "a Hugging Face dataset: its Hub name or a local path (needs [hf])",
    )
    hf_config: str | None = setting(
        None,
        "hf: the dataset's configuration, e.g. de-en",
    )
    split: str | None = setting(
        None,
        "corpus / hf: the split to read; null = the split this source is listed under (for hf: "
        "train, validation, test)",
    )
    sacrebleu: str | None = setting(
        None,
        "a sacrebleu test set, e.g. wmt14/full (md5-checked, cached in $SACREBLEU)",
    )
    src_lang: str | None = setting(
        None,
        "the source's source language; null = data.src_lang",
    )
    trg_lang: str | None = setting(
        None,
        "the source's target language; null = data.trg_lang. Several target languages make a "
        "multilingual model: each source starts with a <2xx> tag",
    )
    weight: float = setting(
        1.0,
        "data.train only: how much of the source an epoch draws: 2 = each pair twice, 0.5 = a "
        "random half (drawn anew each epoch); an epoch draws a pair at most "
        f"{MAX_SOURCE_WEIGHT:,} times",
        range=Range(lo=0, hi=MAX_SOURCE_WEIGHT, lo_open=True),
    )
    name: str | None = setting(
        None,
        "a plain name for reports and the cache; null = taken from the source",
    )


SOURCE_KINDS = ("src", "tsv", "jsonl", "parquet", "tmx", "corpus", "mtdata", "hf", "sacrebleu")
"""The keys of :class:`SourceConfig` that say what a source is; a source sets exactly one."""


@dataclass
class DataConfig:
    corpus: str = setting(
        "toy",
        '"toy" (built-in generator), "local" (files below) or a registry corpus by name, '
        'e.g. "multi30k" (`mt download --list`); data.train, when set, replaces it',
    )
    train: list[SourceConfig] | None = setting(
        None,
        "training sources, each a mapping (SourceConfig: a file pair, tsv, jsonl, parquet, tmx,"
        " corpus, mtdata, hf or sacrebleu) with its weight",
    )
    valid: list[SourceConfig] | None = setting(
        None,
        "validation sources (needed with data.train); several are read as one set",
    )
    test: list[SourceConfig] | None = setting(
        None,
        "test sources (optional), read as one set",
    )
    temperature: float = setting(
        1.0,
        "several language pairs: an epoch draws pair k in proportion to p_k^(1/T) (p_k = its "
        "share of weight x size); 1 = proportional, larger = flatter, toward the small pairs",
        range=POSITIVE,
    )
    src_lang: str = setting(
        "src",
        "source language code: names files and logs",
    )
    trg_lang: str = setting(
        "trg",
        "target language code",
    )
    train_src: str | None = setting(
        None,
        "local corpus: training source file (plain or .gz)",
    )
    train_trg: str | None = setting(
        None,
        "local corpus: training target file",
    )
    valid_src: str | None = setting(
        None,
        "local corpus: validation source file",
    )
    valid_trg: str | None = setting(
        None,
        "local corpus: validation target file",
    )
    test_src: str | None = setting(
        None,
        "local corpus: test source file",
    )
    test_trg: str | None = setting(
        None,
        "local corpus: test target file",
    )
    toy_train_size: int = setting(
        20000,
        "toy corpus: training pairs",
        range=AT_LEAST_1,
    )
    toy_valid_size: int = setting(
        500,
        "toy corpus: validation pairs",
        range=AT_LEAST_1,
    )
    toy_test_size: int = setting(
        500,
        "toy corpus: test pairs",
        range=AT_LEAST_1,
    )
    toy_seed: int = setting(
        1234,
        "toy corpus: generator seed (same seed, same corpus)",
        range=ANY_NUMBER,
    )
    max_words: int | None = setting(
        250,
        "cleaning: pairs with more whitespace words on a side are dropped; null = no limit",
        range=Range(lo=1, none_ok=True),
    )
    max_ratio: float | None = setting(
        3.0,
        "cleaning: longest allowed word-count ratio, checked only when the longer side has more"
        " than 5 words (CleanConfig.ratio_min_words); null = no check",
        range=Range(lo=1.0, none_ok=True),
    )
    skip_bad_lines: bool = setting(
        False,
        "cleaning: skip invalid UTF-8 pairs instead of stopping",
    )
    max_tokens_per_side: int = setting(
        128,
        "pairs longer than this (subword pieces + EOS) are dropped",
        range=Range(lo=2),  # one piece + EOS (or BOS) is the shortest pair
    )
    download_dir: str = setting(
        "data",
        "known corpora are downloaded to <download_dir>/<corpus>",
    )
    base_url: str | None = setting(
        None,
        "mirror for a known corpus's files; null = the registry's URL",
    )
    cache_dir: str = setting(
        "data/cache",
        "where prepared corpora (tokenizer, token ids) are kept",
    )
    max_line_bytes: int = setting(
        1 << 20,
        "reading: the longest line of a text, TSV, JSONL or SGML file (and the largest TMX "
        "translation unit, or side of a record) in bytes; longer is an error naming the file "
        "and line",
        range=AT_LEAST_1,
    )
    max_archive_bytes: int = setting(
        64 << 30,
        "reading a member of a tar or zip archive in place: the most bytes decompressed to reach "
        "and read it (checked against the sizes the archive declares before reading)",
        range=AT_LEAST_1,
    )
    max_archive_members: int = setting(
        100_000,
        "reading a tar or zip archive in place: the most members it may hold",
        range=AT_LEAST_1,
    )
    max_nesting: int = setting(
        100,
        "reading JSON lines and TMX: the deepest nesting of JSON objects and arrays, or of XML "
        "elements",
        range=Range(lo=1, hi=500),  # json.loads recurses: well within Python's recursion limit
    )


@dataclass
class TokenizerConfig:
    vocab_size: int = setting(
        1000,
        "sentencepiece vocabulary size (a target; tiny corpora may get fewer)",
        range=Range(lo=MIN_VOCAB_SIZE),
    )
    model_type: str = setting(
        "unigram",
        "sentencepiece algorithm",
        choices=("unigram", "bpe"),
    )
    joint: bool = setting(
        True,
        "one vocabulary for both languages (allows model.share_embeddings)",
    )
    character_coverage: float = setting(
        1.0,
        "share of characters covered; 0.9995 for large alphabets",
        range=Range(lo=0.0, hi=1.0, lo_open=True),
    )
    sample_alpha: float = setting(
        0.0,
        "subword regularization: train on sampled segmentations, one of sample_draws per pair "
        "each epoch; unigram smoothing (lower = more varied) or BPE-dropout rate; 0 = off (the "
        "best segmentation only)",
        range=AT_LEAST_0,
    )
    sample_nbest: int = setting(
        -1,
        "unigram: sample among the n best segmentations (>= 2); -1 = all of them; BPE-dropout "
        "ignores it",
        range=Range(lo=-1),
    )
    train_on: list[str] | None = setting(
        None,
        "the training sources (their names in the log and cache, e.g. [europarl-v7]) "
        "sentencepiece learns from; null = all of them, by weight. Naming some keeps the "
        "tokenizer, and so every other source's cache, when a source is added",
    )
    sample_draws: int = setting(
        16,
        "sampled segmentations per pair, drawn once into the data cache (which grows this many "
        "times the training split); each run of this many epochs reads each draw once",
        range=AT_LEAST_1,
    )


@dataclass
class ModelConfig:
    d_model: int = setting(
        256,
        "width of embeddings and hidden states",
        range=AT_LEAST_1,
    )
    n_head: int = setting(
        4,
        "attention heads; must divide d_model",
        range=AT_LEAST_1,
    )
    ffn_hidden: int = setting(
        1024,
        "inner width of the feed-forward sublayers",
        range=AT_LEAST_1,
    )
    n_layers: int = setting(
        3,
        "encoder layers",
        range=AT_LEAST_1,
    )
    n_dec_layers: int | None = setting(
        None,
        "decoder layers; null = same as n_layers",
        range=Range(lo=1, none_ok=True),
    )
    drop_prob: float = setting(
        0.1,
        "dropout on embeddings and sublayer outputs (the paper's)",
        range=PROBABILITY,
    )
    attn_drop_prob: float = setting(
        0.0,
        "dropout on attention weights (not in the paper; costs time)",
        range=PROBABILITY,
    )
    ffn_drop_prob: float = setting(
        0.0,
        "dropout inside the feed-forward sublayer (not in the paper)",
        range=PROBABILITY,
    )
    max_len: int = setting(
        256,
        "longest sequence (source or target) the position table covers",
        range=Range(lo=2),  # BOS or EOS and one token
    )
    pre_norm: bool = setting(
        False,
        "LayerNorm before sublayers (stable when deep) instead of after (paper)",
    )
    tie_embeddings: bool = setting(
        True,
        "decoder input embedding shared with the output projection",
    )
    share_embeddings: bool = setting(
        True,
        "source and target embeddings shared (needs tokenizer.joint)",
    )
    # What imported models (`mt import`: Marian / OPUS-MT) compute differently; the defaults are
    # this project's own Transformer, which every trained checkpoint was built as:
    scale_embeddings: bool = setting(
        True,
        "embeddings multiplied by sqrt(d_model) (Marian: config's scale_embedding)",
    )
    position_layout: str = setting(
        "interleaved",
        'sinusoid table: "interleaved" (sin, cos alternate, the paper\'s) or "halves" (all '
        "sines, then all cosines: Marian's)",
        choices=("interleaved", "halves"),
    )
    activation: str = setting(
        "relu",
        "feed-forward activation: relu, gelu or swish (OPUS-MT's)",
        choices=("relu", "gelu", "swish"),
    )
    logits_bias: bool = setting(
        False,
        "a bias on the output projection (Marian's final_logits_bias)",
    )

    def __setattr__(self, key: str, value: Any) -> None:
        """Set a field; a choice the model does not have is refused, naming the key.

        Whether set by the constructor, a config file or an override.
        """
        declared = self.__dataclass_fields__.get(key)
        choices = declared.metadata.get("choices") if declared is not None else None
        if choices is not None and value not in choices:
            raise MTError(_choice_error(f"model.{key}", value, choices))
        super().__setattr__(key, value)


@dataclass
class TrainConfig:
    seed: int = setting(
        1,
        "seeds model init, dropout and batch order",
        range=SEED_63,
    )
    max_steps: int = setting(
        2000,
        "optimizer steps to train for",
        range=AT_LEAST_1,
    )
    batch_tokens: int = setting(
        4096,
        "tokens (source or target, padding included) per micro-batch",
        range=AT_LEAST_1,
    )
    accum_steps: int = setting(
        1,
        "micro-batches per optimizer step",
        range=AT_LEAST_1,
    )
    lr_factor: float = setting(
        1.0,
        "Noam factor: lr = factor * d_model^-0.5 * min(s^-0.5, s * warmup^-1.5)",
        range=POSITIVE,
    )
    warmup_steps: int = setting(
        4000,
        "Noam warm-up in optimizer steps",
        range=AT_LEAST_1,
    )
    lr_schedule: str = setting(
        "noam",
        '"noam" (the paper\'s), or "linear": Noam\'s warm-up, then a straight line to 0 where'
        " the run ends (max_steps, or max_minutes when that comes first)",
        choices=("noam", "linear"),
    )
    adam_beta1: float = setting(
        0.9,
        "Adam beta1",
        range=PROBABILITY,
    )
    adam_beta2: float = setting(
        0.98,
        "Adam beta2 (the paper's value)",
        range=PROBABILITY,
    )
    adam_eps: float = setting(
        1e-9,
        "Adam epsilon (the paper's value)",
        range=POSITIVE,
    )
    weight_decay: float = setting(
        0.0,
        "decoupled weight decay (AdamW); 0 = plain Adam",
        range=AT_LEAST_0,
    )
    label_smoothing: float = setting(
        0.1,
        "label smoothing epsilon",
        range=PROBABILITY,
    )
    clip_norm: float = setting(
        0.0,
        "clip the global gradient norm to this; 0 = off",
        range=AT_LEAST_0,
    )
    log_every: int = setting(
        50,
        "optimizer steps between metrics.jsonl lines",
        range=AT_LEAST_1,
    )
    valid_every: int = setting(
        500,
        "optimizer steps between validations (also at the end)",
        range=AT_LEAST_1,
    )
    valid_bleu: bool = setting(
        True,
        "decode the validation set greedily and compute BLEU",
    )
    valid_bleu_tokenize: str = setting(
        "13a",
        "sacrebleu's BLEU tokenizer for it (as `mt evaluate --tokenize`): 13a, or zh / ja-mecab"
        " / ko-mecab / char / intl / none for other scripts",
        choices=BLEU_TOKENIZERS,
    )
    best_metric: str = setting(
        "bleu",
        'checkpoint selection: "bleu" (higher is better) or "loss"',
        choices=("bleu", "loss"),
    )
    patience: int = setting(
        0,
        "stop after this many validations without improvement; 0 = never",
        range=AT_LEAST_0,
    )
    max_minutes: float = setting(
        0.0,
        "stop (validate, save) after this much training wall time; 0 = off",
        range=AT_LEAST_0,
    )
    precision: str = setting(
        "auto",
        '"auto" (bf16 where the device runs it natively and a start-up probe measures it faster,'
        " else fp16 with a gradient scaler on a GPU without native bf16 (V100, T4), else fp32; a"
        ' resumed run keeps its choice), "fp32", "bf16" (autocast) or "fp16" (autocast +'
        " gradient scaler)",
        choices=("auto", "fp32", "bf16", "fp16"),
    )
    compile: bool = setting(
        False,
        "torch.compile the encoder and decoder layers, one static graph per layer kind and batch"
        " shape (train.pad_to_multiple bounds the shapes; graphs counted and logged): on one"
        " H200, 15-25 % more tokens/s once compiled (measured when the whole model recompiled"
        " for 7 minutes of 10 as shapes varied); no gain measured on 2 CPUs",
    )
    pad_to_multiple: int | None = setting(
        None,
        "batch shapes: each batch's lengths (both sides) padded up to a multiple of N (steps of"
        " 2N past 8N, 4N past 16N, ...) and its rows to as many as train.batch_tokens allows at"
        " that length, so that a run meets a handful of shapes (train.compile: one graph each;"
        " the padding it adds is logged); 0 = off (a batch is as long as its longest sentence);"
        " null = 8 on a GPU or with train.compile, else 0",
        range=Range(lo=0, none_ok=True),
    )
    pad_vocab_to: int | None = setting(
        None,
        "the training step's output projection runs over the target vocabulary padded to a"
        " multiple of N rows, whose logits are -inf (loss, gradients, checkpoints and decoding"
        " unchanged); 1 = off; null = 64 on a GPU, else 1",
        range=Range(lo=1, none_ok=True),
    )
    max_nonfinite: int = setting(
        5,
        "stop after this many non-finite losses in a row (each is skipped)",
        range=AT_LEAST_1,
    )
    tensorboard: bool = setting(
        False,
        "also write metrics to RUN_DIR/tensorboard (needs `tensorboard`)",
    )
    keep_last: int = setting(
        2,
        "step checkpoints kept besides last.pt and best.pt",
        range=AT_LEAST_0,
    )
    average_last: int = setting(
        0,
        "at the end, average.pt = mean of the last N step checkpoints (at most keep_last); 0 = off",
        range=AT_LEAST_0,
    )
    device: str = setting(
        "auto",
        '"auto" (cuda if available), "cpu", "cuda", "cuda:1", ...',
    )
    threads: int = setting(
        0,
        "torch intra-op threads on CPU; 0 = torch's default",
        range=AT_LEAST_0,
    )
    keep_freed_memory: bool = setting(
        True,
        "CPU on Linux: malloc reuses freed blocks (~30 % faster)",
    )
    init_from: str | None = setting(
        None,
        "fine-tuning: a checkpoint whose weights, tokenizers, shape and language tags start "
        "this run (fresh optimizer and schedule); null = random weights",
    )
    collective_timeout_s: float = setting(
        300.0,
        "torchrun: seconds a rank waits for the others in a step's collective before the run "
        "stops with an error naming the rank that did not answer",
        range=POSITIVE,
    )


@dataclass
class DecodeConfig:
    """How a trained model translates: the one parameter object of translation and search."""

    beam_size: int = setting(
        4,
        "beam width (hypotheses kept per step); 1 = greedy search. Wider beams cost memory in "
        "proportion and no longer improve translations",
        range=Range(lo=1, hi=MAX_BEAM),
        option="--beam",
    )
    nbest: int = setting(
        1,
        "hypotheses returned per line, best first (at most the beam size); `mt translate` "
        "writes them as text<TAB>score lines",
        range=AT_LEAST_1,
        option="--nbest",
    )
    len_penalty: float = setting(
        1.0,
        "length penalty alpha: a hypothesis's log-probability is divided by GNMT's "
        "((5 + length) / 6) ** alpha (a CTranslate2 export: length ** alpha); 0 = none",
        range=AT_LEAST_0,
        option="--len-penalty",
    )
    max_len_a: float = setting(
        10.0,
        "longest output = a + b * source length (in subword tokens); a and b not both 0",
        range=AT_LEAST_0,
    )
    max_len_b: float = setting(
        1.5,
        "see max_len_a",
        range=AT_LEAST_0,
    )
    batch_tokens: int = setting(
        4096,
        "source tokens per decoding batch",
        range=AT_LEAST_1,
        option="--batch-tokens",
    )
    precision: str = setting(
        "auto",
        "the products of the linear layers when translating with a checkpoint: auto = bf16 "
        "where the device runs it natively (a GPU from Ampere on, a CPU with AVX512-BF16 or "
        "AMX) and a start-up probe finds it faster, else fp32; fp32; bf16 (weights rounded to "
        "bf16 once, fp32 around the products). --quantize int8 replaces it",
        choices=("auto", "fp32", "bf16"),
        option="--precision",
    )
    sampling: bool = setting(
        False,
        "draw each token instead of searching (back-translation); beam 1 only",
        option="--sample",
    )
    temperature: float = setting(
        1.0,
        "sampling: softmax temperature; lower is closer to greedy",
        range=POSITIVE,
        option="--temperature",
    )
    top_k: int = setting(
        0,
        "sampling: keep the k most likely tokens; 0 = all",
        range=AT_LEAST_0,
        option="--top-k",
    )
    top_p: float = setting(
        1.0,
        "sampling: keep the smallest set holding this probability mass; 1 = all",
        range=Range(lo=0.0, hi=1.0, lo_open=True),
        option="--top-p",
    )
    sample_seed: int = setting(
        0,
        "sampling: seed of the draws; a line's sample depends on the seed and its line number "
        "only (not on batch_tokens or the lines decoded beside it)",
        range=Range(-(2**63), 2**64 - 1),  # 64-bit words, signed or not
        option="--seed",
    )


@dataclass
class Config:
    name: str = setting(
        "toy",
        "run name; the default run directory is runs/<name>",
    )
    data: DataConfig = setting(
        help="corpus and preparation",
        factory=DataConfig,
    )
    tokenizer: TokenizerConfig = setting(
        help="sentencepiece",
        factory=TokenizerConfig,
    )
    model: ModelConfig = setting(
        help="Transformer shape",
        factory=ModelConfig,
    )
    train: TrainConfig = setting(
        help="optimization and logging",
        factory=TrainConfig,
    )
    decode: DecodeConfig = setting(
        help="search defaults",
        factory=DecodeConfig,
    )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _check_type(value: Any, tp: Any, key: str) -> Any:
    """Return ``value`` as type ``tp`` (int is accepted for float) or raise naming ``key``."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        others = [arg for arg in args if arg is not type(None)]
        if len(others) == 1 and typing.get_origin(others[0]) is list:
            return _check_type(value, others[0], key)  # its own error names the item
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _check_type(value, arg, key)
            except MTError:
                pass
        raise MTError(f"config key {key!r}: expected {_type_name(tp)}, got {_shown(value)}")
    if origin is list:
        (item,) = typing.get_args(tp)
        if isinstance(value, dict) and dataclasses.is_dataclass(item):
            value = [value]  # one source may be written without the list around it
        if not isinstance(value, list):
            raise MTError(f"config key {key!r}: expected a list, got {_shown(value)}")
        return [_check_type(v, item, f"{key}[{i}]") for i, v in enumerate(value)]
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return _build_dataclass(tp, value, key)
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp is bool and not isinstance(value, bool):
        raise MTError(f"config key {key!r}: expected true/false, got {_shown(value)}")
    if tp is int and isinstance(value, bool):
        raise MTError(f"config key {key!r}: expected an integer, got {_shown(value)}")
    if not isinstance(value, tp):
        raise MTError(f"config key {key!r}: expected {_type_name(tp)}, got {_shown(value)}")
    return value


def _build_dataclass(cls: type, value: Any, key: str) -> Any:
    """An instance of ``cls`` from a mapping of its keys (a list item such as one source)."""
    if isinstance(value, cls):
        return value
    if not isinstance(value, dict):
        raise MTError(f"config key {key!r}: expected a mapping of keys, got {_shown(value)}")
    obj, hints = cls(), _section_types(cls)
    for name, item in value.items():
        if name not in hints:
            raise MTError(f"unknown config key '{key}.{name}'; known keys: {', '.join(hints)}")
        setattr(obj, name, _check_type(item, hints[name], f"{key}.{name}"))
    return obj


def _shown(value: Any, limit: int = 80) -> str:
    """``value`` as an error line shows it: its repr on one line, cut at ``limit`` characters.

    (A tensor's or array's repr spans several lines; an error is one line.)"""
    text = " ".join(repr(value).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _section_types(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _apply(cfg: Config, section: str, key: str, value: Any, where: str) -> None:
    """Set ``section.key`` to ``value`` after checking that both exist and the type fits."""
    sections = {k: v for k, v in _section_types(Config).items() if k != "name"}
    if section not in sections:
        known = ", ".join(sections)
        raise MTError(f"{where}unknown config section {section!r}; known: name, {known}")
    obj = getattr(cfg, section)
    hints = _section_types(type(obj))
    if key not in hints:
        raise MTError(
            f"{where}unknown config key '{section}.{key}'; known keys: {', '.join(hints)}"
        )
    setattr(obj, key, _check_type(value, hints[key], f"{section}.{key}"))


DEFAULT_RECIPE = "toy"  # the recipe `mt train` trains when no --config is given


def _recipes_dir() -> Path:
    # Package data (transformer_mt/configs/, linked from configs/ in a checkout). An installed
    # package is plain files (pip never installs zipped), so the resource is a real path.
    return Path(str(importlib.resources.files("transformer_mt") / "configs"))


def recipe_names() -> list[str]:
    """The names of the recipes shipped with the package ("toy", "multi30k_de_en", ...)."""
    return sorted(p.stem for p in _recipes_dir().glob("*.yaml"))


def recipe_path(name: str = DEFAULT_RECIPE) -> Path:
    """The YAML file of the shipped recipe ``name``, wherever the package is installed."""
    if name not in recipe_names():
        raise MTError(f"no shipped recipe {name!r}; known: {', '.join(recipe_names())}")
    return _recipes_dir() / f"{name}.yaml"


def find_config(path: Path | str) -> Path:
    """The config file that a ``--config`` value names.

    ``path`` when it is a file; else, for a bare name such as ``multi30k_de_en``, the shipped
    recipe of that name (so ``--config multi30k_de_en`` works from any directory).
    """
    path = Path(path)
    if path.is_file():
        return path
    if str(path) == path.name and not path.suffix and path.name in recipe_names():
        return recipe_path(path.name)
    raise MTError(
        f"config file not found: {path}; pass an existing YAML file to --config, "
        f"or the name of a shipped recipe ({', '.join(recipe_names())})"
    )


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader, reading plain scalars and repeated keys as YAML 1.2 says.

    ``1e-4`` is a float, only true/false are booleans, integers are decimal (``010`` is 10;
    ``0o``/``0x`` prefixes, ``_`` between digits), no base-60. (PyYAML follows YAML 1.1, where
    ``1e-4`` is text, ``no``, ``on`` and ``y`` are booleans and ``1:30`` is 90: ``--set
    train.weight_decay=1e-4`` or ``data.trg_lang: no`` would fail.) A key repeated in one mapping
    is an error, as YAML 1.2 says (PyYAML keeps the last one: a second ``train:`` section would
    silently replace the first).
    """

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        first_line: dict[Any, int] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == _MERGE:
                continue  # merge keys (<<) may override; other keys are refused below anyway
            key = self.construct_object(key_node)
            if key in first_line:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"the key {key!r} is repeated: first on line {first_line[key]}",
                    key_node.start_mark,
                )
            first_line[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep)


class _Dumper(yaml.SafeDumper):
    """Writes what :class:`_Loader` reads back unchanged (quotes the text ``1e5``, say)."""


_BOOL, _INT, _FLOAT, _MERGE = (f"tag:yaml.org,2002:{t}" for t in ("bool", "int", "float", "merge"))
_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag not in (_BOOL, _INT, _FLOAT)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(
    _BOOL, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)
_Loader.add_implicit_resolver(
    _INT,
    re.compile(r"^[-+]?(?:[0-9][0-9_]*|0o[0-7_]+|0x[0-9a-fA-F_]+)$"),
    list("-+0123456789"),
)
_Loader.add_implicit_resolver(
    _FLOAT,
    re.compile(
        r"^(?:[-+]?(?:(?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?|[0-9]+[eE][-+]?[0-9]+)"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
    ),
    list("-+0123456789."),
)


def _construct_int(loader: _Loader, node: yaml.ScalarNode) -> int:
    text = loader.construct_scalar(node)
    return int(text, 0) if text.lstrip("+-")[:2] in ("0o", "0x") else int(text)  # 010 is 10


_Loader.add_constructor(_INT, _construct_int)
_Dumper.yaml_implicit_resolvers = _Loader.yaml_implicit_resolvers


def _load_yaml(text: str) -> Any:
    return yaml.load(text, Loader=_Loader)  # a SafeLoader: builds plain data only


def load_config(path: Path | str | None = None, overrides: list[str] | None = None) -> Config:
    """Build a Config from defaults, then the YAML file (if any), then ``key=value`` overrides.

    ``path`` is a YAML file or a shipped recipe's name (:func:`find_config`); None keeps the
    dataclass defaults (the command line's default is the toy recipe: :func:`recipe_path`).
    """
    cfg = Config()
    if path is not None:
        if Path(path).is_dir():
            raise MTError(f"--config {path} is a directory; pass a YAML file")
        path = find_config(path)
        try:
            raw = _load_yaml(decode_utf8(path.read_bytes(), path)) or {}
        except yaml.YAMLError as err:
            raise MTError(f"{path}{_yaml_problem(err)}; fix the YAML syntax there") from None
        if not isinstance(raw, dict):
            raise MTError(f"{path}: expected a mapping of sections at the top level")
        where = f"{path}: "
        for section, body in raw.items():
            if section == "name":
                cfg.name = _check_type(body, str, "name")
                continue
            if not isinstance(body, dict):
                raise MTError(f"{where}section {section!r} must be a mapping of keys")
            for key, value in body.items():
                _apply(cfg, str(section), str(key), value, where)
        if "name" not in raw:
            cfg.name = path.stem
    for item in overrides or []:
        apply_override(cfg, item)
    _expand_home(cfg.data)
    validate(cfg)
    return cfg


def _expand_home(data_cfg: DataConfig) -> None:
    """Expand ``~`` in the data paths to the home directory, as a shell does.

    The shell does not expand it inside ``--set data.cache_dir=~/x``, and YAML never does.
    """
    for f in dataclasses.fields(data_cfg):
        value = getattr(data_cfg, f.name)
        if f.name in _DATA_PATHS and isinstance(value, str):
            setattr(data_cfg, f.name, os.path.expanduser(value))
    for split in SPLITS:
        for source in getattr(data_cfg, split) or []:
            for key in _SOURCE_PATHS:
                value = getattr(source, key)
                if isinstance(value, str):
                    setattr(source, key, os.path.expanduser(value))


# The local corpus's file keys (data.corpus: local), and every data path.
LOCAL_FILE_KEYS = tuple(
    f"{s}_{side}" for s in ("train", "valid", "test") for side in ("src", "trg")
)
_DATA_PATHS = ("download_dir", "cache_dir", *LOCAL_FILE_KEYS)
_SOURCE_PATHS = ("src", "trg", "tsv", "jsonl", "parquet", "tmx", "archive", "hf")
SPLITS = ("train", "valid", "test")


def _yaml_problem(err: yaml.YAMLError, where: str = "line") -> str:
    """``:LINE: invalid YAML (problem)`` for a file, `` (problem)`` for a --set value."""
    mark = getattr(err, "problem_mark", None)
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    if where and mark is not None:
        return f":{mark.line + 1}: invalid YAML ({problem})"
    return f": invalid YAML ({problem})" if where else f" ({problem})"


def apply_override(cfg: Config, item: str) -> None:
    """Apply one ``section.key=value`` override; the value is parsed as YAML (``1e-3``, ``true``)."""
    if "=" not in item:
        raise MTError(f"--set {item!r}: expected section.key=value, e.g. train.max_steps=100")
    dotted, text = item.split("=", 1)
    try:
        value = _load_yaml(text) if text.strip() else ""
    except yaml.YAMLError as err:
        raise MTError(
            f"--set {item!r}: the value is not valid YAML{_yaml_problem(err, where='')}; write "
            f"a number, true/false, or text in quotes (--set '{dotted}=\"...\"')"
        ) from None
    if dotted == "name":
        cfg.name = _check_type(value, str, "name")
        return
    if "." not in dotted:
        raise MTError(f"--set {item!r}: expected section.key=value, e.g. train.max_steps=100")
    section, key = dotted.split(".", 1)
    _apply(cfg, section, key, value, "--set: ")


@dataclass(frozen=True)
class Limit:
    """A caller's tighter upper bound on one decode setting, and what sets it (for its error)."""

    most: int | float
    setting: str  # named in the error, e.g. "the server's max_beam (mt serve --max-beam)"


def check_settings(
    section: str,
    obj: Any,
    names: Mapping[str, str] | None = None,
    limits: Mapping[str, Limit] | None = None,
    units: Mapping[str, Callable[[float], float]] | None = None,
) -> None:
    """Check every field of ``obj`` (a config dataclass) against its declared range or choices.

    ``names`` says how the caller calls a key in its error (default ``section.key``, with the
    declared option: ``decode.beam_size (--beam)``); ``limits`` narrow a range for this caller;
    ``units`` show a key's value and range in the unit its option takes, where its field keeps
    another (a function from the field's value to the option's: bytes -> KiB). A None left at a
    None default passes (an optional setting not given).

    Raises:
        MTError: one line naming the key, the value and the allowed values, e.g.
            ``model.n_head is 0; it must be at least 1``.
    """
    for declared in settings_of(type(obj)):
        value, key = getattr(obj, declared.name), declared.name
        if value is None and declared.default is None:
            continue
        name = setting_name(section, declared, names)
        if declared.choices is not None and value not in declared.choices:
            raise MTError(_choice_error(name, value, declared.choices))
        limit = (limits or {}).get(key)
        allowed = _narrowed(declared.range, limit)
        if allowed is not None and not allowed.holds(value):
            why = (
                f" ({limit.setting})" if limit is not None and allowed is not declared.range else ""
            )
            raise MTError(_range_error(name, value, allowed, (units or {}).get(key)) + why)


def _narrowed(allowed: Range | None, limit: Limit | None) -> Range | None:
    """``allowed`` with a caller's upper bound ``limit`` where that is tighter than its own."""
    if allowed is None or limit is None or (allowed.hi is not None and limit.most >= allowed.hi):
        return allowed
    return dataclasses.replace(allowed, hi=limit.most, hi_open=False)


def _range_error(
    name: str, value: Any, allowed: Range, unit: Callable[[float], float] | None
) -> str:
    """The line refusing ``value`` of the key ``name`` outside ``allowed``, both in ``unit``."""
    if unit is not None and isinstance(value, int | float):
        value, allowed = unit(value), allowed.converted(unit)
    shown = _number(value) if isinstance(value, int | float) else repr(value)
    finite = "finite and " if isinstance(value, float) and not math.isfinite(value) else ""
    return f"{name} is {shown}; it must be {finite}{allowed.describe()}"


def setting_name(section: str, declared: Setting, names: Mapping[str, str] | None) -> str:
    """How an error calls a key: the caller's name for it, or ``section.key (--option)``."""
    if names and declared.name in names:
        return names[declared.name]
    return f"{section}.{declared.name}" + (f" ({declared.option})" if declared.option else "")


def _choice_error(name: str, value: Any, choices: tuple[str, ...]) -> str:
    return f"{name}={value!r}: expected one of {', '.join(choices)}"


def check_device_name(name: str, key: str = "train.device") -> None:
    """Refuse a device name that torch would reject later (or misread), naming ``key``."""
    if not _DEVICE_RE.fullmatch(name):
        raise MTError(f"{key} is {name!r}; it must be {DEVICE_NAMES}")


def validate_decode(
    d: DecodeConfig,
    names: Mapping[str, str] | None = None,
    limits: Mapping[str, Limit] | None = None,
) -> None:
    """Check the decode settings: each declared range, then the rules across them.

    A caller's ``limits`` narrow a range; errors call each key as ``names`` says (see
    :func:`check_settings`).
    """
    check_settings("decode", d, names, limits)
    declared = declared_settings(DecodeConfig)
    nbest, beam, sampling = (
        setting_name("decode", declared[key], names) for key in ("nbest", "beam_size", "sampling")
    )
    if not 1 <= d.nbest <= d.beam_size:
        raise MTError(
            f"{nbest} is {d.nbest}; it must be between 1 and the beam size ({d.beam_size})"
        )
    if d.max_len_a + d.max_len_b <= 0:
        raise MTError(
            f"decode.max_len_a={d.max_len_a:g} and decode.max_len_b={d.max_len_b:g} must be >= 0 "
            "and not both 0 (longest output = a + b * source length)"
        )
    if d.sampling and (d.beam_size != 1 or d.nbest != 1):
        raise MTError(
            f"{sampling} draws one translation per line: it needs beam size 1 and n-best 1; "
            f"drop {beam} / {nbest}"
        )


def apply_overrides(
    base: DecodeConfig,
    overrides: Mapping[str, Any],
    limits: Mapping[str, Limit] | None = None,
    names: Mapping[str, str] | None = None,
) -> DecodeConfig:
    """``base`` with ``overrides`` (None keeps base's value), checked as one config.

    The one path by which `mt translate` / `evaluate` / `score` and both server APIs change a
    model's decode settings. Each value is checked against its field's type and declared range,
    narrowed by the caller's ``limits`` (a server's max_beam), then the rules across fields
    (:func:`validate_decode`).
    ``names`` says how the caller calls each key in its errors (a request field, an option).
    """
    declared = declared_settings(DecodeConfig)
    changes = {}
    for key, value in overrides.items():
        if key not in declared:
            raise MTError(f"unknown decode setting {key!r}; known: {', '.join(declared)}")
        if value is not None:
            name = setting_name("decode", declared[key], names)
            changes[key] = _check_type(value, declared[key].type, name)
    decode = dataclasses.replace(base, **changes)
    validate_decode(decode, names, limits)
    return decode


def option_help(key: str, run_default: bool = True) -> str:
    """The help of the `mt translate` option that sets decode field ``key``.

    Its declared help, its range and (``run_default``) that the run's config gives its default.
    """
    declared = next(s for s in settings_of(DecodeConfig) if s.name == key)
    allowed = f" ({declared.range.describe()})" if declared.range is not None else ""
    default = f" Default: the run's decode.{key}." if run_default else ""
    return f"{_sentence(declared.help)}{allowed}.{default}"


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:]


def validate(cfg: Config) -> None:
    """Check a whole config before any work starts.

    Every declared range and choice (:func:`check_settings`), then the checks across fields: a
    wrong value fails in a second, not after the data preparation.
    """
    if not re.fullmatch(r"[^/\\\x00]+", cfg.name) or cfg.name in (".", ".."):
        raise MTError(
            f"name={cfg.name!r}: the run name names directories (runs/<name>, the data cache); "
            "give one plain name, e.g. name: my-run"
        )
    for section in ("data", "tokenizer", "model", "train"):
        check_settings(section, getattr(cfg, section))
    _validate_data(cfg.data)
    _validate_model(cfg.model, cfg.tokenizer)
    _validate_train(cfg.train, cfg.data)
    validate_decode(cfg.decode)
    if cfg.data.max_tokens_per_side > cfg.model.max_len:
        raise MTError(
            f"data.max_tokens_per_side={cfg.data.max_tokens_per_side} exceeds "
            f"model.max_len={cfg.model.max_len}; lower the first or raise the second"
        )


_LANG_RE = re.compile(r"[A-Za-z0-9]+(?:[_-][A-Za-z0-9]+)*")  # de, en, zh-Hant, pt_BR, src
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")  # one path component, no ..


def check_plain_name(value: str, key: str, example: str = "europarl") -> None:
    """Refuse a value that becomes part of a file name unless it is one plain name.

    No ``/``, ``\\``, ``..`` or leading dot, so that it can never point outside its folder.
    """
    if not _NAME_RE.fullmatch(value) or ".." in value:
        raise MTError(
            f"{key}={value!r}: it names files, so it must be one plain name (letters, digits, "
            f"_ . + -), e.g. {example}"
        )


def _validate_data(data_cfg: DataConfig) -> None:
    base_url = data_cfg.base_url
    if base_url is not None and not re.match(r"https?://[^/]", base_url):
        raise MTError(
            f"data.base_url is {base_url!r}; it must be an http(s) URL (e.g. http://host:port/) "
            "or null"
        )
    for key in ("src_lang", "trg_lang"):
        check_language(getattr(data_cfg, key), f"data.{key}")
    _validate_sources(data_cfg)


def check_language(code: str, key: str) -> None:
    """Refuse a language code that is not letters and digits (it names files and folders)."""
    if not _LANG_RE.fullmatch(code):
        raise MTError(
            f"{key}={code!r}: a language code names files, so it must be letters and "
            "digits, with - or _ between parts (de, en, zh-Hant, pt_BR)"
        )


def _validate_sources(data_cfg: DataConfig) -> None:
    """``data.train`` / ``valid`` / ``test``: each source one kind with the keys it reads."""
    if data_cfg.train is None:
        for split in ("valid", "test"):
            if getattr(data_cfg, split) is not None:
                raise MTError(f"data.{split} is set without data.train; list the training sources")
        return
    if data_cfg.corpus != "toy" or any(getattr(data_cfg, k) for k in LOCAL_FILE_KEYS):
        raise MTError(
            "data.train lists the sources, so data.corpus and the data.*_src / *_trg files are "
            "not read; remove them (a registry corpus is a source too: {corpus: NAME})"
        )
    if not data_cfg.train or not data_cfg.valid:
        raise MTError("data.train and data.valid need one source each at least")
    for split in SPLITS:
        for i, source in enumerate(getattr(data_cfg, split) or []):
            _validate_source(source, f"data.{split}[{i}]", split)


def _validate_source(source: SourceConfig, key: str, split: str) -> None:
    kinds = [k for k in SOURCE_KINDS if getattr(source, k) is not None]
    if len(kinds) != 1:
        found = f"has {' and '.join(kinds)}" if kinds else "has none"
        raise MTError(f"{key} {found}; a source is exactly one of {', '.join(SOURCE_KINDS)}")
    kind = kinds[0]
    if kind == "src" and not source.trg:
        raise MTError(f"{key}.src needs {key}.trg, the target-language file")
    unused = [
        k
        for k, needs in (
            ("trg", ("src",)),
            ("archive", ("src", "tsv", "jsonl", "tmx")),
            ("fields", ("jsonl", "parquet", "hf")),
            ("hf_config", ("hf",)),
            ("split", ("corpus", "hf")),
        )
        if getattr(source, k) is not None and kind not in needs
    ]
    if source.columns != [0, 1] and kind != "tsv":
        unused.append("columns")
    if unused:
        raise MTError(f"{key}.{unused[0]} is not read by a {kind} source; remove it")
    # Two columns; that they differ is data/sides.py's rule for every kind of source.
    if len(source.columns) != 2 or min(source.columns) < 0:
        raise MTError(f"{key}.columns={source.columns}: give two columns from 0 up, e.g. [0, 1]")
    if source.fields is not None and len(source.fields) != 2:
        raise MTError(f"{key}.fields={source.fields}: give the source field and the target field")
    weight = next(s for s in settings_of(SourceConfig) if s.name == "weight").range
    if weight is not None and not (math.isfinite(source.weight) and weight.holds(source.weight)):
        raise MTError(
            f"{key}.weight is {source.weight:g}; it must be finite and {weight.describe()}"
        )
    if split != "train" and source.weight != 1.0:
        raise MTError(f"{key}.weight: only training sources are weighted; remove it")
    if source.name is not None:
        check_plain_name(source.name, f"{key}.name")
    for side in ("src_lang", "trg_lang"):
        if getattr(source, side) is not None:
            check_language(getattr(source, side), f"{key}.{side}")


def _validate_model(model_cfg: ModelConfig, tok_cfg: TokenizerConfig) -> None:
    if model_cfg.d_model % model_cfg.n_head != 0:
        raise MTError(
            f"model.d_model={model_cfg.d_model} must be divisible by model.n_head={model_cfg.n_head}"
        )
    if model_cfg.share_embeddings and not tok_cfg.joint:
        raise MTError("model.share_embeddings needs tokenizer.joint: true (one vocabulary)")
    if tok_cfg.model_type == "bpe" and tok_cfg.sample_alpha >= 1:
        raise MTError(
            f"tokenizer.sample_alpha={tok_cfg.sample_alpha}: expected 0 (off) or more; below 1 "
            "for bpe"
        )
    if tok_cfg.sample_nbest != -1 and tok_cfg.sample_nbest < 2:  # 0 and 1 would not sample
        raise MTError(
            f"tokenizer.sample_nbest={tok_cfg.sample_nbest}: expected -1 (all) or at least 2"
        )


def _validate_train(train_cfg: TrainConfig, data_cfg: DataConfig) -> None:
    check_device_name(train_cfg.device)
    if train_cfg.best_metric == "bleu" and not train_cfg.valid_bleu:
        raise MTError("train.best_metric=bleu needs train.valid_bleu: true")
    if train_cfg.batch_tokens < data_cfg.max_tokens_per_side:
        raise MTError(
            f"train.batch_tokens={train_cfg.batch_tokens} is below data.max_tokens_per_side="
            f"{data_cfg.max_tokens_per_side}: the longest pair would not fit in a batch"
        )
    if not 0 <= train_cfg.average_last <= train_cfg.keep_last:
        raise MTError(
            f"train.average_last={train_cfg.average_last} must be between 0 and train.keep_last="
            f"{train_cfg.keep_last}: only kept step checkpoints can be averaged"
        )


def config_from_dict(raw: dict[str, Any]) -> Config:
    """Rebuild a Config from ``Config.to_dict()`` output (e.g. stored in a checkpoint)."""
    cfg = Config()
    if not isinstance(raw, dict):
        raise MTError("checkpoint config: expected a mapping of sections")
    for section, body in raw.items():
        if section == "name":
            cfg.name = _check_type(body, str, "name")
            continue
        if not isinstance(body, dict):
            raise MTError(f"checkpoint config: section {section!r} must be a mapping of keys")
        for key, value in body.items():
            _apply(cfg, section, key, value, "checkpoint config: ")
    return cfg


def save_config(cfg: Config, path: Path) -> None:
    """Write ``cfg`` as YAML, atomically (never a half-written file, a full disk named)."""
    write_text_atomic(path, yaml.dump(cfg.to_dict(), Dumper=_Dumper, sort_keys=False))


def config_yaml(cfg: Config) -> str:
    """``cfg`` as YAML, every key with its help as a comment; it loads back as ``cfg``.

    Each key's comment holds its help and allowed values; every value is shown, defaults
    included, so that :func:`load_config` of the text gives ``cfg`` again.
    """
    lines = ["# Every key of the config, with its help; docs/CONFIG.md is the reference."]
    for declared in settings_of(Config):
        value = getattr(cfg, declared.name)
        lines.append("")
        if dataclasses.is_dataclass(value):
            lines += [*_yaml_comment(declared, ""), f"{declared.name}:"]
            for inner in settings_of(type(value)):
                lines += _yaml_key(inner, getattr(value, inner.name), "  ")
        else:
            lines += _yaml_key(declared, value, "")
    return "\n".join(lines) + "\n"


def _yaml_key(declared: Setting, value: Any, indent: str) -> list[str]:
    """One key: its comment, then ``key: value`` (a list of sources: one mapping per item)."""
    lines = _yaml_comment(declared, indent)
    if not (isinstance(value, list) and value and dataclasses.is_dataclass(value[0])):
        return [*lines, f"{indent}{declared.name}: {_yaml_scalar(value)}"]
    lines.append(f"{indent}{declared.name}:  # the keys each source sets (SourceConfig)")
    for item in value:
        lines.append(f"{indent}  -")
        for inner in settings_of(type(item)):
            if getattr(item, inner.name) != inner.default:
                lines += _yaml_key(inner, getattr(item, inner.name), indent + "    ")
    return lines


def _yaml_comment(declared: Setting, indent: str) -> list[str]:
    """The help of a key, with its range or choices, as ``#`` lines of at most ~100 columns."""
    text = declared.help + allowed_values(declared, prefix="; allowed: ")
    width = max(40, 98 - len(indent))
    return [f"{indent}# {line}" for line in textwrap.wrap(text, width)]


def allowed_values(declared: Setting, prefix: str = "") -> str:
    """The values a key accepts in words ("at least 1", "one of relu, gelu"), or ""."""
    if declared.choices is not None:
        return f"{prefix}one of {', '.join(declared.choices)}"
    if declared.range is not None:
        return f"{prefix}{declared.range.describe()}"
    return ""


def _yaml_scalar(value: Any) -> str:
    """One value in YAML flow style, as :class:`_Loader` reads it back."""
    text = yaml.dump(
        value, Dumper=_Dumper, default_flow_style=True, width=1 << 30, allow_unicode=True
    )
    return text.removesuffix("\n").removesuffix("\n...")
