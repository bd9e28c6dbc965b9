"""Export a trained model to CTranslate2 (fast CPU/GPU inference, int8 quantization).

The model is described through CTranslate2's own model-spec API (``ctranslate2.specs``), weight by
weight, so nothing depends on another toolkit's checkpoint format. Facts the mapping relies on:

- our fused self-attention projection is q, k, v stacked on the output axis: CTranslate2's fused
  ``linear[0]``; cross-attention is ``q_proj`` -> ``linear[0]``, ``kv_proj`` (k, v) ->
  ``linear[1]``, ``out_proj`` -> the last linear;
- CTranslate2 multiplies embeddings by sqrt(d_model) itself (``scale_embeddings``), as we do
  (an imported model without that scale exports with it off); the feed-forward activation
  (ReLU, or an imported model's swish or gelu) and the output projection's bias, where a model
  has one, are CTranslate2's options as they are;
- its built-in sinusoid lays out sin/cos differently and starts at position 1, so our position
  table is passed explicitly (row t = position t);
- post-norm (the paper's) is ``pre_norm=False``: a LayerNorm after each residual sum, no final
  norm; pre-norm adds the final encoder/decoder norms;
- LayerNorm epsilon is torch's 1e-5 (CTranslate2 would assume 1e-6);
- our sources end with EOS: ``add_source_eos`` makes CTranslate2 append it; the decoder starts
  from BOS (``<s>``), and special pieces are sentencepiece's ``<pad> <unk> <s> </s>`` (ids 0-3).

The exported directory holds CTranslate2's ``model.bin``, ``config.json`` and vocabularies, plus our
sentencepiece model(s) and ``transformer_mt.json`` (the run's decode settings, the source of the
export, and ``files``: the list of the files the export wrote, which is all that a later export into
the same directory replaces or removes). CTranslate2's length penalty is ``score / length **
alpha``, ours GNMT's ``score / ((5 + length) / 6) ** alpha``: beam search ranks finished hypotheses
slightly differently unless alpha is 0; greedy search is unaffected.
"""

import dataclasses
import json
import os
import re
import shutil
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, cast

from transformer_mt.checkpoint import check_finite
from transformer_mt.engines.ct2 import SETTINGS_FILE, import_ctranslate2, read_settings
from transformer_mt.engines.loading import LoadedModel, validation_report
from transformer_mt.errors import MTError
from transformer_mt.fileio import write_text_atomic
from transformer_mt.model import Transformer
from transformer_mt.model.layers import DecoderLayer, EncoderLayer

if TYPE_CHECKING:
    # ctranslate2 ships no type hints: its spec classes are Any to mypy, named here for the reader.
    import numpy as np
    import numpy.typing as npt
    import torch
    from ctranslate2.specs.attention_spec import MultiHeadAttentionSpec
    from ctranslate2.specs.common_spec import LayerNormSpec, LinearSpec
    from ctranslate2.specs.transformer_spec import FeedForwardSpec, TransformerSpec
    from torch import nn

    from transformer_mt.data.tokenizer import Tokenizer
    from transformer_mt.model.layers import FeedForward

QUANTIZATIONS = ("float32", "int8", "int8_float32", "int8_bfloat16", "bfloat16", "float16")
LAYER_NORM_EPSILON = 1e-5  # torch.nn.LayerNorm's default, which the model uses
# What an export wrote before its settings file listed its files (CTranslate2's, then ours).
LEGACY_FILES = [
    "model.bin",
    "config.json",
    "shared_vocabulary.json",
    "source_vocabulary.json",
    "target_vocabulary.json",
    "spm.src.model",
    "spm.trg.model",
    SETTINGS_FILE,
]
STAGING = ".transformer_mt.export-"  # + pid: a new export, written inside the directory it replaces
# An interrupted export's staging directory, or the temporary file of its settings file.
_LEFTOVER = re.compile(re.escape(STAGING) + r"\d+|\." + re.escape(SETTINGS_FILE) + r"\..+\.tmp")


