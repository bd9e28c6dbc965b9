"""Export to CTranslate2: the exported model computes what ours does.

Skipped where ctranslate2 is not installed (`make test` installs the `ct2` extra).
"""

import copy
import dataclasses
import json
import math
import os
from pathlib import Path

import pytest
import torch

from transformer_mt.config import Config, DecodeConfig
from transformer_mt.data.tokenizer import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    UNK_ID,
    Tokenizer,
    TokenizerSettings,
)
from transformer_mt.engines import (
    TranslateExtras,
    load_engine,
    load_for_inference,
    translate_lines,
)
from transformer_mt.engines.loading import LoadedModel
from transformer_mt.errors import MTError
from transformer_mt.model import Transformer

ctranslate2 = pytest.importorskip("ctranslate2", reason="the ct2 extra is not installed")

from transformer_mt.convert.ctranslate2 import export_ctranslate2  # noqa: E402
from transformer_mt.engines.ct2 import load_ct2, translate_lines_ct2  # noqa: E402

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "old_checkpoint"


@pytest.fixture(scope="module")
def fixture_model():
    return load_for_inference(FIXTURE / "old_last.pt")


@pytest.fixture(scope="module")
def source_lines() -> list[str]:
    return (FIXTURE / "src.txt").read_text(encoding="utf-8").splitlines()


def _token_log_probs(loaded, src_line: str, trg_line: str) -> torch.Tensor:
    """Our teacher-forced log-probability of each target piece and EOS."""
    src = torch.tensor([[*loaded.src_tok.encode(src_line), EOS_ID]])
    target = loaded.trg_tok.encode(trg_line)
    with torch.no_grad():
        logits = loaded.model(src, torch.tensor([[BOS_ID, *target]]))
    log_probs = torch.log_softmax(logits.float(), dim=-1)[0]  # (T, V)
    return log_probs.gather(1, torch.tensor([*target, EOS_ID])[:, None]).squeeze(1)


def test_exported_greedy_output_equals_ours(fixture_model, source_lines, tmp_path):
    exported = load_ct2(export_ctranslate2(fixture_model, tmp_path / "ct2"))
    greedy = dataclasses.replace(fixture_model.config.decode, beam_size=1, nbest=1)
    ours = translate_lines(
        fixture_model.model, fixture_model.src_tok, fixture_model.trg_tok, source_lines, greedy
    )
    theirs = translate_lines_ct2(exported, source_lines, greedy)
    assert len(theirs) == len(source_lines) and theirs[4] == [("", 0.0)], "the line contract"
    same = sum(a[0][0] == b[0][0] for a, b in zip(ours, theirs, strict=True))
    assert same >= 0.99 * len(source_lines), f"{same} of {len(source_lines)} lines equal"


def test_exported_next_token_probabilities_within_1e_4(fixture_model, source_lines, tmp_path):
    directory = export_ctranslate2(fixture_model, tmp_path / "ct2")
    translator = ctranslate2.Translator(str(directory), intra_threads=1)
    targets = (FIXTURE / "expected.beam1.txt").read_text(encoding="utf-8").splitlines()
    pairs = [(s, t) for s, t in zip(source_lines, targets, strict=True) if s.strip()][:8]
    scored = translator.score_batch(
        [fixture_model.src_tok.pieces(s) for s, _ in pairs],
        [fixture_model.trg_tok.pieces(t) for _, t in pairs],
    )
    for (src_line, trg_line), result in zip(pairs, scored, strict=True):
        ours = _token_log_probs(fixture_model, src_line, trg_line)
        theirs = torch.tensor(result.log_probs)
        assert theirs.shape == ours.shape
        assert torch.allclose(ours, theirs, atol=1e-4)


