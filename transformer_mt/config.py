"""Typed configuration: dataclasses, YAML loading, dotted overrides and validation.

A YAML file has one mapping per section (``data``, ``tokenizer``, ``model``, ``train``, ``decode``).
Every key must be a field of that section's dataclass and have its type; ``--set train.max_steps=100``
overrides one field. Mistakes raise :class:`MTError` naming the key, before any work starts.
"""

import dataclasses
import importlib.resources
import math
import os
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from transformer_mt.errors import MTError
from transformer_mt.fileio import decode_utf8, write_text_atomic


@dataclass
class SourceConfig:
    """One source of parallel text in ``data.train`` / ``data.valid`` / ``data.test``.

    Exactly one of the keys ``src`` (with ``trg``), ``tsv``, ``jsonl``, ``parquet``, ``tmx``,
    ``corpus``, ``mtdata``, ``hf`` and ``sacrebleu`` says what the source is; the other keys
    refine it. The languages are ``data.src_lang`` / ``data.trg_lang``.
    """

    src: str | None = None  # source-side file: text (plain, .gz, .xz, .bz2), WMT .sgm, or IWSLT
    # .xml / train.tags (by its name); read inside `archive` when that is set
    trg: str | None = None  # target-side file, the same format as `src`
    tsv: str | None = None  # a tab-separated file, one pair a line (see `columns`)
    columns: list[int] = field(default_factory=lambda: [0, 1])  # tsv: the source and target
    # columns, counted from 0
    jsonl: str | None = None  # a JSON-lines file, one object a pair (see `fields`)
    parquet: str | None = None  # a parquet file, one row a pair (see `fields`); needs [hf]
    fields: list[str] | None = None  # jsonl / parquet / hf: the source and target fields, dotted
    # into nested objects; null = translation.<src_lang> and translation.<trg_lang>
    tmx: str | None = None  # a TMX translation memory (units without both languages are skipped)
    archive: str | None = None  # read src/trg, tsv, jsonl or tmx as members of this archive
    # (.tar, .tgz, .tar.xz, .tar.bz2, .zip) without unpacking it
    corpus: str | None = None  # a registry corpus by name (`mt download --list`)
    mtdata: str | None = None  # an mtdata dataset ID, e.g. Statmt-news_commentary-16-deu-eng
    # (needs the [mtdata] extra)
    hf: str | None = None  # a Hugging Face dataset: its Hub name or a local path (needs [hf])
    hf_config: str | None = None  # hf: the dataset's configuration, e.g. de-en
    split: str | None = None  # corpus / hf: the split to read; null = the split this source is
    # listed under (for hf: train, validation, test)
    sacrebleu: str | None = None  # a sacrebleu test set, e.g. wmt14/full (md5-checked, cached in
    # $SACREBLEU)
    src_lang: str | None = None  # the source's source language; null = data.src_lang
    trg_lang: str | None = None  # the source's target language; null = data.trg_lang. Several
    # target languages make a multilingual model: each source starts with a <2xx> tag
    weight: float = 1.0  # data.train only: how much of the source an epoch draws: 2 = each pair
    # twice, 0.5 = a random half (drawn anew each epoch)
    name: str | None = None  # a plain name for reports and the cache; null = taken from the source


SOURCE_KINDS = ("src", "tsv", "jsonl", "parquet", "tmx", "corpus", "mtdata", "hf", "sacrebleu")
"""The keys of :class:`SourceConfig` that say what a source is; a source sets exactly one."""