def export_ctranslate2(
    loaded: LoadedModel,
    output: Path,
    quantization: str = "float32",
    source: str = "",
    *,
    inputs: Iterable[Path | str] = (),
) -> Path:
    """Write ``loaded`` as a CTranslate2 model directory at ``output``; returns ``output``.

    ``output`` may be new, empty, or an earlier export: that export's files (those its
    ``transformer_mt.json`` lists) are replaced, and nothing else is ever removed. A directory
    that holds anything else, ``inputs`` (the checkpoint being exported) above all, is refused
    before any work (:func:`check_export_output`). A new directory is built beside ``output`` and
    renamed into place when complete; an existing one gets the new files one by one under a
    marker that lists both exports' files until the new one is complete (:func:`_move_in`), so
    an interruption never leaves a file that no manifest lists, nor a half-written file.
    """
    if quantization not in QUANTIZATIONS:
        raise MTError(
            f"--quantization {quantization!r}: expected one of {', '.join(QUANTIZATIONS)}"
        )
    output = Path(output)
    earlier = check_export_output(output, inputs)
    check_finite(loaded.model.state_dict(), output, saving=True)
    ctranslate2 = import_ctranslate2()
    spec = transformer_spec(loaded.model, ctranslate2.specs)
    spec.register_source_vocabulary(_pieces(loaded.src_tok, loaded.model.src_emb.num_embeddings))
    spec.register_target_vocabulary(_pieces(loaded.trg_tok, loaded.model.out.out_features))
    spec.config.add_source_eos = True
    spec.config.layer_norm_epsilon = LAYER_NORM_EPSILON
    spec.validate()
    spec.optimize(quantization=quantization)

    def write(directory: Path) -> list[str]:
        spec.save(str(directory))
        return _write_ours(directory, loaded, quantization, source)

    if earlier is None:
        _write_new(output, write)
    else:
        _write_over(output, earlier, write)
    return output


def _write_ours(directory: Path, loaded: LoadedModel, quantization: str, source: str) -> list[str]:
    """Write our files beside CTranslate2's in ``directory``.

    The sentencepiece models and the settings file, whose ``files`` lists every file of the export
    (its manifest). Returns that list."""
    for side, tok in (("src", loaded.src_tok), ("trg", loaded.trg_tok)):
        (directory / f"spm.{side}.model").write_bytes(tok.model_proto)
    files = sorted({p.name for p in directory.iterdir()} | {SETTINGS_FILE})
    settings = {
        "decode": dataclasses.asdict(loaded.config.decode),
        "files": files,
        "joint_vocabulary": loaded.src_tok is loaded.trg_tok,
        "max_len": loaded.model.config.model.max_len,
        "model_args": loaded.model_args,
        "quantization": quantization,
        "source": source,
        "step": loaded.step,
        "src_lang": loaded.config.data.src_lang,
        "trg_lang": loaded.config.data.trg_lang,
        # A multilingual model's pairs and tags: the engine starts each source with its tag.
        "pairs": [list(pair) for pair in loaded.pairs],
        "lang_tags": loaded.lang_tags,
        "validation": validation_report(loaded),
    }
    write_text_atomic(directory / SETTINGS_FILE, json.dumps(settings, indent=2) + "\n")
    return files


