"""Config validation: every declared range, then the rules across fields and sections.

:func:`validate` checks a whole :class:`~transformer_mt.config.schema.Config` before any work
starts; :func:`validate_decode` checks the decode settings alone (as a request or an option
changes them). The name checks (:func:`check_language`, :func:`check_plain_name`,
:func:`check_device_name`) are shared with the parts that read those names.
"""

import math
import re
from collections.abc import Mapping

from transformer_mt.config.schema import (
    LOCAL_FILE_KEYS,
    SOURCE_KINDS,
    SPLITS,
    Config,
    DataConfig,
    DecodeConfig,
    ModelConfig,
    SourceConfig,
    TokenizerConfig,
    TrainConfig,
)
from transformer_mt.config.settings import (
    Limit,
    check_settings,
    declared_settings,
    setting_name,
    settings_of,
)
from transformer_mt.errors import MTError

DEVICE_NAMES = "auto, cpu, cuda, cuda:N or mps"  # what train.device accepts (check_device_name)
_DEVICE_RE = re.compile(r"auto|cpu|cuda(:\d+)?|mps")


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
        more = (
            f": an epoch draws a pair at most {weight.hi:,g} times; to draw this source more "
            "than the others, lower the others' weights"
            if weight.hi is not None and source.weight > weight.hi
            else ""
        )
        raise MTError(
            f"{key}.weight is {source.weight:g}; it must be finite and {weight.describe()}{more}"
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
    if train_cfg.cuda_graphs and not train_cfg.compile:
        raise MTError("train.cuda_graphs replays compiled layers: set train.compile: true too")
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
