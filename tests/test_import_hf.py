"""`mt import --from hf`: tiny MarianMTModels built by `transformers` itself compute, once
imported, what they compute in `transformers` (log-probabilities, greedy and beam outputs), and
what cannot be imported is refused in one line.

Skipped where the `hf` extra (transformers, safetensors) is not installed.
"""

import copy
import io
import json
import random
import re
import shutil
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from transformer_mt.cli import app
from transformer_mt.config import DecodeConfig
from transformer_mt.convert.marian import import_marian
from transformer_mt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from transformer_mt.decoding.search import search
from transformer_mt.engines.loading import load_for_inference
from transformer_mt.errors import MTError

transformers = pytest.importorskip("transformers", reason="the hf extra is not installed")
spm = pytest.importorskip("sentencepiece")

pytestmark = pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses")
runner = CliRunner()
_SYLLABLES = "ka lo mi ne su ra te vo zu pi gha ost ing ber und sch".split()


def _sentences(seed: int, n: int) -> list[str]:
    """Sentences of made-up words (syllable strings), so that pieces are subwords."""
    rng = random.Random(seed)
    words = ["".join(rng.choices(_SYLLABLES, k=rng.randint(1, 4))) for _ in range(60)]
    return [" ".join(rng.choices(words, k=rng.randint(2, 9))) for _ in range(n)]


def _train_spm(sentences: list[str], path: Path) -> list[str]:
    """A unigram sentencepiece model as Marian's (unk 0, <s> 1, </s> 2); its normal pieces."""
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences),
        model_writer=buf,
        vocab_size=70,
        model_type="unigram",
        minloglevel=2,
        hard_vocab_limit=False,
        num_threads=1,
    )
    path.write_bytes(buf.getvalue())
    sp = spm.SentencePieceProcessor(model_proto=buf.getvalue())
    return [
        sp.id_to_piece(i)
        for i in range(sp.get_piece_size())
        if not sp.is_unknown(i) and not sp.is_control(i)
    ]


def _vocab(pieces: list[str], tags: tuple[str, ...] = ()) -> dict[str, int]:
    """A Marian vocabulary: </s> 0, <unk> 1, the pieces, the tags, <pad> last."""
    vocab = {"</s>": 0, "<unk>": 1}
    for piece in [*pieces, *tags]:
        vocab.setdefault(piece, len(vocab))
    vocab["<pad>"] = len(vocab)
    return vocab


# The kinds of tiny Marian models built: OPUS-MT's (one vocabulary and sentencepiece model,
# shared and tied embeddings, swish, scaled embeddings); separate vocabularies; a vocabulary
# that lacks a sentencepiece piece; an untied output layer, gelu and unscaled embeddings.
VARIANTS = ("shared", "separate", "unknown-piece", "untied-gelu-unscaled")