@dataclass
class DataConfig:
    corpus: str = "toy"  # "toy" (built-in generator), "local" (files below) or a registry
    # corpus by name, e.g. "multi30k" (`mt download --list`); data.train, when set, replaces it
    train: list[SourceConfig] | None = None  # training sources, each a mapping (SourceConfig:
    # a file pair, tsv, jsonl, parquet, tmx, corpus, mtdata, hf or sacrebleu) with its weight
    valid: list[SourceConfig] | None = None  # validation sources (needed with data.train);
    # several are read as one set
    test: list[SourceConfig] | None = None  # test sources (optional), read as one set
    temperature: float = 1.0  # several language pairs: an epoch draws pair k in proportion to
    # p_k^(1/T) (p_k = its share of weight x size); 1 = proportional, larger = flatter, toward
    # the small pairs
    src_lang: str = "src"  # source language code: names files and logs
    trg_lang: str = "trg"  # target language code
    train_src: str | None = None  # local corpus: training source file (plain or .gz)
    train_trg: str | None = None  # local corpus: training target file
    valid_src: str | None = None  # local corpus: validation source file
    valid_trg: str | None = None  # local corpus: validation target file
    test_src: str | None = None  # local corpus: test source file
    test_trg: str | None = None  # local corpus: test target file
    toy_train_size: int = 20000  # toy corpus: training pairs
    toy_valid_size: int = 500  # toy corpus: validation pairs
    toy_test_size: int = 500  # toy corpus: test pairs
    toy_seed: int = 1234  # toy corpus: generator seed (same seed, same corpus)
    max_words: int | None = 250  # cleaning: pairs with more whitespace words on a side are
    # dropped; null = no limit
    max_ratio: float | None = 3.0  # cleaning: longest allowed word-count ratio, checked only when
    # the longer side has more than 5 words (CleanConfig.ratio_min_words); null = no check
    skip_bad_lines: bool = False  # cleaning: skip invalid UTF-8 pairs instead of stopping
    max_tokens_per_side: int = 128  # pairs longer than this (subword pieces + EOS) are dropped
    download_dir: str = "data"  # known corpora are downloaded to <download_dir>/<corpus>
    base_url: str | None = None  # mirror for a known corpus's files; null = the registry's URL
    cache_dir: str = "data/cache"  # where prepared corpora (tokenizer, token ids) are kept


@dataclass
class TokenizerConfig:
    vocab_size: int = 1000  # sentencepiece vocabulary size (a target; tiny corpora may get fewer)
    model_type: str = "unigram"  # sentencepiece algorithm: unigram | bpe
    joint: bool = True  # one vocabulary for both languages (allows model.share_embeddings)
    character_coverage: float = 1.0  # share of characters covered; 0.9995 for large alphabets
    sample_alpha: float = 0.0  # subword regularization: train on sampled segmentations, one of
    # sample_draws per pair each epoch; unigram smoothing (lower = more varied) or BPE-dropout rate;
    # 0 = off (the best segmentation only)
    sample_nbest: int = -1  # unigram: sample among the n best segmentations (>= 2); -1 = all of
    # them; BPE-dropout ignores it
    train_on: list[str] | None = None  # the training sources (their names in the log and
    # cache, e.g. [europarl-v7]) sentencepiece learns from; null = all of them, by weight. Naming
    # some keeps the tokenizer, and so every other source's cache, when a source is added
    sample_draws: int = 16  # sampled segmentations per pair, drawn once into the data cache (which
    # grows this many times the training split); each run of this many epochs reads each draw once


@dataclass
class ModelConfig:
    d_model: int = 256  # width of embeddings and hidden states
    n_head: int = 4  # attention heads; must divide d_model
    ffn_hidden: int = 1024  # inner width of the feed-forward sublayers
    n_layers: int = 3  # encoder layers
    n_dec_layers: int | None = None  # decoder layers; null = same as n_layers
    drop_prob: float = 0.1  # dropout on embeddings and sublayer outputs (the paper's)
    attn_drop_prob: float = 0.0  # dropout on attention weights (not in the paper; costs time)
    ffn_drop_prob: float = 0.0  # dropout inside the feed-forward sublayer (not in the paper)
    max_len: int = 256  # longest sequence (source or target) the position table covers
    pre_norm: bool = False  # LayerNorm before sublayers (stable when deep) instead of after (paper)
    tie_embeddings: bool = True  # decoder input embedding shared with the output projection
    share_embeddings: bool = True  # source and target embeddings shared (needs tokenizer.joint)
    # What imported models (`mt import`: Marian / OPUS-MT) compute differently; the defaults are
    # this project's own Transformer, which every trained checkpoint was built as:
    scale_embeddings: bool = True  # embeddings multiplied by sqrt(d_model) (Marian: config's
    # scale_embedding)
    position_layout: str = "interleaved"  # sinusoid table: "interleaved" (sin, cos alternate,
    # the paper's) or "halves" (all sines, then all cosines: Marian's)
    activation: str = "relu"  # feed-forward activation: relu, gelu or swish (OPUS-MT's)
    logits_bias: bool = False  # a bias on the output projection (Marian's final_logits_bias)

    # The values of the string choices above (the model implements exactly these).
    CHOICES = types.MappingProxyType(
        {"position_layout": ("interleaved", "halves"), "activation": ("relu", "gelu", "swish")}
    )

    def __setattr__(self, key: str, value: Any) -> None:
        """Set a field; a choice the model does not have is refused, naming the key (whether
        set by the constructor, a config file or an override)."""
        choices = self.CHOICES.get(key)
        if choices is not None and value not in choices:
            raise MTError(f"model.{key}={value!r}: expected one of {', '.join(choices)}")
        super().__setattr__(key, value)


