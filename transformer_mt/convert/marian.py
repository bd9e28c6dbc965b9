"""`mt import --from hf`: a Hugging Face ``MarianMTModel`` (OPUS-MT) as one of our checkpoints.

What is converted, and how:

- the weights, onto our :class:`~transformer_mt.model.Transformer` built with the options that
  make it compute what Marian computes: post-norm layers, the embedding scale of the config's
  ``scale_embedding``, the sinusoid table in halves (sines, then cosines), the config's
  activation (OPUS-MT: swish), a bias on the output projection (``final_logits_bias``); shared,
  separate or tied embeddings as the config has them;
- the vocabularies. Marian's tokenizer cuts text with ``source.spm`` / ``target.spm`` and maps
  each piece to an id through ``vocab.json`` (``target_vocab.json`` for a separate target
  vocabulary); ``</s>`` ends a sequence and ``<pad>`` starts the decoder. Our tokenizers give
  sentencepiece ids directly, with fixed special ids (pad 0, unk 1, bos 2, eos 3). So each side
  becomes a sentencepiece model with the same pieces and scores, reordered: our four special
  ids, then the vocabulary's pieces in its order. Pieces the vocabulary has and the
  sentencepiece model lacks (language tags, the other side's pieces) are kept as unused pieces
  (never produced by cutting text). Embedding rows, output rows and the bias are permuted to
  match. Our BOS row is Marian's decoder start (the pad row); as an output it is that row's
  logit minus 100 (never chosen, its probability e^-100 of pad's), so every other log-probability
  is Marian's to rounding. A sentencepiece piece the vocabulary lacks (Marian reads it as
  ``<unk>``) keeps an id of its own after the vocabulary's, with ``<unk>``'s embedding and, as an
  output, ``<unk>``'s logit minus 100: text is cut into the same pieces, and translated the
  same. A vocabulary that holds our BOS piece ``<s>`` as a piece of its own is refused;
- the language tags (``>>deu<<``) of a multi-target model, as the checkpoint's ``lang_tags``
  (``--target-lang deu``);
- the decode defaults of ``generation_config.json`` (or ``config.json``): ``num_beams``,
  ``length_penalty`` (Hugging Face divides a score by length^alpha, ours by GNMT's
  ((5 + length) / 6)^alpha: the same alpha, not the same ranking) and ``max_length``.

Everything is checked before anything is written, each problem one line naming the file and
field: ``config.json`` against one schema (:data:`CONFIG_SCHEMA`: types and ranges; token ids
within the vocabulary), each sentencepiece model (it loads, and cuts text into pieces of the
vocabulary: an empty or foreign one would read every text as <unk>), and every tensor's shape
against the config (:func:`check_shapes`) before the model is built.

A name that is not a local directory is fetched with ``huggingface_hub.snapshot_download``.
"""

import json
import logging
import math
import re
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from transformer_mt.checkpoint import save_checkpoint
from transformer_mt.config import (
    PROBABILITY,
    Config,
    DecodeConfig,
    ModelConfig,
    Range,
    validate_decode,
)
from transformer_mt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, SPECIAL_IDS, UNK_ID, Tokenizer
from transformer_mt.errors import MTError
from transformer_mt.fileio import check_output
from transformer_mt.model import Transformer, TransformerConfig

log = logging.getLogger(__name__)

# The files a Marian directory is read from (and all that is fetched from the hub).
HUB_FILES = [
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "pytorch_model.bin",
    "source.spm",
    "target.spm",
    "vocab.json",
    "target_vocab.json",
    "tokenizer_config.json",
]
# How much less likely than pad our BOS row is as an output (its logit: pad's minus this).
BOS_LOGIT_GAP = 100.0  # (and any row that only copies another's, as a never-chosen output)
_ACTIVATIONS = {"swish": "swish", "silu": "swish", "relu": "relu", "gelu": "gelu"}
_TAG_RE = re.compile(r">>([A-Za-z0-9]+(?:[_-][A-Za-z0-9]+)*)<<")
_LANG_RE = re.compile(r"[A-Za-z0-9]+(?:[_-][A-Za-z0-9]+)*")


