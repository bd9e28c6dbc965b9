"""Export a trained model to CTranslate2 (fast CPU/GPU inference, int8 quantization).

The model is described through CTranslate2's own model-spec API (``ctranslate2.specs``), weight by
weight, so nothing depends on another toolkit's checkpoint format. Facts the mapping relies on:

- our fused self-attention projection is q, k, v stacked on the output axis: CTranslate2's fused
  ``linear[0]``; cross-attention is ``q_proj`` -> ``linear[0]``, ``kv_proj`` (k, v) ->
  ``linear[1]``, ``out_proj`` -> the last linear;
- CTranslate2 multiplies embeddings by sqrt(d_model) itself (``scale_embeddings``), as we do;
- its built-in sinusoid lays out sin/cos differently and starts at position 1, so our position
  table is passed explicitly (row t = position t);
- post-norm (the paper's) is ``pre_norm=False``: a LayerNorm after each residual sum, no final
  norm; pre-norm adds the final encoder/decoder norms;
- LayerNorm epsilon is torch's 1e-5 (CTranslate2 would assume 1e-6);
- our sources end with EOS: ``add_source_eos`` makes CTranslate2 append it; the decoder starts
  from BOS (``<s>``), and special pieces are sentencepiece's ``<pad> <unk> <s> </s>`` (ids 0-3).

The exported directory holds CTranslate2's ``model.bin``, ``config.json`` and vocabularies, plus
our sentencepiece model(s) and ``transformer_mt.json`` (the run's decode settings, the source of
the export). CTranslate2's length penalty is ``score / length ** alpha``, ours GNMT's
``score / ((5 + length) / 6) ** alpha``: beam search ranks finished hypotheses slightly
differently unless alpha is 0; greedy search is unaffected.
"""

import dataclasses
import json
import os
import shutil
from pathlib import Path

from transformer_mt.errors import MTError
from transformer_mt.fileio import write_text_atomic
from transformer_mt.inference.loading import LoadedModel, validation_report
from transformer_mt.model import Transformer

QUANTIZATIONS = ("float32", "int8", "int8_float32", "int8_bfloat16", "bfloat16", "float16")
SETTINGS_FILE = "transformer_mt.json"
LAYER_NORM_EPSILON = 1e-5  # torch.nn.LayerNorm's default, which the model uses


def import_ctranslate2():
    """The ctranslate2 module, or a one-line error saying how to install it."""
    try:
        import ctranslate2
    except ImportError as err:
        raise MTError(
            "exporting to CTranslate2 needs the ctranslate2 package: "
            "pip install 'transformer-mt[ct2]' (in a checkout: pip install -e '.[ct2]')"
        ) from err
    return ctranslate2