@dataclass
class TrainConfig:
    seed: int = 1  # seeds model init, dropout and batch order
    max_steps: int = 2000  # optimizer steps to train for
    batch_tokens: int = 4096  # tokens (source or target, padding included) per micro-batch
    accum_steps: int = 1  # micro-batches per optimizer step
    lr_factor: float = 1.0  # Noam factor: lr = factor * d_model^-0.5 * min(s^-0.5, s * warmup^-1.5)
    warmup_steps: int = 4000  # Noam warm-up in optimizer steps
    lr_schedule: str = "noam"  # "noam" (the paper's), or "linear": Noam's warm-up, then a straight
    # line to 0 where the run ends (max_steps, or max_minutes when that comes first)
    adam_beta1: float = 0.9  # Adam beta1
    adam_beta2: float = 0.98  # Adam beta2 (the paper's value)
    adam_eps: float = 1e-9  # Adam epsilon (the paper's value)
    weight_decay: float = 0.0  # decoupled weight decay (AdamW); 0 = plain Adam
    label_smoothing: float = 0.1  # label smoothing epsilon
    clip_norm: float = 0.0  # clip the global gradient norm to this; 0 = off
    log_every: int = 50  # optimizer steps between metrics.jsonl lines
    valid_every: int = 500  # optimizer steps between validations (also at the end)
    valid_bleu: bool = True  # decode the validation set greedily and compute BLEU
    valid_bleu_tokenize: str = "13a"  # sacrebleu's BLEU tokenizer for it (as `mt evaluate
    # --tokenize`): 13a, or zh / ja-mecab / ko-mecab / char / intl / none for other scripts
    best_metric: str = "bleu"  # checkpoint selection: "bleu" (higher is better) or "loss"
    patience: int = 0  # stop after this many validations without improvement; 0 = never
    max_minutes: float = 0.0  # stop (validate, save) after this much training wall time; 0 = off
    precision: str = "fp32"  # "fp32", "bf16" (autocast) or "fp16" (autocast + gradient scaler)
    compile: bool = False  # torch.compile the model (helps on GPUs; measured no gain on 2 CPUs)
    max_nonfinite: int = 5  # stop after this many non-finite losses in a row (each is skipped)
    tensorboard: bool = False  # also write metrics to RUN_DIR/tensorboard (needs `tensorboard`)
    keep_last: int = 2  # step checkpoints kept besides last.pt and best.pt
    average_last: int = 0  # at the end, average.pt = mean of the last N step checkpoints; 0 = off
    device: str = "auto"  # "auto" (cuda if available), "cpu", "cuda", "cuda:1", ...
    threads: int = 0  # torch intra-op threads on CPU; 0 = torch's default
    keep_freed_memory: bool = True  # CPU on Linux: malloc reuses freed blocks (~30 % faster)
    init_from: str | None = None  # fine-tuning: a checkpoint whose weights, tokenizers, shape
    # and language tags start this run (fresh optimizer and schedule); null = random weights
    collective_timeout_s: float = 300.0  # torchrun: seconds a rank waits for the others in a
    # step's collective before the run stops with an error naming the rank that did not answer


@dataclass
class DecodeConfig:
    """How a trained model translates: the one parameter object of translation and search."""

    beam_size: int = 4  # beam width used by `mt translate` / `mt evaluate` by default; 1 = greedy
    nbest: int = 1  # hypotheses returned per line, best first (at most beam_size)
    len_penalty: float = 1.0  # GNMT length-penalty alpha
    max_len_a: float = 10.0  # longest output = a + b * source length (in subword tokens)
    max_len_b: float = 1.5  # see max_len_a
    batch_tokens: int = 4096  # source tokens per decoding batch
    sampling: bool = False  # draw each token instead of searching (back-translation); beam 1 only
    temperature: float = 1.0  # sampling: softmax temperature (> 0; lower is closer to greedy)
    top_k: int = 0  # sampling: keep the k most likely tokens; 0 = all
    top_p: float = 1.0  # sampling: keep the smallest set holding this probability mass; 1 = all
    sample_seed: int = 0  # sampling: seed of the draws; a line's sample depends on the seed and
    # its line number only (not on batch_tokens or the lines decoded beside it)