def import_marian(source: str, output: Path) -> dict[str, Any]:
    """Convert the Marian model ``source`` (a directory, or a hub name) into a checkpoint.

    The checkpoint is written at ``output``. Returns what the command reports: the directory read,
    the language tags and the decode defaults.

    Raises:
        MTError: a model that is not Marian, uses what our model cannot compute, or has a
            vocabulary our tokenizer cannot reproduce (naming the file and field); a hub name
            that cannot be fetched.
    """
    check_output(output)  # before any work: a directory, or a missing parent, is one line
    directory = resolve_source(source)
    inputs = [directory / name for name in HUB_FILES]
    check_output(output, inputs)  # never over a file it reads (the model being imported)
    config = _read_json(directory / "config.json", required=True)
    shape = marian_shape(config, directory / "config.json")
    tok_cfg = _read_json(directory / "tokenizer_config.json", required=False)
    src_vocab, trg_vocab = _vocabularies(directory, tok_cfg)
    _check_specials(config, src_vocab, trg_vocab, directory)
    src_spm, src_rows = convert_vocabulary(directory / "source.spm", src_vocab, "vocab.json")
    trg_name = "target_vocab.json" if trg_vocab is not src_vocab else "vocab.json"
    trg_spm, trg_rows = convert_vocabulary(directory / "target.spm", trg_vocab, trg_name)
    weights = read_weights(directory)
    check_shapes(weights, shape, config, (len(src_vocab), len(trg_vocab)), _weights_file(directory))
    src_emb, trg_emb = embeddings(weights)
    shared = src_spm == trg_spm and src_emb.shape == trg_emb.shape and torch.equal(src_emb, trg_emb)
    model_cfg = ModelConfig(**shape, share_embeddings=shared)
    built = TransformerConfig.build(
        model_cfg, len(src_rows), len(trg_rows), pad_idx=PAD_ID, bos_idx=BOS_ID
    )
    never = [BOS_ID, *range(len(trg_vocab) + 1, len(trg_rows))]  # BOS, then the unknown pieces
    model = _built(built, map_weights(weights, built, (src_rows, trg_rows), never), directory)
    tags = language_tags(src_vocab)
    cfg = _run_config(model_cfg, tok_cfg, tags, config, directory, shared)
    cfg.name = _run_name(source)
    ckpt = {
        "model": model.state_dict(),
        "model_args": built.to_args(),
        "config": cfg.to_dict(),
        "src_spm": src_spm,
        "trg_spm": trg_spm,
        "special_ids": dict(SPECIAL_IDS),
        "step": 0,
        "imported_from": {"format": "hf-marian", "source": source},
    }
    if tags:
        ckpt["lang_tags"] = tags
    save_checkpoint(ckpt, output, inputs=inputs)  # a user-named output: written as such
    return {"directory": str(directory), "lang_tags": sorted(tags), "decode": asdict(cfg.decode)}


def _built(
    shape: TransformerConfig, state: dict[str, torch.Tensor], directory: Path
) -> Transformer:
    """Our Transformer with the mapped weights.

    Every name and shape is checked before anything is written (a one-line MTError when the weights
    do not fit the config)."""
    model = Transformer(shape)
    try:
        model.load_state_dict(state)
    except RuntimeError as err:
        first = (str(err).strip().splitlines() or ["RuntimeError"])[-1].strip()[:200]
        raise MTError(f"{directory}: the weights do not fit config.json ({first})") from None
    return model


def resolve_source(source: str) -> Path:
    """The directory of the model ``source``.

    A local directory as it is; any other name is fetched from the Hugging Face hub (the
    files of :data:`HUB_FILES` only) into its cache, and that snapshot's directory returned."""
    path = Path(source).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise MTError(
            f"{source} is a file; pass the model's directory (config.json, weights, "
            "source.spm, ...) or its name on the Hugging Face hub"
        )
    if source.startswith((".", "/", "~")) or source.count("/") > 1:
        raise MTError(
            f"{source}: no such directory; pass a model directory or a hub name "
            "such as Helsinki-NLP/opus-mt-en-de"
        )
    try:
        import huggingface_hub
    except ImportError:
        raise MTError(
            f"{source} is not a local directory, and fetching it needs huggingface_hub: "
            "pip install 'transformer-mt[hf]'"
        ) from None
    try:
        # The older weights file only where the model has no safetensors (often both exist).
        newer = [name for name in HUB_FILES if name != "pytorch_model.bin"]
        fetched = Path(huggingface_hub.snapshot_download(source, allow_patterns=newer))
        if not (fetched / "model.safetensors").is_file():
            huggingface_hub.snapshot_download(source, allow_patterns=["pytorch_model.bin"])
    except Exception as err:  # the hub's errors (offline, no such repo, gated) vary by version
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
        reason = reason.split(". ")[0][:200]  # the first sentence says what failed
        raise MTError(
            f"cannot fetch {source} from the Hugging Face hub ({reason}); check the "
            "name and the network, or pass a local directory"
        ) from err
    return fetched


def _read_json(path: Path, *, required: bool) -> dict[str, Any]:
    """A JSON object file; {} for a missing optional one."""
    if not path.is_file():
        if required:
            raise MTError(f"{path} not found; a Hugging Face model directory has a config.json")
        return {}
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise MTError(f"{path}: not valid JSON ({err})") from None
    if not isinstance(value, dict):
        raise MTError(f"{path}: expected a JSON object")
    return value