def build_marian(where: Path, variant: str = "shared", tags: tuple[str, ...] = ()) -> Path:
    """A tiny MarianMTModel (of the :data:`VARIANTS`) with random weights and its tokenizer,
    saved as Hugging Face saves them; returns the directory. ``unknown-piece``: the vocabulary
    lacks the sentencepiece piece most frequent in the test sentences (Marian reads it as
    <unk>), and holds another instead."""
    separate, unknown = variant == "separate", variant == "unknown-piece"
    options = dict(activation_function="swish", scale_embedding=True, tie_word_embeddings=True)
    if variant == "untied-gelu-unscaled":
        options = dict(activation_function="gelu", scale_embedding=False, tie_word_embeddings=False)
    work = where / "build"
    work.mkdir(parents=True)
    src_pieces = _train_spm(_sentences(1, 300), work / "source.spm")
    if separate:
        trg_pieces = _train_spm(_sentences(2, 300), work / "target.spm")
    else:
        shutil.copy(work / "source.spm", work / "target.spm")
        trg_pieces = src_pieces
    src_vocab = _vocab(src_pieces, tags)
    if unknown:
        sp = spm.SentencePieceProcessor(model_file=str(work / "source.spm"))
        cut = [p for line in _sentences(4, 50) for p in sp.encode(line, out_type=str)]
        frequent = max(set(cut) - {"▁"}, key=cut.count)
        src_vocab = {("▁notapiece" if p == frequent else p): i for p, i in src_vocab.items()}
    trg_vocab = _vocab(trg_pieces) if separate else src_vocab
    (work / "vocab.json").write_text(json.dumps(src_vocab))
    (work / "target_vocab.json").write_text(json.dumps(trg_vocab))
    tok = transformers.MarianTokenizer(
        str(work / "source.spm"),
        str(work / "target.spm"),
        str(work / "vocab.json"),
        str(work / "target_vocab.json") if separate else None,
        source_lang="en",
        target_lang="de",
        separate_vocabs=separate,
    )
    pad = len(trg_vocab) - 1
    config = transformers.MarianConfig(
        vocab_size=len(src_vocab),
        decoder_vocab_size=len(trg_vocab),
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        pad_token_id=pad,
        decoder_start_token_id=pad,
        eos_token_id=0,
        forced_eos_token_id=0,
        max_position_embeddings=64,
        share_encoder_decoder_embeddings=not separate,
        init_std=0.3,
        **options,
    )
    torch.manual_seed(0)
    model = transformers.MarianMTModel(config).eval()
    with torch.no_grad():  # a bias as trained models have; EOS likely enough to end sentences
        model.final_logits_bias.normal_(0.0, 0.5)
        model.final_logits_bias[0, 0] += 1.0
    out = where / "hf"
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="module", params=VARIANTS)
def imported(request, tmp_path_factory):
    """(Marian directory, transformers model, its tokenizer, our loaded import)."""
    where = tmp_path_factory.mktemp(request.param)
    directory = build_marian(where, request.param)
    import_marian(str(directory), where / "imported.pt")
    hf_model = transformers.MarianMTModel.from_pretrained(directory).eval()
    hf_tok = transformers.MarianTokenizer.from_pretrained(directory)
    return directory, hf_model, hf_tok, load_for_inference(where / "imported.pt", pack=False)


def _vocab_orders(directory: Path, loaded) -> tuple[list[int], list[int]]:
    """Marian's id of each of our ids, source and target side, read from the pieces: our
    specials as Marian's (BOS: its decoder start, pad), other pieces through the vocabulary
    files (one it lacks: <unk>, as Marian's tokenizer reads it)."""
    src = json.loads((directory / "vocab.json").read_text())
    trg_file = directory / "target_vocab.json"
    trg = json.loads(trg_file.read_text()) if trg_file.exists() else src
    orders = []
    for vocab, tok in ((src, loaded.src_tok), (trg, loaded.trg_tok)):
        specials = [vocab["<pad>"], vocab["<unk>"], vocab["<pad>"], vocab["</s>"]]
        pieces = tok.id_to_piece(range(len(specials), tok.vocab_size))
        orders.append(specials + [vocab.get(p, vocab["<unk>"]) for p in pieces])
    return orders[0], orders[1]


def _ours(order: list[int], marian_ids: list[int]) -> list[int]:
    """Marian ids as ours (Marian's pad, as a decoder input, is our BOS)."""
    inverse = {m: i for i, m in reversed(list(enumerate(order))) if i != PAD_ID}
    return [inverse[i] for i in marian_ids]


def test_tokenizers_give_marians_ids(imported):
    directory, _, hf_tok, loaded = imported
    src_order, trg_order = _vocab_orders(directory, loaded)
    for line in _sentences(3, 50):
        hf_ids = hf_tok(line).input_ids  # pieces and </s>
        assert [src_order[i] for i in [*loaded.src_tok.encode(line), EOS_ID]] == hf_ids
        hf_trg = hf_tok(text_target=line).input_ids
        assert [trg_order[i] for i in [*loaded.trg_tok.encode(line), EOS_ID]] == hf_trg
    assert any(len(loaded.src_tok.encode(w)) > 1 for w in _sentences(3, 5)[0].split())