@dataclass
class Config:
    name: str = "toy"  # run name; the default run directory is runs/<name>
    data: DataConfig = field(default_factory=DataConfig)  # corpus and preparation
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)  # sentencepiece
    model: ModelConfig = field(default_factory=ModelConfig)  # Transformer shape
    train: TrainConfig = field(default_factory=TrainConfig)  # optimization and logging
    decode: DecodeConfig = field(default_factory=DecodeConfig)  # search defaults

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
        raise MTError(f"config key {key!r}: expected {_type_name(tp)}, got {value!r}")
    if origin is list:
        (item,) = typing.get_args(tp)
        if isinstance(value, dict) and dataclasses.is_dataclass(item):
            value = [value]  # one source may be written without the list around it
        if not isinstance(value, list):
            raise MTError(f"config key {key!r}: expected a list, got {value!r}")
        return [_check_type(v, item, f"{key}[{i}]") for i, v in enumerate(value)]
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return _build_dataclass(tp, value, key)
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp is bool and not isinstance(value, bool):
        raise MTError(f"config key {key!r}: expected true/false, got {value!r}")
    if tp is int and isinstance(value, bool):
        raise MTError(f"config key {key!r}: expected an integer, got {value!r}")
    if not isinstance(value, tp):
        raise MTError(f"config key {key!r}: expected {_type_name(tp)}, got {value!r}")
    return value


def _build_dataclass(cls: type, value: Any, key: str) -> Any:
    """An instance of ``cls`` from a mapping of its keys (a list item such as one source)."""
    if isinstance(value, cls):
        return value
    if not isinstance(value, dict):
        raise MTError(f"config key {key!r}: expected a mapping of keys, got {value!r}")
    obj, hints = cls(), _section_types(cls)
    for name, item in value.items():
        if name not in hints:
            raise MTError(f"unknown config key '{key}.{name}'; known keys: {', '.join(hints)}")
        setattr(obj, name, _check_type(item, hints[name], f"{key}.{name}"))
    return obj


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
    """``path`` when it is a file; else, for a bare name such as ``multi30k_de_en``, the shipped
    recipe of that name (so ``--config multi30k_de_en`` works from any directory)."""
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
    """PyYAML's safe loader with YAML 1.2's plain scalars: ``1e-4`` is a float, only true/false
    are booleans, integers are decimal (``010`` is 10; ``0o``/``0x`` prefixes, ``_`` between
    digits), no base-60. (PyYAML follows YAML 1.1, where ``1e-4`` is text, ``no``, ``on`` and
    ``y`` are booleans and ``1:30`` is 90: ``--set train.weight_decay=1e-4`` or
    ``data.trg_lang: no`` would fail.) A key repeated in one mapping is an error, as YAML 1.2
    says (PyYAML keeps the last one: a second ``train:`` section would silently replace the
    first)."""

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
    """``~`` in the data paths means the home directory, as in a shell (the shell does not expand
    it inside ``--set data.cache_dir=~/x``, and YAML never does)."""
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


# sacrebleu's BLEU tokenizers that need no download (its spm/flores ones fetch a model).
BLEU_TOKENIZERS = ("13a", "intl", "zh", "ja-mecab", "ko-mecab", "char", "none")
MAX_BEAM = 128  # wider beams cost memory in proportion and no longer improve translations
MIN_VOCAB_SIZE = 16  # the 4 special ids and a few pieces: no corpus's alphabet fits in fewer
DEVICE_NAMES = "auto, cpu, cuda, cuda:N or mps"  # what train.device accepts (check_device_name)
_DEVICE_RE = re.compile(r"auto|cpu|cuda(:\d+)?|mps")