def test_export_of_a_pre_norm_model_with_separate_vocabularies(tmp_path):
    # Final norms, untied output projection, two tokenizers: the parts the fixture lacks.
    words = "the a cat dog sat ran on under big small red house garden".split()
    texts = [
        " ".join(words[(i * 7 + j) % len(words)] for j in range(2 + i % 6)) for i in range(300)
    ]
    src_tok = Tokenizer.train(texts, TokenizerSettings(vocab_size=50))
    trg_tok = Tokenizer.train([t.upper() for t in texts], TokenizerSettings(vocab_size=60))
    torch.manual_seed(0)
    model = Transformer(
        PAD_ID, PAD_ID, BOS_ID, src_tok.vocab_size, trg_tok.vocab_size, d_model=32, n_head=4,
        max_len=48, ffn_hidden=64, n_layers=2, drop_prob=0.0, n_dec_layers=1, pre_norm=True,
        tie_embeddings=False,
    ).eval()  # fmt: skip
    loaded = LoadedModel(model, src_tok, trg_tok, Config(), step=0)
    directory = export_ctranslate2(loaded, tmp_path / "ct2")
    translator = ctranslate2.Translator(str(directory), intra_threads=1)
    for src_line, trg_line in [("the cat sat", "A DOG RAN"), ("big red house", "ON THE")]:
        (result,) = translator.score_batch([src_tok.pieces(src_line)], [trg_tok.pieces(trg_line)])
        ours = _token_log_probs(loaded, src_line, trg_line)
        assert torch.allclose(ours, torch.tensor(result.log_probs), atol=1e-4)


def test_ct2_beam_output_does_not_depend_on_the_lines_batched_with_it(
    fixture_model, source_lines, tmp_path
):
    """Each line keeps its own length limit under beam search, whatever shares its batch:
    the same distinct n-best, with the same scores, alone and beside a long line."""
    exported = load_ct2(export_ctranslate2(fixture_model, tmp_path / "ct2"))
    decode = DecodeConfig(beam_size=4, nbest=4, max_len_a=0.0, max_len_b=0.5)
    short, long = "The friend closed the woman.", max(source_lines, key=len)
    (alone,) = translate_lines_ct2(exported, [short], decode)
    batched, _ = translate_lines_ct2(exported, [short, long], decode)
    assert batched == alone
    assert len({text for text, _ in alone}) == 4, "four distinct hypotheses"


@pytest.mark.parametrize("beam", [1, 4])
def test_ct2_output_and_score_at_the_length_limit_do_not_depend_on_the_batch(
    fixture_model, source_lines, tmp_path, beam
):
    """Tight limits put many outputs at exactly their own limit. CTranslate2 counts EOS in
    ``max_decoding_length``, so an output of that length from a batch's longer call may have
    ended with an EOS its own limit forbids: text and score must still be those of the line
    decoded alone (greedy included, where the text agrees but the score did not)."""
    exported = load_ct2(export_ctranslate2(fixture_model, tmp_path / "ct2"))
    decode = DecodeConfig(beam_size=beam, nbest=1, max_len_a=0.0, max_len_b=0.8, len_penalty=1.0)
    lines = source_lines[:40]
    long = max(source_lines, key=len)
    alone = [translate_lines_ct2(exported, [line], decode)[0] for line in lines]
    batched = translate_lines_ct2(exported, [long, *lines], decode)[1:]
    assert [t for ((t, _),) in batched] == [t for ((t, _),) in alone]
    assert [s for ((_, s),) in batched] == pytest.approx([s for ((_, s),) in alone], abs=1e-5)


def test_ct2_pieces_give_the_text_our_ids_give(fixture_model):
    """The CT2 engine turns pieces into text as ours turns ids: <unk> dropped on both."""
    tok = fixture_model.trg_tok
    ids = [*tok.encode("The friend closed the woman."), UNK_ID, *tok.encode("a dog")]
    pieces = tok.id_to_piece(ids)
    assert "<unk>" in pieces and "\u2047" not in tok.decode_pieces(pieces)
    assert tok.decode_pieces(pieces) == tok.decode(ids)


@pytest.fixture(scope="module")
def both_engines(fixture_model, tmp_path_factory):
    """The fixture's CT2 engine (a float32 export) and our torch engine, on the same weights."""
    directory = export_ctranslate2(fixture_model, tmp_path_factory.mktemp("conf") / "ct2")
    return load_engine("ct2", directory), load_engine("torch", FIXTURE / "old_last.pt")