@pytest.mark.parametrize(
    ("dtype", "n_lines", "tolerance"), [(torch.float32, 8, 1e-5), (torch.float64, 50, 1e-10)]
)
def test_next_token_log_probs_equal_transformers(imported, dtype, n_lines, tolerance):
    """Teacher-forced log-probabilities of every id: within 1e-5 in fp32 (rounding: the two
    models order their sums differently), and to 1e-10 with both models in float64 (the
    conversion itself is exact)."""
    directory, hf_model, hf_tok, loaded = imported
    hf_model, model = copy.deepcopy(hf_model).to(dtype), copy.deepcopy(loaded.model).to(dtype)
    _, trg_order = _vocab_orders(directory, loaded)
    lines = _sentences(4, n_lines)
    batch = hf_tok(lines, text_target=lines[::-1], return_tensors="pt", padding=True)
    pad = hf_model.config.pad_token_id
    labels = batch["labels"].masked_fill(batch["labels"] == -100, pad)
    decoder_in = torch.cat([torch.full((len(lines), 1), pad), labels[:, :-1]], dim=1)
    with torch.no_grad():
        theirs = hf_model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            decoder_input_ids=decoder_in,
        ).logits.log_softmax(-1)
        src = [[*loaded.src_tok.encode(line), EOS_ID] for line in lines]
        src = torch.nn.utils.rnn.pad_sequence([torch.tensor(s) for s in src], True, PAD_ID)
        trg = torch.tensor([[BOS_ID, *_ours(trg_order, row[1:].tolist())] for row in decoder_in])
        ours = model(src, trg).log_softmax(-1)
    # Marian id j is our id order.index(j): our PAD for pad, our BOS left out.
    columns = [trg_order.index(j) for j in range(theirs.size(-1))]
    real = decoder_in != pad  # positions after a padded target are not compared
    real[:, 0] = True
    diff = (ours[..., columns] - theirs)[real].abs().max().item()
    assert diff < tolerance
    assert (ours[..., BOS_ID] < ours[..., PAD_ID] - 99).all()  # never chosen


@pytest.mark.parametrize("beam", [1, 3])
def test_generate_equals_transformers(imported, beam):
    directory, hf_model, hf_tok, loaded = imported
    _, trg_order = _vocab_orders(directory, loaded)
    lines = _sentences(5, 50)
    pad = hf_model.config.pad_token_id
    batch = hf_tok(lines, return_tensors="pt", padding=True)
    with torch.no_grad():
        theirs = hf_model.generate(
            **batch,
            num_beams=beam,
            do_sample=False,
            max_new_tokens=12,
            length_penalty=0.0,
            early_stopping=True,
            forced_eos_token_id=None,
            bad_words_ids=[[pad]],
        )
    decode = DecodeConfig(beam_size=beam, len_penalty=0.0, max_len_a=12.0, max_len_b=0.0)
    src = [torch.tensor([*loaded.src_tok.encode(line), EOS_ID]) for line in lines]
    src = torch.nn.utils.rnn.pad_sequence(src, True, PAD_ID)
    ours = search(loaded.model, src, decode)
    for row, result in zip(theirs.tolist(), ours, strict=True):
        expected = [i for i in row[1:] if i != pad]
        expected = expected[: expected.index(0)] if 0 in expected else expected
        assert [trg_order[i] for i in result.tokens] == expected
    assert sum(len(r.tokens) for r in ours) > 100  # not a vacuous comparison of empty outputs
    texts = hf_tok.batch_decode(theirs, skip_special_tokens=True)
    assert [loaded.trg_tok.decode(r.tokens) for r in ours] == texts