@dataclass(frozen=True)
class Range:
    """The values a numeric config field accepts: ``lo``/``hi`` (None = unbounded), each bound
    included unless ``*_open``; ``none_ok`` also accepts null. Floats must also be finite."""

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

    def describe(self) -> str:
        """The range in words: "at least 1", "1 to 128", "in [0, 1)", "greater than 0"."""
        lo, hi = _number(self.lo), _number(self.hi)
        if self.hi is None:
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

# The allowed values of every numeric field, by section; load_config checks them all before any
# work (tests/test_config.py fails when a numeric field is in neither this table nor UNBOUNDED).
RANGES: dict[str, dict[str, Range]] = {
    "data": {
        "toy_train_size": AT_LEAST_1,
        "toy_valid_size": AT_LEAST_1,
        "toy_test_size": AT_LEAST_1,
        "max_words": Range(lo=1, none_ok=True),
        "max_ratio": Range(lo=1.0, none_ok=True),
        "max_tokens_per_side": Range(lo=2),  # one piece + EOS (or BOS) is the shortest pair
        "temperature": Range(lo=0.0, lo_open=True),
    },
    "tokenizer": {
        "vocab_size": Range(lo=MIN_VOCAB_SIZE),
        "character_coverage": Range(lo=0.0, hi=1.0, lo_open=True),
        "sample_alpha": AT_LEAST_0,  # and below 1 for bpe (_validate_tokenizer)
        "sample_nbest": Range(lo=-1),  # and -1 or >= 2 (_validate_tokenizer)
        "sample_draws": AT_LEAST_1,
    },
    "model": {
        "d_model": AT_LEAST_1,
        "n_head": AT_LEAST_1,
        "ffn_hidden": AT_LEAST_1,
        "n_layers": AT_LEAST_1,
        "n_dec_layers": Range(lo=1, none_ok=True),
        "drop_prob": PROBABILITY,
        "attn_drop_prob": PROBABILITY,
        "ffn_drop_prob": PROBABILITY,
        "max_len": Range(lo=2),  # BOS or EOS and one token
    },
    "train": {
        "seed": SEED_63,
        "max_steps": AT_LEAST_1,
        "batch_tokens": AT_LEAST_1,
        "accum_steps": AT_LEAST_1,
        "lr_factor": POSITIVE,
        "warmup_steps": AT_LEAST_1,
        "adam_beta1": PROBABILITY,
        "adam_beta2": PROBABILITY,
        "adam_eps": POSITIVE,
        "weight_decay": AT_LEAST_0,
        "label_smoothing": PROBABILITY,
        "clip_norm": AT_LEAST_0,
        "log_every": AT_LEAST_1,
        "valid_every": AT_LEAST_1,
        "patience": AT_LEAST_0,
        "max_minutes": AT_LEAST_0,
        "max_nonfinite": AT_LEAST_1,
        "keep_last": AT_LEAST_0,
        "average_last": AT_LEAST_0,  # and at most keep_last (_validate_train)
        "threads": AT_LEAST_0,
        "collective_timeout_s": POSITIVE,
    },
    "decode": {
        "beam_size": Range(1, MAX_BEAM),
        "nbest": AT_LEAST_1,  # and at most beam_size (validate_decode)
        "len_penalty": AT_LEAST_0,
        "max_len_a": AT_LEAST_0,  # and not both 0 (validate_decode)
        "max_len_b": AT_LEAST_0,
        "batch_tokens": AT_LEAST_1,
        "temperature": POSITIVE,
        "top_k": AT_LEAST_0,
        "top_p": Range(lo=0.0, hi=1.0, lo_open=True),
        "sample_seed": Range(-(2**63), 2**64 - 1),  # 64-bit words, signed or not
    },
}
# Numeric fields that take any value: random.Random accepts every integer as a seed.
UNBOUNDED = {"data.toy_seed"}
# The `mt translate` / `mt evaluate` options that set decode keys, named in their errors.
DECODE_OPTIONS = {
    "beam_size": "--beam",
    "nbest": "--nbest",
    "len_penalty": "--len-penalty",
    "batch_tokens": "--batch-tokens",
    "temperature": "--temperature",
    "top_k": "--top-k",
    "top_p": "--top-p",
    "sample_seed": "--seed",
}


