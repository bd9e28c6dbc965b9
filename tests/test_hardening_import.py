"""`mt import --from hf` against damaged or hostile Marian directories, and language tags in
source text: config.json outside its schema (types, ranges, token ids beyond the vocabulary),
tensors whose shapes the config does not describe, sentencepiece models that are empty or cut
text into nothing the vocabulary knows, each refused in one line naming the file and field before
anything is written (a property test: random config values and tensor shapes give success or one
MTError, never another exception); and text that looks like a language tag (``<2de>``,
``>>fra<<``) is translated as text, the tag's id coming from the target language only.
"""

import contextlib
import json
import math
import random
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers", reason="the hf extra is not installed")
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file
from sentencepiece import sentencepiece_model_pb2 as spm_pb2
from test_import_hf import _sentences, _train_spm, build_marian
from typer.testing import CliRunner

from transformer_mt.cli import app
from transformer_mt.config import DecodeConfig
from transformer_mt.convert.marian import CONFIG_SCHEMA, import_marian
from transformer_mt.data.languages import source_prefix
from transformer_mt.data.tokenizer import Tokenizer, TokenizerSettings
from transformer_mt.engines import translate_lines
from transformer_mt.engines.loading import load_for_inference
from transformer_mt.errors import MTError

runner = CliRunner()
pytestmark = pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses")


@pytest.fixture(scope="module")
def marian_dir(tmp_path_factory) -> Path:
    return build_marian(tmp_path_factory.mktemp("marian"))


@pytest.fixture
def marian(marian_dir, tmp_path) -> Path:
    """A copy of the tiny Marian directory (d_model 32, 2+2 layers, ffn 64, 70 pieces)."""
    return Path(shutil.copytree(marian_dir, tmp_path / "model"))


def _import_fails(directory: Path, out: Path, pattern: str) -> str:
    """`mt import` of ``directory``: exit 1, one line matching ``pattern``, nothing written."""
    result = runner.invoke(app, ["import", "--from", "hf", str(directory), "-o", str(out)])
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    assert pytest.importorskip("re").search(pattern, result.output), result.output
    assert not out.exists()
    return result.output


def _edit_config(directory: Path, **changes) -> None:
    config = json.loads((directory / "config.json").read_text())
    config.update(changes)
    (directory / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"d_model": "32"}, r"field d_model='32': expected an integer, 1 to 65536"),
        ({"d_model": 32.0}, r"field d_model=32.0: expected an integer"),
        ({"encoder_attention_heads": 0, "decoder_attention_heads": 0},
         r"field encoder_attention_heads=0: expected an integer, 1 to 1024"),
        ({"dropout": 5.0}, r"field dropout=5.0: expected a number, in \[0, 1\)"),
        ({"attention_dropout": math.nan}, r"field attention_dropout=nan: expected a number"),
        ({"encoder_layers": 0}, r"field encoder_layers=0: expected an integer, 1 to 1024"),
        ({"decoder_layers": 0}, r"field decoder_layers=0: expected an integer, 1 to 1024"),
        ({"decoder_layers": True}, r"field decoder_layers=True: expected an integer"),
        ({"max_position_embeddings": 10**9}, r"field max_position_embeddings=1000000000"),
        ({"activation_function": ["swish"]}, r"field activation_function=\['swish'\]: expected a string"),
        ({"architectures": 5}, r"field architectures=5: expected a list of strings"),
        ({"vocab_size": "70"}, r"field vocab_size='70': expected an integer"),
        ({"eos_token_id": -1}, r"field eos_token_id=-1: expected an integer, 0 to"),
        ({"pad_token_id": 70, "decoder_start_token_id": 70},
         r"field pad_token_id=70 is not an id of the target vocabulary \(0 to 69\)"),
        ({"forced_eos_token_id": 123456}, r"field forced_eos_token_id=123456 is not an id of"),
        ({"scale_embedding": "yes"}, r"field scale_embedding='yes': expected true or false"),
    ],
)  # fmt: skip
def test_a_config_outside_its_schema_is_one_line_naming_the_field(
    marian, tmp_path, changes, message
):
    _edit_config(marian, **changes)
    output = _import_fails(marian, tmp_path / "x.pt", message)
    assert f"{marian / 'config.json'}: field" in output


def test_a_tokenizer_config_flag_of_another_type_is_one_line(marian, tmp_path):
    tok_cfg = json.loads((marian / "tokenizer_config.json").read_text())
    tok_cfg["separate_vocabs"] = "no"
    (marian / "tokenizer_config.json").write_text(json.dumps(tok_cfg))
    _import_fails(marian, tmp_path / "x.pt", r"tokenizer_config\.json: field separate_vocabs='no'")


