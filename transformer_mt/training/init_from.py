"""Fine-tuning: a new run that starts from a trained model (``train.init_from``).

Domain adaptation continues training a model on new, in-domain data. Such a run takes from the
checkpoint its weights, its tokenizers (the new data is encoded with them: the model's ids keep
their meaning), its model shape and, when it has them, its language tags; it starts its own
optimizer and learning-rate schedule (step 0, the warm-up again). The dropout rates are the
config's: they size nothing.

Everything is read and checked before any work is done: a missing file or one that is not a
checkpoint, a shape in the config that contradicts the checkpoint's (:func:`check_shape`), a
target language the checkpoint has no tag for (:func:`check_languages`). A tokenizer setting
that differs is no error: the checkpoint's tokenizer is used, and the log says so.

The run records where it started: its config.yaml keeps ``train.init_from``, and each checkpoint
it writes holds ``train_state["init_from"]`` = {path, sha256, step} of the file it started from.
A resumed fine-tuning run continues from its own last.pt (which holds the same tokenizers, shape
and tags): ``train.init_from`` is not read again.
"""

import dataclasses
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from transformer_mt.checkpoint import load_checkpoint
from transformer_mt.config import Config, ModelConfig, config_from_dict, validate
from transformer_mt.data.download import sha256_of
from transformer_mt.data.languages import training_pairs
from transformer_mt.data.prepare import PreparedData
from transformer_mt.data.tokenizer import Tokenizer
from transformer_mt.errors import MTError
from transformer_mt.model import TransformerConfig
from transformer_mt.model.transformer_config import stated_settings

log = logging.getLogger(__name__)

# The model settings that set no parameter's shape, the dropout rates (ModelConfig's fields named
# *drop_prob): a run may change them (a resumed run, or a fine-tuning run that drops more or less
# than the model was trained with).
DROPOUT_ARGS = tuple(
    f.name for f in dataclasses.fields(ModelConfig) if f.name.endswith("drop_prob")
)
# Every other ModelConfig key sizes a parameter or changes what one means (the options of
# imported Marian models included): fixed by the checkpoint.
SHAPE_KEYS = tuple(f.name for f in dataclasses.fields(ModelConfig) if f.name not in DROPOUT_ARGS)
# The tokenizer settings that describe a trained vocabulary (``joint`` is read from the bytes).
_VOCABULARY_KEYS = ("vocab_size", "model_type", "character_coverage")


@dataclass
class Start:
    """What a fine-tuning run starts from, read and checked before any data is prepared."""

    cfg: Config  # the run's config: the checkpoint's shape and tokenizer settings, its dropout
    src_tok: Tokenizer  # the checkpoint's tokenizers: they encode the new data
    trg_tok: Tokenizer
    model_config: TransformerConfig  # the checkpoint's model, with the config's dropout rates
    record: dict[str, Any]  # train_state["init_from"]: {"path", "sha256", "step"}
    lang_tags: dict[str, str] | None  # target language -> its tag piece; None: one language
    weights: dict[str, torch.Tensor] | None  # the weights to load; None: a resume (last.pt's)


def find_start(cfg: Config, last: Mapping[str, Any] | None, last_path: Path) -> Start | None:
    """The start of a fine-tuning run, or None for a run from random weights.

    ``last`` is the run's own last.pt when the run resumes. One that records ``init_from`` is a
    fine-tuning run: tokenizers, shape and tags come from it, and ``train.init_from`` is not read
    again. An ordinary run's last.pt while ``train.init_from`` is set is refused: that run did
    not start from the checkpoint named, and continuing it would not either.
    """
    if last is not None:
        record = last.get("train_state", {}).get("init_from")
        if record is None:
            if cfg.train.init_from is not None:
                raise MTError(
                    f"{last_path} is a run that did not start from train.init_from="
                    f"{cfg.train.init_from}; pass another --run-dir for the fine-tuning run, or "
                    "drop --init-from (train.init_from) to continue that run"
                )
            return None
        _check_record(record, last_path)
        _note_resume(cfg, record, last_path)
        train = dataclasses.replace(cfg.train, init_from=cfg.train.init_from or record["path"])
        return _start(dataclasses.replace(cfg, train=train), last, last_path, record, None)
    if cfg.train.init_from is None:
        return None
    path = Path(cfg.train.init_from).expanduser()
    ckpt = load_checkpoint(path)  # a missing file or not a checkpoint: a one-line MTError
    record = {"path": str(path.resolve()), "sha256": sha256_of(path), "step": ckpt.get("step")}
    start = _start(cfg, ckpt, path, record, ckpt["model"])
    log.info(
        f"fine-tuning {path} (step {record['step']}): its weights, tokenizers and shape, a new "
        "optimizer and learning-rate schedule"
    )
    return start


def _check_record(record: Any, path: Path) -> None:
    """A checkpoint's ``train_state["init_from"]`` must be {path, sha256, step} of their types."""
    fits = (
        isinstance(record, dict)
        and isinstance(record.get("path"), str)
        and isinstance(record.get("sha256"), str)
        and (record.get("step") is None or type(record.get("step")) is int)
    )
    if not fits:
        raise MTError(
            f"damaged checkpoint {path}: field train_state.init_from is not {{path, sha256, "
            "step}}; use an intact copy or another checkpoint of the run"
        )