@pytest.mark.parametrize(
    ("beam", "len_penalty", "max_len_b", "how"),
    [
        (1, 1.0, 1.2, "one call"),
        (1, 0.0, 1.2, "one call"),
        (3, 2.0, 1.2, "one call"),
        (3, 1.0, 0.5, "one call"),  # outputs cut at their limit: no EOS in their pieces
        (1, 1.0, 1.2, "attention"),
        (3, 1.0, 0.5, "attention"),
        (3, 1.0, 1.2, "batch by batch"),
    ],
)
def test_ct2_confidences_are_the_torch_engines_for_the_same_output(
    both_engines, source_lines, beam, len_penalty, max_len_b, how
):
    """CTranslate2's score is the log-probability (EOS included) over ``pieces ** penalty``,
    pieces counting EOS too: the engine's log-probabilities and confidences are then ours for
    every identical hypothesis. A line not decoded (empty, nothing to translate) has none."""
    ct2, ours = both_engines
    lines = [*source_lines[:16], "  ...  "]  # line 4 is empty
    decode = DecodeConfig(
        beam_size=beam, nbest=beam, len_penalty=len_penalty, max_len_a=0.0 if max_len_b < 1 else 5.0,
        max_len_b=max_len_b, batch_tokens=60,
    )  # fmt: skip
    theirs = ct2.translate(
        lines, decode, attention=how == "attention", stop=(lambda: False) if how[0] == "b" else None
    )
    want = ours.translate(lines, decode)
    compared = cut = 0
    for i, (a, b) in enumerate(zip(theirs, want, strict=True)):
        if i in (4, len(lines) - 1):
            assert a.logprobs is None and a.confidences() is None and b.logprobs is None
            continue
        assert a.logprobs is not None and len(a.logprobs) == beam
        for k, ((text_a, _), (text_b, _)) in enumerate(zip(a.nbest, b.nbest, strict=True)):
            if text_a != text_b:
                continue
            (logp_a, n_a), (logp_b, n_b) = a.logprobs[k], b.logprobs[k]
            assert n_a == n_b and logp_a == pytest.approx(logp_b, abs=1e-4), (i, k, text_a)
            assert a.confidences()[k] == pytest.approx(b.confidences()[k], abs=0.011)
            compared += 1
            cut += n_a == len(ct2.trg_tok.encode(text_a))  # no EOS
    assert compared >= 0.8 * beam * (len(lines) - 2), f"only {compared} identical hypotheses"
    assert cut > 0 or max_len_b >= 1, "the tight limit cuts some hypotheses"


def test_ct2_confidence_of_a_split_paragraph_is_the_torch_engines(both_engines, source_lines):
    """Split paragraphs join their sentences' log-probabilities: a confidence with CT2 too."""
    ct2, ours = both_engines
    paragraphs = [" ".join(source_lines[:3]), source_lines[5] + "\n\n" + source_lines[6], "", "..."]
    decode = DecodeConfig(beam_size=1, nbest=1, max_len_a=5.0, max_len_b=1.2)
    extras = TranslateExtras(split=True)
    theirs, want = (e.translate(paragraphs, decode, extras=extras) for e in (ct2, ours))
    assert [r.text for r in theirs] == [r.text for r in want]
    for a, b in zip(theirs[:2], want[:2], strict=True):
        assert a.logprobs is not None and b.logprobs is not None
        assert a.logprobs[0][1] == b.logprobs[0][1]
        assert a.logprobs[0][0] == pytest.approx(b.logprobs[0][0], abs=1e-4)
        assert a.confidences() == pytest.approx(b.confidences(), abs=0.011)
    assert [r.confidences() for r in theirs[2:]] == [None, None]