def export_ctranslate2(
    loaded: LoadedModel, output: Path, quantization: str = "float32", source: str = ""
) -> Path:
    """Write ``loaded`` as a CTranslate2 model directory at ``output``; an earlier export there is
    replaced, any other non-empty directory refused.

    Built in a temporary directory beside ``output`` and renamed into place when complete, so a
    failure leaves no half-written model.
    """
    if quantization not in QUANTIZATIONS:
        raise MTError(
            f"--quantization {quantization!r}: expected one of {', '.join(QUANTIZATIONS)}"
        )
    output = Path(output)
    _check_replaceable(output)
    ctranslate2 = import_ctranslate2()
    spec = transformer_spec(loaded.model, ctranslate2.specs)
    spec.register_source_vocabulary(_pieces(loaded.src_tok, loaded.model.src_emb.num_embeddings))
    spec.register_target_vocabulary(_pieces(loaded.trg_tok, loaded.model.out.out_features))
    spec.config.add_source_eos = True
    spec.config.layer_norm_epsilon = LAYER_NORM_EPSILON
    spec.validate()
    spec.optimize(quantization=quantization)
    tmp = output.with_name(f".{output.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
        spec.save(str(tmp))
        joint = loaded.src_tok is loaded.trg_tok
        for side, tok in (("src", loaded.src_tok), ("trg", loaded.trg_tok)):
            (tmp / f"spm.{side}.model").write_bytes(tok.model_proto)
        settings = {
            "decode": dataclasses.asdict(loaded.config.decode),
            "joint_vocabulary": joint,
            "max_len": loaded.model.positions.max_len,
            "model_args": loaded.model_args,
            "quantization": quantization,
            "source": source,
            "step": loaded.step,
            "src_lang": loaded.config.data.src_lang,
            "trg_lang": loaded.config.data.trg_lang,
            "validation": validation_report(loaded),
        }
        write_text_atomic(tmp / SETTINGS_FILE, json.dumps(settings, indent=2) + "\n")
        _swap_in(tmp, output)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return output


def _swap_in(tmp: Path, output: Path) -> None:
    """Rename ``tmp`` to ``output``. An earlier export there is renamed aside first and removed
    only once the new one is in place (put back if the rename fails), so an interruption never
    leaves neither of them."""
    if not output.exists():
        os.replace(tmp, output)
        return
    old = output.with_name(f".{output.name}.old-{os.getpid()}")
    shutil.rmtree(old, ignore_errors=True)
    os.replace(output, old)
    try:
        os.replace(tmp, output)
    except BaseException:
        os.replace(old, output)
        raise
    shutil.rmtree(old, ignore_errors=True)


def _check_replaceable(output: Path) -> None:
    """An existing ``output`` is replaced only when it is an earlier export or empty: never a
    directory of the user's that happens to have the name (nor a link: the export would replace
    the link, not what it points to)."""
    if output.is_symlink():
        raise MTError(
            f"--output {output} is a symbolic link; name the directory itself ({output.resolve()})"
        )
    if not output.exists():
        if not output.parent.is_dir():
            raise MTError(f"--output {output}: {output.parent} is not a directory; create it first")
        return
    if not output.is_dir():
        raise MTError(f"--output {output} is a file; name a directory for the exported model")
    if any(output.iterdir()) and not (output / SETTINGS_FILE).is_file():
        raise MTError(
            f"--output {output} is a directory that holds no exported model; name a new or an "
            "empty directory (an earlier export there is replaced)"
        )


def _pieces(tok, size: int) -> list[str]:
    """The vocabulary as CTranslate2 wants it: piece strings in id order, one per embedding row."""
    if tok.vocab_size != size:
        raise MTError(f"tokenizer has {tok.vocab_size} pieces but the model {size} embeddings")
    return tok.id_to_piece(range(size))


def transformer_spec(model: Transformer, specs):
    """A ``ctranslate2.specs.TransformerSpec`` holding ``model``'s weights (float32 numpy)."""
    pre_norm = _is_pre_norm(model)
    spec = specs.TransformerSpec.from_config(
        (len(model.encoder), len(model.decoder)),
        model.encoder[0].self_attn.n_head,
        pre_norm=pre_norm,
        activation=specs.common_spec.Activation.RELU,
    )
    positions = _numpy(model.positions.table)  # (max_len, D): row t is position t
    spec.encoder.embeddings[0].weight = _numpy(model.src_emb.weight)
    spec.encoder.scale_embeddings = True
    spec.encoder.position_encodings.encodings = positions
    for layer_spec, layer in zip(spec.encoder.layer, model.encoder, strict=True):
        _attention(layer_spec.self_attention, [layer.self_attn.qkv_proj, layer.self_attn.out_proj])
        _norm(layer_spec.self_attention.layer_norm, layer.self_attn_residual.norm)
        _ffn(layer_spec.ffn, layer.ffn, layer.ffn_residual.norm)
    spec.decoder.embeddings.weight = _numpy(model.trg_emb.weight)
    spec.decoder.scale_embeddings = True
    spec.decoder.position_encodings.encodings = positions
    spec.decoder.projection.weight = _numpy(model.out.weight)
    for layer_spec, layer in zip(spec.decoder.layer, model.decoder, strict=True):
        _attention(layer_spec.self_attention, [layer.self_attn.qkv_proj, layer.self_attn.out_proj])
        _norm(layer_spec.self_attention.layer_norm, layer.self_attn_residual.norm)
        cross = layer.cross_attn
        _attention(layer_spec.attention, [cross.q_proj, cross.kv_proj, cross.out_proj])
        _norm(layer_spec.attention.layer_norm, layer.cross_attn_residual.norm)
        _ffn(layer_spec.ffn, layer.ffn, layer.ffn_residual.norm)
    if pre_norm:
        _norm(spec.encoder.layer_norm, model.enc_norm)
        _norm(spec.decoder.layer_norm, model.dec_norm)
    return spec


def _is_pre_norm(model: Transformer) -> bool:
    return model.encoder[0].self_attn_residual.pre_norm


def _numpy(tensor):
    """A float32 copy: CTranslate2 quantizes its arrays in place, and a view would share the
    model's own parameters (the exported model would then corrupt the one it came from)."""
    return tensor.detach().float().cpu().numpy().copy()


def _linear(spec, module) -> None:
    spec.weight = _numpy(module.weight)
    if module.bias is not None:
        spec.bias = _numpy(module.bias)


def _attention(spec, linears) -> None:
    for linear_spec, module in zip(spec.linear, linears, strict=True):
        _linear(linear_spec, module)


def _norm(spec, module) -> None:
    spec.gamma = _numpy(module.weight)
    spec.beta = _numpy(module.bias)


def _ffn(spec, ffn, norm) -> None:
    _linear(spec.linear_0, ffn.fc1)
    _linear(spec.linear_1, ffn.fc2)
    _norm(spec.layer_norm, norm)