def _write_new(output: Path, write: Callable[[Path], list[str]]) -> None:
    """A new export directory: written beside ``output``, renamed into place when complete."""
    tmp = output.with_name(f".{output.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)  # this process id's: a killed run's leftover
    try:
        tmp.mkdir()
        write(tmp)
        os.replace(tmp, output)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _write_over(output: Path, earlier: list[str], write: Callable[[Path], list[str]]) -> None:
    """Export into an existing directory (empty, or an earlier export listing ``earlier``).

    The new export is written in a staging directory inside it, then moved in (:func:`_move_in`)."""
    for leftover in output.iterdir():  # an interrupted export's (check_export_output allowed them)
        if _LEFTOVER.fullmatch(leftover.name):
            if leftover.is_dir():
                shutil.rmtree(leftover, ignore_errors=True)
            else:
                leftover.unlink(missing_ok=True)
    staging = output / f"{STAGING}{os.getpid()}"
    try:
        staging.mkdir()
        _move_in(staging, output, earlier, write(staging))
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _move_in(staging: Path, output: Path, earlier: list[str], files: list[str]) -> None:
    """Move the export in ``staging`` (``files``) into ``output``.

    Replaces the ``earlier`` export's files and removes those the new one lacks.

    First the marker is rewritten to list the files of both, marked incomplete (an
    interruption from here on leaves a directory that ``mt translate --engine ct2`` refuses and
    the next export replaces); then each file is renamed in (atomic, one by one) and the
    earlier export's others are removed; the new settings file comes last."""
    marker = output / SETTINGS_FILE
    both = sorted({*earlier, *files})
    write_text_atomic(marker, json.dumps({"incomplete": True, "files": both}, indent=2) + "\n")
    for name in files:
        if name != SETTINGS_FILE:
            os.replace(staging / name, output / name)
    for name in set(earlier) - set(files):
        (output / name).unlink(missing_ok=True)
    os.replace(staging / SETTINGS_FILE, marker)


def check_export_output(output: Path | str, inputs: Iterable[Path | str] = ()) -> list[str] | None:
    """Whether ``--output`` can take an export, checked before any work.

    None when it is a new directory, else the files of the earlier export there (``[]`` when it is
    empty); a one-line MTError otherwise.

    Refused: a symbolic link (the export would replace the link), a file, a directory in a
    missing parent, and a directory that holds anything its earlier export did not write -
    ``inputs`` (the checkpoint being exported) named first. Paths whose name is empty (``.``,
    ``..``) are directories that exist, so they are filled in place or refused by these rules.
    """
    output = Path(output)
    if output.is_symlink():
        raise MTError(
            f"--output {output} is a symbolic link; name the directory itself ({output.resolve()})"
        )
    if not output.exists():
        if not output.parent.is_dir():
            raise MTError(f"--output {output}: {output.parent} is not a directory; create it first")
        return None
    if not output.is_dir():
        raise MTError(f"--output {output} is a file; name a directory for the exported model")
    _refuse_inputs(output, inputs)
    entries = [p for p in output.iterdir() if not _LEFTOVER.fullmatch(p.name)]
    if not entries:
        return []
    if not (output / SETTINGS_FILE).is_file():
        raise MTError(
            f"--output {output} is a directory that holds no exported model; name a new or an "
            "empty directory (an earlier export there is replaced)"
        )
    listed = export_files(output)
    others = [
        p.name for p in entries if p.name not in listed or (p.is_dir() and not p.is_symlink())
    ]
    if others:
        more = f" and {len(others) - 1} more" if len(others) > 1 else ""
        raise MTError(
            f"--output {output} holds {others[0]}{more}, which its earlier export did not write; "
            "an export replaces only an earlier export's files: name a new or an empty "
            "directory, or move those files away"
        )
    return listed


def _refuse_inputs(output: Path, inputs: Iterable[Path | str]) -> None:
    """The checkpoint being exported must not be inside ``output`` (nor linked into it)."""
    inside = output.resolve()
    entries = list(output.iterdir())
    for given in inputs:
        path = Path(given)
        if not path.exists():
            continue
        if path.resolve().is_relative_to(inside) or any(_same_file(path, e) for e in entries):
            raise MTError(
                f"{path} is the checkpoint being exported, and it is in --output {output}; "
                "export to another directory"
            )


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def export_files(directory: Path) -> list[str]:
    """The files the export in ``directory`` wrote, as its settings file lists them.

    For an export of an older version, which listed none: the names an export writes. A one-line
    MTError when the settings file is unreadable or its list damaged."""
    settings = read_settings(directory)
    files = settings.get("files", LEGACY_FILES)
    if not isinstance(files, list) or not all(map(_plain_name, files)):
        raise MTError(
            f"{directory / SETTINGS_FILE}: its list of files is damaged; move the directory "
            "away and export again"
        )
    return list(files)


def _plain_name(name: Any) -> bool:
    """A file name without a directory part (a manifest never points outside its directory)."""
    return (
        isinstance(name, str)
        and name not in ("", ".", "..")
        and "/" not in name
        and "\0" not in name
    )


def _pieces(tok: "Tokenizer", size: int) -> list[str]:
    """The vocabulary as CTranslate2 wants it: piece strings in id order, one per embedding row."""
    if tok.vocab_size != size:
        raise MTError(f"tokenizer has {tok.vocab_size} pieces but the model {size} embeddings")
    return tok.id_to_piece(range(size))


def transformer_spec(model: Transformer, specs: ModuleType) -> "TransformerSpec":
    """A ``ctranslate2.specs.TransformerSpec`` holding ``model``'s weights (float32 numpy).

    Shaped by the model's config.
    """
    config = model.config
    pre_norm = config.model.pre_norm
    spec = specs.TransformerSpec.from_config(
        (config.model.n_layers, config.n_dec_layers),
        config.model.n_head,
        pre_norm=pre_norm,
        activation=_ACTIVATIONS[config.model.activation](specs.common_spec.Activation),
    )
    positions = _numpy(model.positions.table)  # (max_len, D): row t is position t
    spec.encoder.embeddings[0].weight = _numpy(model.src_emb.weight)
    spec.encoder.scale_embeddings = config.model.scale_embeddings
    spec.encoder.position_encodings.encodings = positions
    for layer_spec, layer in zip(spec.encoder.layer, model.encoder, strict=True):
        assert isinstance(layer, EncoderLayer)  # the only layers a Transformer's encoder has
        _attention(layer_spec.self_attention, [layer.self_attn.qkv_proj, layer.self_attn.out_proj])
        _norm(layer_spec.self_attention.layer_norm, layer.self_attn_residual.norm)
        _ffn(layer_spec.ffn, layer.ffn, layer.ffn_residual.norm)
    spec.decoder.embeddings.weight = _numpy(model.trg_emb.weight)
    spec.decoder.scale_embeddings = config.model.scale_embeddings
    spec.decoder.position_encodings.encodings = positions
    _linear(spec.decoder.projection, model.out)  # with its bias where it has one (imported)
    for layer_spec, layer in zip(spec.decoder.layer, model.decoder, strict=True):
        assert isinstance(layer, DecoderLayer)  # the only layers a Transformer's decoder has
        _attention(layer_spec.self_attention, [layer.self_attn.qkv_proj, layer.self_attn.out_proj])
        _norm(layer_spec.self_attention.layer_norm, layer.self_attn_residual.norm)
        cross = layer.cross_attn
        _attention(layer_spec.attention, [cross.q_proj, cross.kv_proj, cross.out_proj])
        _norm(layer_spec.attention.layer_norm, layer.cross_attn_residual.norm)
        _ffn(layer_spec.ffn, layer.ffn, layer.ffn_residual.norm)
    if pre_norm:
        # Pre-norm: the final norms are LayerNorms (an Identity only in a post-norm model).
        _norm(spec.encoder.layer_norm, cast("nn.LayerNorm", model.enc_norm))
        _norm(spec.decoder.layer_norm, cast("nn.LayerNorm", model.dec_norm))
    return spec


# Our feed-forward activations (ModelConfig.activation) as CTranslate2's; torch's gelu is the
# exact (erf) one, CTranslate2's GELU.
_ACTIVATIONS = {
    "relu": lambda kinds: kinds.RELU,
    "gelu": lambda kinds: kinds.GELU,
    "swish": lambda kinds: kinds.SWISH,
}


def _numpy(tensor: "torch.Tensor") -> "npt.NDArray[np.float32]":
    """A float32 copy of ``tensor`` as a numpy array.

    CTranslate2 quantizes its arrays in place, and a view would share the model's own parameters
    (the exported model would then corrupt the one it came from)."""
    return tensor.detach().float().cpu().numpy().copy()


def _linear(spec: "LinearSpec", module: "nn.Linear") -> None:
    spec.weight = _numpy(module.weight)
    if module.bias is not None:
        spec.bias = _numpy(module.bias)


def _attention(spec: "MultiHeadAttentionSpec", linears: Sequence["nn.Linear"]) -> None:
    for linear_spec, module in zip(spec.linear, linears, strict=True):
        _linear(linear_spec, module)


def _norm(spec: "LayerNormSpec", module: "nn.LayerNorm") -> None:
    spec.gamma = _numpy(module.weight)
    spec.beta = _numpy(module.bias)


def _ffn(spec: "FeedForwardSpec", ffn: "FeedForward", norm: "nn.LayerNorm") -> None:
    _linear(spec.linear_0, ffn.fc1)
    _linear(spec.linear_1, ffn.fc2)
    _norm(spec.layer_norm, norm)
