"""What a Transformer is built from: the run's model settings and what its vocabularies decide.

:class:`TransformerConfig` is to :class:`~transformer_mt.model.Transformer` what nanoGPT's
``GPTConfig`` is to ``GPT``: ``Transformer(config)``. Its settings are a
:class:`~transformer_mt.config.ModelConfig` (each field declared once in config/schema.py, with its
default, range and help); the rest is what the data decides: the vocabulary sizes and the padding
and BOS ids. :meth:`TransformerConfig.build` is the one function that makes it from a run's
ModelConfig and its tokenizers.

Checkpoints store the same shape as the seeds' keyword arguments (``model_args``): the data's
values under the seeds' names (``src_pad_idx``, ``trg_pad_idx``, ``trg_sos_idx``,
``enc_voc_size``, ``dec_voc_size``) and every setting under its ModelConfig name.
:meth:`TransformerConfig.to_args` writes that dict and :meth:`TransformerConfig.from_args` reads
it, as it reads the seeds' constructor arguments (``Transformer(src_pad_idx, ...)``).
"""

import dataclasses
import functools
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from transformer_mt.config import ModelConfig

# What the data decides, under the seeds' names and in their positional order.
DATA_ARGS = ("src_pad_idx", "trg_pad_idx", "trg_sos_idx", "enc_voc_size", "dec_voc_size")
# The seeds' positional arguments: Transformer(src_pad_idx, ..., dec_voc_size, d_model, n_head,
# max_len, ffn_hidden, n_layers, drop_prob).
SEED_ORDER = (*DATA_ARGS, "d_model", "n_head", "max_len", "ffn_hidden", "n_layers", "drop_prob")
# The settings every checkpoint's model_args holds. Any other setting is stored only where it
# differs from its default, so that a model without it is stored as before (readers of older
# versions refuse an argument they do not know) and a stored dict without it means the default.
ALWAYS_STORED = (
    "d_model",
    "n_head",
    "max_len",
    "ffn_hidden",
    "n_layers",
    "drop_prob",
    "n_dec_layers",
    "pre_norm",
    "attn_drop_prob",
    "ffn_drop_prob",
    "tie_embeddings",
    "share_embeddings",
)
# What an argument left out means where it is not ModelConfig's default: the seeds' model has an
# embedding per side (every checkpoint stores share_embeddings; the seeds' constructor omits it).
UNSTATED = {"share_embeddings": False}


@dataclass(frozen=True)
class TransformerConfig:
    """A Transformer's whole shape: its settings and what its vocabularies decide.

    ``model`` is a copy of the run's ModelConfig (every setting with its declared default); the
    vocabulary sizes are the embeddings' rows (``dec_voc_size``: also the output classes).
    With ``model.share_embeddings`` the two sizes must be equal (one joint vocabulary).
    """

    model: ModelConfig
    enc_voc_size: int
    dec_voc_size: int
    src_pad_idx: int
    trg_pad_idx: int
    trg_sos_idx: int  # BOS: the id that starts every target sequence

    def __post_init__(self) -> None:
        """Refuse shared embeddings over two vocabulary sizes."""
        if self.model.share_embeddings and self.enc_voc_size != self.dec_voc_size:
            raise ValueError("share_embeddings needs enc_voc_size == dec_voc_size (a joint vocab)")

    @property
    def n_dec_layers(self) -> int:
        """Decoder layers: ``model.n_dec_layers``, or as many as the encoder's when null."""
        n_dec = self.model.n_dec_layers
        return self.model.n_layers if n_dec is None else n_dec

    @classmethod
    def build(
        cls,
        model: ModelConfig,
        src_vocab_size: int,
        trg_vocab_size: int,
        *,
        pad_idx: int,
        bos_idx: int,
    ) -> "TransformerConfig":
        """The shape of a run's model: its ModelConfig and its tokenizers' sizes and ids.

        With ``share_embeddings`` both sides get the larger vocabulary size (a joint vocabulary)."""
        if model.share_embeddings:
            src_vocab_size = trg_vocab_size = max(src_vocab_size, trg_vocab_size)
        return cls(
            model=dataclasses.replace(model),  # a copy: the run's config may change later
            enc_voc_size=src_vocab_size,
            dec_voc_size=trg_vocab_size,
            src_pad_idx=pad_idx,
            trg_pad_idx=pad_idx,
            trg_sos_idx=bos_idx,
        )

    @classmethod
    def from_args(cls, *args: Any, **kwargs: Any) -> "TransformerConfig":
        """The config that the seeds' constructor arguments describe.

        They come positional in :data:`SEED_ORDER` or by name (a checkpoint's ``model_args``). The
        five of :data:`DATA_ARGS` are required; a setting left out takes ModelConfig's default
        (:data:`UNSTATED` where that differs).

        Raises:
            TypeError: too many positional arguments, one given twice, an unknown or a missing
                one (as a constructor would).
            MTError: a setting ModelConfig refuses (a choice the model does not have).
        """
        if len(args) > len(SEED_ORDER):
            raise TypeError(f"Transformer takes at most {len(SEED_ORDER)} positional arguments")
        named = dict(zip(SEED_ORDER, args, strict=False))
        twice = sorted(named.keys() & kwargs.keys())
        if twice:
            raise TypeError(f"Transformer got multiple values for argument {twice[0]!r}")
        named.update(kwargs)
        unknown = sorted(named.keys() - argument_types().keys())
        if unknown:
            raise TypeError(f"Transformer got an unexpected keyword argument {unknown[0]!r}")
        missing = [name for name in DATA_ARGS if name not in named]
        if missing:
            raise TypeError(f"Transformer is missing the required argument {missing[0]!r}")
        data = {name: named.pop(name) for name in DATA_ARGS}
        return cls(model=ModelConfig(**stated_settings(named)), **data)

    def to_args(self) -> dict[str, Any]:
        """The seeds' keyword arguments for this shape, as checkpoints store them.

        That is ``model_args``: the data's values, :data:`ALWAYS_STORED` and every other setting
        that differs from its default."""
        default = ModelConfig()
        settings = {
            key: value
            for key, value in dataclasses.asdict(self.model).items()
            if key in ALWAYS_STORED or value != getattr(default, key)
        }
        return {**{name: getattr(self, name) for name in DATA_ARGS}, **settings}


def stated_settings(args: Mapping[str, Any]) -> dict[str, Any]:
    """Every ModelConfig setting that stored arguments ``args`` mean.

    Each is its value there, or what leaving it out means (:data:`UNSTATED`, else ModelConfig's
    default); other keys ignored."""
    default = ModelConfig()
    return {
        f.name: args.get(f.name, UNSTATED.get(f.name, getattr(default, f.name)))
        for f in dataclasses.fields(ModelConfig)
    }


@functools.cache
def argument_types() -> dict[str, tuple[Any, bool]]:
    """The arguments stored ``model_args`` may hold: name -> (annotated type, required).

    The data's are required integers; the settings are ModelConfig's fields, of their types."""
    hints = typing.get_type_hints(ModelConfig)
    settings = {f.name: (hints[f.name], False) for f in dataclasses.fields(ModelConfig)}
    return {**{name: (int, True) for name in DATA_ARGS}, **settings}