def _note_resume(cfg: Config, record: Mapping[str, Any], last_path: Path) -> None:
    """Log that a resumed fine-tuning run continues from its own last.pt.

    Also that a ``train.init_from`` given now is not read (a warning when it names another file)."""
    given = cfg.train.init_from
    if given is None:
        return
    if Path(given).expanduser().resolve() == Path(record["path"]):
        log.info(f"train.init_from is not read again: the run continues from {last_path}")
    else:
        log.warning(
            f"train.init_from={given} is ignored: {last_path} continues the run that started "
            f"from {record['path']}"
        )


def _start(
    cfg: Config,
    ckpt: Mapping[str, Any],
    path: Path,
    record: dict[str, Any],
    weights: dict[str, torch.Tensor] | None,
) -> Start:
    """Check ``cfg`` against the checkpoint ``ckpt`` (read from ``path``) and assemble the start."""
    saved_args = ckpt["model_args"]
    check_shape(cfg.model, saved_args, path)
    src_tok, trg_tok = _tokenizers(ckpt, path)
    check_languages(cfg, ckpt, path)
    run_cfg = _adopt(cfg, ckpt, path)
    # The run's model section is the checkpoint's shape with the config's dropout (_adopt).
    model = dataclasses.replace(run_cfg.model)  # a copy
    model_config = dataclasses.replace(_saved_model(saved_args, path), model=model)
    lang_tags = ckpt.get("lang_tags") or None
    return Start(run_cfg, src_tok, trg_tok, model_config, record, lang_tags, weights)


def _saved_model(saved_args: Mapping[str, Any], path: Path) -> TransformerConfig:
    """The model a checkpoint's arguments describe, or a one-line MTError naming ``path``."""
    try:
        return TransformerConfig.from_args(**saved_args)
    except (MTError, TypeError, ValueError) as err:
        raise MTError(
            f"damaged checkpoint {path}: its model arguments describe no model ({err}); use "
            "another checkpoint"
        ) from None


def saved_shape(saved_args: Mapping[str, Any]) -> dict[str, Any]:
    """The :data:`SHAPE_KEYS` of a checkpoint's model arguments.

    A key that an older checkpoint lacks has the value it was built with
    (:func:`stated_settings`)."""
    settings = stated_settings(saved_args)
    return {k: settings[k] for k in SHAPE_KEYS}


def check_shape(model_cfg: ModelConfig, saved_args: Mapping[str, Any], path: Path) -> None:
    """Refuse a shape key of the config that contradicts the checkpoint's model.

    A Config does not record which keys a file gave, so a key at ModelConfig's default counts as
    not given: a config without a model section fine-tunes any checkpoint (its shape is then
    the checkpoint's, logged by :func:`_adopt`). A decoder depth of null means "as deep as the
    encoder" on both sides of the comparison.
    """
    saved, default = saved_shape(saved_args), ModelConfig()
    conflicts = []
    for key in SHAPE_KEYS:
        mine = getattr(model_cfg, key)
        theirs = saved[key]
        if key == "n_dec_layers":
            mine_eff = model_cfg.n_layers if mine is None else mine
            theirs_eff = saved["n_layers"] if theirs is None else theirs
            same = mine_eff == theirs_eff
        else:
            same = mine == theirs
        if not same and mine != getattr(default, key):
            conflicts.append(f"model.{key} is {_show(mine)} in the config but {_show(theirs)}")
    if conflicts:
        raise MTError(
            f"{', '.join(conflicts)} in {path}; remove the model section's shape keys "
            "(fine-tuning keeps the checkpoint's shape) or match them"
        )


def _show(value: Any) -> str:
    """A config value as YAML writes it (true, null, 256)."""
    return json.dumps(value) if isinstance(value, bool | None) else str(value)


def _tokenizers(ckpt: Mapping[str, Any], path: Path) -> tuple[Tokenizer, Tokenizer]:
    """The checkpoint's (source, target) tokenizers, one object when they are one model.

    Each must fit the embedding it indexes."""
    try:
        src_tok = Tokenizer(ckpt["src_spm"])
        trg_tok = src_tok if ckpt["trg_spm"] == ckpt["src_spm"] else Tokenizer(ckpt["trg_spm"])
    except (MTError, RuntimeError) as err:  # sentencepiece raises RuntimeError on bad bytes
        first = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
        raise MTError(f"damaged checkpoint {path}: its tokenizer does not load ({first})") from err
    args = ckpt["model_args"]
    for side, tok, rows in (
        ("source", src_tok, "enc_voc_size"),
        ("target", trg_tok, "dec_voc_size"),
    ):
        if tok.vocab_size > args[rows]:  # its pieces would index past the embedding
            raise MTError(
                f"damaged checkpoint {path}: the {side} tokenizer has {tok.vocab_size} pieces, "
                f"the model {args[rows]} rows; use another checkpoint"
            )
    return src_tok, trg_tok


