"""Rebuild a trained model and its tokenizers from one checkpoint file, ready to translate."""

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from transformer_mt.checkpoint import load_checkpoint
from transformer_mt.config import Config, ModelConfig, config_from_dict
from transformer_mt.data.languages import model_pairs, source_prefix, tag_ids, target_tags
from transformer_mt.data.tokenizer import Tokenizer
from transformer_mt.devices import choose_precision, resolve_device

# The linear layers live in linear_layers.py; their names stay importable from here.
from transformer_mt.engines.linear_layers import (  # noqa: F401
    QUANTIZATIONS,
    Int8Linear,
    PackedLinear,
    _onednn_linear_works,
    pack_linear_layers,
    quantize,
    to_bf16,
)
from transformer_mt.engines.options import PRECISIONS, ModelOptions
from transformer_mt.errors import MTError
from transformer_mt.host_memory import keep_freed_memory
from transformer_mt.model import Transformer, TransformerConfig


@dataclass
class LoadedModel:
    """Everything inference needs, rebuilt from one checkpoint file."""

    model: Transformer  # in eval mode, on the device it was loaded for
    src_tok: Tokenizer
    trg_tok: Tokenizer  # the same object as src_tok for a joint vocabulary
    config: Config  # the run's resolved config; ``config.decode`` holds its decoding defaults
    step: int  # optimizer steps the weights were trained for (0 when unknown)
    model_args: dict[str, Any] = field(default_factory=dict)  # its shape as stored (JSON-ready)
    validation: dict[str, Any] | None = None  # validation BLEU at its step (validation_bleu)
    lang_tags: dict[str, str] = field(default_factory=dict)  # target language -> its tag, for a
    # model with several target languages (or fine-tuned from one); empty: no tags
    precision: str = "fp32"  # what its linear layers multiply in: fp32, bf16 or int8
    precision_why: str = ""  # where that came from (an option, the config, auto's probe)

    @property
    def pairs(self) -> list[tuple[str, str]]:
        """The (source, target) language pairs the model translates (:func:`model_pairs`)."""
        return model_pairs(self.config.data, self.lang_tags)

    def source_prefix(self, target: str | None) -> list[int]:
        """The ids that start every source asking for ``target``: its tag, or none.

        Raises:
            MTError: a model with several targets and no ``target``; a target it does not know.
        """
        return source_prefix(self.src_tok, self.lang_tags, self.pairs, target)