def test_mt_import_then_translate_with_a_language_tag(tmp_path):
    """The command; a multi-target model's >>tag<< is --target-lang; an existing file is kept."""
    directory = build_marian(tmp_path, tags=(">>deu<<", ">>fra<<"))
    out = tmp_path / "opus.pt"
    result = runner.invoke(app, ["import", "--from", "hf", str(directory), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "targets (--target-lang): deu, fra" in result.output
    loaded = load_for_inference(out)
    assert loaded.lang_tags == {"deu": ">>deu<<", "fra": ">>fra<<"}
    tag = loaded.src_tok.piece_id(">>deu<<")
    assert loaded.source_prefix("deu") == [tag] and tag not in loaded.src_tok.encode(">>deu<<")
    src = tmp_path / "in.txt"
    src.write_text("\n".join(_sentences(6, 5)) + "\n")
    for lang in ("deu", "fra"):
        result = runner.invoke(
            app, ["translate", "-c", str(out), "-i", str(src), "--target-lang", lang, "--beam", "2"]
        )
        assert result.exit_code == 0, result.output
    missing = runner.invoke(app, ["translate", "-c", str(out), "-i", str(src)])
    assert missing.exit_code == 1 and "choose one with --target-lang" in missing.output


@pytest.mark.parametrize("name", ["model.safetensors", "config.json", "source.spm"])
def test_an_import_never_writes_over_the_model_it_reads(marian_copy, name):
    """`-o` naming one of the model's own files is refused before anything is written."""
    before = {p.name: p.read_bytes() for p in marian_copy.iterdir()}
    out = marian_copy / name
    result = runner.invoke(app, ["import", "--from", "hf", str(marian_copy), "-o", str(out)])
    assert result.exit_code == 1
    assert "would destroy the input" in result.output and str(out) in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert {p.name: p.read_bytes() for p in marian_copy.iterdir()} == before


def _edit_json(path: Path, **changes) -> None:
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"model_type": "bart"}, r"config\.json: field model_type is 'bart', not 'marian'"),
        ({"activation_function": "tanh"}, r"field activation_function='tanh'"),
        ({"decoder_ffn_dim": 128}, r"field decoder_ffn_dim=128 differs from encoder_ffn_dim"),
        ({"decoder_start_token_id": 0}, r"field decoder_start_token_id is not pad_token_id"),
        ({"normalize_before": True}, r"field normalize_before is set"),
    ],
)
def test_what_our_model_cannot_compute_is_one_line_naming_the_field(
    marian_copy, tmp_path, change, message
):
    _edit_json(marian_copy / "config.json", **change)
    result = runner.invoke(app, ["import", str(marian_copy), "-o", str(tmp_path / "x.pt")])
    assert result.exit_code == 1
    assert re.search(message, result.output), result.output
    assert len(result.output.strip().splitlines()) == 1 and not (tmp_path / "x.pt").exists()


def test_a_vocabulary_holding_our_bos_piece_is_refused(marian_copy, tmp_path):
    vocab = json.loads((marian_copy / "vocab.json").read_text())
    renamed = next(p for p in vocab if p.startswith("▁") and len(p) > 2)
    vocab = {("<s>" if p == renamed else p): i for p, i in vocab.items()}
    (marian_copy / "vocab.json").write_text(json.dumps(vocab))
    with pytest.raises(MTError, match=r"vocab\.json: piece '<s>' is one of our special pieces"):
        import_marian(str(marian_copy), tmp_path / "x.pt")
    assert not (tmp_path / "x.pt").exists()


def test_a_piece_the_vocabulary_lacks_is_cut_as_marian_cuts_it(imported):
    """The sentencepiece piece the unknown-piece vocabulary lacks: the same pieces (Marian's
    <unk> id for it), the same embedding as <unk>, never an output."""
    directory, _, hf_tok, loaded = imported
    vocab = json.loads((directory / "vocab.json").read_text())
    src_order, _ = _vocab_orders(directory, loaded)
    extra = [
        i for i in range(loaded.src_tok.vocab_size) if i > 3 and src_order[i] == vocab["<unk>"]
    ]
    if "▁notapiece" not in vocab:
        assert extra == []
        return
    (piece_id,) = extra
    hits = [line for line in _sentences(4, 50) if piece_id in loaded.src_tok.encode(line)]
    assert hits and all(vocab["<unk>"] in hf_tok(line).input_ids for line in hits)
    emb = loaded.model.src_emb.weight
    assert torch.equal(emb[piece_id], emb[1])
    bias = loaded.model.out.bias
    assert bias[piece_id] == bias[1] - 100


