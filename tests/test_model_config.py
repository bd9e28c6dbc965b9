"""The model is built from its config: ``Transformer(TransformerConfig)`` and the seeds'
constructor build the same model, every ModelConfig field reaches it, and the arguments that
checkpoints store (older ones included) rebuild it."""

import dataclasses
from pathlib import Path

import pytest
import torch

from transformer_mt.checkpoint import load_checkpoint
from transformer_mt.config import ModelConfig, settings_of
from transformer_mt.data.tokenizer import BOS_ID, PAD_ID
from transformer_mt.engines import load_for_inference
from transformer_mt.model import Transformer, TransformerConfig
from transformer_mt.model.transformer_config import ALWAYS_STORED, DATA_ARGS

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "old_checkpoint" / "old_last.pt"
VOCAB = 40
# A small model, every setting away from where a changed value would be refused.
SMALL = dict(d_model=32, n_head=4, ffn_hidden=64, n_layers=2, max_len=64, drop_prob=0.1)


def _config(**settings) -> TransformerConfig:
    model = ModelConfig(**{**SMALL, **settings})
    return TransformerConfig.build(model, VOCAB, VOCAB, pad_idx=PAD_ID, bos_idx=BOS_ID)


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(5)
    return torch.randint(4, VOCAB, (3, 7), generator=gen), torch.randint(
        4, VOCAB, (3, 6), generator=gen
    )


def _seeded(build) -> Transformer:
    torch.manual_seed(0)
    return build()


def _fingerprint(model: Transformer) -> tuple:
    """What tells two models apart: parameter names and shapes, the position table, the
    outputs in eval mode and, from the same generator state, in training mode (dropout)."""
    src, trg = _inputs()
    params = [(name, tuple(p.shape)) for name, p in model.named_parameters()]
    with torch.no_grad():
        model.eval()
        evaluated = model(src, trg)
        model.train()
        torch.manual_seed(1)
        trained = model(src, trg)
    return params, tuple(model.positions.table.shape), evaluated, trained


def _same(a: tuple, b: tuple) -> bool:
    return a[:2] == b[:2] and all(
        x.shape == y.shape and torch.equal(x, y) for x, y in zip(a[2:], b[2:], strict=True)
    )


CONFIGS = [
    {},
    {"pre_norm": True, "n_dec_layers": 1, "tie_embeddings": False, "share_embeddings": False},
    {"activation": "swish", "position_layout": "halves", "logits_bias": True},
    {"scale_embeddings": False, "attn_drop_prob": 0.2, "ffn_drop_prob": 0.3},
]


@pytest.mark.parametrize("settings", CONFIGS)
def test_the_config_and_the_seeds_constructor_build_the_same_model(settings):
    config = _config(**settings)
    built = _seeded(lambda: Transformer(config))
    by_keywords = _seeded(lambda: Transformer(**config.to_args()))
    args = config.to_args()
    positional = [args.pop(name) for name in (*DATA_ARGS, "d_model", "n_head", "max_len")]
    by_position = _seeded(lambda: Transformer(*positional, **args))
    assert by_keywords.config == by_position.config == config
    for other in (by_keywords, by_position):
        assert [(n, p.shape) for n, p in built.state_dict().items()] == [
            (n, p.shape) for n, p in other.state_dict().items()
        ]
        assert _same(_fingerprint(built), _fingerprint(other))


def _changed(declared, value):
    """Another value than ``value`` that the setting ``declared`` accepts."""
    if declared.choices:
        return next(choice for choice in declared.choices if choice != value)
    if isinstance(value, bool):
        return not value
    if value is None:  # n_dec_layers: null = as deep as the encoder
        return 1
    if isinstance(value, int):
        return value * 2  # d_model 64 and n_head 8 both still divide
    if isinstance(value, float):
        return 0.3 if value != 0.3 else 0.2
    pytest.fail(f"model.{declared.name}: no value to change it to; extend _changed")