def load_for_inference(
    path: Path | str,
    device: str | torch.device = ModelOptions.device,
    quantization: str | None = None,
    *,
    pack: bool = True,
    precision: str | None = None,
    reuse_freed_memory: bool = True,
) -> LoadedModel:
    """Rebuild the model (in eval mode, on ``device``) and tokenizers from a checkpoint.

    ``quantization`` (``int8``, CPU only) quantizes the linear layers (:func:`quantize`).
    Otherwise ``precision`` (None: the checkpoint's ``decode.precision``; fp32 for checkpoints
    written before that key, so that they translate as they did) chooses their products:
    ``bf16`` (:func:`to_bf16`), ``fp32``, or ``auto`` (:func:`choose_precision`, the choice and
    its reason in :attr:`LoadedModel.precision`). In fp32 on a CPU, ``pack`` runs them on
    weights packed once for oneDNN (:func:`pack_linear_layers`: the same products, 2-3x faster
    here); ``pack=False`` keeps plain ``nn.Linear`` layers (fp32 whatever ``precision`` says).

    On a CPU, with ``reuse_freed_memory``, it also tells glibc's malloc to keep freed memory for
    reuse (process-wide, :func:`~transformer_mt.host_memory.keep_freed_memory`): every search step
    allocates the same tensors again, and fresh pages cost about a tenth of a decoding's time. A
    long-running process hands the pages back when idle (the server's batcher does).

    Loaded with ``weights_only=True``: a checkpoint from a stranger cannot run code.
    """
    device = resolve_device(device, "--device")
    ckpt = load_checkpoint(path)
    try:
        model = Transformer(TransformerConfig.from_args(**ckpt["model_args"]))
        model.load_state_dict(ckpt["model"])  # older parameter names are upgraded by the model
        src_tok = Tokenizer(ckpt["src_spm"])
        trg_tok = src_tok if ckpt["trg_spm"] == ckpt["src_spm"] else Tokenizer(ckpt["trg_spm"])
        config = config_from_dict(ckpt["config"])
        for side, tok, rows in (
            ("source", src_tok, model.src_emb.num_embeddings),
            ("target", trg_tok, model.out.out_features),
        ):
            if tok.vocab_size > rows:  # its pieces would index past the embedding
                raise ValueError(
                    f"the {side} tokenizer has {tok.vocab_size} pieces, the model {rows} rows"
                )
    except MTError as err:
        raise MTError(f"{path}: {err}") from err
    # What a checkpoint that does not fit together raises: TransformerConfig.from_args's
    # TypeError (unknown or missing arguments), the model's ValueError (a shape it refuses),
    # load_state_dict's RuntimeError (missing keys, other sizes), sentencepiece's RuntimeError.
    # Anything else is a bug.
    except (TypeError, ValueError, RuntimeError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise MTError(
            f"{path}: a damaged checkpoint (its weights, model arguments or tokenizers do not "
            f"fit together: {first[:200]}); use another checkpoint of the run"
        ) from err
    model.to(device).eval()
    if device.type == "cpu" and reuse_freed_memory:
        keep_freed_memory()
    stored = _stored_precision(ckpt)
    chosen, why = _precision(model.config.model, device, quantization, precision, stored, pack)
    if quantization is not None:
        model = quantize(model, quantization)
    elif chosen == "bf16":
        model = to_bf16(model)
    elif pack:
        pack_linear_layers(model)
    step = int(ckpt.get("step", 0))
    lang_tags = dict(ckpt.get("lang_tags") or target_tags(config.data))
    model.never_emit = tag_ids(trg_tok, lang_tags)
    return LoadedModel(
        model=model,
        src_tok=src_tok,
        trg_tok=trg_tok,
        config=config,
        step=step,
        model_args=model.config.to_args(),
        validation=validation_bleu(ckpt.get("train_state"), step),
        lang_tags=lang_tags,
        precision=chosen,
        precision_why=why,
    )


# Rows of the auto probe's product when translating: a beam of 4 over a batch of 32 sentences.
_PROBE_ROWS = 128


def agreed_precision(
    path: Path | str,
    device: str = ModelOptions.device,
    quantization: str | None = None,
    given: str | None = None,
) -> tuple[str | None, str]:
    """The precision :func:`load_for_inference` would choose for ``path``, decided once, and why.

    What `mt serve --workers N` hands every worker, so that all of them compute alike (``auto``'s
    probe, run in each process, could land on either side of its margin). None with
    ``quantization`` (int8 has no other precision)."""
    if quantization is not None:
        return None, f"--quantize {quantization}"
    ckpt = load_checkpoint(path)
    try:
        cfg = TransformerConfig.from_args(**ckpt["model_args"]).model
    except (TypeError, ValueError) as err:
        raise MTError(f"{path}: a damaged checkpoint ({err}); use another checkpoint") from err
    on = resolve_device(device, "--device")
    return _precision(cfg, on, None, given, _stored_precision(ckpt), True)


def _stored_precision(ckpt: dict[str, Any]) -> str:
    """A checkpoint's decode.precision; fp32 for one written before the key existed."""
    return (ckpt["config"].get("decode") or {}).get("precision", "fp32")


def _precision(
    cfg: ModelConfig,
    device: torch.device,
    quantization: str | None,
    given: str | None,
    stored: str,
    pack: bool,
) -> tuple[str, str]:
    """What the loaded model's linear layers multiply in, and why (see load_for_inference)."""
    if quantization is not None:
        if given is not None:
            raise MTError(
                f"--precision {given} and --quantize {quantization}: choose one "
                "(int8 layers have no other precision)"
            )
        return "int8", f"--quantize {quantization}"
    if not pack:
        return "fp32", "plain linear layers asked for"
    precision, source = (stored, "decode.precision") if given is None else (given, "--precision")
    if precision not in PRECISIONS:
        raise MTError(f"{source} {precision!r}: expected one of {', '.join(PRECISIONS)}")
    if precision != "auto":
        return precision, source
    chosen, why = choose_precision(device, cfg.d_model, cfg.ffn_hidden, _PROBE_ROWS)
    return chosen, f"auto: {why}"


def validation_bleu(train_state: Any, step: int) -> dict[str, Any] | None:
    """The validation BLEU recorded when the checkpoint was saved.

    The history entry of its step else the latest one), as {"step", "bleu"}; None when the
    checkpoint holds no validation BLEU (averaged or old checkpoints)."""
    if not isinstance(train_state, dict):
        return None
    history = (train_state.get("state") or {}).get("history") or []
    scored = [h for h in history if isinstance(h, dict) and "val_bleu" in h]
    if not scored:
        return None
    entry = next((h for h in reversed(scored) if h.get("step") == step), scored[-1])
    return {"step": int(entry.get("step", 0)), "bleu": float(entry["val_bleu"])}


def validation_report(loaded: LoadedModel) -> dict[str, Any] | None:
    """``loaded.validation`` with the signature of its BLEU.

    For what people read (GET /v1/model, an export's settings); None without one."""
    if loaded.validation is None:
        return None
    from transformer_mt.evaluation import bleu_signature  # sacrebleu: only when reported

    return {
        **loaded.validation,
        "signature": bleu_signature(loaded.config.train.valid_bleu_tokenize),
    }