def test_int8_export_translates_close_to_float32(fixture_model, source_lines, tmp_path):
    float32 = load_ct2(export_ctranslate2(fixture_model, tmp_path / "f32"))
    int8 = load_ct2(export_ctranslate2(fixture_model, tmp_path / "int8", quantization="int8"))
    assert (tmp_path / "int8" / "model.bin").stat().st_size < (
        tmp_path / "f32" / "model.bin"
    ).stat().st_size
    decode = DecodeConfig(beam_size=1, max_len_a=5, max_len_b=1.2)
    a = translate_lines_ct2(float32, source_lines, decode)
    b = translate_lines_ct2(int8, source_lines, decode)
    # A 130 KB model has little margin for rounding: most lines must still agree.
    same = sum(x[0][0] == y[0][0] for x, y in zip(a, b, strict=True))
    assert same >= 0.6 * len(source_lines), f"only {same} of {len(source_lines)} lines agree"


def test_a_failed_export_leaves_nothing(fixture_model, tmp_path, monkeypatch):
    from transformer_mt.convert import ctranslate2 as export

    def broken(*args, **kwargs):
        raise OSError("disk full")

    target = tmp_path / "ct2"
    monkeypatch.setattr(ctranslate2.specs.TransformerSpec, "save", broken)
    with pytest.raises(OSError):
        export.export_ctranslate2(fixture_model, target)
    assert list(tmp_path.iterdir()) == []


def test_export_leaves_the_model_untouched(fixture_model, tmp_path):
    before = {k: v.clone() for k, v in fixture_model.model.state_dict().items()}
    export_ctranslate2(fixture_model, tmp_path / "int8", quantization="int8")
    after = fixture_model.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before), "int8 quantized our weights"


def test_export_never_replaces_a_directory_that_is_not_an_export(fixture_model, tmp_path):
    from transformer_mt.errors import MTError

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    with pytest.raises(MTError, match="holds no exported model"):
        export_ctranslate2(fixture_model, mine)
    assert (mine / "notes.txt").read_text() == "keep me"
    export_ctranslate2(fixture_model, tmp_path / "ct2")
    export_ctranslate2(fixture_model, tmp_path / "ct2", quantization="int8")  # replaces its own
    assert "int8" in (tmp_path / "ct2" / "transformer_mt.json").read_text()


def test_mt_export_then_translate_and_evaluate_with_the_ct2_engine(tmp_path):
    from typer.testing import CliRunner

    from transformer_mt.cli import app

    runner = CliRunner()
    ckpt, src = str(FIXTURE / "old_last.pt"), str(FIXTURE / "src.txt")
    exported = tmp_path / "ct2"
    done = runner.invoke(app, ["export", "-c", ckpt, "-o", str(exported), "--quantization", "int8"])
    assert done.exit_code == 0, done.output
    assert (exported / "model.bin").is_file() and "--engine ct2" in done.stderr
    ours = runner.invoke(app, ["translate", "-c", ckpt, "-i", src, "--beam", "1"])
    theirs = runner.invoke(
        app, ["translate", "--engine", "ct2", "-c", str(exported), "-i", src, "--beam", "1"]
    )
    assert theirs.exit_code == 0, theirs.output
    lines = theirs.stdout.split("\n")
    assert len(lines) == len(ours.stdout.split("\n")) and lines[4] == "", "the line contract"
    assert ours.exit_code == 0, ours.output
    assert ours.stdout == (FIXTURE / "expected.beam1.txt").read_text(encoding="utf-8")
    refs = tmp_path / "refs.txt"
    refs.write_text(ours.stdout)  # score int8 against our own float32 output
    scored = runner.invoke(
        app, ["evaluate", "--engine", "ct2", "-c", str(exported), "--src", src, "--ref",
              str(refs), "--beam", "1", "--json"],
    )  # fmt: skip
    assert scored.exit_code == 0, scored.output
    # int8 rounding changes about a third of this tiny model's greedy outputs (see
    # test_int8_export_translates_close_to_float32): BLEU about 78 against float32's
    assert json.loads(scored.stdout)["bleu"] >= 60, scored.stdout
    pictures = runner.invoke(
        app, ["translate", "--engine", "ct2", "-c", str(exported), "-i", src,
              "--attention-dir", str(tmp_path / "png")],
    )  # fmt: skip
    assert pictures.exit_code == 1 and "--engine torch" in pictures.stderr