@pytest.mark.parametrize("declared", settings_of(ModelConfig), ids=lambda d: d.name)
def test_every_model_setting_reaches_the_model_and_its_stored_arguments(declared):
    base = _config()
    value = _changed(declared, getattr(base.model, declared.name))
    try:
        changed = _config(**{declared.name: value})
    except (ValueError, TypeError) as err:  # refused: then it says which setting
        assert declared.name in str(err)
        return
    assert getattr(changed.model, declared.name) == value
    original = _fingerprint(_seeded(lambda: Transformer(base)))
    assert not _same(original, _fingerprint(_seeded(lambda: Transformer(changed))))
    # The arguments a checkpoint stores rebuild the same config.
    assert TransformerConfig.from_args(**changed.to_args()) == changed


def test_build_shares_one_vocabulary_and_copies_the_settings():
    model_cfg = ModelConfig(**SMALL)
    shared = TransformerConfig.build(model_cfg, 300, 200, pad_idx=PAD_ID, bos_idx=BOS_ID)
    assert (shared.enc_voc_size, shared.dec_voc_size) == (300, 300)
    model_cfg.d_model = 64  # a later change of the run's config is not the built model's
    assert shared.model.d_model == 32
    model_cfg.share_embeddings = False
    separate = TransformerConfig.build(model_cfg, 300, 200, pad_idx=PAD_ID, bos_idx=BOS_ID)
    assert (separate.enc_voc_size, separate.dec_voc_size) == (300, 200)
    with pytest.raises(ValueError, match="share_embeddings needs enc_voc_size == dec_voc_size"):
        dataclasses.replace(separate, model=ModelConfig(share_embeddings=True))


def test_the_seeds_constructor_refuses_what_a_constructor_would():
    args = _config().to_args()
    with pytest.raises(TypeError, match="unexpected keyword argument 'dmodel'"):
        Transformer(**args, dmodel=8)
    with pytest.raises(TypeError, match="missing the required argument 'dec_voc_size'"):
        Transformer(**{k: v for k, v in args.items() if k != "dec_voc_size"})
    with pytest.raises(TypeError, match="multiple values for argument 'src_pad_idx'"):
        Transformer(PAD_ID, **args)
    with pytest.raises(TypeError, match="at most 11 positional"):
        Transformer(*range(12))


def test_stored_arguments_keep_the_form_older_readers_accept():
    """Our own models store the keys they always stored; a setting outside those appears only
    where it is not its default (readers of older versions refuse keys they do not know)."""
    plain = _config().to_args()
    assert set(plain) == {*DATA_ARGS, *ALWAYS_STORED}
    swish = _config(activation="swish").to_args()
    assert set(swish) - set(plain) == {"activation"} and swish["activation"] == "swish"


def test_an_old_checkpoint_rebuilds_its_model_through_the_config():
    stored = load_checkpoint(FIXTURE)["model_args"]
    loaded = load_for_inference(FIXTURE, pack=False)
    assert loaded.model.config == TransformerConfig.from_args(**stored)
    assert loaded.model_args == loaded.model.config.to_args() == stored  # written as it was read
    # Written before attention and feed-forward dropout and the imported models' options: a
    # stored dict without those keys builds what such a checkpoint was trained as.
    later = ("attn_drop_prob", "ffn_drop_prob")
    older = TransformerConfig.from_args(**{k: v for k, v in stored.items() if k not in later})
    assert older == loaded.model.config
    model = older.model
    assert (model.attn_drop_prob, model.ffn_drop_prob, model.scale_embeddings) == (0, 0, True)
    assert (model.position_layout, model.activation, model.logits_bias) == (
        "interleaved",
        "relu",
        False,
    )
    # The seeds' constructor leaves share_embeddings out: one embedding per side.
    seeds = {k: v for k, v in stored.items() if k != "share_embeddings"}
    assert not TransformerConfig.from_args(**seeds).model.share_embeddings