def _edit_weights(directory: Path, **tensors) -> None:
    weights = load_file(str(directory / "model.safetensors"))
    for name, tensor in tensors.items():
        if tensor is None:
            del weights[name.replace("__", ".")]
        else:
            weights[name.replace("__", ".")] = tensor
    save_file(weights, str(directory / "model.safetensors"))


@pytest.mark.parametrize(
    ("config", "tensors", "message"),
    [
        ({}, {"model__encoder__layers__0__fc1__weight": torch.zeros(64, 31)},
         r"model\.safetensors: tensor model\.encoder\.layers\.0\.fc1\.weight has shape \(64, 31\); "
         r"config\.json asks for \(64, 32\)"),
        ({"d_model": 64}, {},
         r"tensor model\.encoder\.embed_tokens\.weight \(or model\.shared\.weight\) has shape "
         r"\(70, 32\); config\.json and the vocabulary ask for \(70, 64\)"),
        ({"encoder_ffn_dim": 128, "decoder_ffn_dim": 128}, {},
         r"tensor model\.encoder\.layers\.0\.fc1\.weight has shape \(64, 32\); .*\(128, 32\)"),
        ({"encoder_layers": 3}, {}, r"model\.safetensors: the weights lack model\.encoder\.layers\.2\."),
        ({"vocab_size": 80, "decoder_vocab_size": 80}, {}, r"ask for \(80, 32\)"),
        ({"vocab_size": 60, "decoder_vocab_size": 60}, {"model__shared__weight": torch.zeros(60, 32)},
         r"at least 70 rows \(its pieces\)"),
        ({}, {"final_logits_bias": torch.zeros(1, 7)}, r"tensor final_logits_bias has shape \(1, 7\)"),
        ({}, {"model__decoder__layers__1__encoder_attn__k_proj__bias": torch.zeros(())},
         r"tensor model\.decoder\.layers\.1\.encoder_attn\.k_proj\.bias has shape \(\); .*\(32,\)"),
    ],
)  # fmt: skip
def test_tensors_the_config_does_not_describe_are_one_line(
    marian, tmp_path, config, tensors, message
):
    _edit_config(marian, **config)
    _edit_weights(marian, **tensors)
    _import_fails(marian, tmp_path / "x.pt", message)


def _no_normal_pieces(path: Path) -> None:
    proto = spm_pb2.ModelProto()
    proto.ParseFromString(path.read_bytes())
    for piece in proto.pieces:
        if piece.type == piece.NORMAL:
            piece.type = piece.UNUSED
    path.write_bytes(proto.SerializeToString())


def test_an_empty_or_unusable_sentencepiece_model_is_one_line(marian, tmp_path):
    """Each of these read every text as <unk> (or could not be read): refused by name."""
    (marian / "source.spm").write_bytes(b"")
    _import_fails(marian, tmp_path / "x.pt", r"source\.spm: an empty file, not a sentencepiece")
    (marian / "source.spm").write_bytes(b"\x0a\x03abc\xff\xff garbage")
    _import_fails(marian, tmp_path / "x.pt", r"source\.spm: not a sentencepiece model")
    shutil.copy(marian / "target.spm", marian / "source.spm")
    _no_normal_pieces(marian / "target.spm")
    _import_fails(marian, tmp_path / "x.pt", r"target\.spm: no pieces to cut text into")
    foreign = [" ".join(random.Random(i).choices("αβγδεζηθικλμ", k=9)) for i in range(200)]
    _train_spm(foreign, marian / "target.spm")
    _import_fails(
        marian,
        tmp_path / "x.pt",
        r"target\.spm: (none of its pieces is|only \d+ of its \d+ pieces are) in the vocab",
    )


# --- language tags in source text are text -----------------------------------------------


def test_text_that_looks_like_our_tag_is_cut_as_text():
    rng = random.Random(0)
    words = ["ka", "lo", "mi", "<", ">", "2", "de", "en", "2de", "ne"]
    texts = [" ".join("".join(rng.choices(words, k=3)) for _ in range(8)) for _ in range(400)]
    tok = Tokenizer.train(texts, TokenizerSettings(vocab_size=80, user_symbols=("<2en>", "<2de>")))
    tags = {tok.piece_id("<2en>"), tok.piece_id("<2de>")}
    assert None not in tags and tags == set(tok.tag_ids)
    for line in ("<2de> kalo", "mi <2en> ne <2de>", "<2de>"):
        ids = tok.encode(line)
        assert not tags & set(ids), (line, tok.pieces(line))
        assert tok.decode(ids) == line  # every character is the text's
        assert tok.encode_batch([line]) == [ids]
        assert not tags & set(tok.sample_batch([line], 0.1)[0])
    prefix = source_prefix(tok, {"en": "<2en>", "de": "<2de>"}, [], "de")
    assert prefix == [tok.piece_id("<2de>")]  # the tag comes from the target language only