def check_ranges(section: str, obj: Any, options: dict[str, str] | None = None) -> None:
    """Check every field of ``obj`` (the dataclass of ``section``) that :data:`RANGES` bounds.

    Raises:
        MTError: one line naming the key (and its command-line option, if ``options`` names one),
            the value and the allowed range, e.g. ``model.n_head is 0; it must be at least 1``.
    """
    for key, allowed in RANGES[section].items():
        value = getattr(obj, key)
        if not allowed.holds(value):
            option = (options or {}).get(key)
            name = f"{section}.{key}" + (f" ({option})" if option else "")
            shown = _number(value) if isinstance(value, int | float) else repr(value)
            finite = "finite and " if isinstance(value, float) and not math.isfinite(value) else ""
            raise MTError(f"{name} is {shown}; it must be {finite}{allowed.describe()}")


def check_device_name(name: str, key: str = "train.device") -> None:
    """Refuse a device name that torch would reject later (or misread), naming ``key``."""
    if not _DEVICE_RE.fullmatch(name):
        raise MTError(f"{key} is {name!r}; it must be {DEVICE_NAMES}")


def validate_decode(d: DecodeConfig) -> None:
    """The checks of the decode settings, run by :func:`validate` and again after command-line
    options replaced some of them; messages name the key and the `mt translate` option."""
    check_ranges("decode", d, DECODE_OPTIONS)
    if not 1 <= d.nbest <= d.beam_size:
        raise MTError(
            f"decode.nbest (--nbest) is {d.nbest}; it must be between 1 and the beam size "
            f"({d.beam_size})"
        )
    if d.max_len_a + d.max_len_b <= 0:
        raise MTError(
            f"decode.max_len_a={d.max_len_a:g} and decode.max_len_b={d.max_len_b:g} must be >= 0 "
            "and not both 0 (longest output = a + b * source length)"
        )
    if not d.sampling:
        return
    if d.beam_size != 1 or d.nbest != 1:
        raise MTError(
            "decode.sampling (--sample) draws one translation per line: it needs beam size 1 and "
            "n-best 1; drop --beam / --nbest"
        )


def validate(cfg: Config) -> None:
    """Every range (:data:`RANGES`), then the checks across fields, before any work starts: a
    wrong value fails in a second, not after the data preparation."""
    if not re.fullmatch(r"[^/\\\x00]+", cfg.name) or cfg.name in (".", ".."):
        raise MTError(
            f"name={cfg.name!r}: the run name names directories (runs/<name>, the data cache); "
            "give one plain name, e.g. name: my-run"
        )
    for section in ("data", "tokenizer", "model", "train"):
        check_ranges(section, getattr(cfg, section))
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
    """Refuse a value that becomes part of a file name unless it is one plain name: no ``/``,
    ``\\``, ``..`` or leading dot, so that it can never point outside its folder."""
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
    if len(source.columns) != 2 or min(source.columns) < 0 or len(set(source.columns)) != 2:
        raise MTError(f"{key}.columns={source.columns}: give two different columns, e.g. [0, 1]")
    if source.fields is not None and len(source.fields) != 2:
        raise MTError(f"{key}.fields={source.fields}: give the source field and the target field")
    if not (math.isfinite(source.weight) and source.weight > 0):
        raise MTError(f"{key}.weight is {source.weight:g}; it must be finite and greater than 0")
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
    if tok_cfg.model_type not in ("unigram", "bpe"):
        raise MTError(f"tokenizer.model_type={tok_cfg.model_type!r}: expected unigram or bpe")
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
    if train_cfg.best_metric not in ("bleu", "loss"):
        raise MTError(f"train.best_metric={train_cfg.best_metric!r}: expected bleu or loss")
    if train_cfg.valid_bleu_tokenize not in BLEU_TOKENIZERS:
        raise MTError(
            f"train.valid_bleu_tokenize={train_cfg.valid_bleu_tokenize!r}: expected one of "
            f"{', '.join(BLEU_TOKENIZERS)}"
        )
    if train_cfg.best_metric == "bleu" and not train_cfg.valid_bleu:
        raise MTError("train.best_metric=bleu needs train.valid_bleu: true")
    if train_cfg.lr_schedule not in ("noam", "linear"):
        raise MTError(f"train.lr_schedule={train_cfg.lr_schedule!r}: expected noam or linear")
    if train_cfg.precision not in ("fp32", "bf16", "fp16"):
        raise MTError(f"train.precision={train_cfg.precision!r}: expected fp32, bf16 or fp16")
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
