"""The config's schema: one dataclass per section, each field a declared setting.

:class:`Config` holds the sections ``data`` (with its :class:`SourceConfig` items), ``tokenizer``,
``model``, ``train`` and ``decode``; the constants beside them are the values fields and
validation share (BLEU tokenizers, the widest beam, the source kinds, the splits).
"""

import dataclasses
from dataclasses import dataclass
from typing import Any

from transformer_mt.config.settings import (
    ANY_NUMBER,
    AT_LEAST_0,
    AT_LEAST_1,
    POSITIVE,
    PROBABILITY,
    SEED_63,
    Range,
    _choice_error,
    setting,
    settings_of,
)
from transformer_mt.errors import MTError

# sacrebleu's BLEU tokenizers that need no download (its spm/flores ones fetch a model).
BLEU_TOKENIZERS = ("13a", "intl", "zh", "ja-mecab", "ko-mecab", "char", "none")
MAX_BEAM = 128  # wider beams cost memory in proportion and no longer improve translations
MIN_VOCAB_SIZE = 16  # the 4 special ids and a few pieces: no corpus's alphabet fits in fewer
MAX_SOURCE_WEIGHT = 1000  # a source's weight: the most times an epoch draws each of its pairs


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
    cuda_graphs: bool = setting(
        False,
        "with train.compile on a GPU: each compiled layer replayed as a CUDA graph (Inductor's"
        " CUDA graph trees, as torch.compile's mode='reduce-overhead'): the host launches a graph"
        " instead of each of its kernels, for more GPU memory; ignored on a CPU; not yet measured",
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
        "writes them as text<TAB>score lines (with a glossary, those holding every term: the "
        "lines past them empty, scored -inf)",
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


# The local corpus's file keys (data.corpus: local), and the splits of data sources.
LOCAL_FILE_KEYS = tuple(
    f"{s}_{side}" for s in ("train", "valid", "test") for side in ("src", "trg")
)
SPLITS = ("train", "valid", "test")


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