def _with_user_tags(path: Path, tags: tuple[str, ...]) -> None:
    """``path``'s sentencepiece model with ``tags`` as user-defined symbols (cut from text)."""
    proto = spm_pb2.ModelProto()
    proto.ParseFromString(path.read_bytes())
    for tag in tags:
        proto.pieces.add(piece=tag, score=0.0, type=spm_pb2.ModelProto.SentencePiece.USER_DEFINED)
    path.write_bytes(proto.SerializeToString())


def test_text_that_looks_like_a_marian_tag_is_translated_as_text(tmp_path):
    """A multi-target model whose sentencepiece model cuts >>fra<< out of text: the import
    makes its tags unused pieces, so a source line holding ">>fra<<" reaches the encoder as
    text, after the one tag --target-lang asks for."""
    tags = (">>deu<<", ">>fra<<")
    directory = build_marian(tmp_path, tags=tags)
    for name in ("source.spm", "target.spm"):
        _with_user_tags(directory / name, tags)
    import_marian(str(directory), tmp_path / "opus.pt")
    loaded = load_for_inference(tmp_path / "opus.pt")
    tag_ids = {loaded.src_tok.piece_id(tag) for tag in tags}
    deu = loaded.src_tok.piece_id(">>deu<<")
    lines = [">>fra<< " + _sentences(9, 1)[0], "kalo >>fra<<", ">>deu<<"]
    for line in lines:
        assert not tag_ids & set(loaded.src_tok.encode(line)), loaded.src_tok.pieces(line)
    seen: list[list[int]] = []
    encode = loaded.model.encode

    def spied(src):  # what the encoder is given
        seen.extend(src.tolist())
        return encode(src)

    loaded.model.encode = spied
    greedy = DecodeConfig(beam_size=1, max_len_a=6.0, max_len_b=0.0)
    prefix = loaded.source_prefix("deu")
    translate_lines(loaded.model, loaded.src_tok, loaded.trg_tok, lines, greedy, src_prefix=prefix)
    rows = {tuple(i for i in row if i != 0) for row in seen}
    expected = {(deu, *loaded.src_tok.encode(line), 3) for line in lines}
    assert rows == expected


# --- the property: random config values and tensor shapes -----------------------------------

CONFIG_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(0, 80),
    st.integers(-(10**12), 10**12),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(
        [0.0, 0.1, 0.99, 1.0, 32.0, "32", "swish", "marian", ["MarianMTModel"], [], {}]
    ),
    st.text(max_size=4),
)
SHAPES = st.one_of(
    st.none(), st.lists(st.sampled_from([0, 1, 2, 31, 32, 64, 69, 70, 71]), max_size=3)
)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    changes=st.dictionaries(st.sampled_from(sorted(CONFIG_SCHEMA)), CONFIG_VALUES, max_size=3),
    reshaped=st.lists(st.tuples(st.integers(0, 10**6), SHAPES), max_size=2),
)
def test_any_config_values_and_tensor_shapes_import_or_are_one_line(marian_dir, changes, reshaped):
    """Whatever config.json says and whatever shapes the tensors have: the checkpoint is
    written, or one MTError line says why and nothing is written; never another exception."""
    with tempfile.TemporaryDirectory() as work:
        directory = Path(shutil.copytree(marian_dir, Path(work) / "model"))
        _edit_config(directory, **changes)
        weights = load_file(str(directory / "model.safetensors"))
        names = sorted(weights)
        for pick, shape in reshaped:
            name = names[pick % len(names)]
            if shape is None:
                weights.pop(name, None)
            else:
                weights[name] = torch.randn(shape)
        save_file(weights, str(directory / "model.safetensors"))
        out = Path(work) / "out.pt"
        try:
            import_marian(str(directory), out)
        except MTError as err:
            assert "\n" not in str(err) and not out.exists(), str(err)
        else:
            with contextlib.suppress(MTError):  # written: it loads, or says why in one line
                load_for_inference(out)