def test_export_replaces_its_own_leaving_no_copy_and_refuses_a_link(fixture_model, tmp_path):
    from transformer_mt.errors import MTError

    first = export_ctranslate2(fixture_model, tmp_path / "ct2")
    export_ctranslate2(fixture_model, first, quantization="int8")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ct2"], "no old or temporary copy left"
    assert load_ct2(first).translator is not None
    (tmp_path / "link").symlink_to(first)
    with pytest.raises(MTError, match="is a symbolic link"):
        export_ctranslate2(fixture_model, tmp_path / "link")
    assert (tmp_path / "link").is_symlink() and (first / "model.bin").is_file()


def _snapshot(directory: Path) -> dict[str, bytes]:
    """Every file under ``directory`` (hidden ones included), byte for byte."""
    return {
        str(p.relative_to(directory)): p.read_bytes() for p in directory.rglob("*") if p.is_file()
    }


def _one_error(result) -> str:
    assert result.exit_code == 1, result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in result.output, result.output
    return errors[0]


def test_export_into_the_folder_of_its_checkpoint_is_refused_and_keeps_every_byte(
    fixture_model, tmp_path, monkeypatch
):
    """`mt export -c exp/best.pt -o exp` where exp holds an earlier export, the checkpoint and
    a file of the user's: refused before any work, and every file there stays byte for byte."""
    from typer.testing import CliRunner

    from transformer_mt.cli import app

    monkeypatch.chdir(tmp_path)
    exp = tmp_path / "exp"
    export_ctranslate2(fixture_model, exp)
    (exp / "best.pt").write_bytes((FIXTURE / "old_last.pt").read_bytes())
    (exp / "notes.txt").write_text("keep me\n")
    before = _snapshot(tmp_path)
    result = CliRunner().invoke(app, ["export", "-c", "exp/best.pt", "-o", "exp"])
    assert "exp/best.pt is the checkpoint being exported" in _one_error(result)
    assert _snapshot(tmp_path) == before
    (exp / "best.pt").unlink()  # without the checkpoint, the user's file still refuses it
    before = _snapshot(tmp_path)
    result = CliRunner().invoke(app, ["export", "-c", str(FIXTURE / "old_last.pt"), "-o", "exp"])
    assert "--output exp holds notes.txt, which its earlier export did not write" in (
        _one_error(result)
    )
    assert _snapshot(tmp_path) == before


def test_an_export_lists_its_files_and_replaces_only_an_earlier_exports(fixture_model, tmp_path):
    """The settings file lists the export's files; the next export into the directory removes
    the earlier one's files it does not write again (here the two vocabularies of a model with
    separate ones, replaced by a shared one), and nothing else is there."""
    words = "the a cat dog sat ran on under big".split()
    texts = [
        " ".join(words[(i * 5 + j) % len(words)] for j in range(2 + i % 5)) for i in range(200)
    ]
    src_tok = Tokenizer.train(texts, TokenizerSettings(vocab_size=40))
    trg_tok = Tokenizer.train([t.upper() for t in texts], TokenizerSettings(vocab_size=45))
    sizes = dict(d_model=16, n_head=2, max_len=32, ffn_hidden=32, n_layers=1)
    model = Transformer(PAD_ID, PAD_ID, BOS_ID, src_tok.vocab_size, trg_tok.vocab_size, **sizes)
    out = export_ctranslate2(LoadedModel(model, src_tok, trg_tok, Config(), step=0), tmp_path / "e")
    first = json.loads((out / "transformer_mt.json").read_text())["files"]
    assert first == sorted(p.name for p in out.iterdir())
    assert {"source_vocabulary.json", "target_vocabulary.json"} <= set(first)
    export_ctranslate2(fixture_model, out)
    second = json.loads((out / "transformer_mt.json").read_text())["files"]
    assert second == sorted(p.name for p in out.iterdir()), "exactly the listed files"
    assert "shared_vocabulary.json" in second and "source_vocabulary.json" not in second
    assert load_ct2(out).max_len == fixture_model.model.positions.max_len