def test_a_hub_name_that_cannot_be_fetched_is_one_line(tmp_path, monkeypatch):
    """Offline (no request leaves the machine): the hub's error, in one line."""
    import huggingface_hub

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # read per call
    result = runner.invoke(
        app, ["import", "Helsinki-NLP/opus-mt-xx-yy", "-o", str(tmp_path / "x.pt")]
    )
    assert result.exit_code == 1
    assert "cannot fetch Helsinki-NLP/opus-mt-xx-yy from the Hugging Face hub" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_decode_defaults_come_from_the_generation_config(marian_copy, tmp_path):
    _edit_json(
        marian_copy / "generation_config.json", num_beams=5, length_penalty=0.6, max_length=40
    )
    import_marian(str(marian_copy), tmp_path / "x.pt")
    decode = load_for_inference(tmp_path / "x.pt").config.decode
    assert (decode.beam_size, decode.len_penalty) == (5, 0.6)
    assert (decode.max_len_a, decode.max_len_b) == (39.0, 0.0)


@pytest.fixture(scope="module")
def marian_dir(tmp_path_factory) -> Path:
    return build_marian(tmp_path_factory.mktemp("marian"))


@pytest.fixture
def marian_copy(marian_dir, tmp_path) -> Path:
    """A copy of a tiny Marian directory that a test may damage."""
    return Path(shutil.copytree(marian_dir, tmp_path / "copy"))


def test_ctranslate2_export_of_an_imported_model_agrees(imported, tmp_path):
    ctranslate2 = pytest.importorskip("ctranslate2", reason="the ct2 extra is not installed")
    from transformer_mt.convert.ctranslate2 import export_ctranslate2
    from transformer_mt.engines import translate_lines
    from transformer_mt.engines.ct2 import load_ct2, translate_lines_ct2

    _, _, _, loaded = imported
    lines = _sentences(7, 30)
    exported = load_ct2(export_ctranslate2(loaded, tmp_path / "ct2"))
    greedy = DecodeConfig(beam_size=1, max_len_a=12.0, max_len_b=0.0)
    ours = translate_lines(loaded.model, loaded.src_tok, loaded.trg_tok, lines, greedy)
    theirs = translate_lines_ct2(exported, lines, greedy)
    same = sum(a[0][0] == b[0][0] for a, b in zip(ours, theirs, strict=True))
    assert same >= 0.95 * len(lines), f"{same} of {len(lines)} lines equal"
    translator = ctranslate2.Translator(str(tmp_path / "ct2"), intra_threads=1)
    pairs = list(zip(lines[:8], lines[8:16], strict=True))
    scored = translator.score_batch(
        [loaded.src_tok.pieces(s) for s, _ in pairs], [loaded.trg_tok.pieces(t) for _, t in pairs]
    )
    for (src_line, trg_line), result in zip(pairs, scored, strict=True):
        src = torch.tensor([[*loaded.src_tok.encode(src_line), EOS_ID]])
        target = loaded.trg_tok.encode(trg_line)
        with torch.no_grad():
            lp = loaded.model(src, torch.tensor([[BOS_ID, *target]])).log_softmax(-1)[0]
        ours_lp = lp.gather(1, torch.tensor([*target, EOS_ID])[:, None]).squeeze(1)
        assert torch.allclose(ours_lp, torch.tensor(result.log_probs), atol=1e-4)


def _mean_logprob(checkpoint: Path, src: Path, trg: Path) -> float:
    """`mt score`: the mean per-token log-probability of the pairs (the model's whole output
    layer, its bias included)."""
    result = runner.invoke(
        app, ["score", "-c", str(checkpoint), "--src", str(src), "--trg", str(trg), "--json"]
    )
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    return sum(r["logprob"] for r in rows) / sum(r["tokens"] for r in rows)