# MarianConfig's defaults (transformers 4 and 5 alike): what a config.json that leaves a field
# out means.
MARIAN_DEFAULTS: dict[str, Any] = {
    "d_model": 1024,
    "encoder_layers": 12,
    "decoder_layers": 12,
    "encoder_attention_heads": 16,
    "decoder_attention_heads": 16,
    "encoder_ffn_dim": 4096,
    "decoder_ffn_dim": 4096,
    "activation_function": "gelu",
    "max_position_embeddings": 1024,
    "dropout": 0.1,
    "attention_dropout": 0.0,
    "activation_dropout": 0.0,
    "scale_embedding": False,
    "pad_token_id": 58100,
    "decoder_start_token_id": 58100,
    "tie_word_embeddings": True,
}


_SIZE = Range(1, 1 << 16)
_COUNT = Range(1, 1024)
_ID = Range(0, 1 << 24, none_ok=True)  # null: not given; within the vocabulary: _check_specials
# What each field of config.json that the import reads may hold: its kind (int, float: any
# number, bool, str, list: of strings) and range. One schema, checked before anything else.
CONFIG_SCHEMA: dict[str, tuple[type, Range | None]] = {
    "model_type": (str, None),
    "architectures": (list, Range(none_ok=True)),
    "d_model": (int, _SIZE),
    "encoder_layers": (int, _COUNT),
    "decoder_layers": (int, _COUNT),
    "encoder_attention_heads": (int, _COUNT),
    "decoder_attention_heads": (int, _COUNT),
    "encoder_ffn_dim": (int, Range(1, 1 << 20)),
    "decoder_ffn_dim": (int, Range(1, 1 << 20)),
    "activation_function": (str, None),
    "max_position_embeddings": (int, Range(2, 1 << 16)),
    "dropout": (float, PROBABILITY),
    "attention_dropout": (float, PROBABILITY),
    "activation_dropout": (float, PROBABILITY),
    "scale_embedding": (bool, None),
    "tie_word_embeddings": (bool, None),
    "normalize_before": (bool, Range(none_ok=True)),
    "add_final_layer_norm": (bool, Range(none_ok=True)),
    "normalize_embedding": (bool, Range(none_ok=True)),
    "vocab_size": (int, Range(1, 1 << 24, none_ok=True)),
    "decoder_vocab_size": (int, Range(1, 1 << 24, none_ok=True)),
    "pad_token_id": (int, _ID),
    "eos_token_id": (int, _ID),
    "decoder_start_token_id": (int, _ID),
    "forced_eos_token_id": (int, _ID),
}
_KINDS = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}
_KINDS[list] = "a list of strings"
_TOKEN_IDS = ("pad_token_id", "eos_token_id", "decoder_start_token_id", "forced_eos_token_id")


def check_schema(config: Mapping[str, Any], where: Path) -> None:
    """Refuse a field of ``config`` whose value is not of its :data:`CONFIG_SCHEMA` kind and range.

    A field left out means MarianConfig's default (:data:`MARIAN_DEFAULTS`); null is accepted
    where the range allows it (a token id or flag not given).

    Raises:
        MTError: one line naming the file, the field, its value and what it must be.
    """
    for key, (kind, allowed) in CONFIG_SCHEMA.items():
        if key not in config:
            continue
        value = config[key]
        if value is None and allowed is not None and allowed.none_ok:
            continue
        if _of_kind(value, kind) and (allowed is None or value is None or allowed.holds(value)):
            continue
        want = _KINDS[kind] + (
            f", {allowed.describe()}" if allowed and kind in (int, float) else ""
        )
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
        raise MTError(f"{where}: field {key}={shown}: expected {want}")


def _of_kind(value: Any, kind: type) -> bool:
    """Whether ``value`` is of the schema's ``kind`` (a bool is no number, a number no bool)."""
    if kind is float:
        return type(value) in (int, float)
    if kind is list:
        return isinstance(value, list) and all(isinstance(item, str) for item in value)
    return type(value) is kind


def _setting(config: Mapping[str, Any], key: str) -> Any:
    """A field of a Marian ``config.json``, or MarianConfig's default when it is left out."""
    return config.get(key, MARIAN_DEFAULTS[key])