def test_an_export_of_an_older_version_without_a_list_is_replaced(fixture_model, tmp_path):
    out = export_ctranslate2(fixture_model, tmp_path / "e")
    settings = json.loads((out / "transformer_mt.json").read_text())
    del settings["files"]  # as exports wrote it before they listed their files
    (out / "transformer_mt.json").write_text(json.dumps(settings))
    export_ctranslate2(fixture_model, out, quantization="int8")
    assert json.loads((out / "transformer_mt.json").read_text())["quantization"] == "int8"
    settings = json.loads((out / "transformer_mt.json").read_text())
    settings["files"] = ["model.bin", "../../elsewhere.txt"]  # a list that points outside
    (out / "transformer_mt.json").write_text(json.dumps(settings))
    before = _snapshot(tmp_path)
    with pytest.raises(MTError, match="its list of files is damaged"):
        export_ctranslate2(fixture_model, out)
    assert _snapshot(tmp_path) == before


def test_export_into_the_current_directory_and_its_parent(tmp_path, monkeypatch):
    """`-o .` (a path whose name is empty) exports into the working directory when it is
    empty or an earlier export, in place (the shell's working directory stays the export's);
    `-o ..` here holds more than an export: one line, nothing changed."""
    from typer.testing import CliRunner

    from transformer_mt.cli import app

    here = tmp_path / "model"
    here.mkdir()
    monkeypatch.chdir(here)
    ckpt = str(FIXTURE / "old_last.pt")
    for quantization in ("float32", "int8"):  # into the empty directory, then over itself
        done = CliRunner().invoke(
            app, ["export", "-c", ckpt, "-o", ".", "--quantization", quantization]
        )
        assert done.exit_code == 0, done.output
    settings = json.loads((here / "transformer_mt.json").read_text())
    assert settings["quantization"] == "int8" and settings["files"] == sorted(os.listdir(here))
    assert load_ct2(Path(".")).max_len == 64
    before = _snapshot(tmp_path)
    refused = CliRunner().invoke(app, ["export", "-c", ckpt, "-o", ".."])
    assert "--output .. is a directory that holds no exported model" in _one_error(refused)
    assert _snapshot(tmp_path) == before


def test_an_interrupted_replacement_is_refused_by_the_engine_and_redone(
    fixture_model, tmp_path, monkeypatch
):
    """The move of a new export into an earlier one's directory fails halfway (a full disk, a
    signal): its settings file then lists the files of both and says it is incomplete, so the
    CT2 engine refuses it in one line and the next export replaces it; no temporary is left."""
    from transformer_mt.convert import ctranslate2 as export

    out = export_ctranslate2(fixture_model, tmp_path / "e")
    real_replace = os.replace

    def replace(src, dst):  # the OS refuses to move the new model.bin in
        if Path(src).name == "model.bin":
            raise OSError(28, "No space left on device")
        real_replace(src, dst)

    monkeypatch.setattr(export.os, "replace", replace)
    with pytest.raises(OSError, match="No space left"):
        export_ctranslate2(fixture_model, out, quantization="int8")
    settings = json.loads((out / "transformer_mt.json").read_text())
    assert settings["incomplete"] and settings["files"] == sorted(p.name for p in out.iterdir())
    with pytest.raises(MTError, match="holds an export that was interrupted"):
        load_ct2(out)
    monkeypatch.setattr(export.os, "replace", real_replace)
    export_ctranslate2(fixture_model, out, quantization="int8")
    assert load_ct2(out).translator is not None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e"]


def test_export_of_weights_that_are_not_finite_writes_nothing(fixture_model, tmp_path):
    model = copy.deepcopy(fixture_model.model)
    with torch.no_grad():
        model.encoder[0].ffn.fc2.weight[1, 2] = math.nan
    loaded = dataclasses.replace(fixture_model, model=model)
    with pytest.raises(MTError, match=r"tensor encoder\.0\.ffn\.fc2\.weight holds NaN/Inf"):
        export_ctranslate2(loaded, tmp_path / "e")
    assert list(tmp_path.iterdir()) == []