def test_fine_tuning_an_imported_model_improves_it_on_the_corpus(marian_dir, tmp_path):
    """`mt train --init-from` on a toy corpus of the model's own pieces (targets: the sources'
    words in reverse order): the training loss falls, and `mt score` gives the corpus a higher
    log-probability than the imported model did; `mt evaluate` runs on both."""
    import_marian(str(marian_dir), tmp_path / "opus.pt")
    lines = _sentences(8, 240)
    for split, part in (("train", lines[:200]), ("valid", lines[200:220]), ("test", lines[220:])):
        (tmp_path / f"{split}.src").write_text("\n".join(part) + "\n")
        reordered = [" ".join(reversed(line.split())) for line in part]
        (tmp_path / f"{split}.trg").write_text("\n".join(reordered) + "\n")
    files = "".join(
        f"  {s}_{side}: {tmp_path / f'{s}.{side}'}\n"
        for s in ("train", "valid", "test")
        for side in ("src", "trg")
    )
    config = tmp_path / "tune.yaml"
    config.write_text(
        f"name: tune\ndata:\n  corpus: local\n{files}  max_tokens_per_side: 48\n"
        f"  cache_dir: {tmp_path / 'cache'}\ntrain:\n  max_steps: 30\n  batch_tokens: 600\n"
        "  warmup_steps: 10\n  lr_factor: 2.0\n  log_every: 1\n  valid_every: 1000\n"
        "  valid_bleu: false\n  best_metric: loss\n  threads: 1\n"
    )
    run = tmp_path / "run"
    result = runner.invoke(
        app,
        [
            "train",
            "--config",
            str(config),
            "--run-dir",
            str(run),
            "--init-from",
            str(tmp_path / "opus.pt"),
        ],
    )
    assert result.exit_code == 0, result.output
    losses = [
        json.loads(line)["loss"]
        for line in (run / "metrics.jsonl").read_text().splitlines()
        if "loss" in json.loads(line)
    ]
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < first - 0.5, (first, last)
    assert load_for_inference(run / "last.pt").model.activation == "swish"
    src, trg = tmp_path / "train.src", tmp_path / "train.trg"
    before, after = (
        _mean_logprob(tmp_path / "opus.pt", src, trg),
        _mean_logprob(run / "last.pt", src, trg),
    )
    assert after > before + 0.5, (before, after)
    for checkpoint in (tmp_path / "opus.pt", run / "last.pt"):
        result = runner.invoke(
            app,
            [
                "evaluate",
                "-c",
                str(checkpoint),
                "--src",
                str(tmp_path / "test.src"),
                "--ref",
                str(tmp_path / "test.trg"),
                "--json",
            ],
        )
        assert result.exit_code == 0, result.output
        assert "bleu" in json.loads(result.stdout.strip().splitlines()[-1])


def test_weights_from_pytorch_model_bin_import_the_same(marian_copy, tmp_path):
    """Older model directories hold pytorch_model.bin (loaded weights-only) instead."""
    from safetensors.torch import load_file

    import_marian(str(marian_copy), tmp_path / "a.pt")
    weights = load_file(str(marian_copy / "model.safetensors"))
    torch.save(weights, marian_copy / "pytorch_model.bin")
    (marian_copy / "model.safetensors").unlink()
    import_marian(str(marian_copy), tmp_path / "b.pt")
    a, b = (torch.load(tmp_path / n, weights_only=True)["model"] for n in ("a.pt", "b.pt"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_our_own_models_keep_their_arguments_and_an_unknown_choice_is_one_line():
    """The imported models' options appear in model_args only where a config sets them (a
    trained checkpoint's arguments, compared on resume, stay as they were); a choice the model
    does not have is refused naming the key."""
    from transformer_mt.config import ModelConfig, config_from_dict
    from transformer_mt.model import model_args

    args = model_args(ModelConfig(), 100, 100, pad_idx=PAD_ID, bos_idx=BOS_ID)
    assert not {"scale_embeddings", "position_layout", "activation", "logits_bias"} & set(args)
    swish = model_args(ModelConfig(activation="swish"), 100, 100, pad_idx=PAD_ID, bos_idx=BOS_ID)
    assert swish["activation"] == "swish" and "logits_bias" not in swish
    with pytest.raises(MTError, match=r"model\.activation='tanh': expected one of relu, gelu"):
        config_from_dict({"model": {"activation": "tanh"}})
    with pytest.raises(MTError, match=r"model\.position_layout='odd'"):
        ModelConfig(position_layout="odd")