def check_marian(config: Mapping[str, Any], where: Path) -> None:
    """Refuse a ``config`` that is not a Marian model's, or asks what our model cannot compute.

    A one-line MTError naming the field.
    """
    if config.get("model_type") != "marian":
        raise MTError(
            f"{where}: field model_type is {config.get('model_type')!r}, not 'marian': "
            "only Marian (OPUS-MT) models can be imported"
        )
    archs = config.get("architectures") or ["MarianMTModel"]
    if "MarianMTModel" not in archs:
        raise MTError(f"{where}: field architectures is {archs}: a MarianMTModel is needed")
    for enc, dec in (
        ("encoder_attention_heads", "decoder_attention_heads"),
        ("encoder_ffn_dim", "decoder_ffn_dim"),
    ):
        if _setting(config, enc) != _setting(config, dec):
            raise MTError(
                f"{where}: field {dec}={_setting(config, dec)} differs from {enc}="
                f"{_setting(config, enc)}; our model has one value for both"
            )
    if _setting(config, "activation_function") not in _ACTIVATIONS:
        raise MTError(
            f"{where}: field activation_function={config['activation_function']!r}: "
            f"our model computes {', '.join(sorted(_ACTIVATIONS))} only"
        )
    if _setting(config, "decoder_start_token_id") != _setting(config, "pad_token_id"):
        raise MTError(
            f"{where}: field decoder_start_token_id is not pad_token_id; only Marian "
            "models that start the decoder with <pad> can be imported"
        )
    d_model, heads = _setting(config, "d_model"), _setting(config, "encoder_attention_heads")
    if d_model % heads:
        raise MTError(f"{where}: field d_model={d_model} is not divisible by {heads} heads")
    for flag in ("normalize_before", "add_final_layer_norm", "normalize_embedding"):
        if config.get(flag):
            raise MTError(
                f"{where}: field {flag} is set: a Marian model has no such norm, and "
                "our model cannot compute it"
            )


def marian_shape(config: Mapping[str, Any], where: Path) -> dict[str, Any]:
    """The ModelConfig keys of a Marian ``config.json`` (checked by :func:`check_marian`).

    That is post-norm, the sinusoid table in halves, a bias on the output projection, and the
    config's sizes, dropout, activation, embedding scale and tying."""
    check_schema(config, where)
    check_marian(config, where)
    return dict(
        d_model=_setting(config, "d_model"),
        n_head=_setting(config, "encoder_attention_heads"),
        ffn_hidden=_setting(config, "encoder_ffn_dim"),
        n_layers=_setting(config, "encoder_layers"),
        n_dec_layers=_setting(config, "decoder_layers"),
        drop_prob=float(_setting(config, "dropout")),
        attn_drop_prob=float(_setting(config, "attention_dropout")),
        ffn_drop_prob=float(_setting(config, "activation_dropout")),
        max_len=_setting(config, "max_position_embeddings"),
        pre_norm=False,
        tie_embeddings=bool(_setting(config, "tie_word_embeddings")),
        scale_embeddings=bool(_setting(config, "scale_embedding")),
        position_layout="halves",
        activation=_ACTIVATIONS[_setting(config, "activation_function")],
        logits_bias=True,
    )