def _adopt(cfg: Config, ckpt: Mapping[str, Any], path: Path) -> Config:
    """``cfg`` with the checkpoint's shape and tokenizer settings, checked again.

    So that config.yaml says what the run trains; what changed is logged once."""
    shape = saved_shape(ckpt["model_args"])
    max_len = shape["max_len"]
    if cfg.data.max_tokens_per_side > max_len:
        raise MTError(
            f"data.max_tokens_per_side={cfg.data.max_tokens_per_side} exceeds model.max_len="
            f"{max_len} of {path}; set data.max_tokens_per_side to {max_len} or less"
        )
    model = dataclasses.replace(cfg.model, **shape)
    saved_tok = config_from_dict(ckpt["config"]).tokenizer
    vocabulary = {k: getattr(saved_tok, k) for k in _VOCABULARY_KEYS}
    vocabulary["joint"] = ckpt["src_spm"] == ckpt["trg_spm"]
    tokenizer = dataclasses.replace(cfg.tokenizer, **vocabulary)
    run_cfg = dataclasses.replace(cfg, model=model, tokenizer=tokenizer)
    validate(run_cfg)
    _log_changes(cfg, run_cfg, path)
    return run_cfg


def _log_changes(cfg: Config, run_cfg: Config, path: Path) -> None:
    """Say which model and tokenizer settings of the config the checkpoint's replaced."""
    for section, keys, what in (
        ("model", SHAPE_KEYS, "the model's shape"),
        ("tokenizer", (*_VOCABULARY_KEYS, "joint"), "the tokenizer (it encodes the data)"),
    ):
        before, after = getattr(cfg, section), getattr(run_cfg, section)
        changes = [
            f"{section}.{k} {_show(getattr(before, k))} -> {_show(getattr(after, k))}"
            for k in keys
            if getattr(before, k) != getattr(after, k)
        ]
        if changes:
            log.info(f"{path} sets {what}: {', '.join(changes)}")


def check_languages(
    cfg: Config, ckpt: Mapping[str, Any], where: str | Path = "the checkpoint"
) -> None:
    """Refuse a target language of ``cfg`` that a multilingual checkpoint has no tag for.

    ``ckpt["lang_tags"]`` (written by multilingual training) maps each target language to the
    piece that asks the model for it, e.g. ``{"en": "<2en>"}``. A checkpoint without it (one
    language pair) is not checked. With it, each target language of the config needs a tag, and
    the tag must be one piece of the checkpoint's vocabulary, or no sentence could ask for it.
    """
    tags = ckpt.get("lang_tags")
    if tags is None:
        return
    if not isinstance(tags, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in tags.items()
    ):
        raise MTError(f"damaged checkpoint {where}: field lang_tags is not a dict of strings")
    vocabularies = [Tokenizer(ckpt["src_spm"]), Tokenizer(ckpt["trg_spm"])]
    for lang in _target_languages(cfg):
        if lang not in tags:
            known = ", ".join(sorted(tags)) or "none"
            raise MTError(
                f"{where} has no language tag for the target language {lang!r} (data.trg_lang; "
                f"it knows: {known}); fine-tune it into a language it knows, or train a new model"
            )
        if not any(_is_piece(tok, tags[lang]) for tok in vocabularies):
            raise MTError(
                f"damaged checkpoint {where}: the tag {tags[lang]!r} of language {lang!r} is not "
                "a piece of its vocabulary"
            )


def _target_languages(cfg: Config) -> list[str]:
    """The target languages the config trains into, in the order its sources name them."""
    return list(dict.fromkeys(trg for _, trg in training_pairs(cfg.data)))


def _is_piece(tok: Tokenizer, piece: str) -> bool:
    """Whether ``piece`` is one piece of ``tok``'s vocabulary (unknown ones map to <unk>)."""
    return tok.piece_id(piece) is not None


def load_weights(model: torch.nn.Module, start: Start) -> None:
    """Load the start's weights into ``model`` (built from ``start.model_config``)."""
    if start.weights is None:
        return
    try:
        model.load_state_dict(start.weights)  # older parameter names are upgraded by the model
    except RuntimeError as err:  # missing keys or other sizes than its own model arguments
        first = (str(err).strip().splitlines() or ["RuntimeError"])[0][:200]
        raise MTError(
            f"damaged checkpoint {start.record['path']}: its weights do not fit its model "
            f"arguments ({first}); use another checkpoint"
        ) from err
    start.weights = None  # the model holds them now: no second copy for the rest of the run


def check_data(start: Start, data: PreparedData) -> None:
    """Refuse prepared data (given to the trainer) that another tokenizer encoded.

    Another than the start's: the model's ids would mean other pieces."""
    for given, own in ((data.src_tok, start.src_tok), (data.trg_tok, start.trg_tok)):
        if given.model_proto != own.model_proto:
            raise MTError(
                f"the prepared data was encoded with another tokenizer than {start.record['path']}"
                "'s; prepare it with prepare(cfg, tokenizers=...) of that checkpoint's tokenizers"
            )