def _vocabularies(directory: Path, tok_cfg: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """The source and target vocabularies (pieces in id order; one list object when shared)."""
    src = _vocab_file(directory / "vocab.json")
    separate = tok_cfg.get("separate_vocabs", False)
    if separate is not None and not isinstance(separate, bool):
        where = directory / "tokenizer_config.json"
        raise MTError(f"{where}: field separate_vocabs={separate!r}: expected true or false")
    if not separate:
        return src, src
    return src, _vocab_file(directory / "target_vocab.json")


def _vocab_file(path: Path) -> list[str]:
    """The pieces of a ``vocab.json`` (piece -> id) in id order; its ids must be 0 .. N-1."""
    vocab = _read_json(path, required=True)
    by_id: dict[int, str] = {}
    for piece, i in vocab.items():
        if type(i) is not int or i in by_id:
            raise MTError(f"{path}: piece {piece!r} has id {i!r}; expected distinct integer ids")
        by_id[i] = piece
    if sorted(by_id) != list(range(len(by_id))):
        raise MTError(f"{path}: ids are not 0 .. {len(by_id) - 1}; a damaged vocabulary")
    return [by_id[i] for i in range(len(by_id))]


def _check_specials(
    config: Mapping[str, Any], src: list[str], trg: list[str], directory: Path
) -> None:
    """Both vocabularies hold <pad>, </s> and <unk>, pad and </s> at the config's ids."""
    for vocab, name in ((src, "vocab.json"), (trg, "target_vocab.json")):
        for piece in ("<pad>", "</s>", "<unk>"):
            if piece not in vocab:
                raise MTError(f"{directory / name}: no piece {piece}; not a Marian vocabulary")
    for key in _TOKEN_IDS:  # an int by the schema, or null
        if config.get(key) is not None and not 0 <= config[key] < len(trg):
            raise MTError(
                f"{directory / 'config.json'}: field {key}={config[key]} is not an id of the "
                f"target vocabulary (0 to {len(trg) - 1})"
            )
    expected = {"pad_token_id": "<pad>", "eos_token_id": "</s>"}
    for key, piece in expected.items():
        if config.get(key) is not None and trg[config[key]] != piece:
            raise MTError(
                f"{directory / 'config.json'}: field {key}={config[key]} is "
                f"{trg[config[key]]!r} in the vocabulary, not {piece}"
            )


def our_order(vocab: list[str], unknown: int = 0) -> list[int]:
    """Marian's id of each of our ids.

    Pad, unk, bos (Marian's decoder start: its pad), eos, every other piece in the vocabulary's
    order, then ``unknown`` pieces (sentencepiece pieces the vocabulary lacks) as Marian reads them:
    <unk>."""
    specials = {vocab.index(p) for p in ("<pad>", "<unk>", "</s>")}
    pad, unk, eos = vocab.index("<pad>"), vocab.index("<unk>"), vocab.index("</s>")
    rest = [i for i in range(len(vocab)) if i not in specials]
    return [pad, unk, pad, eos, *rest, *[unk] * unknown]


def convert_vocabulary(
    spm_path: Path, vocab: list[str], vocab_name: str
) -> tuple[bytes, list[int]]:
    """The sentencepiece model ``spm_path`` with its pieces in our id order.

    As bytes our :class:`Tokenizer` loads, and Marian's id of each of our ids (:func:`our_order`).

    A piece the sentencepiece model can cut and ``vocab`` lacks, which Marian reads as <unk>,
    keeps its own id after the vocabulary's (the model gives it <unk>'s embedding, and as an
    output it is never chosen): the same pieces as Marian's tokenizer, the same translation.

    Raises:
        MTError: the file is missing or not a sentencepiece model, or ``vocab`` holds a piece
            named like one of our special pieces.
    """
    proto, spm_pb2 = _read_spm(spm_path)
    kinds = spm_pb2.ModelProto.SentencePiece.Type
    own = {p.piece: p for p in proto.pieces if p.type not in (kinds.CONTROL, kinds.UNKNOWN)}
    in_vocab = set(vocab)
    _check_cuts(spm_path, [p.piece for p in proto.pieces if p.type == kinds.NORMAL], in_vocab)
    unknown = [p for p in own if p not in in_vocab]
    if unknown:
        log.warning(
            f"{spm_path}: {len(unknown)} piece(s) that {vocab_name} lacks (first: {unknown[0]!r}) "
            "keep their own ids, with <unk>'s embedding, as Marian reads them"
        )
    if "<s>" in in_vocab:  # our BOS piece: a vocabulary piece of that name would clash
        raise MTError(
            f"{spm_path.parent / vocab_name}: piece '<s>' is one of our special "
            "pieces; this vocabulary cannot be imported"
        )
    order = our_order(vocab, len(unknown))
    names = [vocab[i] for i in order[: len(order) - len(unknown)]] + unknown
    pieces = []
    for our_id, piece in enumerate(names):
        new = spm_pb2.ModelProto.SentencePiece()
        if our_id < len(SPECIAL_IDS):
            new.piece = ("<pad>", "<unk>", "<s>", "</s>")[our_id]
            new.type = kinds.UNKNOWN if our_id == UNK_ID else kinds.CONTROL
        elif piece in own:
            new.CopyFrom(own[piece])
            if _TAG_RE.fullmatch(piece):  # a language tag: its id comes from --target-lang only
                new.type = kinds.UNUSED
        else:  # a piece of the vocabulary only: its id exists, text never cuts into it
            new.piece, new.type, new.score = piece, kinds.UNUSED, 0.0
        pieces.append(new)
    del proto.pieces[:]
    proto.pieces.extend(pieces)
    return _with_our_specials(proto, spm_path), order


def _check_cuts(spm_path: Path, normal: list[str], in_vocab: set[str]) -> None:
    """Refuse a sentencepiece model that would read text as <unk>.

    That is one without pieces to cut text into (``normal``: its normal pieces), or most of
    whose pieces the vocabulary lacks (a sentencepiece model of another vocabulary: a Marian
    vocabulary holds every piece of its sentencepiece models, or nearly)."""
    if not normal:
        raise MTError(
            f"{spm_path}: no pieces to cut text into; every text would be read as <unk> "
            "(a damaged or empty sentencepiece model)"
        )
    known = sum(piece in in_vocab for piece in normal if piece != "▁")
    if 2 * known < len(normal):
        some = f"only {known} of its {len(normal)} pieces are" if known else "none of its pieces is"
        raise MTError(
            f"{spm_path}: {some} in the vocabulary; text would be read as <unk> (the "
            "sentencepiece model of another vocabulary?)"
        )


def _read_spm(spm_path: Path) -> tuple[Any, Any]:
    """The ModelProto of a sentencepiece file, and sentencepiece's protobuf module."""
    try:
        from sentencepiece import sentencepiece_model_pb2
    except ImportError:  # the model module needs protobuf
        raise MTError("importing needs protobuf: pip install 'transformer-mt[hf]'") from None
    # protobuf's generated module makes its message classes when imported: none is declared.
    spm_pb2: Any = sentencepiece_model_pb2
    if not spm_path.is_file():
        raise MTError(
            f"{spm_path} not found; a Marian model directory has source.spm and target.spm"
        )
    data = spm_path.read_bytes()
    if not data:
        raise MTError(f"{spm_path}: an empty file, not a sentencepiece model")
    proto = spm_pb2.ModelProto()
    try:
        proto.ParseFromString(data)
        import sentencepiece

        sentencepiece.SentencePieceProcessor(model_proto=data)
    except Exception as err:  # protobuf's DecodeError, by implementation; sentencepiece's own
        first = (str(err).strip().splitlines() or [type(err).__name__])[-1][:200]
        raise MTError(f"{spm_path}: not a sentencepiece model ({first})") from None
    return proto, spm_pb2


def _with_our_specials(proto: Any, spm_path: Path) -> bytes:
    """Serialize ``proto`` (its pieces in our order) with our special ids.

    Checked by loading it as our :class:`Tokenizer` does."""
    spec = proto.trainer_spec
    spec.pad_id, spec.unk_id, spec.bos_id, spec.eos_id = PAD_ID, UNK_ID, BOS_ID, EOS_ID
    spec.pad_piece, spec.unk_piece, spec.bos_piece, spec.eos_piece = "<pad>", "<unk>", "<s>", "</s>"
    spec.vocab_size = len(proto.pieces)
    data = proto.SerializeToString()
    try:
        Tokenizer(data)
    except RuntimeError as err:
        raise MTError(f"{spm_path}: its pieces in our order do not load ({err})") from None
    return data


def _weights_file(directory: Path) -> Path:
    """The weights file :func:`read_weights` reads (for errors that name it)."""
    safetensors_file = directory / "model.safetensors"
    return safetensors_file if safetensors_file.is_file() else directory / "pytorch_model.bin"


def check_shapes(
    weights: Mapping[str, torch.Tensor],
    shape: Mapping[str, Any],
    config: Mapping[str, Any],
    vocab_sizes: tuple[int, int],
    where: Path,
) -> None:
    """Refuse weights that lack a tensor the model needs, or hold one of another shape.

    Each tensor's shape follows from ``shape`` (:func:`marian_shape`'s sizes), the config's
    vocabulary sizes and the vocabularies' (``vocab_sizes``: source, target; every id needs a
    row). Checked before the model is built, which would allocate what the config says.

    Raises:
        MTError: one line naming the weights file, the tensor, its shape and the one expected.
    """
    d, ffn = shape["d_model"], shape["ffn_hidden"]
    sides = (("encoder", "vocab_size"), ("decoder", "decoder_vocab_size"))
    rows = []
    for (side, size_key), least in zip(sides, vocab_sizes, strict=True):
        name = f"model.{side}.embed_tokens.weight"
        emb = _find(weights, name, "model.shared.weight", file=where)
        size = config.get(size_key) or config.get("vocab_size") or (emb.shape or (0,))[0]
        if tuple(emb.shape) != (size, d) or size < least:
            raise MTError(
                f"{where}: tensor {name} (or model.shared.weight) has shape "
                f"{tuple(emb.shape)}; config.json and the vocabulary ask for ({size}, {d}), "
                f"at least {least} rows (its pieces)"
            )
        rows.append(size)
    expected: dict[str, tuple[int, ...]] = {"final_logits_bias": (1, rows[1])}
    if not shape["tie_embeddings"]:
        expected["lm_head.weight"] = (rows[1], d)
    for side, count in (("encoder", shape["n_layers"]), ("decoder", shape["n_dec_layers"])):
        blocks = ("self_attn", "encoder_attn") if side == "decoder" else ("self_attn",)
        for i in range(count):
            at = f"model.{side}.layers.{i}"
            for part in (*(f"{b}.{x}_proj" for b in blocks for x in "qkv"), "self_attn.out_proj"):
                expected |= {f"{at}.{part}.weight": (d, d), f"{at}.{part}.bias": (d,)}
            if side == "decoder":
                expected |= {f"{at}.encoder_attn.out_proj.weight": (d, d)}
                expected |= {f"{at}.encoder_attn.out_proj.bias": (d,)}
            expected |= {f"{at}.fc1.weight": (ffn, d), f"{at}.fc1.bias": (ffn,)}
            expected |= {f"{at}.fc2.weight": (d, ffn), f"{at}.fc2.bias": (d,)}
            for norm in ("self_attn_layer_norm", "encoder_attn_layer_norm", "final_layer_norm"):
                if norm != "encoder_attn_layer_norm" or side == "decoder":
                    expected |= {f"{at}.{norm}.weight": (d,), f"{at}.{norm}.bias": (d,)}
    for name, want in expected.items():
        if name == "final_logits_bias" and name not in weights:
            continue  # none: a bias of zeros
        got = tuple(_find(weights, name, file=where).shape)
        if got != want and not (name == "final_logits_bias" and got == want[1:]):
            raise MTError(
                f"{where}: tensor {name} has shape {got}; config.json asks for {want} "
                f"(d_model={d}, ffn_dim={ffn}, target vocabulary {rows[1]})"
            )


def read_weights(directory: Path) -> dict[str, torch.Tensor]:
    """The tensors of ``model.safetensors`` (or ``pytorch_model.bin``, loaded weights-only)."""
    safetensors_file, bin_file = directory / "model.safetensors", directory / "pytorch_model.bin"
    if safetensors_file.is_file():
        try:
            from safetensors.torch import load_file
        except ImportError:
            raise MTError(
                "reading model.safetensors needs safetensors: pip install 'transformer-mt[hf]'"
            ) from None
        try:
            return load_file(str(safetensors_file))
        except Exception as err:  # safetensors' SafetensorError: a damaged file
            raise MTError(f"{safetensors_file}: cannot read it ({err})") from None
    if bin_file.is_file():
        try:
            weights = torch.load(bin_file, map_location="cpu", weights_only=True)
        except Exception as err:  # refused pickles and damaged files alike
            first = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
            raise MTError(f"{bin_file}: cannot read it weights-only ({first})") from None
        return dict(weights)
    raise MTError(f"{directory}: no model.safetensors or pytorch_model.bin")


def _tensor(weights: Mapping[str, torch.Tensor], *names: str) -> torch.Tensor:
    """The first of ``names`` the weights hold, in float32 (tied tensors are saved once)."""
    return _find(weights, *names).float()


def _find(
    weights: Mapping[str, torch.Tensor], *names: str, file: Path | None = None
) -> torch.Tensor:
    """The first of ``names`` the weights hold, as it is (tied tensors are saved once)."""
    for name in names:
        if name in weights:
            return weights[name]
    where = f"{file}: " if file is not None else ""
    raise MTError(
        f"{where}the weights lack {names[0]}; not a MarianMTModel's weights file, or not the "
        "one config.json describes (its layer counts)"
    )


def embeddings(weights: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """The (source, target) embedding matrices the model computes with.

    Each side's own, or the shared one where the file holds only that (tied tensors are saved
    once)."""
    shared = "model.shared.weight"
    src = _tensor(weights, "model.encoder.embed_tokens.weight", shared)
    trg = _tensor(weights, "model.decoder.embed_tokens.weight", shared)
    return src, trg


def map_weights(
    weights: Mapping[str, torch.Tensor],
    shape: TransformerConfig,
    rows: tuple[list[int], list[int]],
    never: list[int],
) -> dict[str, torch.Tensor]:
    """Marian's tensors under the names of our Transformer of ``shape``.

    ``rows``: Marian's id of each of our (source, target) ids; ``never``: our target ids that are
    never output (their logit is that of their Marian row minus :data:`BOS_LOGIT_GAP`)."""
    src_rows, trg_rows = (torch.tensor(side) for side in rows)
    src_emb, trg_emb = embeddings(weights)
    state = {"src_emb.weight": src_emb[src_rows], "trg_emb.weight": trg_emb[trg_rows]}
    head = trg_emb if shape.model.tie_embeddings else _tensor(weights, "lm_head.weight")
    state["out.weight"] = head[trg_rows]
    bias = weights.get("final_logits_bias", torch.zeros(1, head.size(0))).float().view(-1)
    state["out.bias"] = bias[trg_rows].clone()
    # Our BOS row is the decoder start (Marian's pad) as an input, an unknown piece's row is
    # <unk>'s; as outputs, neither is ever chosen.
    state["out.bias"][never] -= BOS_LOGIT_GAP
    for i in range(shape.model.n_layers):
        state.update(_encoder_layer(weights, i))
    for i in range(shape.n_dec_layers):
        state.update(_decoder_layer(weights, i))
    return state


def _attention(weights: Mapping[str, torch.Tensor], at: str, to: str, cross: bool) -> dict:
    """One attention block: Marian's q/k/v projections fused as ours (qkv, or q and kv)."""
    q, k, v, o = (f"{at}.{n}_proj" for n in ("q", "k", "v", "out"))
    out = {f"{to}.out_proj.{p}": _tensor(weights, f"{o}.{p}") for p in ("weight", "bias")}
    for p in ("weight", "bias"):
        parts = [_tensor(weights, f"{name}.{p}") for name in (q, k, v)]
        if cross:
            out[f"{to}.q_proj.{p}"] = parts[0]
            out[f"{to}.kv_proj.{p}"] = torch.cat(parts[1:])
        else:
            out[f"{to}.qkv_proj.{p}"] = torch.cat(parts)
    return out


def _copy(weights: Mapping[str, torch.Tensor], pairs: dict[str, str]) -> dict:
    """Weight and bias of each (Marian module -> our module) pair, as they are."""
    return {
        f"{ours}.{p}": _tensor(weights, f"{theirs}.{p}")
        for theirs, ours in pairs.items()
        for p in ("weight", "bias")
    }


def _encoder_layer(weights: Mapping[str, torch.Tensor], i: int) -> dict:
    """Encoder layer ``i``: self-attention, feed-forward, the two post-norms."""
    at, to = f"model.encoder.layers.{i}", f"encoder.{i}"
    return {
        **_attention(weights, f"{at}.self_attn", f"{to}.self_attn", cross=False),
        **_copy(
            weights,
            {
                f"{at}.fc1": f"{to}.ffn.fc1",
                f"{at}.fc2": f"{to}.ffn.fc2",
                f"{at}.self_attn_layer_norm": f"{to}.self_attn_residual.norm",
                f"{at}.final_layer_norm": f"{to}.ffn_residual.norm",
            },
        ),
    }


def _decoder_layer(weights: Mapping[str, torch.Tensor], i: int) -> dict:
    """Decoder layer ``i``: self- and cross-attention, feed-forward, the three post-norms."""
    at, to = f"model.decoder.layers.{i}", f"decoder.{i}"
    return {
        **_attention(weights, f"{at}.self_attn", f"{to}.self_attn", cross=False),
        **_attention(weights, f"{at}.encoder_attn", f"{to}.cross_attn", cross=True),
        **_copy(
            weights,
            {
                f"{at}.fc1": f"{to}.ffn.fc1",
                f"{at}.fc2": f"{to}.ffn.fc2",
                f"{at}.self_attn_layer_norm": f"{to}.self_attn_residual.norm",
                f"{at}.encoder_attn_layer_norm": f"{to}.cross_attn_residual.norm",
                f"{at}.final_layer_norm": f"{to}.ffn_residual.norm",
            },
        ),
    }


def language_tags(vocab: list[str]) -> dict[str, str]:
    """Target language -> its tag piece (``{"deu": ">>deu<<"}``) of a multi-target model."""
    return {m.group(1): piece for piece in vocab if (m := _TAG_RE.fullmatch(piece))}


def decode_defaults(directory: Path, config: Mapping[str, Any]) -> DecodeConfig:
    """Our decode defaults from the model's generation settings.

    Read from ``generation_config.json``, else ``config.json``: beam, length penalty alpha and the
    longest output."""
    generation = _read_json(directory / "generation_config.json", required=False) or config
    decode = DecodeConfig()
    beams = generation.get("num_beams")
    if isinstance(beams, int) and beams >= 1:
        decode.beam_size = beams
    alpha = generation.get("length_penalty")
    if isinstance(alpha, int | float) and math.isfinite(alpha):
        decode.len_penalty = float(alpha)
    longest = generation.get("max_length")
    if isinstance(longest, int) and longest > 1:  # it counts the decoder start
        # our rule a + b * source length, capped by the position table
        decode.max_len_a = float(min(longest - 1, config.get("max_position_embeddings", longest)))
        decode.max_len_b = 0.0
    validate_decode(decode)
    return decode


def _run_name(source: str) -> str:
    """The config's run name.

    The model's name (``opus-mt-en-de`` of a hub name or a directory), or ``imported`` when that is
    no plain name."""
    name = Path(source.rstrip("/\\")).name
    return name if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.+-]*", name) else "imported"


def _run_config(
    model_cfg: ModelConfig,
    tok_cfg: Mapping[str, Any],
    tags: Mapping[str, str],
    config: Mapping[str, Any],
    directory: Path,
    shared: bool,
) -> Config:
    """The checkpoint's config: the model's shape, languages and decode defaults."""
    cfg = Config()
    cfg.model = model_cfg
    cfg.tokenizer.joint = shared
    for key, side in (("source_lang", "src_lang"), ("target_lang", "trg_lang")):
        lang = tok_cfg.get(key)
        if isinstance(lang, str) and _LANG_RE.fullmatch(lang):
            setattr(cfg.data, side, lang)
    if tags and cfg.data.trg_lang not in tags:
        cfg.data.trg_lang = sorted(tags)[0]
    cfg.data.corpus = "local"
    cfg.decode = decode_defaults(directory, config)
    return cfg
